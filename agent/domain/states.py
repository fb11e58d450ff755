"""The 14 task states of seed 001 and the explicit transition table between them."""

from __future__ import annotations

from enum import StrEnum

from agent.domain.errors import CloseRefused, TransitionError, UnknownStateError


class TaskState(StrEnum):
    DISCOVERED = "DISCOVERED"
    TASK_RESOLVED = "TASK_RESOLVED"
    IN_DISCOVERY = "IN_DISCOVERY"
    EXECUTING = "EXECUTING"
    VERIFYING = "VERIFYING"
    DRAFT_READY = "DRAFT_READY"
    WAITING_INTERNAL_APPROVAL = "WAITING_INTERNAL_APPROVAL"
    CHANGES_REQUESTED = "CHANGES_REQUESTED"
    APPROVED_TO_SEND = "APPROVED_TO_SEND"
    CLIENT_REPLY_SENT = "CLIENT_REPLY_SENT"
    WAITING_CLIENT = "WAITING_CLIENT"
    PARTIALLY_COMPLETED = "PARTIALLY_COMPLETED"
    BLOCKED_RETRY_PENDING = "BLOCKED_RETRY_PENDING"
    COMPLETED = "COMPLETED"


S = TaskState

#: States from which a task may never be closed (seed 001).
NEVER_CLOSED_FROM: frozenset[TaskState] = frozenset(
    {
        S.WAITING_INTERNAL_APPROVAL,
        S.CHANGES_REQUESTED,
        S.WAITING_CLIENT,
        S.BLOCKED_RETRY_PENDING,
        S.PARTIALLY_COMPLETED,
    }
)

#: The only terminal state. Everything else is in the queue.
TERMINAL_STATES: frozenset[TaskState] = frozenset({S.COMPLETED})

#: Allowed transitions. Anything not listed is refused.
TRANSITIONS: dict[TaskState, frozenset[TaskState]] = {
    S.DISCOVERED: frozenset(
        {S.TASK_RESOLVED, S.IN_DISCOVERY, S.BLOCKED_RETRY_PENDING, S.COMPLETED}
    ),
    S.TASK_RESOLVED: frozenset(
        {
            S.IN_DISCOVERY,
            S.EXECUTING,
            S.DRAFT_READY,
            S.WAITING_CLIENT,
            S.BLOCKED_RETRY_PENDING,
            S.COMPLETED,
        }
    ),
    S.IN_DISCOVERY: frozenset(
        {S.TASK_RESOLVED, S.EXECUTING, S.PARTIALLY_COMPLETED, S.BLOCKED_RETRY_PENDING, S.COMPLETED}
    ),
    S.EXECUTING: frozenset(
        {S.VERIFYING, S.DRAFT_READY, S.PARTIALLY_COMPLETED, S.BLOCKED_RETRY_PENDING}
    ),
    S.VERIFYING: frozenset(
        {S.EXECUTING, S.DRAFT_READY, S.PARTIALLY_COMPLETED, S.BLOCKED_RETRY_PENDING, S.COMPLETED}
    ),
    S.DRAFT_READY: frozenset(
        {S.WAITING_INTERNAL_APPROVAL, S.APPROVED_TO_SEND, S.EXECUTING, S.BLOCKED_RETRY_PENDING}
    ),
    S.WAITING_INTERNAL_APPROVAL: frozenset({S.APPROVED_TO_SEND, S.CHANGES_REQUESTED}),
    S.CHANGES_REQUESTED: frozenset({S.EXECUTING, S.DRAFT_READY}),
    # An approver may withdraw an approval before the send: back to waiting, or changes.
    S.APPROVED_TO_SEND: frozenset(
        {
            S.CLIENT_REPLY_SENT,
            S.BLOCKED_RETRY_PENDING,
            S.WAITING_INTERNAL_APPROVAL,
            S.CHANGES_REQUESTED,
        }
    ),
    S.CLIENT_REPLY_SENT: frozenset({S.WAITING_CLIENT, S.TASK_RESOLVED, S.COMPLETED}),
    S.WAITING_CLIENT: frozenset({S.TASK_RESOLVED, S.EXECUTING}),
    S.PARTIALLY_COMPLETED: frozenset({S.EXECUTING, S.DRAFT_READY, S.BLOCKED_RETRY_PENDING}),
    S.BLOCKED_RETRY_PENDING: frozenset(
        {S.TASK_RESOLVED, S.EXECUTING, S.DRAFT_READY, S.APPROVED_TO_SEND}
    ),
    S.COMPLETED: frozenset({S.TASK_RESOLVED}),
}

#: A new inbound message in the task's thread resumes these states (a client reply
#: resumes the same task); in any other state the task simply records the message.
RESUMED_BY_INBOUND: frozenset[TaskState] = frozenset(
    {S.WAITING_CLIENT, S.CLIENT_REPLY_SENT, S.COMPLETED}
)


def parse_state(name: str) -> TaskState:
    """The state called ``name``; an unknown name is a loud error, never a default."""
    try:
        return TaskState(name)
    except ValueError:
        raise UnknownStateError(
            f"unknown task state {name!r}; the lifecycle has exactly these 14: "
            + ", ".join(s.value for s in TaskState)
        ) from None


def check_transition(current: TaskState, target: TaskState) -> None:
    """Raise unless ``current -> target`` is in the transition table."""
    if target is S.COMPLETED and current in NEVER_CLOSED_FROM:
        raise CloseRefused(f"a task in {current} cannot be closed: " + _CLOSE_ADVICE[current])
    if target not in TRANSITIONS[current]:
        allowed = ", ".join(sorted(s.value for s in TRANSITIONS[current]))
        raise TransitionError(
            f"a task cannot move from {current} to {target}; from {current} it may move to: "
            f"{allowed}"
        )


def after_inbound(current: TaskState) -> TaskState:
    """The state a task takes when a new message arrives in its verified thread."""
    return S.TASK_RESOLVED if current in RESUMED_BY_INBOUND else current


_CLOSE_ADVICE: dict[TaskState, str] = {
    S.WAITING_INTERNAL_APPROVAL: "record the approver's decision first (approved or changes "
    "requested)",
    S.CHANGES_REQUESTED: "make the requested changes and get the new draft approved first",
    S.WAITING_CLIENT: "the client's answer is still expected; a client reply resumes the task",
    S.BLOCKED_RETRY_PENDING: "the retry recorded on the execution record must finish first",
    S.PARTIALLY_COMPLETED: "finish the remaining work, or report it to the requester and resume it",
}
