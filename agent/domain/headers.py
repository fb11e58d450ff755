"""Header values that come from mail, as the core accepts them and passes them on.

A Message-ID, In-Reply-To or References taken from received mail is copied into what we
send. It is accepted only in RFC 5322's ``msg-id`` form (section 3.6.4): ``<`` id-left ``@``
id-right ``>`` of printable ASCII, with no whitespace, no RFC 2047 encoded word (an encoded
word is not allowed in a msg-id, and some mail libraries decode one into line breaks that
start new header lines), and at most ``MAX_MSG_ID`` characters. Anything else is left out of
threading headers. References is built as section 3.6.4 says and bounded, keeping the root.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

MAX_MSG_ID = 250
"""Longer identifiers are refused (real ones are well under 100 characters)."""
MAX_REFERENCES = 20
"""References keeps the thread's root and the newest ids up to this many."""

_ATEXT = r"[A-Za-z0-9!#$%&'*+\-/=?^_`{|}~]+"
_DOT_ATOM = _ATEXT + r"(?:\." + _ATEXT + r")*"
_NO_FOLD_LITERAL = r"\[[\x21-\x5a\x5e-\x7e]*\]"
_MSG_ID = re.compile(r"<" + _DOT_ATOM + r"@(?:" + _DOT_ATOM + "|" + _NO_FOLD_LITERAL + r")>")
_CANDIDATE = re.compile(r"<[^<>]*>")

#: Every header that names mailboxes (RFC 5322 sections 3.6.2, 3.6.3, 3.6.6, and the common
#: extensions that direct replies or receipts). A send sets From, To and Cc only.
ADDRESS_HEADERS = frozenset(
    {
        "from",
        "sender",
        "reply-to",
        "to",
        "cc",
        "bcc",
        "resent-from",
        "resent-sender",
        "resent-to",
        "resent-cc",
        "resent-bcc",
        "disposition-notification-to",
        "return-receipt-to",
        "mail-followup-to",
        "mail-reply-to",
        "errors-to",
        "apparently-to",
    }
)


def msg_id(value: str | None) -> str | None:
    """``value`` when it is exactly one RFC 5322 msg-id we may copy into a header, else None."""
    if value is None:
        return None
    value = value.strip()
    if len(value) > MAX_MSG_ID or "=?" in value or not _MSG_ID.fullmatch(value):
        return None
    return value


def msg_ids(raw: str | None) -> tuple[str, ...]:
    """The acceptable msg-ids a raw header value lists, in order, each once. A candidate
    that is not in msg-id form is left out (never repaired)."""
    if not raw:
        return ()
    found = (msg_id(c) for c in _CANDIDATE.findall(raw))
    return tuple(dict.fromkeys(m for m in found if m is not None))


def references_for(
    parent_id: str | None, parent_references: Iterable[str], parent_in_reply_to: str | None
) -> tuple[str, ...]:
    """The References of a reply (RFC 5322 section 3.6.4): the parent's References (or, when
    it has none, its single In-Reply-To), then the parent's Message-ID; at most
    ``MAX_REFERENCES`` ids, the root kept first."""
    earlier = tuple(parent_references) or ((parent_in_reply_to,) if parent_in_reply_to else ())
    ids = tuple(
        dict.fromkeys(m for m in (msg_id(v) for v in (*earlier, parent_id)) if m is not None)
    )
    if len(ids) <= MAX_REFERENCES:
        return ids
    return (ids[0], *ids[len(ids) - MAX_REFERENCES + 1 :])
