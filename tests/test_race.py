"""Race: many OS processes each intake the same 10,000 occurrences in random order."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench import claims
from tests.conftest import REPORTED, pg_cluster


@pytest.mark.slow
def test_sixteen_processes_racing_over_ten_thousand_occurrences_claim_each_exactly_once(
    tmp_path: Path,
) -> None:
    result = claims.run(tmp_path, workers=16, items=10_000, per_thread=4, mode="intake")
    REPORTED["race sqlite 16x10000"] = {
        k: result[k] for k in ("claims", "tasks", "duplicates", "lost", "busy_errors", "attempts")
    }
    assert result["attempts"] == 16 * 10_000
    assert result["claims"] == 10_000
    assert result["executions_done"] == 10_000
    assert result["tasks"] == result["threads"] == 2_500  # one task per thread
    assert result["duplicates"] == 0 and result["lost"] == 0
    assert result["busy_errors"] == 0
    assert result["runs_clean"] == 16 and result["scanned_per_run"] == [10_000]
    assert result["integrity_check"] == "ok"


@pytest.mark.slow
def test_thirty_two_processes_racing_over_ten_thousand_occurrences_on_postgres(
    tmp_path: Path,
) -> None:
    result = claims.run(
        tmp_path,
        backend="postgres",
        url=pg_cluster().url,
        workers=32,
        items=10_000,
        per_thread=4,
        mode="intake",
    )
    REPORTED["race postgres 32x10000"] = {
        k: result[k]
        for k in ("claims", "tasks", "duplicates", "lost", "busy_errors", "retries", "attempts")
    }
    assert result["backend"] == "postgres"
    assert result["attempts"] == 32 * 10_000
    assert result["claims"] == 10_000
    assert result["executions_done"] == 10_000
    assert result["tasks"] == result["threads"] == 2_500  # one task per thread
    assert result["duplicates"] == 0 and result["lost"] == 0
    assert result["busy_errors"] == 0
    assert result["runs_clean"] == 32 and result["scanned_per_run"] == [10_000]
    assert result["integrity_check"] == "ok"
