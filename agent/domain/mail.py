"""What a mail provider hands the core and takes from it, in provider-neutral terms."""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, ConfigDict, field_validator

from agent.domain.envelope import Address, Envelope, one_line


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
        # A line break in a header would start another header: never sent as such.
        return one_line(value)

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


class ProviderHealth(BaseModel):
    model_config = ConfigDict(frozen=True)

    provider: str
    mailbox_id: str
    ok: bool
    detail: str
