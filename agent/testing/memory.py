"""The MailProvider fake: one mailbox's state (``agent.testing.mailbox``) shown through a
channel (``ChannelView``).

``InMemoryProvider(mailbox_id)`` is a fresh mailbox in this process seen through the API
channel; ``InMemoryProvider.through(state, view)`` is another channel of an existing mailbox
(in memory, or a ``FileMailbox`` several processes share). Every channel of one mailbox shows
the same Message-IDs, senders and dates; each shows its own ``provider_message_id`` format,
and the mailbox's thread ids when it declares ``native_threads`` (else thread ids of its own).

A view keeps to what it declares: it sets only the markers it lists (the first it can, best
first), a copy it says it keeps is searchable within its declared latency, a channel that
drops our Message-ID lists no ``message_id`` marker, and one that keeps no sent copy lists no
marker at all and cannot search (``Unsupported``).
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from agent.domain.envelope import Address, Envelope, content_digest
from agent.domain.errors import CursorExpired, NotFound, OutcomeUnknown, ProviderError, Unsupported
from agent.domain.mail import (
    AttachmentData,
    Capabilities,
    ChangePage,
    Channel,
    Handover,
    Marker,
    MarkerKind,
    MessageBody,
    OutgoingMessage,
    ProviderHealth,
    ScannedMessage,
    SendResult,
    StoredCopy,
)
from agent.ports import Clock
from agent.providers import mime, rfc822
from agent.testing.mailbox import File, MailboxState, MemoryMailbox, SentRecord

_ALL_MARKERS = (MarkerKind.MESSAGE_ID, MarkerKind.HEADER, MarkerKind.NATIVE)


@dataclass(frozen=True)
class ChannelView:
    """How one channel shows a mailbox, and what it declares it can do."""

    name: str
    channel: Channel
    prefix: str = ""
    """Its ids are the mailbox's own with this prefix (its ``provider_message_id`` format)."""
    native_threads: bool = True
    """It shows the mailbox's own thread ids (else ids of its own: ``<name>:<thread>``)."""
    markers: tuple[MarkerKind, ...] = _ALL_MARKERS
    keeps_sent_copy: bool = True
    sent_copy_latency: timedelta = timedelta(0)
    replaces_message_id: bool = False
    """The provider gives the stored copy a Message-ID of its own (ours does not survive)."""
    hands_mime: bool = True
    """It hands over MIME; else the fields of a compose form (recipient lists beside the
    text), from which the provider writes the message (and its Message-ID)."""
    delivers: bool = True
    page_size: int = 100

    def __post_init__(self) -> None:
        problems: list[str] = []
        if self.replaces_message_id and MarkerKind.MESSAGE_ID in self.markers:
            problems.append("our Message-ID does not survive, so it cannot be a marker")
        if not self.hands_mime and not self.replaces_message_id:
            problems.append("a compose form sets no Message-ID: the provider writes its own")
        if not self.hands_mime and MarkerKind.HEADER in self.markers:
            problems.append("a compose form sets no header, so a header cannot be a marker")
        if not self.keeps_sent_copy and self.markers:
            problems.append("without a sent copy no marker can be searched")
        if problems:
            raise ValueError(f"channel view {self.name}: " + "; ".join(problems))

    def show(self, own: str) -> str:
        return self.prefix + own

    def own(self, shown: str) -> str | None:
        return shown.removeprefix(self.prefix) if shown.startswith(self.prefix) else None

    def thread(self, own: str) -> str:
        return own if self.native_threads else f"{self.name}:{own}"

    def own_thread(self, shown: str) -> str:
        return shown if self.native_threads else shown.removeprefix(f"{self.name}:")


API = ChannelView("api", Channel.API)
"""A provider API: the mailbox's own ids and threads; our Message-ID, a header of ours and
a native property all survive; copies searchable at once."""
BROWSER = ChannelView(
    "browser",
    Channel.BROWSER,
    prefix="web:",
    markers=(MarkerKind.BODY_TOKEN,),
    sent_copy_latency=timedelta(seconds=30),
    replaces_message_id=True,
    hands_mime=False,
)
"""A webmail compose form: ids of its own, the mailbox's threads, a provider-written
Message-ID, so only a token in the body marks our copy; copies searchable within 30 s."""
IMAP = ChannelView(
    "imap",
    Channel.IMAP,
    prefix="uid:",
    native_threads=False,
    markers=(MarkerKind.MESSAGE_ID, MarkerKind.HEADER),
)
"""IMAP: ids of its own and no thread ids every channel shares."""


