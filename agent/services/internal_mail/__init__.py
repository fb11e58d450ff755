"""Internal mail between the workstation's agents and operators (the ``internal_mail``
tool): files under ``<data dir>/mail``, addressed by path, separate from internet email."""

from agent.services.internal_mail.delivery import deliver_due
from agent.services.internal_mail.network import MailboxDir, MailboxMeta, MailNetwork
from agent.services.internal_mail.tool import Identity, InternalMail, MailResult, manual_root

__all__ = [
    "Identity",
    "InternalMail",
    "MailNetwork",
    "MailResult",
    "MailboxDir",
    "MailboxMeta",
    "deliver_due",
    "manual_root",
]
