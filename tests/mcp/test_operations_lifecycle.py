"""A lifecycle run through the MCP server over HTTP, as an operator's monitoring sees it: the
server's stderr carries one JSON decision record per claim, gate verdict, send, read-back and
reconciliation, and its /metrics (read with the Prometheus client's own parser) moved by
exactly as much; /healthz and /readyz answer; each route wants the metrics token; and no
record holds the mail's subject, body or the sender's display name."""

from __future__ import annotations

import json
import secrets
import subprocess
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import anyio
import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import wait_for
from tests.mcp.conftest import OperatorStation
from tests.mcp.lifecycle import drive_lifecycle
from tests.mcp.test_transports import READY_TIMEOUT, SERVE, _bearer, _env, _ready_line

pytestmark = pytest.mark.anyio

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


class Stderr:
    """A process's stderr, drained by a thread as it is written."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self.lines: list[str] = []
        assert proc.stderr is not None
        stream = proc.stderr
        self._thread = threading.Thread(target=lambda: self.lines.extend(stream), daemon=True)
        self._thread.start()

    def json(self) -> list[dict[str, Any]]:
        return [json.loads(line) for line in self.lines if line.startswith("{")]

    def metrics_url(self) -> str:
        wait_for(lambda: any("metrics" in line for line in self.json()), "the metrics line", 30)
        return next(d["metrics"] for d in self.json() if "metrics" in d)

    def join(self) -> None:
        self._thread.join(timeout=15)


@contextmanager
def observed_server(
    station: OperatorStation, mcp_token: str, metrics_token: str
) -> Iterator[tuple[str, str, subprocess.Popen[str], Stderr]]:
    argv = [*SERVE, "--transport", "http", "--port", "0", "--metrics-port", "0",
            "--log-format", "json", "--data-dir", str(station.data_dir)]  # fmt: skip
    env = _env(OUTLOOP_MCP_TOKEN=mcp_token, OUTLOOP_METRICS_TOKEN=metrics_token)
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env)  # fmt: skip
    err = Stderr(proc)
    try:
        assert proc.stdout is not None
        url = _ready_line(proc.stdout, proc)["url"]
        yield url, err.metrics_url(), proc, err
    finally:
        proc.terminate()
        proc.wait(timeout=15)
        err.join()
        for pipe in (proc.stdout, proc.stderr):
            if pipe is not None:
                pipe.close()


def scrape(url: str, token: str) -> Samples:
    answer = httpx.get(url, headers={"Authorization": f"Bearer {token}"}, timeout=30)
    assert answer.status_code == 200, answer.text
    assert answer.headers["content-type"].startswith("text/plain; version=0.0.4")
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(answer.text)
        for s in family.samples
    }


def probe(
    base: str, token: str, other_token: str
) -> tuple[httpx.Response, httpx.Response, list[httpx.Response], httpx.Response]:
    """/healthz and /readyz with the token; each route without it; /metrics with another."""
    bearer = {"Authorization": f"Bearer {token}"}
    return (
        httpx.get(f"{base}/healthz", headers=bearer),
        httpx.get(f"{base}/readyz", headers=bearer),
        [httpx.get(f"{base}{route}") for route in ("/metrics", "/healthz", "/readyz")],
        httpx.get(f"{base}/metrics", headers={"Authorization": f"Bearer {other_token}"}),
    )


def total(found: Samples, name: str, **labels: str) -> float:
    """The sum of ``name``'s samples whose labels include ``labels``."""
    return sum(
        value
        for (sample, have), value in found.items()
        if sample == name and set(labels.items()) <= set(have)
    )


