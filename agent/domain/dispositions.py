"""Dispositions: what happened to one scanned item in one run (seed 000, section 6).

A disposition is about an item in a run; a task state is about where the task stands. An
item can be CLIENT_REPLY_SENT while its task waits in WAITING_CLIENT. docs/dispositions.md
has the full mapping.
"""

from __future__ import annotations

from enum import StrEnum

from agent.domain.errors import UnknownStateError
from agent.domain.states import TaskState


class Disposition(StrEnum):
    # terminal
    CLOSED_NO_REPLY_NEEDED = "CLOSED_NO_REPLY_NEEDED"
    CLIENT_REPLY_SENT = "CLIENT_REPLY_SENT"
    ALREADY_ANSWERED = "ALREADY_ANSWERED"
    NOISE_EXCLUDED = "NOISE_EXCLUDED"
    # non-terminal
    WAITING_INTERNAL_APPROVAL = "WAITING_INTERNAL_APPROVAL"
    WAITING_CLIENT = "WAITING_CLIENT"
    ACK_SENT = "ACK_SENT"
    QUEUED = "QUEUED"
    ESCALATED = "ESCALATED"
    CONTEXT_GAP_DISCOVERY = "CONTEXT_GAP_DISCOVERY"
    AWAITING_ASSIGNMENT = "AWAITING_ASSIGNMENT"
    # claim race: covered although deliberately without a task
    EXECUTION_ALREADY_CLAIMED = "EXECUTION_ALREADY_CLAIMED"
    EXECUTION_ALREADY_DONE = "EXECUTION_ALREADY_DONE"
    # reconciliation found no outcome for the item in this run
    RECONCILIATION_FAILED = "RECONCILIATION_FAILED"


D = Disposition

TERMINAL: frozenset[Disposition] = frozenset(
    {D.CLOSED_NO_REPLY_NEEDED, D.CLIENT_REPLY_SENT, D.ALREADY_ANSWERED, D.NOISE_EXCLUDED}
)
NON_TERMINAL: frozenset[Disposition] = frozenset(
    {
        D.WAITING_INTERNAL_APPROVAL,
        D.WAITING_CLIENT,
        D.ACK_SENT,
        D.QUEUED,
        D.ESCALATED,
        D.CONTEXT_GAP_DISCOVERY,
        D.AWAITING_ASSIGNMENT,
    }
)
CLAIM_RACE: frozenset[Disposition] = frozenset(
    {D.EXECUTION_ALREADY_CLAIMED, D.EXECUTION_ALREADY_DONE}
)
#: Outcomes a run may claim as covered; RECONCILIATION_FAILED is deliberately not one.
COVERED: frozenset[Disposition] = TERMINAL | NON_TERMINAL | CLAIM_RACE


def parse_disposition(name: str) -> Disposition:
    try:
        return Disposition(name)
    except ValueError:
        raise UnknownStateError(
            f"unknown disposition {name!r}; an unknown outcome is a defect, never a completion. "
            "Known: " + ", ".join(d.value for d in Disposition)
        ) from None


class GateKind(StrEnum):
    """Kinds of open gate a task can carry. Each has a waiting disposition."""

    INTERNAL_APPROVAL = "internal_approval"
    CLIENT_RESPONSE = "client_response"
    CONTEXT_GAP = "context_gap"
    ASSIGNMENT = "assignment"
    RECIPIENT_CLASS = "recipient_class"
    PREFLIGHT = "preflight"
    ESCALATION = "escalation"


WAITING_FOR_GATE: dict[GateKind, Disposition] = {
    GateKind.INTERNAL_APPROVAL: D.WAITING_INTERNAL_APPROVAL,
    GateKind.RECIPIENT_CLASS: D.WAITING_INTERNAL_APPROVAL,
    GateKind.CLIENT_RESPONSE: D.WAITING_CLIENT,
    GateKind.CONTEXT_GAP: D.CONTEXT_GAP_DISCOVERY,
    GateKind.ASSIGNMENT: D.AWAITING_ASSIGNMENT,
    GateKind.PREFLIGHT: D.ESCALATED,
    GateKind.ESCALATION: D.ESCALATED,
}

# Order in which an open gate decides the waiting disposition when several are open.
_GATE_PRIORITY: tuple[GateKind, ...] = (
    GateKind.PREFLIGHT,
    GateKind.ESCALATION,
    GateKind.INTERNAL_APPROVAL,
    GateKind.RECIPIENT_CLASS,
    GateKind.CONTEXT_GAP,
    GateKind.ASSIGNMENT,
    GateKind.CLIENT_RESPONSE,
)


def settle(disposition: Disposition, open_gates: frozenset[GateKind]) -> Disposition:
    """A terminal disposition with an unsatisfied gate is self-contradictory: rewrite it.

    Returns the disposition unchanged when it is not terminal or no gate is open.
    """
    if disposition not in TERMINAL or not open_gates:
        return disposition
    for kind in _GATE_PRIORITY:
        if kind in open_gates:
            return WAITING_FOR_GATE[kind]
    raise UnknownStateError(f"open gates {sorted(open_gates)} have no waiting disposition")


#: The task state an item's disposition leaves its task in (None: the task is not touched).
TASK_STATE_FOR: dict[Disposition, TaskState | None] = {
    D.CLOSED_NO_REPLY_NEEDED: TaskState.COMPLETED,
    D.CLIENT_REPLY_SENT: TaskState.WAITING_CLIENT,
    D.ALREADY_ANSWERED: TaskState.COMPLETED,
    D.NOISE_EXCLUDED: TaskState.COMPLETED,
    D.WAITING_INTERNAL_APPROVAL: TaskState.WAITING_INTERNAL_APPROVAL,
    D.WAITING_CLIENT: TaskState.WAITING_CLIENT,
    D.ACK_SENT: TaskState.TASK_RESOLVED,
    D.QUEUED: TaskState.TASK_RESOLVED,
    D.ESCALATED: TaskState.TASK_RESOLVED,
    D.CONTEXT_GAP_DISCOVERY: TaskState.IN_DISCOVERY,
    D.AWAITING_ASSIGNMENT: TaskState.TASK_RESOLVED,
    D.EXECUTION_ALREADY_CLAIMED: None,
    D.EXECUTION_ALREADY_DONE: None,
    D.RECONCILIATION_FAILED: None,
}

#: The disposition a follow-up message gets when it lands on a task already in this state.
DISPOSITION_FOR_STATE: dict[TaskState, Disposition] = {
    TaskState.DISCOVERED: D.QUEUED,
    TaskState.TASK_RESOLVED: D.QUEUED,
    TaskState.IN_DISCOVERY: D.CONTEXT_GAP_DISCOVERY,
    TaskState.EXECUTING: D.QUEUED,
    TaskState.VERIFYING: D.QUEUED,
    TaskState.DRAFT_READY: D.QUEUED,
    TaskState.WAITING_INTERNAL_APPROVAL: D.WAITING_INTERNAL_APPROVAL,
    TaskState.CHANGES_REQUESTED: D.WAITING_INTERNAL_APPROVAL,
    TaskState.APPROVED_TO_SEND: D.QUEUED,
    TaskState.CLIENT_REPLY_SENT: D.QUEUED,
    TaskState.WAITING_CLIENT: D.WAITING_CLIENT,
    TaskState.PARTIALLY_COMPLETED: D.QUEUED,
    TaskState.BLOCKED_RETRY_PENDING: D.QUEUED,
    TaskState.COMPLETED: D.QUEUED,
}
