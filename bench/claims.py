"""``outloop bench claims``: N worker processes each claim the same M occurrences.

Every worker goes over the same synthetic mailbox in its own random order, against one
store. In ``claim`` mode (the default) each worker records its ledger, then claims every
occurrence through the claim service: the claim and the task write in one transaction, a
lost claim recording its claim-race disposition. In ``intake`` mode each worker runs the
whole intake service instead (scan, ledger, claim, report, reconcile).

The baseline is measured in the same run, on the same database, by the same number of
processes. On SQLite: plain one-row-per-transaction inserts with exactly the store's
connection settings (WAL, synchronous=FULL, the same busy timeout, BEGIN IMMEDIATE). On
PostgreSQL: a plain ``INSERT ... ON CONFLICT DO NOTHING`` per transaction on a UNIQUE key,
every process inserting the same M keys in its own random order (the bare claim, without its
task or ledger). ``rate_per_s`` counts claim transactions (every attempt, won or lost) per
second of wall time; ``ratio`` is rate / baseline.

With ``backend="postgres"`` and no URL the benchmark starts its own throwaway cluster on
127.0.0.1; with a URL it works in a fresh schema of that database and drops it afterwards.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sqlite3
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Generator
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from typing import Any

import anyio
import psycopg
from psycopg import sql as pg_sql

from agent.domain.context import MailboxBinding
from agent.domain.dispositions import Disposition
from agent.domain.envelope import occurrence_key
from agent.domain.errors import StoreError
from agent.domain.execution import ClaimOutcome
from agent.domain.records import ClaimRequest, ClaimResult, EscalationDraft, TaskDraft
from agent.domain.run import LedgerEntry
from agent.ports import MailProvider, Store
from agent.services import claim, classify, intake, workspaces
from agent.services.clock import SystemClock
from agent.services.holder import current_holder
from agent.storage.postgres import PostgresStore
from agent.storage.sqlite import SqliteStore, begin_immediate, connect
from agent.testing import InMemoryProvider, synthetic_mailbox
from bench.pg_cluster import ThrowawayCluster

MODES = ("claim", "intake")
BACKENDS = ("sqlite", "postgres")
WORKSPACE_ID = "ws-bench-claims"
MAILBOX = "bench@outloop.test"
CONTEXT = f"""\
workspace_id: {WORKSPACE_ID}
label: claims benchmark
mailboxes: [{{mailbox_id: {MAILBOX}, provider: memory}}]
contacts:
  - {{address: ops@outloop.test, side: internal, roles: [approver, client_manager]}}
