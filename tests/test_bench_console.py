"""``outloop bench console``: the queue page against the bare template render of its rows."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from mcp_server.cli import main


def test_bench_console_json_reports_both_renders_of_every_row_and_their_ratio(
    tmp_path: Path,
) -> None:
    done = CliRunner().invoke(
        main,
        [
            "bench",
            "console",
            "--tasks",
            "40",
            "--rounds",
            "3",
            "--json",
            "--data-dir",
            str(tmp_path),
        ],
    )
    assert done.exit_code == 0, done.output
    result = json.loads(done.stdout)
    assert result["benchmark"] == "console" and result["tasks"] == 40
    assert result["rows_shown"] == 40  # every open task is a row of the page measured
    page, baseline = result["page"], result["baseline"]
    assert page["p50_ms"] > 0 and baseline["p50_ms"] > 0
    assert result["ratio"] == round(baseline["p50_ms"] / page["p50_ms"], 3)
    assert result["meets_target"] == (result["ratio"] >= result["target_ratio"] == 0.5)
