"""Shipped fakes for tests: a fake mailbox shown through channels, and clocks a test drives.

They implement the same ports as the real adapters and pass the same contract suites
(``agent.testing.providers`` for the MailProvider port, ``agent.testing.storage`` for the
store's roles).
"""

from agent.testing.clocks import FileClock, FrozenClock, UtcClock
from agent.testing.mailbox import Faults, MailboxState, MemoryMailbox, SentRecord
from agent.testing.mailbox_file import FileMailbox
from agent.testing.memory import (
    API,
    BROWSER,
    IMAP,
    ChannelView,
    InMemoryProvider,
    make_envelope,
    synthetic_envelopes,
    synthetic_mailbox,
)

__all__ = [
    "API",
    "BROWSER",
    "IMAP",
    "ChannelView",
    "Faults",
    "FileClock",
    "FileMailbox",
    "FrozenClock",
    "InMemoryProvider",
    "MailboxState",
    "MemoryMailbox",
    "SentRecord",
    "UtcClock",
    "make_envelope",
    "synthetic_envelopes",
    "synthetic_mailbox",
]
