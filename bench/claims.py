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
import importlib
import json
import logging
import os
import random
import sqlite3
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Generator, Sequence
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from typing import Any

import anyio
import psycopg
from psycopg import sql as pg_sql

from agent import events
from agent.domain.context import MailboxBinding
from agent.domain.dispositions import Disposition
from agent.domain.envelope import occurrence_key
from agent.domain.errors import StoreError
from agent.domain.execution import ClaimOutcome, ExecutionRecord
from agent.domain.records import ClaimRequest, ClaimResult, EscalationDraft, TaskDraft
from agent.domain.run import LedgerEntry
from agent.ports import EmbeddedStore, MailProvider
from agent.services import claim, classify, intake, workspaces
from agent.services.clock import SystemClock
from agent.services.holder import current_holder
from agent.storage.backend import DATABASE_URL_SETTING
from agent.storage.postgres import PostgresStore
from agent.storage.sqlite import SqliteStore, begin_immediate, connect
from agent.testing import InMemoryProvider, synthetic_mailbox
from bench import choices
from bench.pg_cluster import ThrowawayCluster

MODES = choices.CLAIM_MODES
BACKENDS = choices.STORE_BACKENDS
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
    """Times every call of the claim service in this worker process (won or lost, however
    it was decided) and counts the ones that failed."""

    def __init__(self) -> None:
        self.latencies: list[float] = []
        self.busy_errors = 0
        self._claim_occurrence = claim.claim_occurrence
        setattr(claim, "claim_occurrence", self.claim_occurrence)  # noqa: B010 - this process only

    def claim_occurrence(
        self,
        store: EmbeddedStore,
        request: ClaimRequest,
        make_draft: Callable[[], TaskDraft | EscalationDraft],
        now: datetime,
        *,
        seen: tuple[ExecutionRecord | None] | None = None,
        workspace_id: str = "",
    ) -> ClaimResult:
        started = time.perf_counter()
        try:
            return self._claim_occurrence(
                store, request, make_draft, now, seen=seen, workspace_id=workspace_id
            )
        except StoreError:
            self.busy_errors += 1
            raise
        finally:
            self.latencies.append(time.perf_counter() - started)


class _Tally(logging.Handler):
    """Counts the decision records this worker made (none unless something listens)."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.count = 0

    def handle(self, record: logging.LogRecord) -> bool:
        self.count += 1
        return True


def _open(url: str | None, data_dir: workspaces.DataDir) -> EmbeddedStore:
    return PostgresStore(url) if url else SqliteStore(data_dir.database)


def _ready_then_wait_for_go() -> None:
    """Tell the parent this worker is set up, and block until every worker is: start-up
    (imports, building the mailbox) never runs inside the measured window."""
    sys.stdout.write("ready\n")
    sys.stdout.flush()
    if sys.stdin.readline().strip() != "go":
        raise SystemExit("bench worker: the parent went away before the start")


def _report_then_wait_for_release(result: dict[str, Any]) -> None:
    """Hand the result over, and stay alive until the parent has every worker's result:
    a finished worker's unreported claims would otherwise (rightly) be taken over as a dead
    holder's. Blocking on stdin costs no CPU while the others still work."""
    sys.stdout.write(json.dumps(result) + "\n")
    sys.stdout.flush()
    sys.stdin.readline()


def _claims_worker(args: argparse.Namespace) -> dict[str, Any]:
    root = Path(args.dir)
    data_dir = workspaces.DataDir(root)
    store = _open(args.url, data_dir)
    timer = ClaimTimer()
    box = synthetic_mailbox(MAILBOX, args.items, args.per_thread)
    random.Random(args.seed).shuffle(box.inbox)

    def provider_for(workspace_id: str, binding: MailboxBinding) -> MailProvider:
        del workspace_id, binding
        return box

    tally = _Tally()
    logging.getLogger(events.ROOT).addHandler(tally)
    _ready_then_wait_for_go()
    started = time.perf_counter()
    wall_start = time.time()
    cpu_start = time.process_time()
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
    cpu = time.process_time() - cpu_start
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
        "cpu_s": cpu,
        "clean": clean,
        "scanned": scanned,
        "decision_records": tally.count,
    }


