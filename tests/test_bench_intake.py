"""``outloop bench intake --provider imap --json``, run as a real subprocess with a small
mailbox: the shape of its JSON and its correctness counters (never its timings)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from bench import intake_imap

TIMEOUT = 600
SHAPE = {
    "bench",
    "provider",
    "messages",
    "threads",
    "rounds",
    "page_size",
    "rate_per_s",
    "baseline_per_s",
    "ratio",
    "target_ratio",
    "intake_ms_per_message",
    "bare_fetch_ms_per_message",
    "p50_ms",
    "p99_ms",
    "duplicates",
    "lost",
    "runs_clean",
    "item_errors",
    "dispositions",
    "write_transactions_per_message",
    "store_commit_ms",
    "intake_breakdown",
    "bare_breakdown",
    "fill",
    "includes",
}
BREAKDOWN = {
    "total_s",
    "scan_s",
    "claim_triage_report_s",
    "reconcile_s",
    "imap_s",
    "imap_by_command",
    "normalize_s",
    "store_s",
    "store_top",
    "write_transactions",
    "write_transactions_s",
    "core_s",
}


def _bench(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OUTLOOP_")}
    env.update({"XDG_DATA_HOME": str(tmp_path / "xdg"), "PYTHONIOENCODING": "utf-8"})
    return subprocess.run(
        [sys.executable, "-m", "mcp_server.cli", "bench", "intake", *args,
         "--data-dir", str(tmp_path / "bench")],
        capture_output=True, text=True, encoding="utf-8", env=env, timeout=TIMEOUT, check=False,
    )  # fmt: skip


def test_bench_intake_json_reports_both_rates_and_no_duplicates_or_losses(
    tmp_path: Path,
) -> None:
    done = _bench(tmp_path, "--provider", "imap", "--messages", "60", "--rounds", "2", "--json")
    assert done.returncode == 0, done.stderr
    result: dict[str, Any] = json.loads(done.stdout.splitlines()[-1])
    assert set(result) >= SHAPE
    assert (result["bench"], result["provider"], result["messages"]) == ("intake", "imap", 60)
    assert (result["threads"], result["rounds"]) == (15, 2)
    assert result["rate_per_s"] > 0 and result["baseline_per_s"] > 0 and result["ratio"] > 0
    assert result["p50_ms"] <= result["p99_ms"]
    assert (result["duplicates"], result["lost"]) == (0, 0)
    assert (result["runs_clean"], result["item_errors"]) == (2, 0)
    # Every message of every round was claimed and triaged into one task per thread's item.
    assert sum(result["dispositions"].values()) == 120
    assert "RECONCILIATION_FAILED" not in result["dispositions"]
    breakdown = result["intake_breakdown"]
    assert set(breakdown) >= BREAKDOWN
    assert breakdown["write_transactions"] > 0
    assert {"open_folder", "uid_search", "uid_fetch"} <= set(breakdown["imap_by_command"])
    assert set(result["bare_breakdown"]["imap_by_command"]) == {
        "open_folder",
        "uid_search",
        "uid_fetch",
    }
    assert result["fill"]["bytes"] > 0
    assert set(result["includes"]) == {"intake", "bare"}


def test_bench_intake_offers_only_the_imap_provider(tmp_path: Path) -> None:
    done = _bench(tmp_path, "--provider", "maildir", "--json")
    assert done.returncode == 2
    assert "--provider" in done.stderr and "'imap'" in done.stderr


def test_bench_intake_refuses_to_run_without_root_saying_why(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(intake_imap.os, "geteuid", lambda: 1000)

    def no_server(_root: Path) -> intake_imap.Dovecot:
        raise AssertionError("no server is started without root")

    with pytest.raises(intake_imap.BenchError, match="must be started as root"):
        intake_imap.run(tmp_path, no_server, messages=10)
