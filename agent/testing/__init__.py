"""Shipped fakes for unit tests: an in-memory mail provider and a frozen clock.

They implement the same ports as the real adapters and pass the same contract suites.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from agent.domain.envelope import Address, Envelope, content_digest
from agent.domain.errors import ProviderError
from agent.domain.mail import (
    Handover,
    MessageBody,
    OutgoingMessage,
    ProviderHealth,
    ScannedMessage,
    SendResult,
    StoredCopy,
)
from agent.providers import mime, rfc822


@dataclass
class FrozenClock:
    """A clock that moves only when told to."""

    moment: datetime = field(default_factory=lambda: datetime(2026, 11, 30, 9, 0, tzinfo=UTC))

    def now(self) -> datetime:
        return self.moment

    def advance(self, **delta: float) -> datetime:
        self.moment += timedelta(**delta)
        return self.moment


class InMemoryProvider:
    """The MailProvider port over a list in memory. ``provider`` names it like a real one."""

    def __init__(self, mailbox_id: str, provider: str = "memory") -> None:
        self._mailbox_id = mailbox_id.lower()
        self._provider = provider
        self.inbox: list[ScannedMessage] = []
        self.bodies: dict[str, MessageBody] = {}
        self.sent: list[OutgoingMessage] = []
        self.sent_mime: list[bytes] = []
        """The exact bytes each send handed over (the stored copies are read from them)."""
        self.healthy = True

    @property
    def provider(self) -> str:
        return self._provider

    @property
    def mailbox_id(self) -> str:
        return self._mailbox_id

    def deliver(self, envelope: Envelope, text: str = "", html: str | None = None) -> None:
        self.inbox.append(ScannedMessage(item_ref=envelope.provider_message_id, envelope=envelope))
        self.bodies[envelope.body_ref] = MessageBody(text=text, html=html)

    def deliver_unreadable(self, item_ref: str, error: str) -> None:
        self.inbox.append(ScannedMessage(item_ref=item_ref, error=error))

    async def scan(self) -> AsyncIterator[ScannedMessage]:
        for item in list(self.inbox):
            yield item

    async def fetch_body(self, body_ref: str) -> MessageBody:
        try:
            return self.bodies[body_ref]
        except KeyError:
            raise ProviderError(f"no message body {body_ref!r} in this mailbox") from None

    async def prepare(self, message: OutgoingMessage) -> Handover:
        try:
            raw = mime.build(message, datetime.now(UTC))
        except ValueError as exc:
            raise ProviderError(f"the message cannot be written as MIME: {exc}") from exc
        return Handover(message=message, channel="memory", mime=raw)

    async def send(self, handover: Handover) -> SendResult:
        if handover.mime is None:
            raise ProviderError("the in-memory mailbox stores MIME; prepare the message first")
        self.sent.append(handover.message)
        self.sent_mime.append(handover.mime)
        return SendResult(
            provider_message_id=f"sent-{len(self.sent)}",
            provider_thread_id=handover.message.provider_thread_id,
            internet_message_id=handover.message.internet_message_id,
            channel="memory",
            delivered=True,
            accepted_at=datetime.now(UTC),
        )

    async def read_back(self, internet_message_id: str) -> StoredCopy | None:
        """The stored copy, read from the bytes that were handed over."""
        for index, message in enumerate(self.sent, start=1):
            if message.internet_message_id == internet_message_id:
                return rfc822.stored_copy(
                    self.sent_mime[index - 1],
                    provider_message_id=f"sent-{index}",
                    provider_thread_id=message.provider_thread_id,
                    delivered=True,
                )
        return None

    async def health(self) -> ProviderHealth:
        return ProviderHealth(
            provider=self._provider,
            mailbox_id=self._mailbox_id,
            ok=self.healthy,
            detail="in memory",
        )


def make_envelope(
    *,
    mailbox_id: str,
    message_no: int,
    thread_no: int,
    sender: str = "client@example.test",
    subject: str | None = None,
    provider: str = "memory",
    received_at: datetime | None = None,
    in_reply_to: str | None = None,
    auto_submitted: str | None = None,
) -> Envelope:
    """A deterministic envelope for tests: message ``message_no`` in thread ``thread_no``."""
    mid = f"<m{message_no}@example.test>"
    moment = received_at or datetime(2026, 11, 1, tzinfo=UTC) + timedelta(seconds=message_no)
    return Envelope(
        provider=provider,
        mailbox_id=mailbox_id,
        provider_thread_id=f"thread-{thread_no}",
        provider_message_id=f"pm-{message_no}",
        internet_message_id=mid,
        in_reply_to=in_reply_to,
        references=(in_reply_to,) if in_reply_to else (),
        received_at=moment,
        sender=Address(address=sender),
        to=(Address(address=mailbox_id),),
        subject=subject if subject is not None else f"Request {thread_no}",
        body_ref=f"pm-{message_no}",
        auto_submitted=auto_submitted,
        content_digest=content_digest(mid, str(message_no)),
    )


def synthetic_mailbox(
    mailbox_id: str, messages: int, per_thread: int, provider: str = "memory"
) -> InMemoryProvider:
    """A mailbox of ``messages`` messages, ``per_thread`` to a thread."""
    box = InMemoryProvider(mailbox_id, provider)
    for envelope in synthetic_envelopes(mailbox_id, messages, per_thread, provider):
        box.deliver(envelope)
    return box


def synthetic_envelopes(
    mailbox_id: str, messages: int, per_thread: int, provider: str = "memory"
) -> Iterable[Envelope]:
    for n in range(messages):
        yield make_envelope(
            mailbox_id=mailbox_id, message_no=n, thread_no=n // per_thread, provider=provider
        )
