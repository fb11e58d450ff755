"""Deterministic noise signals read from normalized headers (never from body wording).

NOISE_EXCLUDED is given only where the evidence is clear. Where it is not (list mail from
a known contact), the item goes to a human instead of being silenced.
"""

from __future__ import annotations

from enum import StrEnum

from pydantic import BaseModel, ConfigDict

from agent.domain.envelope import Envelope

#: RFC 3834 Auto-Submitted values and RFC 6522 report types repeated in reasons (any other
#: value is the sender's text and is not repeated).
_REGISTERED_AUTO = frozenset({"auto-generated", "auto-replied", "auto-notified"})
_REGISTERED_REPORTS = frozenset(
    {"delivery-status", "disposition-notification", "feedback-report", "tlsrpt"}
)


class NoiseKind(StrEnum):
    AUTO_REPLY = "auto_reply"
    """RFC 3834 ``Auto-Submitted: auto-replied``: out-of-office and vacation replies."""
    AUTOMATED = "automated"
    """RFC 3834 ``Auto-Submitted`` other than ``no`` and ``auto-replied``."""
    DELIVERY_REPORT = "delivery_report"
    """A bounce: an RFC 3464 report of failed delivery, or a delivery system's own message."""
    BULK = "bulk"
    """List or bulk mail: ``List-Id`` or ``Precedence: bulk/list/junk``."""
    LOOP = "loop"
    """The workspace's own mail come back to it."""


class Noise(BaseModel):
    model_config = ConfigDict(frozen=True)

    kind: NoiseKind
    reason: str
    clear: bool = True
    """False when the signal alone is not enough to silence the item (a human looks)."""


_AUTO_PRECEDENCE = frozenset({"bulk", "junk", "list"})
_DELIVERY_SENDERS = frozenset({"mailer-daemon", "postmaster"})


def noise(envelope: Envelope, *, own_addresses: frozenset[str], known_sender: bool) -> Noise | None:
    """What kind of automated mail the message is, or None for a person's message."""
    sender = envelope.sender.address
    local = sender.split("@", 1)[0]
    if envelope.report_failed or (envelope.report_type is None and local in _DELIVERY_SENDERS):
        what = envelope.report_type or f"from {sender}"
        return Noise(kind=NoiseKind.DELIVERY_REPORT, reason=f"delivery failure ({what})")
    if envelope.report_type is not None:
        return Noise(
            kind=NoiseKind.AUTOMATED,
            reason="automated report ("
            + (
                envelope.report_type
                if envelope.report_type in _REGISTERED_REPORTS
                else "another type"
            )
            + ") that reports no failure",
        )
    auto = (envelope.auto_submitted or "").strip().lower()
    auto_value = auto.split(";", 1)[0].strip()
    if auto_value == "auto-replied":
        return Noise(kind=NoiseKind.AUTO_REPLY, reason="Auto-Submitted: auto-replied")
    if auto_value and auto_value != "no":
        # The header's value is the sender's text: only a registered value is repeated.
        shown_value = auto_value if auto_value in _REGISTERED_AUTO else "an unregistered value"
        return Noise(kind=NoiseKind.AUTOMATED, reason=f"Auto-Submitted: {shown_value}")
    precedence = (envelope.precedence or "").strip().lower()
    if precedence == "auto_reply":
        return Noise(kind=NoiseKind.AUTO_REPLY, reason="Precedence: auto_reply")
    if sender in own_addresses:
        return Noise(kind=NoiseKind.LOOP, reason=f"sent by this workspace's own mailbox {sender}")
    if precedence in _AUTO_PRECEDENCE or envelope.list_id:
        signal = f"Precedence: {precedence}" if precedence in _AUTO_PRECEDENCE else "List-Id"
        if known_sender:
            return Noise(
                kind=NoiseKind.BULK,
                reason=f"list mail ({signal}) from a known contact {sender}: a human decides",
                clear=False,
            )
        return Noise(kind=NoiseKind.BULK, reason=f"list or bulk mail ({signal})")
    return None
