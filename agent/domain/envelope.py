"""The canonical provider envelope and the keys derived from it.

Every channel adapter produces the same envelope, and the keys are built only from what
every channel of a mail system gives (docs/lifecycle.md, "Keys"):

- ``provider`` is the mail system (google, microsoft, imap, maildir), never the channel;
- a message occurrence is its Message-ID plus a digest of channel-independent header
  fields (sender address and Date), never a UID, an item id or a body digest;
- ``work_key = workspace_id + provider + mailbox_id + thread``, where the thread is the mail
  system's own thread id when every channel shows it, else an alias the store keeps,
  reached from the Message-IDs of the thread (In-Reply-To and References).

Subject, sender similarity and timing never link messages.
"""

from __future__ import annotations

import hashlib
import unicodedata
from datetime import datetime
from enum import StrEnum

from pydantic import AliasChoices, BaseModel, ConfigDict, Field, field_validator

#: Characters that break a line: none of them belongs in a single-line header value.
LINE_BREAKS = frozenset("\r\n\v\f\x1c\x1d\x1e\x85\u2028\u2029")


def one_line(value: str) -> str:
    """A header value on one line: every line-breaking character becomes a space."""
    return "".join(" " if ch in LINE_BREAKS else ch for ch in value)


def header_text(value: str) -> str:
    """Text as a header of a message we send may carry it: on one line, with every control
    character (NUL, escape, C1 controls) a space."""
    return "".join(
        " " if ch in LINE_BREAKS or ord(ch) < 0x20 or 0x7F <= ord(ch) < 0xA0 else ch for ch in value
    )


class Address(BaseModel):
    """One mailbox address. The address is compared case-insensitively; the name is display only."""

    model_config = ConfigDict(frozen=True)

    address: str
    name: str = ""

    @field_validator("address")
    @classmethod
    def _normalize(cls, value: str) -> str:
        return value.strip().lower()

    @field_validator("name")
    @classmethod
    def _one_line(cls, value: str) -> str:
        return one_line(value)


class OccurrenceScope(StrEnum):
    """What one occurrence is: a single message, or a whole thread (recurring digests)."""

    MESSAGE = "message"
    THREAD = "thread"


