"""The run ledger: every scanned item gets exactly one disposition per run."""

from __future__ import annotations

from collections.abc import Callable
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


class OpenRun(BaseModel):
    """A run not yet reconciled: who holds it, and until when its lease runs."""

    model_config = ConfigDict(frozen=True)

    run_id: str
    holder: str
    lease_expires_at: datetime | None = None

    def stale(self, now: datetime, holder_alive: Callable[[str], bool]) -> bool:
        """A run is left to reconcile when its holder is provably dead (same host), or
        when its lease ran out (any host: a worker renews its run's lease while it works)."""
        expired = self.lease_expires_at is not None and self.lease_expires_at <= now
        return expired or not holder_alive(self.holder)


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
