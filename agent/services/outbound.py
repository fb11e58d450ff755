"""Ledgered sending: every outbound message goes out at most once, whatever channel it
goes through and whatever is lost on the way.

A send is ledgered (PREPARED) before any channel is asked, with the marker the channel says
its sent copy will carry. Before the handover it is ATTEMPTING(channel); the channel's
answer makes it CONFIRMED. When the answer is lost (the channel said so, or the worker died
mid-handover) it is UNCERTAIN and is settled only from the sent copies: a copy found by its
marker confirms it; a copy proven absent - searched for at least the channel's declared
latency after the attempt - allows one more attempt, through this channel or another; a
channel that keeps no sent copy hands it to a person (``outloop sends settle``). So the
same message never goes twice because a channel changed or an acknowledgement was lost.
"""

from __future__ import annotations

import hashlib
import logging
import time
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Protocol

from agent import crashpoints
from agent.domain.context import WorkspaceContext
from agent.domain.envelope import Address
from agent.domain.errors import (
    GateRefused,
    HandoverRefused,
    InvalidRequest,
    NotHandedOver,
    OutcomeUnknown,
    ProviderError,
    UnknownSend,
)
from agent.domain.handover import check_handover
from agent.domain.headers import msg_id
from agent.domain.mail import (
    AttachmentData,
    Handover,
    Marker,
    MarkerKind,
    OutgoingMessage,
    SendResult,
    StoredCopy,
)
from agent.domain.records import SendAttempt, SendIntent, SendRecord, SendState, TaskAmendment
from agent.domain.task import MessageRef, Task
from agent.events import Event, emit
from agent.ports import Clock, MailProvider, SendLedger, Tasks
from agent.rendering.render import RenderedMessage
from agent.services.holder import current_holder, holder_alive


class OutboundStore(SendLedger, Tasks, Protocol):
    """What sending once needs: the send ledger, and the task the send is recorded on."""


IN_FLIGHT = timedelta(minutes=10)
"""How long an unfinished send is taken to be another live worker's send in progress."""
_SENDING: set[str] = set()
"""Keys this process is handing to a channel right now."""


class SendStatus(StrEnum):
    SENT = "sent"
    ALREADY_SENT = "already_sent"
    RECOVERED = "recovered"
    """An earlier attempt's outcome was lost: its sent copy proved it went out."""
    IN_PROGRESS = "in_progress"
    """Another worker is sending it now."""
    UNCERTAIN = "uncertain"
    """Handed over and the answer lost, or not yet settled from the sent copies: nothing
    more goes out until a search proves the copy absent."""
    WITH_PERSON = "with_person"
    """No channel can settle it: a person decides (``outloop sends settle``)."""
    REFUSED = "refused"


@dataclass(frozen=True)
class SendOutcome:
    status: SendStatus
    record: SendRecord
    result: SendResult | None = None
    copy: StoredCopy | None = None
    """The stored copy a lost outcome was settled from (``RECOVERED``)."""

    @property
    def message_id(self) -> str:
        """The Message-ID the send went out with: ours, or the provider's where the channel
        could not set ours (a web app's send), from its answer or the copy it was settled
        from."""
        if self.result is not None:
            return self.result.internet_message_id
        if self.copy is not None and self.copy.internet_message_id:
            return self.copy.internet_message_id
        return self.record.internet_message_id

    @property
    def went_out(self) -> bool:
        return self.status in {SendStatus.SENT, SendStatus.RECOVERED, SendStatus.ALREADY_SENT}

    @property
    def unsettled(self) -> bool:
        """The send may or may not have gone out, and is not this call's to finish."""
        return self.status in {SendStatus.IN_PROGRESS, SendStatus.UNCERTAIN, SendStatus.WITH_PERSON}

    def why_unsettled(self, what: str) -> str:
        """What an unsettled outcome means for ``what`` (a reply, a request), in words."""
        key = self.record.key
        if self.status is SendStatus.WITH_PERSON:
            return (
                f"{what} {key} cannot be settled by any channel ({self.record.detail}); a "
                f"person settles it with 'outloop sends settle {key} --sent|--not-sent'"
            )
        if self.status is SendStatus.UNCERTAIN:
            return (
                f"{what} {key} was handed over and its outcome is not known yet; it is settled "
                "from the sent copies before anything else is sent: try again later"
            )
        return f"{what} {key} is being sent by another worker; read it back later"


