"""send and read_back: a rendered draft goes out in the task's original thread, exactly once,
and the provider's stored copy is read back and checked.

The gate runs here, inside the server, on every send: what the caller says about recipients'
classes or approval is never evidence. A send is ledgered before the provider is asked, so a
retry of the same draft to the same recipients finds its ledger entry (and, after a crash,
the provider's sent copy) instead of sending again; once it went out, a repeat is refused
with the send_id it went out as.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Protocol

from agent.domain.automation import SendKind
from agent.domain.dispositions import GateKind
from agent.domain.errors import GateRefused, RegistryError, UnknownSend
from agent.domain.gates import GateResult
from agent.domain.mail import (
    AttachmentData,
    MarkerKind,
    OutgoingMessage,
    SendResult,
    StoredCopy,
)
from agent.domain.recipients import Communication
from agent.domain.records import SendRecord, SendState, TaskAmendment
from agent.domain.states import TaskState
from agent.domain.task import CommunicationState, MessageRef, NextAction, Task
from agent.events import Event, codes, emit
from agent.ports import Clock, Drafts, MailProvider, SendLedger, Tasks
from agent.rendering.render import RenderedMessage
from agent.rendering.verify import Check, ReadBackReport, verify_read_back
from agent.services.attachments import read_attachments, unchanged
from agent.services.drafts import DraftStore, facts, load_draft
from agent.services.gate_check import check_send, load_task
from agent.services.outbound import (
    OutboundStore,
    SendOutcome,
    SendStatus,
    marker_of,
    raise_unless_settled,
    reply_in_thread,
    send_once,
    sent_ref,
)
from agent.services.workspaces import load_context


class ReplyStore(DraftStore, OutboundStore, Protocol):
    """What a reply reads and writes: the gate's reads, the draft and the send ledger."""


class TaskDrafts(Tasks, Drafts, Protocol):
    """What reading a reply back needs: the task and the draft it was rendered from."""


_KEY_PREFIX = "reply"


class SendRefused(GateRefused):
    """The gate did not let the send go; ``gate`` carries every blocking reason."""

    def __init__(self, gate: GateResult) -> None:
        super().__init__(f"the send is refused: {gate.summary()}")
        self.gate = gate


class AlreadySent(GateRefused):
    """This draft already went to these recipients; ``send`` is that send."""

    def __init__(self, send: SendRecord) -> None:
        super().__init__(
            f"this draft already went to {', '.join(send.recipients)} as send {send.key} "
            f"(Message-ID {send.internet_message_id}); a draft is never sent twice"
        )
        self.send = send


class UnfinishedSend(GateRefused):
    """The draft has an unfinished send to other recipients; ``send`` is that send. Only
    exactly that send may be repeated: a draft goes out once."""

    def __init__(self, draft_id: str, send: SendRecord) -> None:
        super().__init__(
            f"draft {draft_id} has an unfinished send to {', '.join(send.recipients)}; "
            "a draft goes out once"
        )
        self.send = send


@dataclass(frozen=True)
class ReplyOutcome:
    gate: GateResult
    outcome: SendOutcome
    task: Task


def reply_key(
    draft_id: str, communication: Communication, to: Sequence[str], cc: Sequence[str]
) -> str:
    """The ledger key of a reply. A client-facing draft goes out once, whatever recipients a
    later call names (its approval covers one send); an internal draft goes once to each
    set of recipients, however they are split between To and Cc."""
    if communication is Communication.CLIENT_FACING:
        return f"{_KEY_PREFIX}|{draft_id}|client"
    return f"{_KEY_PREFIX}|{draft_id}|internal|{','.join(sorted({*to, *cc}))}"


def _draft_of(key: str) -> str:
    parts = key.split("|")
    if len(parts) < 3 or parts[0] != _KEY_PREFIX:
        raise UnknownSend(key, "it is not a reply sent by send")
    return parts[1]


async def send_reply(
    store: ReplyStore,
    provider: MailProvider,
    task_id: str,
    draft_id: str,
    *,
    to: Sequence[str],
    cc: Sequence[str] = (),
    clock: Clock,
) -> ReplyOutcome:
    """Re-run the gate, then send the draft in the task's original thread, exactly once."""
    task = load_task(store, task_id)
    record, rendered = load_draft(store, task_id, draft_id)
    gate = check_send(store, task_id, facts(record, rendered), to=to, cc=cc)
    to_addrs, cc_addrs = gate.plan.addresses()
    key = reply_key(draft_id, gate.communication, to_addrs, cc_addrs)
    _refuse_unless_sendable(store, gate, key, draft_id, to_addrs, cc_addrs)
    client = gate.communication is Communication.CLIENT_FACING
    if client and task.state is TaskState.DRAFT_READY:
        task = _approve_on_standing_basis(store, task_id, draft_id, gate, clock)
    kind = SendKind.CLIENT_REPLY if client else SendKind.INTERNAL_REPLY
    files = await _files_of(store, task, provider, rendered)
    intent, message = reply_in_thread(task, key, rendered, to_addrs, cc_addrs, kind, files)
    outcome = await send_once(store, provider, intent, message, clock)
    raise_unless_settled(outcome, "send")
    if outcome.status is SendStatus.REFUSED:
        raise GateRefused(f"send {key} was refused by the ledger: {outcome.record.detail}")
    now = clock.now()
    amendment = _handover_amendment(task, key, kind, outcome, (*to_addrs, *cc_addrs), now)
    task = store.amend_task(task_id, amendment, now)
    return ReplyOutcome(gate=gate, outcome=outcome, task=task)


