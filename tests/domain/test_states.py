from __future__ import annotations

import pytest

from agent.domain.errors import CloseRefused, TransitionError, UnknownStateError
from agent.domain.states import (
    NEVER_CLOSED_FROM,
    TRANSITIONS,
    TaskState,
    after_inbound,
    check_transition,
    parse_state,
)

SEED_001_STATES = [
    "DISCOVERED", "TASK_RESOLVED", "IN_DISCOVERY", "EXECUTING", "VERIFYING", "DRAFT_READY",
    "WAITING_INTERNAL_APPROVAL", "CHANGES_REQUESTED", "APPROVED_TO_SEND", "CLIENT_REPLY_SENT",
    "WAITING_CLIENT", "PARTIALLY_COMPLETED", "BLOCKED_RETRY_PENDING", "COMPLETED",
]  # fmt: skip


def test_the_lifecycle_has_exactly_the_fourteen_states_of_the_worker_card() -> None:
    assert [s.value for s in TaskState] == SEED_001_STATES


def test_every_state_has_a_row_in_the_transition_table() -> None:
    assert set(TRANSITIONS) == set(TaskState)
    for targets in TRANSITIONS.values():
        assert targets <= set(TaskState)


@pytest.mark.parametrize(
    "state",
    ["WAITING_INTERNAL_APPROVAL", "CHANGES_REQUESTED", "WAITING_CLIENT",
     "BLOCKED_RETRY_PENDING", "PARTIALLY_COMPLETED"],
)  # fmt: skip
def test_closing_from_a_waiting_or_partial_state_is_refused_with_advice(state: str) -> None:
    with pytest.raises(CloseRefused, match=rf"a task in {state} cannot be closed: .+"):
        check_transition(TaskState(state), TaskState.COMPLETED)
    assert TaskState(state) in NEVER_CLOSED_FROM


def test_no_table_row_lets_a_never_closed_state_reach_completed() -> None:
    for state in NEVER_CLOSED_FROM:
        assert TaskState.COMPLETED not in TRANSITIONS[state]


def test_a_transition_outside_the_table_names_the_allowed_targets() -> None:
    with pytest.raises(TransitionError, match=r"may move to: .*APPROVED_TO_SEND"):
        check_transition(TaskState.WAITING_INTERNAL_APPROVAL, TaskState.CLIENT_REPLY_SENT)


def test_allowed_transitions_pass() -> None:
    for current, targets in TRANSITIONS.items():
        for target in targets:
            check_transition(current, target)


def test_an_unknown_state_name_is_a_loud_error() -> None:
    with pytest.raises(UnknownStateError, match="unknown task state 'DONE'"):
        parse_state("DONE")
    assert parse_state("WAITING_CLIENT") is TaskState.WAITING_CLIENT


def test_a_client_reply_resumes_the_same_task_from_waiting_client() -> None:
    assert after_inbound(TaskState.WAITING_CLIENT) is TaskState.TASK_RESOLVED
    assert after_inbound(TaskState.COMPLETED) is TaskState.TASK_RESOLVED
    # Work in progress keeps its state; the message is simply recorded on the task.
    assert after_inbound(TaskState.WAITING_INTERNAL_APPROVAL) is TaskState.WAITING_INTERNAL_APPROVAL
    assert after_inbound(TaskState.EXECUTING) is TaskState.EXECUTING