def _replace_message_id(raw: bytes, new: str) -> bytes:
    head, sep, rest = raw.partition(b"\r\n\r\n")
    head = re.sub(
        rb"(?im)^Message-ID:[^\r\n]*", b"Message-ID: " + new.encode("ascii"), head, count=1
    )
    return head + sep + rest


class InMemoryProvider:
    """The MailProvider port on a fake mailbox, through one channel (see the module).

    ``healthy`` is what ``health`` reports; ``closes`` counts ``aclose`` calls (which change
    nothing: a channel reopens what it needs)."""

    def __init__(
        self,
        mailbox_id: str,
        provider: str = "memory",
        *,
        view: ChannelView = API,
        clock: Clock | None = None,
    ) -> None:
        """A fresh mailbox in this process (its time from ``clock``, by default the real
        UTC time), through ``view``."""
        self.state: MailboxState = MemoryMailbox(mailbox_id, provider, clock)
        self.view = view
        self.healthy = True
        self.closes = 0

    @classmethod
    def through(cls, state: MailboxState, view: ChannelView = API) -> InMemoryProvider:
        """Another channel of an existing mailbox (its time is the mailbox's clock)."""
        channel = cls.__new__(cls)
        channel.state, channel.view, channel.healthy, channel.closes = state, view, True, 0
        return channel

    # -- what tests read and do ------------------------------------------------------------

    @property
    def inbox(self) -> list[ScannedMessage]:
        """The mailbox's items in delivery order (of a mailbox in memory, the live list)."""
        state = self.state
        return state.inbox if isinstance(state, MemoryMailbox) else [i for i, _ in state.items()]

    @property
    def bodies(self) -> dict[str, MessageBody]:
        return {
            item.envelope.body_ref: body
            for item, body in self.state.items()
            if item.envelope is not None and body is not None
        }

    @property
    def sent(self) -> list[OutgoingMessage]:
        """Every message the mailbox accepted for sending (through any of its channels)."""
        return [record.message for record in self.state.sent_records()]

    @property
    def sent_mime(self) -> list[bytes]:
        """The exact bytes each send handed over (for a compose form, the MIME the provider
        wrote from its fields); the stored copies are read from them."""
        return [record.handed for record in self.state.sent_records()]

    def deliver(
        self,
        envelope: Envelope,
        text: str = "",
        html: str | None = None,
        attachments: Sequence[File] = (),
    ) -> None:
        self.state.deliver(envelope, text, html, attachments)

    def deliver_raw(self, raw: bytes, ref: str | None = None) -> None:
        self.state.deliver_raw(raw, ref)

    def deliver_unreadable(self, item_ref: str, error: str) -> None:
        self.state.deliver_unreadable(item_ref, error)

    # -- the port --------------------------------------------------------------------------

    @property
    def provider(self) -> str:
        return self.state.provider

    @property
    def mailbox_id(self) -> str:
        return self.state.mailbox_id

    @property
    def capabilities(self) -> Capabilities:
        view = self.view
        return Capabilities(
            channel=view.channel,
            key_basis=True,
            native_threads=view.native_threads,
            markers=view.markers,
            keeps_sent_copy=view.keeps_sent_copy,
            sent_copy_latency=view.sent_copy_latency,
            delivers=view.delivers,
            page_size=view.page_size,
        )

    def _cursor(self, position: int) -> str:
        state = self.state
        return f"memory-v1:{state.uid}:{state.generation()}:{position}:{self.view.name}"

    def _position(self, cursor: str | None) -> int:
        if cursor is None:
            return 0
        parts = cursor.split(":", 4)
        state = self.state
        if (
            len(parts) != 5
            or parts[0] != "memory-v1"
            or parts[1] != state.uid
            or parts[4] != self.view.name
            or not parts[3].isdigit()
            or int(parts[3]) > state.count()
        ):
            raise CursorExpired(f"cursor {cursor!r} is not one of this channel's: read again")
        if parts[2] != str(state.generation()):
            raise CursorExpired("the mailbox's change cursor expired: read it again in full")
        return int(parts[3])

    async def changes(self, cursor: str | None) -> ChangePage:
        after = self._position(cursor)
        chosen, more = self.state.page(after, self.view.page_size)
        last = chosen[-1][0] if chosen else after
        items = tuple(self._show(item) for _, item in chosen)
        return ChangePage(items=items, cursor=self._cursor(last), more=more)

    def _show(self, item: ScannedMessage) -> ScannedMessage:
        view = self.view
        envelope = item.envelope
        if envelope is None:
            return ScannedMessage(item_ref=view.show(item.item_ref), error=item.error)
        shown = envelope.model_copy(
            update={
                "provider_message_id": view.show(envelope.provider_message_id),
                "body_ref": view.show(envelope.body_ref),
                "attachment_refs": tuple(view.show(r) for r in envelope.attachment_refs),
                "provider_thread_id": view.thread(envelope.provider_thread_id),
            }
        )
        return ScannedMessage(item_ref=view.show(item.item_ref), envelope=shown)

    async def fetch_body(self, body_ref: str) -> MessageBody:
        own = self.view.own(body_ref)
        body = None if own is None else self.state.body(own)
        if body is None:
            raise NotFound(f"no message body {body_ref!r} in this mailbox")
        return body

    async def fetch_attachment(self, ref: str) -> AttachmentData:
        own = self.view.own(ref)
        found = None if own is None else self.state.attachment(own)
        if found is None:
            raise NotFound(f"no attachment {ref!r} in this mailbox")
        return AttachmentData(ref=found.ref.model_copy(update={"ref": ref}), data=found.data)

    def _marker(self, message: OutgoingMessage) -> Marker | None:
        token = mime.send_token(message.internet_message_id)
        for kind in self.view.markers:
            if kind is MarkerKind.MESSAGE_ID:
                return Marker(kind=kind, value=message.internet_message_id)
            if kind is not MarkerKind.BODY_TOKEN:
                return Marker(kind=kind, value=token)
            if token in message.text or token in (message.html or ""):
                return Marker(kind=kind, value=token)
        return None

    async def prepare(self, message: OutgoingMessage) -> Handover:
        marker = self._marker(message)
        header = marker.value if marker is not None and marker.kind is MarkerKind.HEADER else None
        try:
            raw = mime.build(message, self.state.clock.now(), header)
        except ValueError as exc:
            raise ProviderError(f"the message cannot be written as MIME: {exc}") from exc
        channel = self.view.channel.value
        if self.view.hands_mime:
            return Handover(message=message, channel=channel, mime=raw, marker=marker)
        lists = (
            ("to", tuple(a.address for a in message.to)),
            ("cc", tuple(a.address for a in message.cc)),
        )
        return Handover(message=message, channel=channel, recipients=lists, marker=marker)

    async def send(self, handover: Handover) -> SendResult:
        view = self.view
        if handover.channel != view.channel.value:
            raise ProviderError(f"a handover for channel {handover.channel} reached {view.name}")
        message = handover.message
        try:
            handed = handover.mime or mime.build(message, self.state.clock.now())
        except ValueError as exc:
            raise ProviderError(f"the message cannot be written as MIME: {exc}") from exc
        stored, copy_id = handed, message.internet_message_id
        if view.replaces_message_id:
            copy_id = f"<{uuid.uuid4().hex}@{view.name}.invalid>"
            stored = _replace_message_id(handed, copy_id)
        marker = handover.marker
        kind = None if marker is None else marker.kind
        draft = SentRecord.draft(
            channel=view.name,
            message=message,
            handed=handed,
            stored=stored if view.keeps_sent_copy else None,
            thread=view.own_thread(message.provider_thread_id),
            native=marker.value if marker and kind is MarkerKind.NATIVE else None,
            delivered=view.delivers,
            copy_message_id=copy_id,
            copy_token=marker.value if marker and kind is MarkerKind.HEADER else None,
        )
        record = self.state.record_send(draft, view.sent_copy_latency)
        if record.answer_lost:
            raise OutcomeUnknown(
                f"the {view.name} channel took the message and its answer was lost"
            )
        return SendResult(
            provider_message_id=view.show(record.canonical_id),
            provider_thread_id=view.thread(record.thread),
            internet_message_id=record.copy_message_id or message.internet_message_id,
            channel=view.channel.value,
            delivered=view.delivers,
            accepted_at=record.accepted_at,
        )

    async def find_sent(self, marker: Marker) -> StoredCopy | None:
        view = self.view
        if not view.keeps_sent_copy:
            raise Unsupported(f"the {view.name} channel keeps no sent copy to search")
        if marker.kind not in view.markers:
            raise Unsupported(f"the {view.name} channel cannot search by a {marker.kind} marker")
        record = self.state.find_copy(marker, self.state.clock.now())
        if record is None or record.stored is None:
            return None
        return rfc822.stored_copy(
            record.stored,
            provider_message_id=view.show(record.canonical_id),
            provider_thread_id=view.thread(record.thread),
            delivered=record.delivered,
        )

    async def health(self) -> ProviderHealth:
        return ProviderHealth(
            provider=self.provider,
            mailbox_id=self.mailbox_id,
            ok=self.healthy,
            detail=f"fake mailbox through its {self.view.name} channel",
        )

    async def aclose(self) -> None:
        self.closes += 1


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
        sent_at=moment,
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
