"""``outloop bench console``: the queue page of a workspace with thousands of open tasks.

The queue is filled through the real intake (a synthetic mailbox of one message per thread,
so every message opens a task). The product's page - read the workspace's open tasks from
the store, keep what the filters ask for, render the template - is timed against the bare
template render of the same rows, in the same run. The page's own callables come from the
command line (the console is a front end above this package)."""

from __future__ import annotations

import gc
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio

from agent.domain.context import MailboxBinding
from agent.ports import MailProvider
from agent.services import intake, workspaces
from agent.services.clock import SystemClock
from agent.storage.sqlite import SqliteStore
from agent.testing import synthetic_mailbox
from agent.testing.contexts import context_yaml

WORKSPACE = "ws-bench-console"
MAILBOX = "queue@fabrikam.test"
TARGET_RATIO = 0.5


def fill_queue(data_root: Path, tasks: int) -> SqliteStore:
    """A data directory whose workspace has ``tasks`` open tasks, taken in by intake."""
    data_dir = workspaces.DataDir(data_root)
    data_root.mkdir(parents=True, exist_ok=True)
    source = data_root / "context.yaml"
    source.write_text(context_yaml(WORKSPACE, mailbox=MAILBOX), encoding="utf-8")
    store = SqliteStore(data_dir.database)
    workspaces.add_workspace(store, data_dir, source, SystemClock().now())
    box = synthetic_mailbox(MAILBOX, tasks, 1)

    def provider_for(workspace_id: str, binding: MailboxBinding) -> MailProvider:
        del workspace_id, binding
        return box

    anyio.run(
        lambda: intake.run_cycle(
            store=store, data_dir=data_dir, workspace_id=WORKSPACE,
            provider_for=provider_for, clock=SystemClock(),
        )
    )  # fmt: skip
    return store


def _latencies(call: Callable[[], object], rounds: int) -> list[float]:
    call()  # warm: templates compiled, pages cached by the OS
    found: list[float] = []
    gc.disable()
    try:
        for _ in range(rounds):
            start = time.perf_counter()
            call()
            found.append(time.perf_counter() - start)
    finally:
        gc.enable()
    return found


def _figures(samples: list[float]) -> dict[str, float]:
    ordered = sorted(samples)
    p99 = ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]
    return {"p50_ms": round(statistics.median(ordered) * 1000, 2), "p99_ms": round(p99 * 1000, 2)}


def run(
    page: Callable[[], str], bare: Callable[[], str], tasks: int, rounds: int
) -> dict[str, Any]:
    """Time ``page`` (the product's queue page) against ``bare`` (the template alone on
    the same rows), interleaved round by round so both see the same machine."""
    page_times: list[float] = []
    bare_times: list[float] = []
    for _ in range(rounds):
        page_times += _latencies(page, 1)
        bare_times += _latencies(bare, 1)
    shown = page()
    product, baseline = _figures(page_times), _figures(bare_times)
    ratio = round(baseline["p50_ms"] / product["p50_ms"], 3) if product["p50_ms"] else 0.0
    return {
        "benchmark": "console",
        "tasks": tasks,
        "rounds": rounds,
        "rows_shown": shown.count("<tr>") - 1,
        "page": product,
        "baseline": {"what": "the same rows through the bare queue template", **baseline},
        "ratio": ratio,
        "target_ratio": TARGET_RATIO,
        "meets_target": ratio >= TARGET_RATIO,
    }
