"""What a report does to its task: one pure function, shared by every store backend.

A report's target state was chosen from a snapshot of the task taken at claim time; by the
time the report is written the task may have moved on (another worker's follow-up, an
agent's transition). So a report never fails on its target: a target the transition table
does not allow from the task's current state is dropped, and the task keeps its state.

The rules:
- a terminal outcome with an open gate is rewritten to the gate's waiting disposition; the
  task takes the waiting state when the report asked for a state change and the table allows
  it, and a report never closes a task with an open gate;
- a retry blocks the task on the execution record that will retry it (several retries may
  block one task); the last of them to report unblocks it;
- a verdict about one message (automated noise) closes the thread only while that message is
  its only one; otherwise the thread has real mail and is treated as a follow-up;
- a follow-up resumes the task from the state it is in when the report is written.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from agent.domain.approval import ApprovalDecision, Decision, current_approval, decisions_on
from agent.domain.dispositions import TASK_STATE_FOR, Disposition, GateKind, settle
from agent.domain.envelope import Address
from agent.domain.errors import TransitionError
from agent.domain.records import TaskAmendment, TaskUpdate
from agent.domain.states import (
    TERMINAL_STATES,
    TRANSITIONS,
    TaskState,
    after_inbound,
    check_transition,
)
from agent.domain.task import Gate, NextAction, ReadinessTier, Task


def readiness(task: Task) -> ReadinessTier:
    if task.state in TERMINAL_STATES:
        return ReadinessTier.DONE
    if task.state is TaskState.BLOCKED_RETRY_PENDING or task.blocked_by:
        return ReadinessTier.BLOCKED
    return ReadinessTier.PENDING_GATES if task.open_gates else ReadinessTier.READY


def _allowed(state: TaskState, target: TaskState | None) -> TaskState | None:
    return target if target is not None and target in TRANSITIONS[state] else None


def apply_report(
    task: Task,
    *,
    key: str,
    disposition: Disposition,
    detail: str,
    update: TaskUpdate | None,
    retrying: bool,
    now: datetime,
) -> tuple[Task, Disposition]:
    """The task after the report, and the disposition the item really gets."""
    update = update or TaskUpdate()
    decided = _approval_target(task, update.approval_decision)
    gates = _gates_after(task, update, decided, now)
    settled = settle(disposition, frozenset(g.kind for g in gates))
    wanted, resume, next_action = _wanted(task, update, disposition, settled, decided, gates)
    state, blocked_by = _moved(task, key, retrying, wanted, resume)
    resumed = state is not task.state
    changes: dict[str, Any] = {
        "execution_key": key,
        "execution_result": detail or None,
        "execution_outcome": settled.value,
        "updated_at": now,
        "open_gates": gates,
        "blocked_by": blocked_by,
        "state": state,
    }
    if next_action is not None and (resumed or not update.resume_on_inbound):
        changes["next_action"] = next_action
    if resumed:
        changes["state_since"] = now
    changes.update(_recorded(task, update))
    reported = task.model_copy(update=changes)
    return reported.model_copy(update={"readiness_tier": readiness(reported)}), settled


def _gates_after(
    task: Task, update: TaskUpdate, decided: TaskState | None, now: datetime
) -> tuple[Gate, ...]:
    """The open gates plus the report's new kinds; an approval clears the approval gate and
    an approver's reservation puts one back."""
    kinds = {g.kind for g in task.open_gates}
    gates = (*task.open_gates, *(g for g in update.add_gates if g.kind not in kinds))
    if decided is TaskState.APPROVED_TO_SEND:
        gates = tuple(g for g in gates if g.kind is not GateKind.INTERNAL_APPROVAL)
    elif decided is TaskState.WAITING_INTERNAL_APPROVAL and not any(
        g.kind is GateKind.INTERNAL_APPROVAL for g in gates
    ):
        gates = (
            *gates,
            Gate(
                kind=GateKind.INTERNAL_APPROVAL,
                owner=update.approval_decision.approver if update.approval_decision else "",
                since=now,
                reason="an approver's reservation suspended the approval",
            ),
        )
    return gates


