"""Ledgered sending: every outbound message is recorded before the provider is asked.

The ledger key names the message (an acknowledgement of one inbound message, the reminder
of one waiting period, the approval request of one draft), so the same message is never
sent twice: a second attempt finds the key. An intent left behind by a worker that stopped
mid-send is resolved by reading the provider's sent copy first; only when the provider has
none, and the intent is older than the in-flight window, is it sent again under the same
Message-ID.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Protocol

from agent import crashpoints
from agent.domain.context import WorkspaceContext
from agent.domain.envelope import Address
from agent.domain.errors import HandoverRefused
from agent.domain.handover import check_handover
from agent.domain.headers import msg_id
from agent.domain.mail import Handover, OutgoingMessage, SendResult
from agent.domain.records import SendIntent, SendRecord, SendState, TaskAmendment
from agent.domain.task import MessageRef, Task
from agent.ports import Clock, MailProvider, SendLedger, Tasks
from agent.rendering.render import RenderedMessage
from agent.services.holder import current_holder, holder_alive


class OutboundStore(SendLedger, Tasks, Protocol):
    """What sending once needs: the send ledger, and the task the send is recorded on."""


IN_FLIGHT = timedelta(minutes=10)
"""How long an unfinished intent is taken to be another worker's send still in progress."""
_SENDING: set[str] = set()
"""Keys this process is handing to a provider right now."""


class SendStatus(StrEnum):
    SENT = "sent"
    ALREADY_SENT = "already_sent"
    RECOVERED = "recovered"
    """A stopped worker's send: the provider's sent copy proved it went out."""
    IN_PROGRESS = "in_progress"
    REFUSED = "refused"


@dataclass(frozen=True)
class SendOutcome:
    status: SendStatus
    record: SendRecord
    result: SendResult | None = None

    @property
    def went_out(self) -> bool:
        return self.status in {SendStatus.SENT, SendStatus.RECOVERED, SendStatus.ALREADY_SENT}


def message_id_for(key: str, mailbox_id: str) -> str:
    """A Message-ID derived from the ledger key: a resend after a crash reuses it."""
    domain = mailbox_id.rsplit("@", 1)[-1] if "@" in mailbox_id else "outloop.invalid"
    return f"<{hashlib.sha256(key.encode()).hexdigest()[:32]}.outloop@{domain}>"


async def send_once(
    store: OutboundStore,
    provider: MailProvider,
    intent: SendIntent,
    message: OutgoingMessage,
    clock: Clock,
    cap: int | None = None,
) -> SendOutcome:
    """Send ``message`` at most once under ``intent.key``.

    An unfinished intent of another worker is left to it while that worker is alive and
    for at most IN_FLIGHT; the intent of a dead worker is resolved at once (its sent copy
    read first).
    """
    if message.internet_message_id != intent.internet_message_id:
        raise ValueError("the message and its intent must carry the same Message-ID")
    handover = await checked_handover(store, provider, intent, message, clock)
    if not intent.holder:
        intent = intent.model_copy(update={"holder": current_holder()})
    record = store.begin_send(intent, clock.now(), cap)
    if record.state is SendState.REFUSED:
        return SendOutcome(SendStatus.REFUSED, record)
    if record.state is SendState.SENT:
        return SendOutcome(SendStatus.ALREADY_SENT, record)
    if record.key in _SENDING:
        return SendOutcome(SendStatus.IN_PROGRESS, record)
    _SENDING.add(record.key)  # no await since the check: this task owns the key here
    try:
        return await _send(store, provider, intent, handover, record, clock)
    finally:
        _SENDING.discard(record.key)


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


async def _send(
    store: SendLedger,
    provider: MailProvider,
    intent: SendIntent,
    handover: Handover,
    record: SendRecord,
    clock: Clock,
) -> SendOutcome:
    if not record.created:
        mine = record.holder == intent.holder  # this worker's earlier attempt, now over
        young = clock.now() - record.created_at < IN_FLIGHT
        if not mine and holder_alive(record.holder) and young:
            return SendOutcome(SendStatus.IN_PROGRESS, record)
        # The worker that recorded the intent is gone (or took too long): take the intent
        # over - one worker wins - then read the provider's sent copy before sending.
        if not store.take_over_send(record.key, record.holder, intent.holder, clock.now()):
            return SendOutcome(SendStatus.IN_PROGRESS, record)
        copy = await provider.read_back(record.internet_message_id)
        if copy is not None:
            done = store.complete_send(
                record.key, copy.provider_message_id, "recovered from the sent copy", clock.now()
            )
            return SendOutcome(SendStatus.RECOVERED, done)
    crashpoints.hit("before_provider_send")
    result = await provider.send(handover)
    crashpoints.hit("after_provider_send")
    done = store.complete_send(
        intent.key,
        result.provider_message_id,
        f"via {result.channel}" + ("" if result.delivered else " (not a delivery)"),
        clock.now(),
    )
    return SendOutcome(SendStatus.SENT, done, result)


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
    """The sent message as the task records it (indexed for exact linkage of replies)."""
    mid = outcome.record.internet_message_id
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
) -> tuple[SendIntent, OutgoingMessage]:
    """A reply in the task's thread, answering its latest message from the recipients."""
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
    )
