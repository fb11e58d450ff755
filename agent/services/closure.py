"""Internal requester closure (seed 000, "Internal requester closure" and "Delivery evidence
and independence").

A verified internal requester gets a result or status reply, in the original thread,
stating exactly what is complete and what remains, before the occurrence is released -
partial results included. It is internal communication: no client-send restriction or
approval holds it. A task is not closed or left partially completed while that loop is open.
"""

from __future__ import annotations

import hashlib
from typing import Protocol

from agent.domain.automation import SendKind
from agent.domain.context import WorkspaceContext
from agent.domain.errors import GateRefused, UnknownTask
from agent.domain.gates import DraftFacts, draft_digest, release_guard
from agent.domain.records import TaskAmendment
from agent.domain.states import TaskState
from agent.domain.task import CommunicationState, Task
from agent.events import Event, emit
from agent.ports import Clock, MailProvider, TaskBoard
from agent.rendering.render import RenderedMessage, render_message, reply_subject
from agent.services import outbound
from agent.services.gate_check import GateReads, check_send, load_task
from agent.services.outbound import OutboundStore, SendOutcome
from agent.services.workspaces import load_context


class ClosureStore(GateReads, OutboundStore, Protocol):
    """What replying to the requester needs: the gate's reads and sending once."""


#: States that release the occurrence's work; the requester's loop must be closed first.
RELEASING: frozenset[TaskState] = frozenset({TaskState.COMPLETED, TaskState.PARTIALLY_COMPLETED})


def status_text(complete: str, remaining: str) -> str:
    text = f"**Complete:** {complete.strip() or 'nothing yet'}\n\n"
    text += f"**Remaining:** {remaining.strip() or 'nothing'}"
    return text


async def reply_to_requester(
    store: ClosureStore,
    provider: MailProvider,
    task_id: str,
    *,
    complete: str,
    remaining: str,
    clock: Clock,
) -> SendOutcome:
    """Send the internal requester the result or status, and close their loop."""
    task = load_task(store, task_id)
    if task.requester is None:
        raise GateRefused(f"task {task_id} has no verified internal requester to reply to")
    context = load_context(store, task.workspace_id)
    rendered, facts = _status_draft(context, task, complete, remaining)
    gate = check_send(store, task_id, facts, to=(task.requester,), internal_only=True)
    if not gate.ready:
        raise GateRefused(f"the status reply to {task.requester} cannot go: {gate.summary()}")
    to, cc = gate.plan.addresses()
    key = f"status|{task_id}|{hashlib.sha256((complete + '|' + remaining).encode()).hexdigest()}"
    intent, message = outbound.reply_in_thread(task, key, rendered, to, cc, SendKind.INTERNAL_REPLY)
    outcome = await outbound.send_once(store, provider, intent, message, clock)
    outbound.raise_unless_settled(outcome, "the status reply")
    store.amend_task(
        task_id,
        TaskAmendment(
            event=f"requester loop closed: {key}",
            requester_loop_closed=True,
            communication_state=CommunicationState.INTERNAL_UPDATE_SENT,
            remaining_work=remaining,
            sent_message=outbound.sent_ref(outcome, "internal_reply", task.mailbox_id, clock.now()),
        ),
        clock.now(),
    )
    return outcome


def _status_draft(
    context: WorkspaceContext, task: Task, complete: str, remaining: str
) -> tuple[RenderedMessage, DraftFacts]:
    """The status reply rendered in the workspace's language, and the facts the gate reads."""
    rendered = render_message(
        status_text(complete, remaining),
        subject=reply_subject(task.original_subject),
        context=context,
    )
    digest = draft_digest(rendered.subject, rendered.html, rendered.text)
    facts = DraftFacts(
        draft_id=f"status-{digest[:12]}",
        digest=digest,
        subject=rendered.subject,
        text=rendered.text,
    )
    return rendered, facts


def release(board: TaskBoard, task_id: str, target: TaskState, evidence: str, clock: Clock) -> Task:
    """Move a task to a releasing state on the board, refused while its requester's loop
    is open."""
    task = board.get_task(task_id)
    if task is None:
        raise UnknownTask(task_id)
    refused = release_guard(task, closing=target in RELEASING)
    if refused is not None:
        raise GateRefused(refused)
    moved = board.transition_task(task_id, target, evidence, clock.now())
    emit(Event.TASK, workspace_id=moved.workspace_id, task_id=task_id, state=moved.state.value)
    return moved