def _wanted(
    task: Task,
    update: TaskUpdate,
    disposition: Disposition,
    settled: Disposition,
    decided: TaskState | None,
    gates: tuple[Gate, ...],
) -> tuple[TaskState | None, bool, NextAction | None]:
    """The state the report asks for, whether the task resumes on the inbound message, and
    the next action: never a close while a gate is open."""
    wanted: TaskState | None
    resume = update.resume_on_inbound
    next_action = update.next_action
    if update.sole_message is not None and any(
        m.provider_message_id != update.sole_message for m in task.messages
    ):
        # The thread holds real mail besides this message: not closable by this verdict.
        wanted, resume, next_action = None, True, None
    elif settled is not disposition and update.state is not None:
        wanted = TASK_STATE_FOR[settled]
    else:
        wanted = update.state
    if decided is not None:
        wanted, resume = decided, False
    if wanted in TERMINAL_STATES and gates:
        wanted = None  # an open gate never lets a report close the task
    return wanted, resume, next_action


def _moved(
    task: Task, key: str, retrying: bool, wanted: TaskState | None, resume: bool
) -> tuple[TaskState, tuple[str, ...]]:
    """The state the task moves to, and the retries it stays blocked on: a retry blocks it,
    and the last retry to report unblocks it."""
    state = task.state
    blocked_by = tuple(task.blocked_by)
    if retrying:
        blocked_by = (*(k for k in blocked_by if k != key), key)
        target = _allowed(state, TaskState.BLOCKED_RETRY_PENDING)
    else:
        if key in blocked_by:
            blocked_by = tuple(k for k in blocked_by if k != key)
            # The last retry this task waited for has run: go straight to the wanted state
            # when the table allows it, else back to TASK_RESOLVED first.
            last = state is TaskState.BLOCKED_RETRY_PENDING and not blocked_by
            if last and _allowed(state, wanted) is None:
                state = TaskState.TASK_RESOLVED
        target = after_inbound(state) if resume else wanted
        if state is TaskState.DISCOVERED and resume and target is state:
            target = TaskState.TASK_RESOLVED  # real mail in a thread nobody triaged yet
        if state is TaskState.BLOCKED_RETRY_PENDING and blocked_by:
            target = None  # still waiting for another retry
        target = _allowed(state, target)
    if target is not None and target is not state:
        check_transition(state, target)
        state = target
    return state, blocked_by


def _recorded(task: Task, update: TaskUpdate) -> dict[str, Any]:
    """What the report records on the task besides its state: benchmarks, remaining work,
    the approver's decision, the requester, display facts and the communication state."""
    changes: dict[str, Any] = {}
    if update.provisional_basis is not None:
        changes["provisional_basis"] = {**task.provisional_basis, **update.provisional_basis}
    if update.remaining_work is not None:
        changes["remaining_work"] = update.remaining_work
    if update.approval_decision is not None:
        changes["approval_decisions"] = (*task.approval_decisions, update.approval_decision)
        changes["approval_evidence"] = (
            *task.approval_evidence,
            update.approval_decision.describe(),
        )
    if update.requester is not None and task.requester is None:
        changes["requester"] = update.requester
    elif update.requester is not None and update.requester == task.requester:
        changes["requester_loop_closed"] = False  # the requester asked again
    if update.sender_name is not None and not task.sender_name:
        changes["sender_name"] = update.sender_name
    if update.attachment_names:
        changes["attachment_names"] = tuple(
            dict.fromkeys((*task.attachment_names, *update.attachment_names))
        )
    if update.content_flags:
        changes["content_flags"] = tuple(
            dict.fromkeys((*task.content_flags, *update.content_flags))
        )
    if update.communication_state is not None:
        changes["communication_state"] = update.communication_state
    return changes


def _approval_target(task: Task, decision: ApprovalDecision | None) -> TaskState | None:
    """The state an approver's decision moves the task to. Only a decision about the draft
    the task's latest approval request carried moves anything (an answer to an older
    request is recorded only); the approval in force is then recomputed from every answer
    to that request in the order the approvers wrote them."""
    if decision is None or task.state not in {
        TaskState.WAITING_INTERNAL_APPROVAL,
        TaskState.APPROVED_TO_SEND,
    }:
        return None
    latest = task.approval_requests[-1] if task.approval_requests else None
    if latest is None or latest.internet_message_id != decision.request_message_id:
        return None
    decisions = (*task.approval_decisions, decision)
    answered = decisions_on(latest, decisions)
    if any(d.decision is Decision.CHANGES_REQUESTED for d in answered):
        return TaskState.CHANGES_REQUESTED
    if current_approval(task.approval_requests, decisions, latest.draft_digest) is not None:
        return TaskState.APPROVED_TO_SEND
    if answered:
        return TaskState.WAITING_INTERNAL_APPROVAL  # a reservation suspends the approval
    return None


