"""One fake mailbox's state, whichever channel shows it.

A ``MailboxState`` holds what a mail system holds for one mailbox: the inbox in delivery
order (each item with its body and its attachments' bytes), the sent copies, and the fault
switches a test flips. Channels (``agent.testing.memory.InMemoryProvider``, each with a
``ChannelView``) show it and keep nothing of their own. ``MemoryMailbox`` keeps the state in
this process; ``agent.testing.mailbox_file.FileMailbox`` keeps it in a SQLite file that
several processes open at once.

Ids: an inbox item has the mailbox's own id (the ``provider_message_id`` it was delivered
with; its attachments are ``<id>/<n>``), a sent copy ``sent-<n>``; each channel shows them in
its own format. Threads: the mailbox's own thread id - the one delivered with an envelope, or
for raw mail the thread of the first message its References or In-Reply-To name that the
mailbox holds, else one named after the thread's root Message-ID.

Fault switches (every channel of the mailbox, or the one named, and every process):

- ``lose_acks(count)`` or ``lose_acks(probability=, seed=)``: a send is accepted and its copy
  stored, and then the answer is lost (``OutcomeUnknown``); for the next ``count`` sends, or
  each with ``probability``, decided by a random seeded with ``seed`` and the send's number
  (the same decisions in every process);
- ``delay_sent_copies(delay)``: from now on a sent copy becomes searchable only once the
  clock reaches its acceptance plus ``delay`` (never beyond the channel's declared latency:
  the send refuses to break it);
- ``expire_cursors()``: every cursor given out so far expires (the next ``changes`` with one
  raises ``CursorExpired``).

Mail arriving while a reader pages is simply delivered between pages; a channel that keeps
no sent copy, or drops our Message-ID, is a ``ChannelView`` that says so.
"""

from __future__ import annotations

import base64
import hashlib
import json
import random
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any

from agent.domain.envelope import Envelope
from agent.domain.mail import (
    AttachmentData,
    AttachmentRef,
    Marker,
    MarkerKind,
    MessageBody,
    OutgoingMessage,
    ScannedMessage,
)
from agent.ports import Clock
from agent.providers import rfc822
from agent.testing.clocks import UtcClock

File = tuple[str, str, bytes]
"""An attachment to deliver: (name, content type, bytes)."""


@dataclass(frozen=True)
class Faults:
    """The mailbox's fault switches (see the module's docstring)."""

    lost_count: int = 0
    lost_probability: float = 0.0
    lost_seed: int = 0
    lost_channel: str | None = None
    copy_delay: timedelta = timedelta(0)
    copy_delay_channel: str | None = None

    def lose(self, number: int, channel: str) -> tuple[bool, Faults]:
        """Whether the answer to send ``number`` through ``channel`` is lost, and the
        switches after it."""
        if self.lost_channel not in (None, channel):
            return False, self
        if self.lost_count > 0:
            return True, replace(self, lost_count=self.lost_count - 1)
        if self.lost_probability > 0:
            draw = random.Random(f"{self.lost_seed}:{number}").random()  # noqa: S311 - a fault switch
            return draw < self.lost_probability, self
        return False, self

    def delay(self, channel: str, latency: timedelta) -> timedelta:
        """How long a copy sent through ``channel`` stays unsearchable."""
        if self.copy_delay_channel not in (None, channel):
            return timedelta(0)
        if self.copy_delay > latency:
            raise ValueError(
                f"a sent copy delayed {self.copy_delay} through channel {channel} would break "
                f"its declared sent_copy_latency of {latency}: the fake keeps its declarations"
            )
        return self.copy_delay


