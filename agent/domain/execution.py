"""Execution records: who holds an occurrence, and what came of it.

The execution record, not the task, governs: holder liveness, leases and retry state live
here and nowhere else.
"""

from __future__ import annotations

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