def _claim_all(store: EmbeddedStore, box: InMemoryProvider) -> list[str]:
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
    lookahead = claim.Lookahead(store, keys)
    for index, (envelope, key) in enumerate(zip(envelopes, keys, strict=True)):
        now = clock.now()
        request = ClaimRequest(
            key=key,
            service=intake.SERVICE,
            holder=holder,
            run_id=run_id,
            item_ref=envelope.provider_message_id,
        )
        result = claim.claim_occurrence(
            store,
            request,
            lambda: claim.task_draft(context, envelope, key, owner, now),  # noqa: B023 - called at once
            now,
            seen=lookahead.seen(index),
            workspace_id=WORKSPACE_ID,
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
    _ready_then_wait_for_go()
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
        _ready_then_wait_for_go()
        start = time.time()
        for key in keys:
            conn.execute(
                "INSERT INTO bench_rows (k, v) VALUES (%s, %s) ON CONFLICT DO NOTHING",
                (key, "x" * 64),
            )
        end = time.time()
    return {"start": start, "end": end, "attempts": args.items}


def _spawn(role: str, count: int, extra: list[str], url: str | None) -> list[dict[str, Any]]:
    """Start ``count`` workers, release them together once all are set up, and collect
    their JSON results; then let them exit. A PostgreSQL URL reaches them through their
    environment, never their command line (which any user of the machine can read)."""
    procs = _start_workers(role, count, extra, url)
    results: list[dict[str, Any]] = []
    try:
        _wait_until_ready(role, procs)
        _release(procs)
        _collect(role, procs, results)
    finally:
        _end_workers(procs, interrupted=len(results) < count)
    failed = [p.returncode for p in procs if p.returncode != 0]
    if failed:
        raise RuntimeError(f"bench {role} workers exited with {failed}")
    return results


def _start_workers(
    role: str, count: int, extra: list[str], url: str | None
) -> list[subprocess.Popen[str]]:
    """The worker processes, the database URL in their environment only."""
    env = {k: v for k, v in os.environ.items() if k != DATABASE_URL_SETTING}
    if url:
        env[DATABASE_URL_SETTING] = url
    return [
        subprocess.Popen(
            [sys.executable, "-m", "bench.claims", role, "--seed", str(i), *extra],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )
        for i in range(count)
    ]


def _wait_until_ready(role: str, procs: list[subprocess.Popen[str]]) -> None:
    """Every worker says it is set up."""
    for proc in procs:
        assert proc.stdout is not None
        if proc.stdout.readline().strip() != "ready":
            raise RuntimeError(f"bench {role} worker failed to start ({proc.wait()})")


def _release(procs: list[subprocess.Popen[str]]) -> None:
    """Tell every worker to go, all at once."""
    for proc in procs:
        assert proc.stdin is not None
        proc.stdin.write("go\n")
        proc.stdin.flush()


def _collect(role: str, procs: list[subprocess.Popen[str]], results: list[dict[str, Any]]) -> None:
    """Each worker's JSON result line, appended to ``results`` as it arrives."""
    for proc in procs:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        if not line:
            raise RuntimeError(f"bench {role} worker exited with {proc.wait()}")
        results.append(json.loads(line))


def _end_workers(procs: list[subprocess.Popen[str]], *, interrupted: bool) -> None:
    """Let the workers exit; an interrupted run (a failure, a timeout) kills them, so no
    worker outlives it."""
    for proc in procs:
        if interrupted:
            proc.kill()
        if proc.stdin is not None:
            proc.stdin.close()  # releases a worker waiting for the others
    for proc in procs:
        proc.wait(timeout=3600)
        if proc.stdout is not None:
            proc.stdout.close()


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
    metrics_rounds: int = 0,
    counting: str = "",
) -> dict[str, Any]:
    """Run the benchmark in ``scratch`` (a fresh directory) and return its figures;
    ``metrics_rounds``: also race that many times with metrics off and on, alternately.
    ``counting`` (``module:function``, the command line's) is imported by every worker of
    those races and called by those with metrics on: it counts decision records as a server
    with its metrics on does."""
    plan = (metrics_rounds, per_thread, counting)
    if backend not in BACKENDS:
        raise ValueError(f"backend {backend!r} is not one of {', '.join(BACKENDS)}")
    if mode not in MODES:
        raise ValueError(f"mode {mode!r} is not one of {', '.join(MODES)}")
    scratch.mkdir(parents=True, exist_ok=True)
    if backend == "sqlite":
        return _with_metrics(
            _run(scratch, None, workers, items, per_thread, mode, progress),
            scratch, None, plan, progress,
        )  # fmt: skip
    if url:
        with fresh_schema(url) as scoped:
            result = _run(scratch, scoped, workers, items, per_thread, mode, progress)
            return _with_metrics(result, scratch, scoped, plan, progress)
    progress("starting a throwaway PostgreSQL cluster on 127.0.0.1")
    with ThrowawayCluster(max_connections=2 * workers + 20) as cluster:
        result = _run(scratch, cluster.url, workers, items, per_thread, mode, progress)
        return _with_metrics(result, scratch, cluster.url, plan, progress)