def message_id_for(key: str, mailbox_id: str) -> str:
    """A Message-ID derived from the ledger key: every attempt of a send carries it."""
    domain = mailbox_id.rsplit("@", 1)[-1] if "@" in mailbox_id else "outloop.invalid"
    return f"<{hashlib.sha256(key.encode()).hexdigest()[:32]}.outloop@{domain}>"


def marker_of(record: SendRecord) -> Marker:
    """The marker to search a send's copy by (a send ledgered before markers were recorded
    is found by its Message-ID)."""
    return record.marker or Marker(kind=MarkerKind.MESSAGE_ID, value=record.internet_message_id)


async def send_once(
    store: OutboundStore,
    provider: MailProvider,
    intent: SendIntent,
    message: OutgoingMessage,
    clock: Clock,
    cap: int | None = None,
) -> SendOutcome:
    """Send ``message`` at most once under ``intent.key``, through ``provider``.

    An unfinished send of another live worker is left to it for at most IN_FLIGHT; one of
    a dead worker is taken over and settled from the sent copies before anything is sent.
    The outcome is a decision record: the ledger's state, the status and the channel.
    """
    started = time.perf_counter()
    try:
        outcome = await _send_once(store, provider, intent, message, clock, cap)
    except ProviderError as exc:
        _record_send(
            intent.workspace_id, intent.key, provider, started, "failed", "ERROR",
            reason=type(exc).__name__, task_id=intent.task_id,
        )  # fmt: skip
        raise
    _record_send(
        intent.workspace_id,
        intent.key,
        provider,
        started,
        outcome.status.value,
        outcome.record.state.name,
        outcome.record.channel,
        intent.task_id,
    )
    return outcome


def _record_send(
    workspace_id: str,
    key: str,
    provider: MailProvider,
    started: float,
    status: str,
    state: str,
    channel: str = "",
    task_id: str | None = None,
    reason: str | None = None,
) -> None:
    emit(
        Event.SEND,
        level=logging.WARNING if status in _WARN else logging.INFO,
        workspace_id=workspace_id,
        task_id=task_id,
        send_key=key,
        channel=channel or provider.capabilities.channel.value,
        outcome=status,
        state=state,
        reason=reason,
        duration_seconds=round(time.perf_counter() - started, 6),
    )


_WARN = frozenset({"failed", SendStatus.UNCERTAIN.value, SendStatus.WITH_PERSON.value})


async def _send_once(
    store: OutboundStore,
    provider: MailProvider,
    intent: SendIntent,
    message: OutgoingMessage,
    clock: Clock,
    cap: int | None,
) -> SendOutcome:
    if message.internet_message_id != intent.internet_message_id:
        raise ValueError("the message and its intent must carry the same Message-ID")
    handover = await checked_handover(store, provider, intent, message, clock)
    intent = intent.model_copy(
        update={"holder": intent.holder or current_holder(), "marker": handover.marker}
    )
    record = store.begin_send(intent, clock.now(), cap)
    finished = _finished(record)
    if finished is not None:
        return await _as_sent(provider, finished)
    if record.key in _SENDING:
        return SendOutcome(SendStatus.IN_PROGRESS, record)
    _SENDING.add(record.key)  # no await since the check: this task owns the key here
    try:
        return await _drive(store, provider, intent, handover, record, clock)
    finally:
        _SENDING.discard(record.key)


async def _as_sent(provider: MailProvider, outcome: SendOutcome) -> SendOutcome:
    """A send confirmed earlier, with the copy it went out as where the channel could not
    give it our Message-ID (its own marker: a web app's send), so callers record the id
    answers name; as it is when the copy cannot be read now."""
    marker = outcome.record.marker
    if outcome.status is not SendStatus.ALREADY_SENT or marker is None:
        return outcome
    if marker.kind is not MarkerKind.NATIVE or not provider.capabilities.finds(marker.kind):
        return outcome
    try:
        copy = await provider.find_sent(marker)
    except ProviderError:
        return outcome
    return SendOutcome(outcome.status, outcome.record, copy=copy)


