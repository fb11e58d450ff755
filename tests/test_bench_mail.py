"""``outloop bench mail --json``, run as a real subprocess with small numbers: the shape of
its JSON and its correctness counters (never its timings)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.test_cli import BENCH_KEYS

SHAPE = BENCH_KEYS | {"processes", "messages", "delivered", "corrupt"}


def test_bench_mail_prints_its_figures_and_every_message_arrives_once(tmp_path: Path) -> None:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "mcp_server.cli",
            "bench",
            "mail",
            "--json",
            "--processes",
            "3",
            "--messages",
            "40",
            "--data-dir",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        env={**os.environ, "OUTLOOP_DATA_DIR": str(tmp_path)},
    )
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert set(result) == SHAPE
    assert result["bench"] == "mail" and result["processes"] == 3
    assert (result["messages"], result["delivered"]) == (120, 120)
    assert (result["duplicates"], result["lost"], result["corrupt"]) == (0, 0, 0)
    # The ratio of the unrounded rates: within what the rates' rounding (0.05) allows.
    rate, baseline = result["rate_per_s"], result["baseline_per_s"]
    low = (rate - 0.05) / (baseline + 0.05) - 0.0005
    high = (rate + 0.05) / (baseline - 0.05) + 0.0005
    assert low <= result["ratio"] <= high, (result["ratio"], rate, baseline)
    assert list(tmp_path.iterdir()) == []  # the scratch directory is removed