def _with_metrics(
    result: dict[str, Any],
    scratch: Path,
    url: str | None,
    plan: tuple[int, int, str],
    progress: Callable[[str], None],
) -> dict[str, Any]:
    """The figures, with the cost of counting every decision record (``rounds`` races with
    metrics off and on, alternately and in turn first, each on a fresh station; the best
    rate of each)."""
    rounds, per_thread, counting = plan
    if rounds < 1:
        return result
    if not counting:
        raise ValueError("metrics rounds need the counting function (module:function)")
    rates: dict[bool, list[float]] = {False: [], True: []}
    records = {False: 0, True: 0}
    shape = (result["workers"], result["items"], result["mode"])
    for round_no in range(rounds):
        # Each round in the other order: a race never always follows the other kind (the
        # store's files, or the server, may still be busy with what the last one wrote).
        for on in (False, True) if round_no % 2 == 0 else (True, False):
            progress(f"metrics {'on' if on else 'off'}: round {round_no + 1} of {rounds}")
            where = scratch / f"metrics-{round_no}-{'on' if on else 'off'}"
            data_dir = workspaces.DataDir(where / "station")
            where.mkdir(parents=True)
            _register_workspace(where, _scoped(url, where), data_dir)
            prelude = ["--prelude", counting, *(["--call-prelude"] if on else [])]
            raced = _race(
                data_dir, _scoped(url, where), *shape[:2], per_thread, shape[2], extra=prelude
            )
            rates[on].append(_rate(raced)[0])
            records[on] += sum(int(r["decision_records"]) for r in raced)
    off, on = max(rates[False]), max(rates[True])
    result["metrics"] = {
        "rounds": rounds,
        "off_per_s": round(off, 1),
        "on_per_s": round(on, 1),
        "ratio": round(on / off, 3),
        "off_rates": [round(r, 1) for r in rates[False]],
        "on_rates": [round(r, 1) for r in rates[True]],
        # Records made by the workers with metrics on (every claim's, counted), and off
        # (none: nothing listens, so none is made).
        "records_on": records[True],
        "records_off": records[False],
    }
    return result


def _scoped(url: str | None, where: Path) -> str | None:
    """A fresh schema's URL of each metrics round on PostgreSQL (its own occurrences)."""
    if url is None:
        return None
    schema = f"bench_{uuid.uuid5(uuid.NAMESPACE_URL, str(where)).hex[:12]}"
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(pg_sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(pg_sql.Identifier(schema)))
    separator = "&" if "?" in url else "?"
    return f"{url}{separator}options=-csearch_path%3D{schema}"


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
    """The baseline, then the product raced by as many processes, then the figures."""
    baseline_rate, baseline_wall = _baseline(scratch, url, workers, max(1, items), progress)
    data_dir = workspaces.DataDir(scratch / "station")
    _register_workspace(scratch, url, data_dir)
    progress(f"{mode}: {workers} processes x {items} shared occurrences, random order")
    results = _race(data_dir, url, workers, items, per_thread, mode)
    rate, wall, attempts = _rate(results)
    latencies = [x for r in results for x in r["latencies_ms"]]
    counts, integrity = _store_counts(url, data_dir)
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
        **_latency_figures(latencies),
        "attempts": attempts,
        "claims": claimed,
        "executions_done": counts["executions_done"],
        "tasks": counts["tasks"],
        "threads": threads,
        "duplicates": duplicates,
        # An occurrence is lost if it ended with no execution at all (claim mode) or
        # without a DONE one (intake mode, where every claim is reported).
        "lost": items - (counts["executions_done"] if mode == "intake" else counts["executions"]),
        **_worker_figures(results),
        "integrity_check": integrity,
        "elapsed_s": round(wall, 3),
        "baseline_elapsed_s": round(baseline_wall, 3),
        "cpus": os.cpu_count(),
    }


