"""What a report does to its task: one pure function, shared by every store backend.

The rules: a terminal outcome with an open gate is rewritten to the gate's waiting state and
never closes the task; a retry blocks the task on the execution record that will retry it,
and that record's next report unblocks it; a verdict about one message closes a thread only
while the thread holds no other message; a follow-up resumes the task from the state it is
in when the report is written.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from agent.domain.dispositions import TASK_STATE_FOR, Disposition, settle
from agent.domain.records import TaskUpdate
from agent.domain.states import (
    TERMINAL_STATES,
    TRANSITIONS,
    TaskState,
    after_inbound,
    check_transition,
)
from agent.domain.task import ReadinessTier, Task


def readiness(task: Task) -> ReadinessTier:
    if task.state in TERMINAL_STATES:
        return ReadinessTier.DONE
    if task.state is TaskState.BLOCKED_RETRY_PENDING:
        return ReadinessTier.BLOCKED
    return ReadinessTier.PENDING_GATES if task.open_gates else ReadinessTier.READY


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
    kinds = {g.kind for g in task.open_gates}
    gates = (*task.open_gates, *(g for g in update.add_gates if g.kind not in kinds))
    settled = settle(disposition, frozenset(g.kind for g in gates))

    state = task.state
    blocked_by = task.blocked_by
    if state is TaskState.BLOCKED_RETRY_PENDING and blocked_by == key and not retrying:
        check_transition(state, TaskState.TASK_RESOLVED)  # the retry this task waited for ran
        state, blocked_by = TaskState.TASK_RESOLVED, None

    target: TaskState | None
    if retrying:
        target, blocked_by = TaskState.BLOCKED_RETRY_PENDING, key
    elif settled is not disposition:
        waiting = TASK_STATE_FOR[settled]
        target = waiting if waiting is not None and waiting in TRANSITIONS[state] else None
    elif update.resume_on_inbound:
        target = after_inbound(state)
    else:
        target = update.state
    if update.sole_message is not None and any(
        m.provider_message_id != update.sole_message for m in task.messages
    ):
        target = None
    if target in TERMINAL_STATES and gates:
        target = None  # an open gate never lets a report close the task

    changes: dict[str, Any] = {
        "execution_key": key,
        "execution_result": detail or None,
        "execution_outcome": settled.value,
        "updated_at": now,
        "open_gates": gates,
        "blocked_by": blocked_by,
    }
    resumed = target is not None and target is not state
    if resumed:
        assert target is not None
        check_transition(state, target)
        state = target
    changes["state"] = state
    if update.next_action is not None and (resumed or not update.resume_on_inbound):
        changes["next_action"] = update.next_action
    if update.provisional_basis is not None:
        changes["provisional_basis"] = {**task.provisional_basis, **update.provisional_basis}
    if update.remaining_work is not None:
        changes["remaining_work"] = update.remaining_work
    reported = task.model_copy(update=changes)
    return reported.model_copy(update={"readiness_tier": readiness(reported)}), settled
