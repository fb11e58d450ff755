"""Execution records: who holds an occurrence, and what came of it.

The execution record, not the task, governs: holder liveness, leases and retry state live
here and nowhere else.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from enum import StrEnum

from pydantic import BaseModel, ConfigDict

from agent.domain.dispositions import Disposition


class ExecutionState(StrEnum):
    CLAIMED = "CLAIMED"
    DONE = "DONE"
    RETRY_PENDING = "RETRY_PENDING"


class ClaimOutcome(StrEnum):
    CLAIMED = "CLAIMED"
    EXECUTION_ALREADY_CLAIMED = "EXECUTION_ALREADY_CLAIMED"
    EXECUTION_ALREADY_DONE = "EXECUTION_ALREADY_DONE"

    def disposition(self) -> Disposition:
        if self is ClaimOutcome.CLAIMED:
            raise ValueError("a successful claim has no claim-race disposition")
        return Disposition(self.value)


class ExecutionRecord(BaseModel):
    model_config = ConfigDict(frozen=True)

    key: str
    service: str
    holder: str
    state: ExecutionState
    generation: int
    lease_expires_at: datetime
    retry_at: datetime | None = None
    outcome: Disposition | None = None
    result: str | None = None
    run_id: str | None = None
    item_ref: str | None = None
    task_id: str | None = None
    claimed_at: datetime
    reported_at: datetime | None = None


def contest(
    existing: ExecutionRecord, now: datetime, holder_alive: Callable[[str], bool]
) -> ClaimOutcome | None:
    """What a new claim gets against an existing execution record: None when it may take
    the occurrence over (a due retry, an expired lease, a provably dead holder), else the
    claim-race outcome. DONE is final."""
    if existing.state is ExecutionState.DONE:
        return ClaimOutcome.EXECUTION_ALREADY_DONE
    if existing.state is ExecutionState.RETRY_PENDING:
        due = existing.retry_at is None or existing.retry_at <= now
        return None if due else ClaimOutcome.EXECUTION_ALREADY_CLAIMED
    if existing.lease_expires_at <= now or not holder_alive(existing.holder):
        return None
    return ClaimOutcome.EXECUTION_ALREADY_CLAIMED