def _finished(record: SendRecord) -> SendOutcome | None:
    """The outcome of a send the ledger has already decided, else None."""
    if record.state is SendState.REFUSED:
        return SendOutcome(SendStatus.REFUSED, record)
    if record.state is SendState.CONFIRMED:
        return SendOutcome(SendStatus.ALREADY_SENT, record)
    if record.state is SendState.WITH_PERSON:
        return SendOutcome(SendStatus.WITH_PERSON, record)
    return None


async def send_automated(
    store: OutboundStore,
    provider: MailProvider,
    intent: SendIntent,
    message: OutgoingMessage,
    clock: Clock,
    context: WorkspaceContext,
) -> SendOutcome:
    """``send_once`` for a message no person asked for (an acknowledgement, a reminder):
    capped per recipient per day as the workspace's automation settings say."""
    return await send_once(
        store, provider, intent, message, clock, cap=context.automation.max_per_recipient_per_day
    )


async def checked_handover(
    store: Tasks, provider: MailProvider, intent: SendIntent, message: OutgoingMessage, clock: Clock
) -> Handover:
    """The form the channel would hand ``message`` over in, checked against the plan; a
    difference refuses the send before anything is ledgered or handed over, and the task
    records why."""
    handover = await provider.prepare(message)
    problems = check_handover(handover)
    if handover.message != message:
        problems = ("the channel prepared another message than the one planned", *problems)
    if handover.marker is None and provider.capabilities.keeps_sent_copy:
        problems = (
            *problems,
            f"channel {handover.channel} keeps a sent copy but would leave no marker to find "
            "it by (a channel that marks copies only with a body token needs one in the body)",
        )
    if not problems:
        return handover
    if intent.task_id is not None:
        store.amend_task(
            intent.task_id,
            TaskAmendment(
                event=f"send {intent.key} refused before handover: {'; '.join(problems)}"
            ),
            clock.now(),
        )
    raise HandoverRefused(intent.key, problems)


async def _drive(
    store: SendLedger,
    provider: MailProvider,
    intent: SendIntent,
    handover: Handover,
    record: SendRecord,
    clock: Clock,
) -> SendOutcome:
    """Take the send as far as this worker may: settle an earlier attempt, then attempt."""
    if not record.created:
        taken = _take_over(store, intent, record, clock)
        if isinstance(taken, SendOutcome):
            return taken
        record = taken
        if record.state is not SendState.PREPARED or not record.resend_allowed:
            settled = await settle_from_copies(store, provider, record, intent.holder, clock)
            if settled is not None:
                return settled
    return await _attempt(store, provider, intent, handover, clock)


def _take_over(
    store: SendLedger, intent: SendIntent, record: SendRecord, clock: Clock
) -> SendRecord | SendOutcome:
    """The send as this worker's own, or the outcome that it is another live worker's."""
    if record.holder == intent.holder:
        return record  # this worker's earlier attempt, now over
    busy = record.state in {SendState.PREPARED, SendState.ATTEMPTING}
    # In flight since its latest sign of life: ledgered, taken over, or attempted.
    since = max(record.created_at, record.attempted_at or record.created_at)
    young = clock.now() - since < IN_FLIGHT
    if busy and young and holder_alive(record.holder):
        return SendOutcome(SendStatus.IN_PROGRESS, record)
    # The compare-and-set is on everything decided from: holder, state and attempt count.
    if not store.take_over_send(
        record.key, record.holder, intent.holder, clock.now(), record.state, record.attempts
    ):
        return SendOutcome(SendStatus.IN_PROGRESS, record)
    current = store.get_send(record.key)
    assert current is not None
    return current


