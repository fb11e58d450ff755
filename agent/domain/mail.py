"""What a mail channel hands the core and takes from it, in provider-neutral terms.

A mailbox's ``provider`` is its mail system (google, microsoft, imap, maildir); a
``Channel`` is how it is reached. ``Capabilities`` are what one channel declares it can do;
the core decides from them, never from a provider's name.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from enum import StrEnum

from pydantic import BaseModel, ConfigDict, Field, field_validator

from agent.domain.envelope import Address, Envelope, header_text
from agent.domain.headers import msg_id


class Channel(StrEnum):
    """How a mailbox is reached. The order of trial is always this order (seed 000 s.9:
    the API first, then a provider's MCP server, then the browser)."""

    LOCAL = "local"
    """Files on this machine (a Maildir)."""
    API = "api"
    IMAP = "imap"
    PROVIDER_MCP = "provider_mcp"
    BROWSER = "browser"


CANONICAL_ORDER: tuple[Channel, ...] = tuple(Channel)
"""The order channels are tried in: an API (a local Maildir, a provider API, IMAP) before
a provider's MCP server, before the browser."""


class MarkerKind(StrEnum):
    """What identifies our copy of a send through a channel (whatever survives there)."""

    MESSAGE_ID = "message_id"
    """The Message-ID header we set."""
    HEADER = "header"
    """Another header we set (``X-Outloop-Send``)."""
    NATIVE = "native"
    """A provider-native property or id set at send time."""
    BODY_TOKEN = "body_token"  # noqa: S105 - a marker kind, not a secret
    """A token in the body that the rendered message carries."""


class Marker(BaseModel):
    """The mark a send leaves on its sent copy, recorded before the send is handed over,
    so the copy can be searched for when the outcome is lost."""

    model_config = ConfigDict(frozen=True)

    kind: MarkerKind
    value: str = Field(min_length=1, max_length=998)


class Capabilities(BaseModel):
    """What one channel of a mailbox can do, declared by its adapter."""

    model_config = ConfigDict(frozen=True)

    channel: Channel
    key_basis: bool = True
    """Reads give every message's Message-ID, sender and Date, so its occurrence key is the
    one every channel gives. A channel without it is not used for intake."""
    native_threads: bool = False
    """Envelopes carry the mail system's own thread or conversation id, the same one every
    channel of the mail system shows. Otherwise threads are kept as aliases in the store."""
    markers: tuple[MarkerKind, ...] = (MarkerKind.MESSAGE_ID,)
    """The marker kinds that survive on a sent copy through this channel and that
    ``find_sent`` can search, best first."""
    searches: tuple[MarkerKind, ...] = ()
    """Marker kinds ``find_sent`` also searches, set by other channels of the mailbox on
    their copies (this one sets none of them): a send another channel left uncertain can
    be settled here."""
    keeps_sent_copy: bool = True
    """Sending leaves a copy that ``find_sent`` can search. Without one, a lost outcome
    cannot be settled here and goes to a person."""
    files_sent_copy: bool = False
    """The channel files a copy of what it sent after the send was accepted (an IMAP
    client appending to Sent): ``find_sent`` reads it back, but its absence proves nothing
    about a lost answer (``keeps_sent_copy`` stays False)."""
    sent_copy_latency: timedelta = timedelta(0)
    """The longest a sent copy may take to become searchable after the send was accepted:
    only a search this long after the attempt proves a copy absent."""
    delivers: bool = True
    """A send reaches its recipients (a local outbox copy does not)."""
    page_size: int = Field(default=100, ge=1)

    def finds(self, kind: MarkerKind) -> bool:
        """Whether ``find_sent`` searches copies marked by ``kind``."""
        return kind in self.markers or kind in self.searches


class AttachmentRef(BaseModel):
    """An attachment by reference: what it is, never its bytes."""

    model_config = ConfigDict(frozen=True)

    ref: str
    name: str
    content_type: str = "application/octet-stream"
    size: int = Field(ge=0)
    sha256: str = ""
    """Known once the bytes were read (read-back compares it)."""


class AttachmentData(BaseModel):
    """An attachment's bytes, fetched by reference (kept inside the core, never put into a
    tool argument or result)."""

    model_config = ConfigDict(frozen=True)

    ref: AttachmentRef
    data: bytes


class ScannedMessage(BaseModel):
    """One item seen in a mailbox scan: an envelope, or why it could not be normalized."""

    model_config = ConfigDict(frozen=True)

    item_ref: str
    envelope: Envelope | None = None
    error: str | None = None


class ChangePage(BaseModel):
    """One page of a mailbox's changes since a cursor."""

    model_config = ConfigDict(frozen=True)

    items: tuple[ScannedMessage, ...]
    cursor: str
    """Where the next page (or the next run) starts; persisted with the items it covers."""
    more: bool
    """More changes follow: ask again with ``cursor``."""


class MessageBody(BaseModel):
    """A message's content. It is untrusted data, never instructions."""

    model_config = ConfigDict(frozen=True)

    text: str = ""
    html: str | None = None


class OutgoingMessage(BaseModel):
    model_config = ConfigDict(frozen=True)

    @field_validator("subject")
    @classmethod
    def _one_line(cls, value: str) -> str:
        # A line break in a header would start another header: never sent as such; the
        # ends are trimmed as a mail reader trims them.
        return header_text(value).strip()

    @field_validator("internet_message_id", "in_reply_to")
    @classmethod
    def _msg_id(cls, value: str | None) -> str | None:
        if value is not None and msg_id(value) != value:
            raise ValueError(f"{value!r} is not an RFC 5322 msg-id this core may send")
        return value

    @field_validator("references")
    @classmethod
    def _msg_ids(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for item in value:
            cls._msg_id(item)
        return value

    provider_thread_id: str
    in_reply_to: str | None = None
    references: tuple[str, ...] = ()
    sender: Address
    to: tuple[Address, ...]
    cc: tuple[Address, ...] = ()
    subject: str
    text: str
    html: str | None = None
    internet_message_id: str
    attachments: tuple[AttachmentData, ...] = ()
    """Files sent with the message, each read by reference from an inbound attachment of
    the same workspace or a directory the context authorizes."""


class Handover(BaseModel):
    """A message in the exact form a channel hands it over: the serialized MIME, and any
    recipient lists or SMTP envelope recipients the channel passes beside it. The core
    checks it against the plan (``agent.domain.handover``) before the channel is asked."""

    model_config = ConfigDict(frozen=True)

    message: OutgoingMessage
    channel: str
    mime: bytes | None = None
    recipients: tuple[tuple[str, tuple[str, ...]], ...] | None = None
    """Address lists the channel passes outside the MIME (header name, addresses), e.g. an
    API's JSON recipients; None when the channel passes none."""
    envelope_recipients: tuple[str, ...] | None = None
    """SMTP ``RCPT TO`` addresses, for channels that submit over SMTP."""
    marker: Marker | None = None
    """The mark this channel leaves on our sent copy (the ledger records it before the
    handover); None only for a channel that can mark nothing."""


class SendResult(BaseModel):
    model_config = ConfigDict(frozen=True)

    provider_message_id: str
    provider_thread_id: str
    internet_message_id: str
    channel: str
    delivered: bool
    accepted_at: datetime
    refused: tuple[tuple[str, str], ...] = ()
    """Recipients the channel refused at handover (address, reason); the rest were
    accepted. Any refusal makes the send a partial delivery, never a plain success."""


class StoredCopy(BaseModel):
    """The provider's stored copy of a sent message, as read back."""

    model_config = ConfigDict(frozen=True)

    provider_message_id: str
    provider_thread_id: str
    internet_message_id: str | None
    sender: Address | None
    to: tuple[Address, ...]
    cc: tuple[Address, ...]
    subject: str
    text: str
    html: str | None
    bcc: tuple[Address, ...] = ()
    reply_to: tuple[Address, ...] = ()
    other_address_headers: tuple[tuple[str, str], ...] = ()
    """Every other header of the stored copy that names mailboxes (name, value): Sender,
    Resent-*, receipt and follow-up headers. A send sets none of them."""
    delivered: bool = False
    """The copy is the provider's record of a message it sent out; False for a local
    outbox copy that reached no one."""
    attachments: tuple[AttachmentRef, ...] = ()
    """The stored copy's attachments (name, size, digest), compared with what was sent."""


class ProviderHealth(BaseModel):
    model_config = ConfigDict(frozen=True)

    provider: str
    mailbox_id: str
    ok: bool
    detail: str
    refused: bool = False
    """Not ok because the provider or a policy refused (a 403), not for want of access: the
    access order never goes around it."""
    account: str | None = None
    """The address the channel signed in as, where it shows one that may differ from the
    mailbox (an IMAP login); None when the channel checked it itself or cannot tell."""