async def _files_of(
    store: ReplyStore, task: Task, provider: MailProvider, rendered: RenderedMessage
) -> tuple[AttachmentData, ...]:
    """The draft's files, read again now: exactly the ones it was rendered with."""
    if not rendered.attachments:
        return ()
    context = load_context(store, task.workspace_id)
    files = await read_attachments(store, context, provider, [a.ref for a in rendered.attachments])
    unchanged(rendered.attachments, files)
    return files


def _refuse_unless_sendable(
    store: SendLedger,
    gate: GateResult,
    key: str,
    draft_id: str,
    to_addrs: tuple[str, ...],
    cc_addrs: tuple[str, ...],
) -> None:
    """A draft that went out is never sent again; one the gate holds is refused; an
    unfinished send is only ever repeated exactly."""
    done = store.get_send(key)
    if done is not None and done.state is SendState.CONFIRMED:
        raise AlreadySent(done)
    if not gate.ready:
        raise SendRefused(gate)
    if done is not None and (done.to, done.cc) != (to_addrs, cc_addrs):
        raise UnfinishedSend(draft_id, done)


def _approve_on_standing_basis(
    store: Tasks, task_id: str, draft_id: str, gate: GateResult, clock: Clock
) -> Task:
    """A standing approval covers this message class: the task records the basis first."""
    return store.amend_task(
        task_id,
        TaskAmendment(
            event=f"approved to send: {gate.approval_basis} (draft {draft_id})",
            expect_states=(TaskState.DRAFT_READY,),
            state=TaskState.APPROVED_TO_SEND,
        ),
        clock.now(),
    )


def _handover_amendment(
    task: Task,
    key: str,
    kind: SendKind,
    outcome: SendOutcome,
    recipients: tuple[str, ...],
    now: datetime,
) -> TaskAmendment:
    """What the task records of a handed-over reply: a client reply waits for its read-back;
    an internal reply to the requester closes their loop."""
    amendment = TaskAmendment(
        event=f"{kind.value} handed over: {key}" + _delivery_note(outcome),
        sent_message=sent_ref(outcome, kind.value, task.mailbox_id, now),
    )
    if kind is SendKind.CLIENT_REPLY:
        # The task reaches CLIENT_REPLY_SENT only when read_back proves the stored copy.
        return amendment.model_copy(
            update={
                "expect_states": (TaskState.APPROVED_TO_SEND,),
                "communication_state": CommunicationState.CLIENT_REPLY_HANDED_OVER,
                "sent_message_id": outcome.message_id,
                "recipients": recipients,
                "next_action": NextAction(
                    description=_after_handover(key, outcome), owner=task.next_action.owner
                ),
            }
        )
    update: dict[str, object] = {"communication_state": CommunicationState.INTERNAL_UPDATE_SENT}
    if task.requester is not None and task.requester in recipients:
        # The internal requester has their result or status reply: their loop is closed.
        update["requester_loop_closed"] = True
    return amendment.model_copy(update=update)


def _after_handover(key: str, outcome: SendOutcome) -> str:
    if outcome.result is not None and not outcome.result.delivered:
        return (
            f"deliver send {key} by hand: {outcome.result.channel} keeps a local copy that "
            "reached no one"
        )
    return f"read back send {key}: the reply counts as sent once its stored copy is verified"


def _delivery_note(outcome: SendOutcome) -> str:
    if outcome.result is None:
        return f" ({outcome.status.value})"
    if outcome.result.delivered:
        return f" (sent via {outcome.result.channel})"
    return (
        f" (written to {outcome.result.channel}: a local copy that reached no one, not a delivery)"
    )


@dataclass(frozen=True)
class ReadBack:
    send: SendRecord
    report: ReadBackReport
    stored_provider_message_id: str | None


async def read_back(
    store: TaskDrafts,
    provider_for: Callable[[Task], MailProvider],
    record: SendRecord,
    clock: Clock,
) -> ReadBack:
    """Fetch the provider's stored copy of a send and check recipients, subject, thread,
    message id, direction, language and isolated fragments against what was rendered. The
    result is a decision record: passed, or failed with the checks that failed."""
    started = time.perf_counter()
    found = await _read_back(store, provider_for, record, clock)
    report = found.report
    emit(
        Event.READ_BACK,
        level=logging.INFO if report.ok else logging.WARNING,
        workspace_id=record.workspace_id,
        task_id=record.task_id,
        send_key=record.key,
        channel=record.channel or None,
        result="passed" if report.ok else "failed",
        checks=len(report.checks),
        checks_failed=codes(c.name for c in report.failed),
        duration_seconds=round(time.perf_counter() - started, 6),
    )
    return found


