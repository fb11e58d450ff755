"""``outloop bench reconcile``: the time to reconcile one run of N scanned items.

The run is built through the store itself: N items scanned, all but 1% given a disposition
(a mix of terminal, non-terminal and claim-race outcomes), the rest left without one, as a
worker that died would leave them. Then ``reconcile`` is timed: it marks the undecided items
RECONCILIATION_FAILED, counts every item into one class and stores the summary, in one
transaction.

The baseline, on the same database in the same run: one plain aggregate over the same
ledger rows (``SELECT disposition, count(*) ... GROUP BY disposition``), the least work any
reconciliation must do. ``rate_per_s`` is items reconciled per second; ``ratio`` is
reconcile rate / baseline rate.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psycopg

from agent.domain.dispositions import Disposition
from agent.domain.run import LedgerEntry
from agent.ports import EmbeddedStore
from agent.storage.postgres import PostgresStore
from agent.storage.sqlite import SqliteStore
from agent.storage.sqlite import connect as sqlite_connect
from bench import choices
from bench.claims import fresh_schema
from bench.pg_cluster import ThrowawayCluster

BACKENDS = choices.STORE_BACKENDS
UNDECIDED_SHARE = 0.01
OUTCOMES = (
    Disposition.QUEUED,
    Disposition.EXECUTION_ALREADY_DONE,
    Disposition.EXECUTION_ALREADY_CLAIMED,
    Disposition.CLOSED_NO_REPLY_NEEDED,
)
BATCH = 5_000


def run(
    scratch: Path,
    *,
    backends: tuple[str, ...] = BACKENDS,
    items: int = 100_000,
    url: str | None = None,
    progress: Callable[[str], None] = lambda _line: None,
) -> dict[str, Any]:
    """Reconcile a run of ``items`` items on each backend; figures per backend and, at the
    top level, those of the slowest backend."""
    unknown = set(backends) - set(BACKENDS)
    if unknown or not backends:
        raise ValueError(f"backends must be among {', '.join(BACKENDS)}")
    scratch.mkdir(parents=True, exist_ok=True)
    figures: dict[str, dict[str, Any]] = {}
    for backend in backends:
        if backend == "sqlite":
            path = scratch / "reconcile.db"
            store: EmbeddedStore = SqliteStore(path)
            try:
                figures[backend] = _measure(store, items, progress, backend, _sqlite_baseline(path))
            finally:
                store.close()
        elif url:
            with fresh_schema(url) as scoped:
                figures[backend] = _on_postgres(scoped, items, progress)
        else:
            progress("starting a throwaway PostgreSQL cluster on 127.0.0.1")
            with ThrowawayCluster(max_connections=20) as cluster:
                figures[backend] = _on_postgres(cluster.url, items, progress)
    slowest = max(figures.values(), key=lambda f: f["reconcile_s"])
    return {
        "bench": "reconcile",
        "items": items,
        "backend": slowest["backend"],
        "rate_per_s": slowest["rate_per_s"],
        "baseline_per_s": slowest["baseline_per_s"],
        "ratio": slowest["ratio"],
        "reconcile_s": slowest["reconcile_s"],
        "lost": sum(f["lost"] for f in figures.values()),
        "backends": figures,
    }


def _on_postgres(url: str, items: int, progress: Callable[[str], None]) -> dict[str, Any]:
    store = PostgresStore(url)
    try:
        return _measure(store, items, progress, "postgres", _pg_baseline(url))
    finally:
        store.close()


def _measure(
    store: EmbeddedStore,
    items: int,
    progress: Callable[[str], None],
    backend: str,
    baseline: Callable[[str], float],
) -> dict[str, Any]:
    now = datetime.now(UTC)
    run_id = f"bench-reconcile-{uuid.uuid4().hex[:12]}"
    store.start_run(run_id, "bench", "bench/0/0/0/0", now)
    refs = [f"bench:box/item-{n:07d}" for n in range(items)]
    progress(f"{backend}: recording {items:,} scanned items")
    for start in range(0, items, BATCH):
        store.record_scanned(
            [LedgerEntry(run_id=run_id, item_ref=r) for r in refs[start : start + BATCH]], now
        )
    undecided = max(1, int(items * UNDECIDED_SHARE))
    decided = refs[: items - undecided]
    progress(f"{backend}: deciding {len(decided):,} items, leaving {undecided:,} undecided")
    for start in range(0, len(decided), BATCH):
        batch = decided[start : start + BATCH]
        store.record_dispositions(
            run_id,
            [(r, OUTCOMES[(start + i) % len(OUTCOMES)], "") for i, r in enumerate(batch)],
            now,
        )
    progress(f"{backend}: reconciling")
    started = time.perf_counter()
    result = store.reconcile(run_id, now)
    elapsed = time.perf_counter() - started
    base_s = baseline(run_id)
    counted = result.terminal + result.non_terminal + result.claim_race
    return {
        "backend": backend,
        "reconcile_s": round(elapsed, 4),
        "rate_per_s": round(items / elapsed, 1),
        "baseline_s": round(base_s, 4),
        "baseline_per_s": round(items / base_s, 1),
        "ratio": round(base_s / elapsed, 3),
        "scanned": result.scanned,
        "reconciliation_failed": result.reconciliation_failed,
        "undecided_before": undecided,
        # Every item ends in exactly one class: nothing is lost from the count.
        "lost": items - (counted + result.reconciliation_failed),
    }


def _sqlite_baseline(path: Path) -> Callable[[str], float]:
    def measure(run_id: str) -> float:
        conn = sqlite_connect(path)  # exactly the store's connection settings
        try:
            started = time.perf_counter()
            conn.execute(
                "SELECT disposition, count(*) AS n FROM run_items WHERE run_id = ?"
                " GROUP BY disposition",
                (run_id,),
            ).fetchall()
            return time.perf_counter() - started
        finally:
            conn.close()

    return measure


def _pg_baseline(url: str) -> Callable[[str], float]:
    def measure(run_id: str) -> float:
        with psycopg.connect(url, autocommit=True) as conn:
            started = time.perf_counter()
            conn.execute(
                "SELECT disposition, count(*) AS n FROM run_items WHERE run_id = %s"
                " GROUP BY disposition",
                (run_id,),
            ).fetchall()
            return time.perf_counter() - started

    return measure