class Envelope(BaseModel):
    """The canonical envelope of one provider message (seed 000, section 3).

    The adapter normalizes only: it never chooses a workspace, classifies, or decides approval.
    """

    model_config = ConfigDict(frozen=True, populate_by_name=True)

    origin: str = "mail"
    provider: str
    mailbox_id: str
    provider_thread_id: str
    provider_message_id: str
    internet_message_id: str | None = None
    in_reply_to: str | None = None
    references: tuple[str, ...] = ()
    received_at: datetime
    sent_at: datetime | None = None
    """The message's own Date header (the same through every channel), if readable."""
    sender: Address = Field(
        validation_alias=AliasChoices("sender", "from"), serialization_alias="from"
    )
    to: tuple[Address, ...] = ()
    cc: tuple[Address, ...] = ()
    subject: str = ""
    body_ref: str
    attachment_refs: tuple[str, ...] = ()
    attachment_names: tuple[str, ...] = ()
    """The attachments' file names as the message gives them (untrusted display data)."""
    # Normalization facts the adapter reads from headers; data, never instructions.
    auto_submitted: str | None = None
    precedence: str | None = None
    list_id: str | None = None
    report_type: str | None = None
    """A delivery report's type (``delivery-status`` for a bounce), from multipart/report."""
    reported_message_id: str | None = None
    """The Message-ID of the message a delivery report is about (exact linkage to it)."""
    report_failed: bool = False
    """The delivery report says delivery failed (``Action: failed``), not delayed, relayed,
    delivered or read."""
    content_digest: str = Field(
        description="sha256 over the message's own content (sender, date, subject, body), "
        "identical for the same message delivered twice"
    )
    normalization_notes: tuple[str, ...] = ()

    @field_validator(
        "internet_message_id", "in_reply_to", "provider_thread_id", "reported_message_id"
    )
    @classmethod
    def _bounded_id(cls, value: str | None) -> str | None:
        return None if value is None else bounded_id(value)

    @field_validator("references")
    @classmethod
    def _bounded_ids(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        return tuple(dict.fromkeys(bounded_id(v) for v in value))

    @field_validator("subject")
    @classmethod
    def _subject_one_line(cls, value: str) -> str:
        return one_line(value)

    @field_validator("received_at", "sent_at")
    @classmethod
    def _aware(cls, value: datetime | None) -> datetime | None:
        if value is not None and value.tzinfo is None:
            raise ValueError("received_at and sent_at must be timezone-aware")
        return value


MAX_ID_LENGTH = 900
"""Longer identifiers (longer than a mail header line may be) are replaced by a digest, so
keys stay within every database's index row limit."""


def bounded_id(value: str) -> str:
    """An identifier as the store keeps it: control characters (NUL among them, which no
    database text column accepts) removed, and one longer than MAX_ID_LENGTH replaced by a
    stable digest of it, so the same header always gives the same id."""
    cleaned = "".join(ch for ch in value if ch >= " " and ch != "\x7f")
    if len(cleaned) <= MAX_ID_LENGTH:
        return cleaned
    digest = hashlib.sha256(cleaned.encode("utf-8", "surrogatepass")).hexdigest()
    return f"<{digest}@long-id.invalid>"


def compose_key(*parts: str) -> str:
    # Length-prefixed so no choice of ids can make two different tuples collide.
    return "|".join(f"{len(p)}:{p}" for p in parts)


def work_key(workspace_id: str, envelope: Envelope) -> str:
    """The thread's work key: workspace + provider + mailbox + provider thread id."""
    return compose_key(
        workspace_id, envelope.provider, envelope.mailbox_id, envelope.provider_thread_id
    )


def identity_digest(envelope: Envelope) -> str:
    """A digest of the header fields every channel of a mail system shows alike: the sender
    address, the Date header (to the second, in UTC) and the subject (its words, however a
    channel wraps or spaces them). Never the body: each channel renders it differently."""
    sent = envelope.sent_at
    stamp = "" if sent is None else str(int(sent.timestamp()))
    subject = " ".join(unicodedata.normalize("NFC", envelope.subject).split())
    return content_digest("identity-v2", envelope.sender.address, stamp, subject)


def occurrence_key(
    scope_owner: str, envelope: Envelope, scope: OccurrenceScope = OccurrenceScope.MESSAGE
) -> str:
    """The key claimed for one occurrence.

    ``scope_owner`` is the workspace id, or the station's own scope for items no workspace
    owns. A message occurrence is its Message-ID plus the identity digest, so the same
    message read twice, or through another channel of the mail system, is one occurrence,
    while two different messages that share a Message-ID stay two. Without a Message-ID the
    channel's own message id and content digest stand in (such a message is one occurrence
    per channel: nothing else identifies it).
    """
    base = (scope_owner, envelope.provider, envelope.mailbox_id)
    if scope is OccurrenceScope.THREAD:
        return compose_key(*base, "thread", envelope.provider_thread_id)
    if envelope.internet_message_id is None:
        ident = f"provider:{envelope.provider_message_id}"
        return compose_key(*base, "message", ident, envelope.content_digest[:32])
    return compose_key(
        *base, "message-v2", envelope.internet_message_id, identity_digest(envelope)[:32]
    )


def thread_alias(root: str) -> str:
    """The alias a thread is first named by: a digest of the Message-ID it started from."""
    return "mt-" + hashlib.sha256(root.encode("utf-8", "surrogateescape")).hexdigest()[:20]


def proposed_thread(envelope: Envelope) -> str:
    """The alias a message proposes for its thread when no message of it has one yet: named
    by the first message its References name (the conversation's start), else the one it
    answers, else itself. Without any Message-ID the channel's thread id stands."""
    refs = envelope.references
    root = refs[0] if refs else envelope.in_reply_to or envelope.internet_message_id
    return envelope.provider_thread_id if root is None else thread_alias(root)


def legacy_occurrence_key(scope_owner: str, envelope: Envelope) -> str:
    """The message occurrence key of stores written before keys were channel-independent
    (Message-ID plus a digest of the message's bytes). Items recorded under it keep it."""
    ident = envelope.internet_message_id or f"provider:{envelope.provider_message_id}"
    base = (scope_owner, envelope.provider, envelope.mailbox_id)
    return compose_key(*base, "message", ident, envelope.content_digest[:32])


def content_digest(*parts: str | bytes) -> str:
    """A stable sha256 over the given parts (adapters use it to fill ``content_digest``)."""
    digest = hashlib.sha256()
    for part in parts:
        data = part.encode("utf-8", "surrogateescape") if isinstance(part, str) else part
        digest.update(len(data).to_bytes(8, "big"))
        digest.update(data)
    return digest.hexdigest()
