from __future__ import annotations

import pytest

from agent.domain.dispositions import (
    CLAIM_RACE,
    DISPOSITION_FOR_STATE,
    NON_TERMINAL,
    TASK_STATE_FOR,
    TERMINAL,
    Disposition,
    GateKind,
    parse_disposition,
    settle,
)
from agent.domain.errors import UnknownStateError
from agent.domain.states import TaskState


def test_terminal_non_terminal_and_claim_race_partition_every_covered_outcome() -> None:
    assert {d.value for d in TERMINAL} == {
        "CLOSED_NO_REPLY_NEEDED", "CLIENT_REPLY_SENT", "ALREADY_ANSWERED", "NOISE_EXCLUDED",
    }  # fmt: skip
    assert {d.value for d in NON_TERMINAL} == {
        "WAITING_INTERNAL_APPROVAL", "WAITING_CLIENT", "ACK_SENT", "QUEUED", "ESCALATED",
        "CONTEXT_GAP_DISCOVERY", "AWAITING_ASSIGNMENT",
    }  # fmt: skip
    assert {d.value for d in CLAIM_RACE} == {"EXECUTION_ALREADY_CLAIMED", "EXECUTION_ALREADY_DONE"}
    assert not (TERMINAL & NON_TERMINAL or TERMINAL & CLAIM_RACE or NON_TERMINAL & CLAIM_RACE)
    rest = set(Disposition) - TERMINAL - NON_TERMINAL - CLAIM_RACE
    assert rest == {Disposition.RECONCILIATION_FAILED}


def test_an_unknown_disposition_is_a_loud_error_never_a_completion() -> None:
    with pytest.raises(UnknownStateError, match="never a completion"):
        parse_disposition("DONE")


@pytest.mark.parametrize(
    ("gate", "expected"),
    [
        (GateKind.INTERNAL_APPROVAL, Disposition.WAITING_INTERNAL_APPROVAL),
        (GateKind.CLIENT_RESPONSE, Disposition.WAITING_CLIENT),
        (GateKind.CONTEXT_GAP, Disposition.CONTEXT_GAP_DISCOVERY),
        (GateKind.ASSIGNMENT, Disposition.AWAITING_ASSIGNMENT),
        (GateKind.PREFLIGHT, Disposition.ESCALATED),
    ],
)
def test_a_terminal_disposition_with_an_open_gate_is_rewritten_to_its_waiting_state(
    gate: GateKind, expected: Disposition
) -> None:
    for terminal in TERMINAL:
        assert settle(terminal, frozenset({gate})) is expected


def test_settle_leaves_non_terminal_outcomes_and_gate_free_terminals_alone() -> None:
    assert settle(Disposition.QUEUED, frozenset({GateKind.INTERNAL_APPROVAL})) is Disposition.QUEUED
    assert settle(Disposition.CLIENT_REPLY_SENT, frozenset()) is Disposition.CLIENT_REPLY_SENT


def test_approval_outranks_other_gates_when_several_are_open() -> None:
    gates = frozenset({GateKind.CLIENT_RESPONSE, GateKind.INTERNAL_APPROVAL})
    assert settle(Disposition.CLIENT_REPLY_SENT, gates) is Disposition.WAITING_INTERNAL_APPROVAL


def test_every_disposition_and_state_has_a_documented_mapping() -> None:
    assert set(TASK_STATE_FOR) == set(Disposition)
    assert set(DISPOSITION_FOR_STATE) == set(TaskState)
    # An item can be CLIENT_REPLY_SENT while its task waits for the client.
    assert TASK_STATE_FOR[Disposition.CLIENT_REPLY_SENT] is TaskState.WAITING_CLIENT
    for race in CLAIM_RACE:
        assert TASK_STATE_FOR[race] is None