async def test_a_lifecycle_through_the_mcp_server_is_logged_and_counted(
    station: OperatorStation,
) -> None:
    mcp_token, metrics_token = secrets.token_urlsafe(32), secrets.token_urlsafe(32)
    with observed_server(station, mcp_token, metrics_token) as (url, metrics_url, proc, err):
        base = metrics_url.removesuffix("/metrics")
        before = scrape(metrics_url, metrics_token)
        assert total(before, "outloop_claims_total") == 0
        with anyio.fail_after(READY_TIMEOUT):
            async with _bearer(url, mcp_token) as client:
                done = await drive_lifecycle(client, station, wall_clock=True)
        after = scrape(metrics_url, metrics_token)
        health, ready, refused, wrong = probe(base, metrics_token, mcp_token)
    records = [r for r in err.json() if "event" in r]
    by_event: dict[str, list[dict[str, Any]]] = {}
    for record in records:
        by_event.setdefault(record["event"], []).append(record)
    task_id, send_id = done["task_id"], done["sent"]["send_id"]

    # The records: the client's request and the approver's reply claimed, two clean runs, the
    # gate pending (approval) then ready, the reply sent once and read back (the Maildir
    # outbox is never a delivery, so the read-back fails on exactly that).
    assert [c["outcome"] for c in by_event["claim"]] == ["CLAIMED", "CLAIMED"]
    assert all(c["duration_seconds"] >= 0 and c["run_id"] for c in by_event["claim"])
    claimed_items = [c["item_ref"] for c in by_event["claim"]]
    assert [d["item_ref"] for d in by_event["disposition"]] == claimed_items
    assert all(d["disposition"] and d["task_id"] == task_id for d in by_event["disposition"])
    assert [(r["scanned"], r["clean"]) for r in by_event["reconciliation"]] == [
        (1, True),
        (1, True),
    ]
    gates = [(g["verdict"], g["blockers"]) for g in by_event["gate"] if g["task_id"] == task_id]
    assert gates[0][0] == "pending" and "approval_missing" in gates[0][1]
    assert ("ready", "") in gates
    reply = [s for s in by_event["send"] if s["send_key"] == send_id]
    assert [(s["state"], s["channel"], s["outcome"]) for s in reply] == [
        ("CONFIRMED", "local", "sent")
    ]
    [read] = by_event["read_back"]
    assert (read["send_key"], read["result"], read["checks_failed"]) == (
        send_id,
        "failed",
        "delivered",
    )
    assert read["level"] == "warning"

    # The metrics moved exactly as the records say.
    def moved(name: str, **labels: str) -> float:
        return total(after, name, **labels) - total(before, name, **labels)

    ws = by_event["claim"][0]["workspace_id"]
    assert moved("outloop_claims_total", workspace=ws, outcome="CLAIMED") == 2
    assert moved("outloop_claim_duration_seconds_count") == 2
    assert moved("outloop_items_scanned_total", workspace=ws) == 2
    assert moved("outloop_dispositions_total", workspace=ws) == 2
    assert moved("outloop_reconciliations_total", workspace=ws, clean="true") == 2
    assert moved("outloop_reconciliation_failures_total") == 0
    assert moved("outloop_gate_checks_total", workspace=ws, verdict="pending") == len(
        [g for g in by_event["gate"] if g["verdict"] == "pending"]
    )
    assert moved("outloop_sends_total", workspace=ws, state="CONFIRMED", channel="local") == len(
        by_event["send"]
    )
    assert moved("outloop_send_duration_seconds_count", channel="local") == len(by_event["send"])
    assert moved("outloop_read_backs_total", workspace=ws, result="failed") == 1
    assert moved("outloop_read_back_duration_seconds_count") == 1
    # The gauges, read from the store: the task waits for a read-back that passes.
    assert total(after, "outloop_store_up") == 1
    assert total(after, "outloop_open_tasks", workspace=ws, state="APPROVED_TO_SEND") == 1
    assert total(after, "outloop_unsettled_sends", workspace=ws) == 0
    assert total(after, "outloop_last_clean_run_timestamp_seconds", workspace=ws) > 0

    assert health.status_code == 200 and health.json()["status"] == "ok"
    assert ready.status_code == 200 and ready.json()["store"] == "answers", ready.text
    assert [r.status_code for r in refused] == [401, 401, 401]
    assert wrong.status_code == 401  # the MCP token is not the scraper's

    # Every stderr line is one JSON object; none holds the mail's words or a token.
    assert all(line.startswith("{") for line in err.lines), err.lines
    text = "".join(err.lines)
    for words in ("Please send the Q4 quote", "Dana Levi", "Quote request", "Approved.",
                  "1,200", mcp_token, metrics_token):  # fmt: skip
        assert words not in text, words
    assert proc.returncode == 0