async def settle_from_copies(
    store: SendLedger, provider: MailProvider, record: SendRecord, holder: str, clock: Clock
) -> SendOutcome | None:
    """Settle an earlier attempt of the holder's send from the sent copies: its outcome, or
    None when no attempt went out (never attempted, or its copy is proven absent)."""
    if record.state is SendState.PREPARED and record.attempts == 0:
        return None
    if record.state is SendState.ATTEMPTING:  # its worker stopped mid-handover
        record = store.mark_uncertain(
            record.key, holder, "the worker handing it over stopped before the answer", clock.now()
        )
    marker = marker_of(record)
    searchable = provider.capabilities.finds(marker.kind)
    if not record.keeps_sent_copy:
        # A copy filed after the answer (an IMAP client's append) proves the send went out
        # when it is there; its absence proves nothing, so a person decides.
        copy = await provider.find_sent(marker) if searchable else None
        if copy is not None:
            return _recovered(store, record, copy, clock, "the copy filed after its answer")
        reason = (
            f"the outcome through {record.channel} was lost and that channel keeps no sent "
            "copy to check"
        )
        return SendOutcome(
            SendStatus.WITH_PERSON, store.hand_to_person(record.key, reason, clock.now())
        )
    if not searchable:
        return SendOutcome(SendStatus.UNCERTAIN, record)  # only its own channel can search it
    # A search sees the mailbox as it was when it began, however long it runs: only one
    # that began after the copy had to be searchable proves it absent.
    searched_from = clock.now()
    copy = await provider.find_sent(marker)
    if copy is not None:
        return _recovered(store, record, copy, clock, "the sent copy")
    if searched_from < _searchable_by(record, provider):
        return SendOutcome(SendStatus.UNCERTAIN, record)
    return None  # proven absent: one more attempt may go


def _recovered(
    store: SendLedger, record: SendRecord, copy: StoredCopy, clock: Clock, source: str
) -> SendOutcome:
    done = store.complete_send(
        record.key, copy.provider_message_id, f"settled from {source}", clock.now()
    )
    return SendOutcome(SendStatus.RECOVERED, done, copy=copy)


def _searchable_by(record: SendRecord, provider: MailProvider) -> datetime:
    """When a copy of the last attempt must be searchable through ``provider``: the
    sending channel's declared latency and the searching channel's own, after the attempt's
    outcome was found lost (a provider may accept the message at any moment of the
    handover, and its latency runs from there)."""
    lost = record.uncertain_at or record.attempted_at or record.created_at
    latency = max(record.sent_copy_latency, provider.capabilities.sent_copy_latency)
    return lost + latency


async def _attempt(
    store: SendLedger,
    provider: MailProvider,
    intent: SendIntent,
    handover: Handover,
    clock: Clock,
) -> SendOutcome:
    """Record the attempt, hand the message over, and record what the channel answered."""
    caps = provider.capabilities
    attempt = SendAttempt(
        channel=caps.channel,
        marker=handover.marker,
        keeps_sent_copy=caps.keeps_sent_copy,
        sent_copy_latency=caps.sent_copy_latency,
    )
    record = store.attempt_send(intent.key, intent.holder, attempt, clock.now())
    if record is None:
        current = store.get_send(intent.key)
        assert current is not None
        return SendOutcome(SendStatus.IN_PROGRESS, current)
    crashpoints.hit("before_provider_send")
    try:
        result = await provider.send(handover)
    except NotHandedOver as exc:
        # The channel says it never took the message: the attempt is over and another may go
        # - if it is still this attempt (a worker that took it over meanwhile decides).
        current = store.get_send(intent.key)
        ours = current is not None and current.state is SendState.ATTEMPTING
        if (
            ours
            and current is not None
            and (current.holder, current.attempts)
            == (
                record.holder,
                record.attempts,
            )
        ):
            channel = provider.capabilities.channel
            evidence = f"{type(exc).__name__}: {exc}"
            store.settle_send(intent.key, False, evidence, f"channel {channel}", clock.now())
        raise
    except ProviderError as exc:
        # Whatever the failure, it may have happened after the channel took the message:
        # the attempt is settled from the sent copies, never repeated blind.
        lost = store.mark_uncertain(
            intent.key, intent.holder, f"{type(exc).__name__}: {exc}", clock.now()
        )
        if isinstance(exc, OutcomeUnknown):
            return SendOutcome(SendStatus.UNCERTAIN, lost)
        raise
    crashpoints.hit("after_provider_send")
    done = store.complete_send(
        intent.key, result.provider_message_id, _sent_detail(result), clock.now(), result.refused
    )
    return SendOutcome(SendStatus.SENT, done, result)


def _sent_detail(result: SendResult) -> str:
    detail = f"via {result.channel}" + ("" if result.delivered else " (not a delivery)")
    if result.refused:
        refused = ", ".join(f"{address} ({why})" for address, why in result.refused)
        detail += f"; partial delivery, refused: {refused}"
    return detail


def raise_unless_settled(outcome: SendOutcome, what: str) -> None:
    """Refuse to go on with a send that is not settled (another worker's, lost, a person's)."""
    if outcome.unsettled:
        raise GateRefused(outcome.why_unsettled(what))


