"""What a mail provider hands the core and takes from it, in provider-neutral terms."""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, ConfigDict, field_validator

from agent.domain.envelope import Address, Envelope, header_text
from agent.domain.headers import msg_id


class ScannedMessage(BaseModel):
    """One item seen in a mailbox scan: an envelope, or why it could not be normalized."""

    model_config = ConfigDict(frozen=True)

    item_ref: str
    envelope: Envelope | None = None
    error: str | None = None


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


class SendResult(BaseModel):
    model_config = ConfigDict(frozen=True)

    provider_message_id: str
    provider_thread_id: str
    internet_message_id: str
    channel: str
    delivered: bool
    accepted_at: datetime


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


class ProviderHealth(BaseModel):
    model_config = ConfigDict(frozen=True)

    provider: str
    mailbox_id: str
    ok: bool
    detail: str
