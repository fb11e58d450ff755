"""Race: many OS processes each intake the same thousands of occurrences in random order."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench import claims
from tests.conftest import REPORTED, pg_cluster

RACES = {
    # backend: (worker processes, shared occurrences); every worker takes in every
    # occurrence, so the work grows with their product (PostgreSQL's per-claim round trips
    # on 2 cores bound its size).
    "sqlite": (16, 10_000),
    "postgres": (16, 4_000),
}


@pytest.mark.slow
@pytest.mark.parametrize("backend", sorted(RACES))
def test_processes_racing_over_thousands_of_occurrences_claim_each_exactly_once(
    tmp_path: Path, backend: str
) -> None:
    workers, items = RACES[backend]
    result = claims.run(
        tmp_path,
        backend=backend,
        url=pg_cluster().url if backend == "postgres" else None,
        workers=workers,
        items=items,
        per_thread=4,
        mode="intake",
    )
    REPORTED[f"race {backend} {workers}x{items}"] = {
        k: result[k]
        for k in ("claims", "tasks", "duplicates", "lost", "busy_errors", "retries", "attempts")
    }
    assert result["backend"] == backend
    assert result["attempts"] == workers * items
    assert result["claims"] == items
    assert result["executions_done"] == items
    assert result["tasks"] == result["threads"] == items // 4  # one task per thread
    assert result["duplicates"] == 0 and result["lost"] == 0
    assert result["busy_errors"] == 0
    assert result["runs_clean"] == workers and result["scanned_per_run"] == [items]
    assert result["integrity_check"] == "ok"
