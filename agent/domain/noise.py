"""Deterministic noise signals read from normalized headers (never from body wording)."""

from __future__ import annotations

from agent.domain.envelope import Envelope

_AUTO_PRECEDENCE = frozenset({"bulk", "junk", "list", "auto_reply"})


def noise_reason(envelope: Envelope) -> str | None:
    """Why the message is automated noise (RFC 3834 and common practice), or None."""
    auto = (envelope.auto_submitted or "").strip().lower()
    if auto and auto != "no":
        return f"Auto-Submitted: {auto}"
    precedence = (envelope.precedence or "").strip().lower()
    if precedence in _AUTO_PRECEDENCE:
        return f"Precedence: {precedence}"
    if envelope.list_id:
        return "mailing-list message (List-Id present)"
    sender = envelope.sender.address
    local = sender.split("@", 1)[0]
    if local in {"mailer-daemon", "postmaster"}:
        return f"delivery system sender {sender}"
    return None