def outgoing(
    *,
    key: str,
    kind: str,
    workspace_id: str,
    task_id: str | None,
    mailbox_id: str,
    to: tuple[str, ...],
    cc: tuple[str, ...] = (),
    subject: str,
    text: str,
    html: str | None = None,
    thread_id: str = "",
    in_reply_to: str | None = None,
    references: tuple[str, ...] = (),
    automated: bool = False,
    attachments: tuple[AttachmentData, ...] = (),
) -> tuple[SendIntent, OutgoingMessage]:
    """A message from the workspace's mailbox and its ledger entry, sharing one Message-ID
    derived from the key. ``thread_id`` empty starts a new thread. Identifiers that are not
    in msg-id form are left out of the threading headers."""
    mid = message_id_for(key, mailbox_id)
    message = OutgoingMessage(
        provider_thread_id=thread_id,
        in_reply_to=msg_id(in_reply_to),
        references=tuple(dict.fromkeys(m for m in map(msg_id, references) if m is not None)),
        sender=Address(address=mailbox_id),
        to=tuple(Address(address=a) for a in to),
        cc=tuple(Address(address=a) for a in cc),
        subject=subject,
        text=text,
        html=html,
        internet_message_id=mid,
        attachments=attachments,
    )
    intent = SendIntent(
        key=key,
        workspace_id=workspace_id,
        kind=kind,
        task_id=task_id,
        internet_message_id=mid,
        recipients=(*to, *cc),
        automated=automated,
        cc=cc,
    )
    return intent, message


def sent_ref(outcome: SendOutcome, direction: str, sender: str, at: datetime) -> MessageRef:
    """The sent message as the task records it (indexed for exact linkage of replies), by
    the Message-ID it went out with: ours, or the provider's where the channel could not
    set ours (a web app's send)."""
    mid = outcome.message_id
    return MessageRef(
        provider_message_id=outcome.record.provider_message_id or mid,
        internet_message_id=mid,
        direction=direction,
        received_at=at,
        sender=sender,
    )


def reply_in_thread(
    task: Task,
    key: str,
    rendered: RenderedMessage,
    to: tuple[str, ...],
    cc: tuple[str, ...],
    kind: str,
    attachments: tuple[AttachmentData, ...] = (),
) -> tuple[SendIntent, OutgoingMessage]:
    """A reply in the task's thread, answering its latest message from the recipients, with
    the files the draft attaches (read by reference, checked against the draft's)."""
    answered = task.answered_message((*to, *cc))
    parent, references = answered.reply_headers() if answered is not None else (None, ())
    return outgoing(
        key=key,
        kind=kind,
        workspace_id=task.workspace_id,
        task_id=task.task_id,
        mailbox_id=task.mailbox_id,
        to=to,
        cc=cc,
        subject=rendered.subject,
        text=rendered.text,
        html=rendered.html,
        thread_id=task.provider_thread_id,
        in_reply_to=parent,
        references=references,
        attachments=attachments,
    )


def settle_by_person(
    store: SendLedger, key: str, sent: bool, evidence: str, actor: str, clock: Clock
) -> SendRecord:
    """A person's word on a send no channel could settle: it went out (CONFIRMED), or it
    did not (one more attempt may go). Refused, changing nothing, without evidence or when
    the send is already settled."""
    evidence = evidence.strip()
    if not evidence:
        raise InvalidRequest(
            "settling a send needs the evidence it rests on (what was checked, where)"
        )
    record = store.get_send(key)
    if record is None:
        raise UnknownSend(key)
    if record.state not in SETTLEABLE:
        raise InvalidRequest(
            f"send {key} is {record.state.value}: only a send whose outcome is unknown "
            f"({', '.join(s.value for s in sorted(SETTLEABLE))}) is settled by a person"
        )
    settled = store.settle_send(key, sent, evidence, actor, clock.now())
    emit(
        Event.SEND,
        workspace_id=settled.workspace_id,
        task_id=settled.task_id,
        send_key=key,
        channel=settled.channel or None,
        outcome="settled_by_person",
        state=settled.state.name,
    )
    return settled


SETTLEABLE = frozenset({SendState.ATTEMPTING, SendState.UNCERTAIN, SendState.WITH_PERSON})
"""States a person may settle a send from (its outcome is not known)."""