escalation_contact: ops@outloop.test
unresolved_queue: unresolved
grants: {{licence: active, mailboxes: [{MAILBOX}]}}
kpis: {{official: {{first_response_hours: 8}}}}
"""


class ClaimTimer:
    """Times every claim call of one store and counts the ones that failed."""

    def __init__(self, store: Store) -> None:
        self.latencies: list[float] = []
        self.busy_errors = 0
        self._claim = store.claim
        setattr(store, "claim", self.claim)  # noqa: B010 - wraps this one instance's method

    def claim(
        self,
        request: ClaimRequest,
        draft: TaskDraft | EscalationDraft,
        now: datetime,
        holder_alive: Callable[[str], bool],
    ) -> ClaimResult:
        started = time.perf_counter()
        try:
            return self._claim(request, draft, now, holder_alive)
        except StoreError:
            self.busy_errors += 1
            raise
        finally:
            self.latencies.append(time.perf_counter() - started)


def _open(url: str | None, data_dir: workspaces.DataDir) -> Store:
    return PostgresStore(url) if url else SqliteStore(data_dir.database)


def _wait_for(go: Path) -> None:
    deadline = time.monotonic() + 120
    while not go.exists():
        if time.monotonic() > deadline:
            raise SystemExit("bench worker: the start signal never came")
        time.sleep(0.002)


def _wait_for_all(go: Path, workers: int) -> None:
    deadline = time.monotonic() + 3600
    while len(list(go.parent.glob(f"{go.name}.done-*"))) < workers:
        if time.monotonic() > deadline:
            raise SystemExit("bench worker: the other workers never finished")
        time.sleep(0.005)


def _claims_worker(args: argparse.Namespace) -> dict[str, Any]:
    root = Path(args.dir)
    data_dir = workspaces.DataDir(root)
    store = _open(args.url, data_dir)
    timer = ClaimTimer(store)
    box = synthetic_mailbox(MAILBOX, args.items, args.per_thread)
    random.Random(args.seed).shuffle(box.inbox)

    def provider_for(binding: MailboxBinding) -> MailProvider:
        del binding
        return box

    _wait_for(Path(args.go))
    started = time.perf_counter()
    wall_start = time.time()
    if args.mode == "intake":
        result = anyio.run(
            lambda: intake.run_cycle(
                store=store,
                data_dir=data_dir,
                workspace_id=WORKSPACE_ID,
                provider_for=provider_for,
                clock=SystemClock(),
            )
        )
        outcomes = [i.claim.value if i.claim else "none" for i in result.items]
        clean = bool(result.reconciliation and result.reconciliation.clean)
        scanned = result.reconciliation.scanned if result.reconciliation else 0
    else:
        outcomes = _claim_all(store, box)
        clean, scanned = True, len(outcomes)
    elapsed = time.perf_counter() - started
    # Stay alive until every worker is done: a finished worker's unreported claims would
    # otherwise (rightly) be taken over as a dead holder's.
    Path(f"{args.go}.done-{args.seed}").touch()
    _wait_for_all(Path(args.go), args.workers)
    counts: dict[str, int] = {}
    for name in outcomes:
        counts[name] = counts.get(name, 0) + 1
    retries = store.retries if isinstance(store, PostgresStore) else 0
    store.close()
    return {
        "start": wall_start,
        "end": wall_start + elapsed,
        "attempts": len(timer.latencies),
        "outcomes": counts,
        "latencies_ms": [round(x * 1000, 4) for x in timer.latencies],
        "busy_errors": timer.busy_errors,
        "retries": retries,
        "clean": clean,
        "scanned": scanned,
    }


def _claim_all(store: Store, box: InMemoryProvider) -> list[str]:
    """Claim every occurrence through the claim service, as intake does, without the rest."""
    clock = SystemClock()
    context = workspaces.load_context(store, WORKSPACE_ID)
    owner = classify.work_owner(context)
    run_id = f"bench-{uuid.uuid4().hex}"
    holder = current_holder()
    store.start_run(run_id, WORKSPACE_ID, holder, clock.now())
    envelopes = [item.envelope for item in box.inbox if item.envelope is not None]
    keys = [occurrence_key(WORKSPACE_ID, e) for e in envelopes]
    store.record_scanned(
        [
            LedgerEntry(run_id=run_id, item_ref=e.provider_message_id, occurrence_key=k)
            for e, k in zip(envelopes, keys, strict=True)
        ],
        clock.now(),
    )
    outcomes: list[str] = []
    race: list[tuple[str, Disposition, str]] = []
    for envelope, key in zip(envelopes, keys, strict=True):
        now = clock.now()
        request = ClaimRequest(
            key=key,
            service=intake.SERVICE,
            holder=holder,
            run_id=run_id,
            item_ref=envelope.provider_message_id,
        )
        result = claim.claim_occurrence(
            store, request, claim.task_draft(context, envelope, key, owner, now), now
        )
        outcomes.append(result.outcome.value)
        if result.outcome is not ClaimOutcome.CLAIMED:
            race.append((envelope.provider_message_id, result.outcome.disposition(), ""))
    store.record_dispositions(run_id, race, clock.now())  # as intake does, in one batch
    return outcomes


def _insert_worker(args: argparse.Namespace) -> dict[str, Any]:
    if args.url:
        return _pg_insert_worker(args)
    db = Path(args.db)
    conn = connect(db)  # exactly the store's connection settings
    _wait_for(Path(args.go))
    start = time.time()
    for n in range(args.items):
        begin_immediate(conn, db)
        conn.execute("INSERT INTO rows (k, v) VALUES (?, ?)", (f"{args.seed}-{n}", "x" * 64))
        conn.execute("COMMIT")
    end = time.time()
    conn.close()
    return {"start": start, "end": end, "attempts": args.items}


def _pg_insert_worker(args: argparse.Namespace) -> dict[str, Any]:
    """The bare claim: one INSERT ... ON CONFLICT DO NOTHING per transaction (autocommit),
    over the same keys as every other worker, in this worker's own random order."""
    keys = [f"k-{n}" for n in range(args.items)]
    random.Random(args.seed).shuffle(keys)
    with psycopg.connect(args.url, autocommit=True) as conn:
        _wait_for(Path(args.go))
        start = time.time()
        for key in keys:
            conn.execute(
                "INSERT INTO bench_rows (k, v) VALUES (%s, %s) ON CONFLICT DO NOTHING",
                (key, "x" * 64),
            )
        end = time.time()
    return {"start": start, "end": end, "attempts": args.items}