async def _read_back(
    store: TaskDrafts,
    provider_for: Callable[[Task], MailProvider],
    record: SendRecord,
    clock: Clock,
) -> ReadBack:
    send_id = record.key
    draft_id = _draft_of(record.key)
    to, cc = record.to, record.cc
    if record.task_id is None:
        raise RegistryError(f"send {send_id!r} belongs to no task")
    task = load_task(store, record.task_id)
    provider = provider_for(task)
    _, rendered = load_draft(store, task.task_id, draft_id)
    if record.state is not SendState.CONFIRMED:
        report = ReadBackReport(
            checks=(
                Check(
                    name="sent",
                    ok=False,
                    detail=f"the send's outcome is not known yet ({record.state.value}); "
                    "read back again once it is settled",
                ),
            )
        )
        return ReadBack(send=record, report=report, stored_provider_message_id=None)
    kind = SendKind(record.kind)
    _, sent = reply_in_thread(task, record.key, rendered, to, cc, kind)
    copy = await provider.find_sent(marker_of(record))
    if copy is None:
        report = ReadBackReport(
            checks=(
                Check(
                    name="stored_copy",
                    ok=False,
                    detail=f"the provider has no stored copy of {record.internet_message_id} "
                    "(yet); read back again before reporting delivery",
                ),
            )
        )
        return ReadBack(send=record, report=report, stored_provider_message_id=None)
    report = verify_read_back(rendered, sent, copy, _sent_as(record, sent, copy))
    evidence = f"read back {copy.internet_message_id or record.internet_message_id}: " + (
        "all checks passed" if report.ok else "failed " + ", ".join(c.name for c in report.failed)
    )
    amendment = _read_back_amendment(task, record, report, evidence, copy)
    store.amend_task(task.task_id, amendment, clock.now())
    return ReadBack(send=record, report=report, stored_provider_message_id=copy.provider_message_id)


def _sent_as(record: SendRecord, sent: OutgoingMessage, copy: StoredCopy) -> SendResult | None:
    """What the send went out as, where the channel could not give it our Message-ID: a
    copy found by the channel's own marker (a web app's) carries the provider's id, which
    is the send's. None where our Message-ID is what was sent."""
    marker = record.marker
    if marker is None or marker.kind is not MarkerKind.NATIVE or not copy.internet_message_id:
        return None
    return SendResult(
        provider_message_id=copy.provider_message_id,
        provider_thread_id=sent.provider_thread_id,
        internet_message_id=copy.internet_message_id,
        channel=record.channel,
        delivered=copy.delivered,
        accepted_at=record.sent_at or record.created_at,
    )


def _read_back_amendment(
    task: Task, record: SendRecord, report: ReadBackReport, evidence: str, copy: StoredCopy
) -> TaskAmendment:
    """What a read-back records: a client reply whose stored copy passed every check (its
    delivery included) is sent; anything else is evidence only. A copy that went out
    under another Message-ID than ours (a web app's send whose copy did not show at once)
    has that id linked to the task either way: answers to it name that one."""
    if record.partial:
        evidence += "; partial delivery: " + ", ".join(
            f"{a} refused ({w})" for a, w in record.refused
        )
    sent_as = copy.internet_message_id or record.internet_message_id
    amendment = TaskAmendment(event=f"read back {record.key}", readback_evidence=evidence)
    if sent_as != record.internet_message_id:
        linked = MessageRef(
            provider_message_id=copy.provider_message_id,
            internet_message_id=sent_as,
            direction=record.kind,
            received_at=record.sent_at or record.created_at,
            sender=task.mailbox_id,
        )
        amendment = amendment.model_copy(update={"sent_message": linked})
    # A partial delivery is never a plain success: the task stays open for a person.
    proven = report.ok and not record.partial and SendKind(record.kind) is SendKind.CLIENT_REPLY
    if not proven or task.state is not TaskState.APPROVED_TO_SEND:
        return amendment
    return amendment.model_copy(
        update={
            "expect_states": (TaskState.APPROVED_TO_SEND,),
            "state": TaskState.CLIENT_REPLY_SENT,
            "remove_gate_kinds": (GateKind.INTERNAL_APPROVAL,),
            "communication_state": CommunicationState.CLIENT_REPLY_SENT,
            # From the ledger: the send's own record, even if its task update was lost.
            "sent_message_id": sent_as,
            "recipients": record.recipients,
            "next_action": NextAction(
                description=f"wait for the client's answer to send {record.key} (its stored "
                "copy was read back and verified)",
                owner=task.next_action.owner,
            ),
        }
    )