def _baseline(
    scratch: Path,
    url: str | None,
    workers: int,
    per_worker: int,
    progress: Callable[[str], None],
) -> tuple[float, float]:
    """The baseline rate and wall time: the same number of processes, one-row transactions
    (on SQLite with the store's pragmas)."""
    if url is None:
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
        target = []
        progress(f"baseline: {workers} processes x {per_worker} INSERT ... ON CONFLICT DO NOTHING")
    baseline_results = _spawn("insert", workers, [*target, "--items", str(per_worker)], url)
    rate, wall, _ = _rate(baseline_results)
    return rate, wall


def _race(
    data_dir: workspaces.DataDir,
    url: str | None,
    workers: int,
    items: int,
    per_thread: int,
    mode: str,
    *,
    extra: Sequence[str] = (),
) -> list[dict[str, Any]]:
    """The product raced: every worker goes over the same occurrences in its own order."""
    args = ["--dir", str(data_dir.root), "--items", str(items)]
    args += ["--per-thread", str(per_thread), "--mode", mode]
    return _spawn("claims", workers, [*args, *extra], url)


def _register_workspace(scratch: Path, url: str | None, data_dir: workspaces.DataDir) -> None:
    """Register the benchmark's workspace once, before the workers race."""
    data_dir.root.mkdir(parents=True, exist_ok=True)
    context_file = scratch / "context.yaml"
    context_file.write_text(CONTEXT, encoding="utf-8")
    store = _open(url, data_dir)
    workspaces.add_workspace(store, data_dir, context_file, SystemClock().now())
    store.close()


def _store_counts(url: str | None, data_dir: workspaces.DataDir) -> tuple[dict[str, int], str]:
    """The store's row counts and integrity check after the race."""
    store = _open(url, data_dir)
    try:
        counts = store.counts()
        integrity = store.integrity_check()
    finally:
        store.close()
    return counts, integrity


def _latency_figures(latencies: list[float]) -> dict[str, float]:
    """The claim latency percentiles and mean, in milliseconds."""
    return {
        "p50_ms": round(_percentile(latencies, 0.50), 3),
        "p99_ms": round(_percentile(latencies, 0.99), 3),
        "mean_ms": round(statistics.fmean(latencies), 3) if latencies else 0.0,
    }


def _worker_figures(results: list[dict[str, Any]]) -> dict[str, Any]:
    """What the workers report about themselves: busy errors, retries, CPU time, clean runs."""
    return {
        "busy_errors": sum(int(r["busy_errors"]) for r in results),
        "retries": sum(int(r["retries"]) for r in results),
        # CPU time of the worker processes themselves (the database server's is not in it).
        "worker_cpu_s": round(sum(float(r["cpu_s"]) for r in results), 2),
        "runs_clean": sum(1 for r in results if r["clean"]),
        "scanned_per_run": sorted({int(r["scanned"]) for r in results}),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="bench worker (started by outloop bench)")
    parser.add_argument("role", choices=["claims", "insert"])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--items", type=int, required=True)
    parser.add_argument("--per-thread", type=int, default=4)
    parser.add_argument("--mode", choices=MODES, default="claim")
    parser.add_argument("--dir")
    parser.add_argument("--db")
    parser.add_argument("--prelude", default="", help="MODULE:FUNCTION imported in every worker")
    parser.add_argument("--call-prelude", action="store_true", help="and called before the race")
    args = parser.parse_args(argv)
    if args.prelude:
        module, _, function = args.prelude.partition(":")
        loaded = importlib.import_module(module)
        if args.call_prelude:
            getattr(loaded, function)()
    # PostgreSQL when the parent passed a URL in the environment, else SQLite.
    args.url = os.environ.get(DATABASE_URL_SETTING) or None
    result = _claims_worker(args) if args.role == "claims" else _insert_worker(args)
    _report_then_wait_for_release(result)


if __name__ == "__main__":
    main()
