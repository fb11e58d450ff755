"""The run ledger: every scanned item gets exactly one disposition per run."""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, ConfigDict

from agent.domain.dispositions import Disposition


class LedgerEntry(BaseModel):
    """One scanned item of one run."""

    model_config = ConfigDict(frozen=True)

    run_id: str
    item_ref: str
    occurrence_key: str | None = None
    disposition: Disposition | None = None
    detail: str = ""


class Reconciliation(BaseModel):
    """scanned = terminal + non_terminal + claim_race; anything unmatched failed."""

    model_config = ConfigDict(frozen=True)

    run_id: str
    scanned: int
    terminal: int
    non_terminal: int
    claim_race: int
    reconciliation_failed: int
    by_disposition: dict[str, int]
    clean: bool
    reconciled_at: datetime