def _spawn(role: str, count: int, extra: list[str], go: Path) -> list[dict[str, Any]]:
    """Start ``count`` workers, release them together, and collect their JSON results."""
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "bench.claims", role, "--go", str(go), "--seed", str(i), *extra],
            stdout=subprocess.PIPE,
            text=True,
        )
        for i in range(count)
    ]
    go.touch()
    results: list[dict[str, Any]] = []
    for proc in procs:
        out, _ = proc.communicate(timeout=3600)
        if proc.returncode != 0:
            raise RuntimeError(f"bench {role} worker exited with {proc.returncode}")
        results.append(json.loads(out.strip().splitlines()[-1]))
    go.unlink()
    for done in go.parent.glob(f"{go.name}.done-*"):
        done.unlink()
    return results


def _rate(results: list[dict[str, Any]]) -> tuple[float, float, int]:
    start = min(r["start"] for r in results)
    end = max(r["end"] for r in results)
    attempts = sum(int(r["attempts"]) for r in results)
    wall = max(end - start, 1e-9)
    return attempts / wall, wall, attempts


def _percentile(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def run(
    scratch: Path,
    *,
    backend: str = "sqlite",
    url: str | None = None,
    workers: int = 4,
    items: int = 2000,
    per_thread: int = 4,
    mode: str = "claim",
    progress: Callable[[str], None] = lambda _line: None,
) -> dict[str, Any]:
    """Run the benchmark in ``scratch`` (a fresh directory) and return its figures."""
    if backend not in BACKENDS:
        raise ValueError(f"backend {backend!r} is not one of {', '.join(BACKENDS)}")
    if mode not in MODES:
        raise ValueError(f"mode {mode!r} is not one of {', '.join(MODES)}")
    scratch.mkdir(parents=True, exist_ok=True)
    if backend == "sqlite":
        return _run(scratch, None, workers, items, per_thread, mode, progress)
    if url:
        with fresh_schema(url) as scoped:
            return _run(scratch, scoped, workers, items, per_thread, mode, progress)
    progress("starting a throwaway PostgreSQL cluster on 127.0.0.1")
    with ThrowawayCluster(max_connections=2 * workers + 20) as cluster:
        return _run(scratch, cluster.url, workers, items, per_thread, mode, progress)


@contextmanager
def fresh_schema(url: str) -> Generator[str]:
    """A URL for a new, empty schema of the database at ``url``; dropped afterwards."""
    schema = f"bench_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(pg_sql.SQL("CREATE SCHEMA {}").format(pg_sql.Identifier(schema)))
    separator = "&" if "?" in url else "?"
    try:
        yield f"{url}{separator}options=-csearch_path%3D{schema}"
    finally:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(pg_sql.SQL("DROP SCHEMA {} CASCADE").format(pg_sql.Identifier(schema)))


def _run(
    scratch: Path,
    url: str | None,
    workers: int,
    items: int,
    per_thread: int,
    mode: str,
    progress: Callable[[str], None],
) -> dict[str, Any]:
    go = scratch / "go"
    per_worker = max(1, items)
    if url is None:
        # Baseline: the same number of processes, one-row transactions, the store's pragmas.
        base_db = scratch / "baseline.db"
        conn = sqlite3.connect(base_db, isolation_level=None)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("CREATE TABLE IF NOT EXISTS rows (k TEXT PRIMARY KEY, v TEXT NOT NULL)")
        conn.close()
        target = ["--db", str(base_db)]
        progress(f"baseline: {workers} processes x {per_worker} one-row transactions")
    else:
        with psycopg.connect(url, autocommit=True) as pg:
            pg.execute("CREATE TABLE bench_rows (k TEXT PRIMARY KEY, v TEXT NOT NULL)")
        target = ["--url", url]
        progress(f"baseline: {workers} processes x {per_worker} INSERT ... ON CONFLICT DO NOTHING")
    baseline_results = _spawn("insert", workers, [*target, "--items", str(per_worker)], go)
    baseline_rate, baseline_wall, _ = _rate(baseline_results)

    # The product: register the workspace once, then race the workers.
    root = scratch / "station"
    data_dir = workspaces.DataDir(root)
    root.mkdir(parents=True, exist_ok=True)
    context_file = scratch / "context.yaml"
    context_file.write_text(CONTEXT, encoding="utf-8")
    store = _open(url, data_dir)
    workspaces.add_workspace(store, data_dir, context_file, SystemClock().now())
    store.close()
    progress(f"{mode}: {workers} processes x {items} shared occurrences, random order")
    results = _spawn(
        "claims",
        workers,
        [
            "--dir",
            str(root),
            "--items",
            str(items),
            "--per-thread",
            str(per_thread),
            "--mode",
            mode,
            "--workers",
            str(workers),
            *(["--url", url] if url else []),
        ],
        go,
    )
    rate, wall, attempts = _rate(results)
    latencies = [x for r in results for x in r["latencies_ms"]]

    store = _open(url, data_dir)
    try:
        counts = store.counts()
        done = counts["executions_done"]
        integrity = store.integrity_check()
    finally:
        store.close()
    claimed = sum(int(r["outcomes"].get("CLAIMED", 0)) for r in results)
    threads = (items + per_thread - 1) // per_thread
    duplicates = max(0, claimed - items) + max(0, counts["tasks"] - threads)
    return {
        "bench": "claims",
        "backend": "sqlite" if url is None else "postgres",
        "mode": mode,
        "workers": workers,
        "items": items,
        "rate_per_s": round(rate, 1),
        "baseline_per_s": round(baseline_rate, 1),
        "ratio": round(rate / baseline_rate, 3),
        # Won claims alone (each a write transaction with its task), against the same baseline.
        "won_per_s": round(claimed / wall, 1),
        "won_ratio": round(claimed / wall / baseline_rate, 3),
        "p50_ms": round(_percentile(latencies, 0.50), 3),
        "p99_ms": round(_percentile(latencies, 0.99), 3),
        "mean_ms": round(statistics.fmean(latencies), 3) if latencies else 0.0,
        "attempts": attempts,
        "claims": claimed,
        "executions_done": done,
        "tasks": counts["tasks"],
        "threads": threads,
        "duplicates": duplicates,
        # An occurrence is lost if it ended with no execution at all (claim mode) or
        # without a DONE one (intake mode, where every claim is reported).
        "lost": items - (done if mode == "intake" else counts["executions"]),
        "busy_errors": sum(int(r["busy_errors"]) for r in results),
        "retries": sum(int(r["retries"]) for r in results),
        "runs_clean": sum(1 for r in results if r["clean"]),
        "scanned_per_run": sorted({int(r["scanned"]) for r in results}),
        "integrity_check": integrity,
        "elapsed_s": round(wall, 3),
        "baseline_elapsed_s": round(baseline_wall, 3),
        "cpus": os.cpu_count(),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="bench worker (started by outloop bench)")
    parser.add_argument("role", choices=["claims", "insert"])
    parser.add_argument("--go", required=True)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--items", type=int, required=True)
    parser.add_argument("--per-thread", type=int, default=4)
    parser.add_argument("--mode", choices=MODES, default="claim")
    parser.add_argument("--workers", type=int, default=1, help="workers to wait for at the end")
    parser.add_argument("--dir")
    parser.add_argument("--db")
    parser.add_argument("--url", help="PostgreSQL URL (else SQLite in --dir / --db)")
    args = parser.parse_args(argv)
    result = _claims_worker(args) if args.role == "claims" else _insert_worker(args)
    sys.stdout.write(json.dumps(result) + "\n")


if __name__ == "__main__":
    main()