@dataclass(frozen=True)
class SentRecord:
    """One send the mailbox accepted, and the copy it keeps (if it keeps one)."""

    number: int
    channel: str
    message: OutgoingMessage
    handed: bytes
    """What the channel was handed (the MIME, or for a compose form the MIME the provider
    wrote from its fields)."""
    stored: bytes | None
    """The sent copy as the mailbox keeps it; None when the channel keeps none."""
    thread: str
    native: str | None
    """The provider-native marker set at send time, if any."""
    delivered: bool
    accepted_at: datetime
    visible_at: datetime
    """When the copy becomes searchable."""
    answer_lost: bool
    """The send went out and its answer was lost (``OutcomeUnknown`` was raised)."""
    copy_message_id: str | None = None
    copy_token: str | None = None
    copy_text: str = ""

    @property
    def canonical_id(self) -> str:
        return f"sent-{self.number}"

    def carries(self, marker: Marker) -> bool:
        if marker.kind is MarkerKind.MESSAGE_ID:
            return self.copy_message_id == marker.value
        if marker.kind is MarkerKind.HEADER:
            return self.copy_token == marker.value
        if marker.kind is MarkerKind.NATIVE:
            return self.native == marker.value
        return marker.value in self.copy_text

    @staticmethod
    def draft(
        *,
        channel: str,
        message: OutgoingMessage,
        handed: bytes,
        stored: bytes | None,
        thread: str,
        native: str | None,
        delivered: bool,
        copy_message_id: str | None,
        copy_token: str | None,
    ) -> SentRecord:
        """A send as a channel hands it to the mailbox (numbered and timed by the mailbox),
        with what a search of its stored copy finds: the copy's Message-ID, our header's
        token, and the message's words."""
        return SentRecord(
            number=0,
            channel=channel,
            message=message,
            handed=handed,
            stored=stored,
            thread=thread,
            native=native,
            delivered=delivered,
            accepted_at=datetime.min,
            visible_at=datetime.min,
            answer_lost=False,
            copy_message_id=copy_message_id if stored is not None else None,
            copy_token=copy_token if stored is not None else None,
            copy_text=message.text + "\n" + (message.html or "") if stored is not None else "",
        )

    def settled(
        self, number: int, now: datetime, faults: Faults, latency: timedelta
    ) -> tuple[SentRecord, Faults]:
        """This send numbered and timed, and the switches after it."""
        lost, after = faults.lose(number, self.channel)
        delay = faults.delay(self.channel, latency)
        record = replace(
            self, number=number, accepted_at=now, visible_at=now + delay, answer_lost=lost
        )
        return record, after


def message_json(message: OutgoingMessage) -> str:
    """An outgoing message as JSON text (attachment bytes in base64)."""
    bare = json.loads(message.model_copy(update={"attachments": ()}).model_dump_json())
    bare["attachments"] = [
        {"ref": a.ref.model_dump(mode="json"), "data": base64.b64encode(a.data).decode("ascii")}
        for a in message.attachments
    ]
    return json.dumps(bare)


def message_from_json(text: str) -> OutgoingMessage:
    bare: dict[str, Any] = json.loads(text)
    files: list[dict[str, Any]] = bare.pop("attachments")
    message = OutgoingMessage.model_validate(bare)
    attachments = tuple(
        AttachmentData(ref=AttachmentRef.model_validate(f["ref"]), data=base64.b64decode(f["data"]))
        for f in files
    )
    return message.model_copy(update={"attachments": attachments})


def _digest(*parts: str | bytes) -> str:
    digest = hashlib.sha256()
    for part in parts:
        data = part.encode("utf-8", "surrogateescape") if isinstance(part, str) else part
        digest.update(len(data).to_bytes(8, "big") + data)
    return digest.hexdigest()


def root_thread(root: str) -> str:
    """The mailbox's thread id of a thread whose first message is ``root``."""
    return "thread-" + _digest(root)[:16]