def apply_amendment(task: Task, amendment: TaskAmendment, now: datetime) -> Task:
    """The task after an amendment; refuses one the task's state does not allow."""
    if amendment.expect_states and task.state not in amendment.expect_states:
        raise TransitionError(
            f"task {task.task_id} is {task.state}, not "
            + " or ".join(s.value for s in amendment.expect_states)
            + f"; {amendment.event} was not applied"
        )
    changes: dict[str, Any] = {"updated_at": now}
    if amendment.state is not None and amendment.state is not task.state:
        check_transition(task.state, amendment.state)
        changes["state"] = amendment.state
        changes["state_since"] = now
    removed = set(amendment.remove_gate_kinds)
    kept = tuple(g for g in task.open_gates if g.kind not in removed)
    kinds = {g.kind for g in kept}
    changes["open_gates"] = (*kept, *(g for g in amendment.add_gates if g.kind not in kinds))
    decided = amendment.approval_decision
    if decided is not None:
        changes.update(_decision_applied(task, decided, changes, now))
    request = amendment.approval_request
    if request is not None and all(
        r.internet_message_id != request.internet_message_id for r in task.approval_requests
    ):
        changes["approval_requests"] = (*task.approval_requests, request)
    changes.update(_amended_fields(amendment))
    if decided is not None and "state" not in changes:
        changes.pop("next_action", None)  # a decision that moved nothing sets no next step
    if amendment.sent_message is not None:
        known = {m.provider_message_id for m in task.messages}
        if amendment.sent_message.provider_message_id not in known:
            changes["messages"] = (*task.messages, amendment.sent_message)
    amended = task.model_copy(update=changes)
    if amended.state in TERMINAL_STATES and amended.open_gates:
        raise TransitionError(f"task {task.task_id} cannot close with open gates")
    return amended.model_copy(update={"readiness_tier": readiness(amended)})


def _decision_applied(
    task: Task, decision: ApprovalDecision, changes: dict[str, Any], now: datetime
) -> dict[str, Any]:
    """An approver's decision given outside mail, applied as an approver's reply is: it is
    recorded, and the state and the approval gate follow the latest request's answers. A
    decision given on a request that is no longer the latest is refused (a person decided
    on what the page showed, and that has changed)."""
    latest = task.approval_requests[-1] if task.approval_requests else None
    if latest is None or latest.internet_message_id != decision.request_message_id:
        raise TransitionError(
            f"task {task.task_id} has a newer approval request than the one decided on: "
            "reload the task and decide on what it shows now"
        )
    decided = _approval_target(task, decision)
    shown = task.model_copy(update={"open_gates": changes["open_gates"]})
    gates = _gates_after(shown, TaskUpdate(approval_decision=decision), decided, now)
    applied: dict[str, Any] = {
        "open_gates": gates,
        **_recorded(task, TaskUpdate(approval_decision=decision)),
    }
    if decided is not None and decided is not task.state:
        check_transition(task.state, decided)
        applied.update(state=decided, state_since=now)
    return applied


def _amended_fields(amendment: TaskAmendment) -> dict[str, Any]:
    """The fields an amendment sets outright (each only when it names a value)."""
    changes: dict[str, Any] = {}
    if amendment.communication_state is not None:
        changes["communication_state"] = amendment.communication_state
    if amendment.requester_loop_closed is not None:
        changes["requester_loop_closed"] = amendment.requester_loop_closed
    if amendment.message_class is not None:
        changes["message_class"] = amendment.message_class
    if amendment.next_action is not None:
        changes["next_action"] = amendment.next_action
    if amendment.remaining_work is not None:
        changes["remaining_work"] = amendment.remaining_work
    if amendment.sent_message_id is not None:
        changes["sent_message_id"] = amendment.sent_message_id
    if amendment.recipients is not None:
        changes["recipients"] = tuple(Address(address=a) for a in amendment.recipients)
    if amendment.readback_evidence is not None:
        changes["readback_evidence"] = amendment.readback_evidence
    return changes
