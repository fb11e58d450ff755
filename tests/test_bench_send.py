"""``outloop bench send --json``, run as a real subprocess with small numbers: the shape of
its JSON and its correctness counters (never its timings)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

TIMEOUT = 600
SHAPE = {
    "bench",
    "mailbox",
    "rate_per_s",
    "baseline_per_s",
    "ratio",
    "target_ratio",
    "p50_ms",
    "p99_ms",
    "sends",
    "ledgered_send_ms",
    "bare_send_ms",
    "added_by_ledger_ms",
    "ledger_commits_per_send",
    "ledger_writes_ms",
    "store_commit_ms",
    "handover_check_ms",
    "statuses",
    "duplicates",
    "lost",
    "includes",
}


def _bench_send(tmp_path: Path, *args: str) -> dict[str, Any]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OUTLOOP_")}
    env.update({"XDG_DATA_HOME": str(tmp_path / "xdg"), "PYTHONIOENCODING": "utf-8"})
    done = subprocess.run(
        [sys.executable, "-m", "mcp_server.cli", "bench", "send", *args, "--json",
         "--data-dir", str(tmp_path / "bench")],
        capture_output=True, text=True, encoding="utf-8", env=env, timeout=TIMEOUT, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.splitlines()[-1])
    assert isinstance(result, dict)
    return result


@pytest.mark.parametrize("mailbox", ["file", "memory"])
def test_bench_send_json_reports_both_rates_and_no_duplicates(tmp_path: Path, mailbox: str) -> None:
    result = _bench_send(tmp_path, "--sends", "40", "--mailbox", mailbox)
    assert set(result) >= SHAPE
    assert (result["bench"], result["mailbox"], result["sends"]) == ("send", mailbox, 40)
    assert result["rate_per_s"] > 0 and result["baseline_per_s"] > 0 and result["ratio"] > 0
    assert result["p50_ms"] <= result["p99_ms"]
    assert result["statuses"] == {"sent": 40}  # every ledgered send went out, once
    assert result["ledger_commits_per_send"] == 3  # PREPARED, ATTEMPTING, CONFIRMED
    assert (result["duplicates"], result["lost"]) == (0, 0)
    assert set(result["includes"]) == {"ledgered", "bare", "channel"}


def test_bench_send_can_run_twice_in_the_same_data_dir(tmp_path: Path) -> None:
    for _ in range(2):
        result = _bench_send(tmp_path, "--sends", "10")
        assert (result["duplicates"], result["lost"]) == (0, 0)