class MailboxState(ABC):
    """What one mailbox holds, shown by any number of channels (see the module docstring).

    Subclasses keep it somewhere (the storage methods); delivering mail, the fault switches
    and the snapshot are written here once."""

    mailbox_id: str
    provider: str
    clock: Clock
    uid: str
    """Tells this mailbox apart from a rebuilt one (cursors carry it)."""

    # -- storage -----------------------------------------------------------------------

    @abstractmethod
    def add(
        self,
        item: ScannedMessage,
        body: MessageBody | None,
        files: Sequence[AttachmentData],
        message_id: str | None,
        thread: str | None,
    ) -> None:
        """Append one item to the inbox (it is the newest in delivery order)."""

    @abstractmethod
    def page(self, after: int, limit: int) -> tuple[list[tuple[int, ScannedMessage]], bool]:
        """Up to ``limit`` inbox items after position ``after`` (0: from the first), each
        with its position, and whether more follow."""

    @abstractmethod
    def count(self) -> int:
        """How many items the inbox holds (the position of the newest)."""

    @abstractmethod
    def generation(self) -> int:
        """Bumped by ``expire_cursors``: cursors of an older generation have expired."""

    @abstractmethod
    def expire_cursors(self) -> None: ...

    @abstractmethod
    def body(self, ref: str) -> MessageBody | None: ...

    @abstractmethod
    def attachment(self, ref: str) -> AttachmentData | None: ...

    @abstractmethod
    def thread_of(self, message_id: str) -> str | None:
        """The thread of a message the mailbox holds (received or sent), by Message-ID."""

    @abstractmethod
    def record_send(self, draft: SentRecord, latency: timedelta) -> SentRecord:
        """Number, time and keep one accepted send, applying the fault switches (at once,
        for every process)."""

    @abstractmethod
    def sent_records(self) -> list[SentRecord]:
        """Every send, in the order they were accepted."""

    @abstractmethod
    def find_copy(self, marker: Marker, now: datetime) -> SentRecord | None:
        """The first kept copy carrying ``marker`` that is searchable at ``now``."""

    @abstractmethod
    def faults(self) -> Faults: ...

    @abstractmethod
    def set_faults(self, faults: Faults) -> None: ...

    @abstractmethod
    def items(self) -> list[tuple[ScannedMessage, MessageBody | None]]:
        """Every inbox item with its body, in delivery order."""

    # -- delivering mail -----------------------------------------------------------------

    def deliver(
        self,
        envelope: Envelope,
        text: str = "",
        html: str | None = None,
        attachments: Sequence[File] = (),
    ) -> ScannedMessage:
        """Deliver a message as this envelope (its ids are the mailbox's own), with its body
        and (name, content type, bytes) attachments."""
        files = tuple(
            _file(f"{envelope.provider_message_id}/{n}", name, kind, data)
            for n, (name, kind, data) in enumerate(attachments)
        )
        if files:
            envelope = envelope.model_copy(
                update={
                    "attachment_refs": tuple(f.ref.ref for f in files),
                    "attachment_names": tuple(f.ref.name for f in files),
                }
            )
        item = ScannedMessage(item_ref=envelope.provider_message_id, envelope=envelope)
        self.add(
            item,
            MessageBody(text=text, html=html),
            files,
            envelope.internet_message_id,
            envelope.provider_thread_id,
        )
        return item

    def deliver_raw(self, raw: bytes, ref: str | None = None) -> ScannedMessage:
        """Deliver RFC 822 bytes, normalized as every adapter normalizes them
        (``agent.providers.rfc822``); bytes that are no message arrive as an unreadable
        item. ``ref`` is the mailbox's id for it (by default ``raw-<n>``)."""
        ref = ref or f"raw-{self.count() + 1}"
        try:
            envelope = rfc822.normalize(
                raw,
                provider=self.provider,
                mailbox_id=self.mailbox_id,
                provider_message_id=ref,
                thread_id_for=lambda mid, irt, refs: self._thread_for(ref, mid, irt, refs),
                fallback_received_at=self.clock.now(),
            )
        except Exception as exc:  # an adapter records what it cannot read, and goes on
            return self.deliver_unreadable(ref, f"could not be normalized: {exc}")
        item = ScannedMessage(item_ref=ref, envelope=envelope)
        files = rfc822.attachments(raw, ref)
        mid, thread = envelope.internet_message_id, envelope.provider_thread_id
        self.add(item, rfc822.body(raw), files, mid, thread)
        return item

    def deliver_unreadable(self, item_ref: str, error: str) -> ScannedMessage:
        item = ScannedMessage(item_ref=item_ref, error=error)
        self.add(item, None, (), None, None)
        return item

    def _thread_for(self, ref: str, mid: str | None, irt: str | None, refs: tuple[str, ...]) -> str:
        for known in (mid, *refs, irt):
            if known is not None and (thread := self.thread_of(known)) is not None:
                return thread
        return root_thread(refs[0] if refs else irt or mid or ref)

    # -- fault switches ------------------------------------------------------------------

    def lose_acks(
        self,
        count: int = 1,
        *,
        probability: float = 0.0,
        seed: int = 0,
        channel: str | None = None,
    ) -> None:
        """Lose the answers of the next ``count`` sends (then, or instead when ``count`` is
        0, each send's with ``probability``), through ``channel`` or any."""
        if count < 0 or not 0.0 <= probability <= 1.0:
            raise ValueError("a count of lost answers is >= 0 and a probability within [0, 1]")
        self.set_faults(
            replace(
                self.faults(),
                lost_count=count,
                lost_probability=probability,
                lost_seed=seed,
                lost_channel=channel,
            )
        )

    def delay_sent_copies(self, delay: timedelta, *, channel: str | None = None) -> None:
        """Copies sent from now on (through ``channel``, or any) become searchable ``delay``
        after they were accepted (``timedelta(0)``: at once again)."""
        if delay < timedelta(0):
            raise ValueError("a delay is never negative")
        self.set_faults(replace(self.faults(), copy_delay=delay, copy_delay_channel=channel))

    # -- what a test compares ------------------------------------------------------------

    def snapshot(self) -> dict[str, str]:
        """Everything the mailbox holds, item by item (inbox items with their bodies and
        attachment bytes, sent copies): two snapshots differ where something changed."""
        shot: dict[str, str] = {}
        for item, body in self.items():
            envelope = item.envelope
            files: tuple[str, ...] = () if envelope is None else envelope.attachment_refs
            data = [f.data for ref in files if (f := self.attachment(ref)) is not None]
            key = f"inbox/{item.item_ref}"
            while key in shot:  # the same item delivered twice
                key += "+"
            shot[key] = _digest(
                item.model_dump_json(), "" if body is None else body.model_dump_json(), *data
            )
        for record in self.sent_records():
            shot[f"sent/{record.number}"] = _digest(record.stored or b"", record.handed)
        return shot


