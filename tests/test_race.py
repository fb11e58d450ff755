"""Race: many OS processes each intake the same 10,000 occurrences in random order."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench import claims
from tests.conftest import REPORTED, pg_cluster

RACES = {
    # backend: worker processes
    "sqlite": 16,
    "postgres": 32,
}


@pytest.mark.slow
@pytest.mark.parametrize("backend", sorted(RACES))
def test_processes_racing_over_ten_thousand_occurrences_claim_each_exactly_once(
    tmp_path: Path, backend: str
) -> None:
    workers = RACES[backend]
    result = claims.run(
        tmp_path,
        backend=backend,
        url=pg_cluster().url if backend == "postgres" else None,
        workers=workers,
        items=10_000,
        per_thread=4,
        mode="intake",
    )
    REPORTED[f"race {backend} {workers}x10000"] = {
        k: result[k]
        for k in ("claims", "tasks", "duplicates", "lost", "busy_errors", "retries", "attempts")
    }
    assert result["backend"] == backend
    assert result["attempts"] == workers * 10_000
    assert result["claims"] == 10_000
    assert result["executions_done"] == 10_000
    assert result["tasks"] == result["threads"] == 2_500  # one task per thread
    assert result["duplicates"] == 0 and result["lost"] == 0
    assert result["busy_errors"] == 0
    assert result["runs_clean"] == workers and result["scanned_per_run"] == [10_000]
    assert result["integrity_check"] == "ok"
