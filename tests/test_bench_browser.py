"""``outloop bench browser --json``, run as a real subprocess with two rounds: the shape of
its JSON, positive figures and its correctness counters (never its timings)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.browser import chromium_executable

TIMEOUT = 600
SHAPE = {
    "bench",
    "channel",
    "rounds",
    "warmup_rounds",
    "rate_per_s",
    "baseline_per_s",
    "ratio",
    "ratio_is",
    "target_ratio",
    "within_target",
    "adapter_median_s",
    "baseline_median_s",
    "p50_ms",
    "p99_ms",
    "baseline_p50_ms",
    "baseline_p99_ms",
    "adapter_breakdown",
    "baseline_breakdown",
    "sign_in_s",
    "read_back",
    "duplicates",
    "lost",
    "includes",
    "chromium",
    "cpus",
}
ADAPTER_PHASES = {"prepare_s", "send_s", "find_sent_s"}
BASELINE_PHASES = {"reply_s", "read_back_s"}
LOADS = {"page_loads_per_round", "requests_per_round"}


def _bench_browser(tmp_path: Path, *args: str) -> dict[str, Any]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OUTLOOP_")}
    env.update(
        {
            "XDG_DATA_HOME": str(tmp_path / "xdg"),
            "PYTHONIOENCODING": "utf-8",
            "OUTLOOP_BROWSER_EXECUTABLE": chromium_executable(),
        }
    )
    done = subprocess.run(
        [sys.executable, "-m", "mcp_server.cli", "bench", "browser", *args, "--json",
         "--data-dir", str(tmp_path / "bench")],
        capture_output=True, text=True, encoding="utf-8", env=env, timeout=TIMEOUT, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "round 2/2" in done.stderr  # progress goes to standard error
    result = json.loads(done.stdout.splitlines()[-1])
    assert isinstance(result, dict)
    return result


def _positive(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and value > 0


def test_bench_browser_json_reports_both_medians_their_ratio_and_every_copy_read_back(
    tmp_path: Path,
) -> None:
    result = _bench_browser(tmp_path, "--rounds", "2")
    assert set(result) >= SHAPE
    assert (result["bench"], result["rounds"], result["warmup_rounds"]) == ("browser", 2, 1)
    for name in ("rate_per_s", "baseline_per_s", "ratio", "adapter_median_s",
                 "baseline_median_s", "p50_ms", "p99_ms", "sign_in_s"):  # fmt: skip
        assert _positive(result[name]), name
    assert result["p50_ms"] <= result["p99_ms"]
    assert result["baseline_p50_ms"] <= result["baseline_p99_ms"]
    assert result["target_ratio"] == 1.5
    assert result["within_target"] == (result["ratio"] <= result["target_ratio"])
    adapter, baseline = result["adapter_breakdown"], result["baseline_breakdown"]
    assert set(adapter) == ADAPTER_PHASES | LOADS
    assert set(baseline) == BASELINE_PHASES | LOADS
    assert all(_positive(v) for v in (*adapter.values(), *baseline.values()))
    # Two sends a round, each copy found in Sent Items once and read back as ours.
    assert result["read_back"] == 4
    assert (result["duplicates"], result["lost"]) == (0, 0)
    assert set(result["includes"]) == {"adapter", "baseline"}