def _file(ref: str, name: str, content_type: str, data: bytes) -> AttachmentData:
    return AttachmentData(
        ref=AttachmentRef(
            ref=ref,
            name=name,
            content_type=content_type,
            size=len(data),
            sha256=hashlib.sha256(data).hexdigest(),
        ),
        data=data,
    )


class MemoryMailbox(MailboxState):
    """A mailbox's state in this process.

    ``inbox`` is the live list of items in delivery order: a test may reorder it before the
    first read (later reads page through it by position)."""

    def __init__(
        self, mailbox_id: str, provider: str = "memory", clock: Clock | None = None
    ) -> None:
        self.mailbox_id = mailbox_id.lower()
        self.provider = provider
        self.clock = clock or UtcClock()
        self.uid = f"mem-{id(self):x}"
        self.inbox: list[ScannedMessage] = []
        self.bodies: dict[str, MessageBody] = {}
        self.files: dict[str, AttachmentData] = {}
        self._threads: dict[str, str] = {}
        self._sent: list[SentRecord] = []
        self._faults = Faults()
        self._generation = 0

    def add(
        self,
        item: ScannedMessage,
        body: MessageBody | None,
        files: Sequence[AttachmentData],
        message_id: str | None,
        thread: str | None,
    ) -> None:
        self.inbox.append(item)
        if item.envelope is not None and body is not None:
            self.bodies[item.envelope.body_ref] = body
        self.files.update((f.ref.ref, f) for f in files)
        if message_id is not None and thread is not None:
            self._threads.setdefault(message_id, thread)

    def page(self, after: int, limit: int) -> tuple[list[tuple[int, ScannedMessage]], bool]:
        chosen = self.inbox[after : after + limit]
        return [(after + n + 1, item) for n, item in enumerate(chosen)], len(
            self.inbox
        ) > after + limit

    def count(self) -> int:
        return len(self.inbox)

    def generation(self) -> int:
        return self._generation

    def expire_cursors(self) -> None:
        self._generation += 1

    def body(self, ref: str) -> MessageBody | None:
        return self.bodies.get(ref)

    def attachment(self, ref: str) -> AttachmentData | None:
        return self.files.get(ref)

    def thread_of(self, message_id: str) -> str | None:
        return self._threads.get(message_id)

    def record_send(self, draft: SentRecord, latency: timedelta) -> SentRecord:
        number = len(self._sent) + 1
        record, self._faults = draft.settled(number, self.clock.now(), self._faults, latency)
        self._sent.append(record)
        for mid in (record.message.internet_message_id, record.copy_message_id):
            if mid is not None:
                self._threads.setdefault(mid, record.thread)
        return record

    def sent_records(self) -> list[SentRecord]:
        return list(self._sent)

    def find_copy(self, marker: Marker, now: datetime) -> SentRecord | None:
        for record in self._sent:
            if record.stored is not None and record.visible_at <= now and record.carries(marker):
                return record
        return None

    def faults(self) -> Faults:
        return self._faults

    def set_faults(self, faults: Faults) -> None:
        self._faults = faults

    def items(self) -> list[tuple[ScannedMessage, MessageBody | None]]:
        return [
            (item, None if item.envelope is None else self.bodies.get(item.envelope.body_ref))
            for item in self.inbox
        ]
