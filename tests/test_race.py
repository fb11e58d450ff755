"""Race: many OS processes each intake the same hundreds of occurrences in random order."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench import claims
from tests.conftest import REPORTED, pg_cluster

RACES = {
    # backend: (worker processes, shared occurrences). Every worker takes in every
    # occurrence, four to a thread, each in its own random order; released together, they
    # race over the same few hundred occurrences at once, so many are claimed by several at
    # the same moment (more occurrences would only lengthen the run, not add contention).
    "sqlite": (8, 600),
    "postgres": (8, 500),
}


@pytest.mark.slow
@pytest.mark.parametrize("backend", sorted(RACES))
def test_processes_racing_over_hundreds_of_occurrences_claim_each_exactly_once(
    tmp_path: Path, backend: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The benchmark first measures a throughput baseline (plain inserts by as many
    # processes): a figure for `outloop bench claims`, no part of this guarantee.
    monkeypatch.setattr(claims, "_baseline", lambda *_args: (1.0, 1.0))
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
