"""``outloop bench intake --provider imap|gmail|graph --json``, run as a real subprocess with
a small mailbox: the shape of its JSON and its correctness counters (never its timings)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from bench import intake_api, intake_imap

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
API_BREAKDOWN = (BREAKDOWN - {"imap_s", "imap_by_command"}) | {"http_s", "http_by_request"}


def _bench(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OUTLOOP_")}
    env.update({"XDG_DATA_HOME": str(tmp_path / "xdg"), "PYTHONIOENCODING": "utf-8"})
    return subprocess.run(
        [sys.executable, "-m", "mcp_server.cli", "bench", "intake", *args,
         "--data-dir", str(tmp_path / "bench")],
        capture_output=True, text=True, encoding="utf-8", env=env, timeout=TIMEOUT, check=False,
    )  # fmt: skip


def _measured(tmp_path: Path, provider: str, messages: int, rounds: int) -> dict[str, Any]:
    """The bench's JSON for a small mailbox (``messages`` of 4 to a thread), with what holds
    for every provider checked: every message of every round claimed and triaged into one
    task per thread, nothing doubled, nothing lost, every round reconciled clean."""
    done = _bench(
        tmp_path, "--provider", provider, "--messages", str(messages), "--rounds", str(rounds),
        "--json",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    result: dict[str, Any] = json.loads(done.stdout.splitlines()[-1])
    assert set(result) >= SHAPE
    assert (result["bench"], result["provider"]) == ("intake", provider)
    assert (result["messages"], result["threads"], result["rounds"]) == (
        messages,
        messages // 4,
        rounds,
    )
    assert result["rate_per_s"] > 0 and result["baseline_per_s"] > 0 and result["ratio"] > 0
    assert result["p50_ms"] <= result["p99_ms"]
    assert (result["duplicates"], result["lost"]) == (0, 0)
    assert (result["runs_clean"], result["item_errors"]) == (rounds, 0)
    assert sum(result["dispositions"].values()) == messages * rounds
    assert "RECONCILIATION_FAILED" not in result["dispositions"]
    assert result["intake_breakdown"]["write_transactions"] > 0
    assert result["fill"]["bytes"] > 0
    assert set(result["includes"]) == {"intake", "bare"}
    return result


def test_bench_intake_json_reports_both_rates_and_no_duplicates_or_losses(
    tmp_path: Path,
) -> None:
    result = _measured(tmp_path, "imap", 60, 2)
    breakdown = result["intake_breakdown"]
    assert set(breakdown) >= BREAKDOWN
    assert {"open_folder", "uid_search", "uid_fetch"} <= set(breakdown["imap_by_command"])
    assert set(result["bare_breakdown"]["imap_by_command"]) == {
        "open_folder",
        "uid_search",
        "uid_fetch",
    }


def test_bench_intake_offers_the_imap_gmail_and_graph_providers_only(tmp_path: Path) -> None:
    done = _bench(tmp_path, "--provider", "maildir", "--json")
    assert done.returncode == 2
    assert "--provider" in done.stderr
    assert all(f"'{name}'" in done.stderr for name in ("imap", "gmail", "graph"))


def test_bench_intake_refuses_to_run_without_root_saying_why(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(intake_imap.os, "geteuid", lambda: 1000)

    def no_server(_root: Path) -> intake_imap.Dovecot:
        raise AssertionError("no server is started without root")

    with pytest.raises(intake_imap.BenchError, match="must be started as root"):
        intake_imap.run(tmp_path, no_server, messages=10)


@pytest.mark.parametrize(
    ("provider", "requests"),
    [
        ("gmail", {"GET users/me/messages", "GET users/me/messages/{id}", "POST token"}),
        (
            "graph",
            {"GET me/mailFolders/inbox/messages", "GET me/messages/{id}/$value", "POST token"},
        ),
    ],
)
def test_bench_intake_through_an_api_reports_both_rates_and_no_duplicates_or_losses(
    tmp_path: Path, provider: str, requests: set[str]
) -> None:
    result = _measured(tmp_path, provider, 12, 1)
    breakdown = result["intake_breakdown"]
    assert set(breakdown) >= API_BREAKDOWN
    assert requests <= set(breakdown["http_by_request"])
    assert requests <= set(result["bare_breakdown"]["http_by_request"])
    assert result["bare_breakdown"]["fetches"] == intake_api.BARE_REPEATS


def test_bench_intake_through_an_api_names_the_providers_it_measures(tmp_path: Path) -> None:
    def no_server(_log: Path) -> intake_api.MockServer:
        raise AssertionError("no server is started for a provider the bench does not know")

    with pytest.raises(ValueError, match="gmail, graph"):
        intake_api.run(tmp_path, no_server, provider="imap", messages=10)
