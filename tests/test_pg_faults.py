"""Faults on PostgreSQL: real workers die by SIGKILL, backends are terminated, the server
crashes and restarts, all while fresh mail keeps arriving.

In rounds, four workers (the ``outloop run`` CLI on one shared PostgreSQL database; some
with a random crash point armed) run together while the test SIGKILLs one or two of them
from outside at random moments and, on some rounds, terminates every client backend
(``pg_terminate_backend``) or restarts the server in immediate mode (a crash) mid-run.
Afterwards the guarantees of tests/test_crash.py hold: nothing lost, no duplicate task, and
every run's scanned items equal the sum of its dispositions after the next reconcile.

Backend sweeps and restarts are injected once every live worker of the round has started
its run and one of them is claiming (a random few polls later, if one is still mid-run):
a worker that cannot reach the server while it starts fails fast by design
(``PostgresStore`` probes the URL once, to name a misconfigured setting), so an outage
during start-up is not a fault the store retries.
"""

from __future__ import annotations

import contextlib
import random
import signal
import subprocess
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import psycopg
import pytest

from agent import crashpoints
from agent.ports import EmbeddedStore
from bench.pg_cluster import ThrowawayCluster
from tests.conftest import REPORTED
from tests.test_crash import WS, Worker, World, assert_recovered

KILLS = 50  # SIGKILLed workers, crash points and external kills together
SWEEPS = 5  # pg_terminate_backend on every client backend, while a worker runs
RESTARTS = 3  # immediate-mode server restarts, while a worker runs
WORKERS = 4  # per round
MAX_ROUNDS = 80
POLL_S = 0.02  # each look at the store waits this long on a worker process in between
# Bound on the random wait before an external kill: about one worker's whole run (forked,
# a worker starts in milliseconds and runs for a fraction of a second), so the kill lands
# anywhere in the run rather than after it has ended.
KILL_WITHIN_S = 0.75
PHASE_TIMEOUT_S = 60.0  # bound on any one wait for a moment to inject a fault
EXIT_TIMEOUT_S = 180.0


@dataclass
class Tally:
    seed: int
    rounds: int = 0
    crashpoint_kills: int = 0
    external_kills: int = 0
    terminate_sweeps: int = 0
    backends_terminated: int = 0
    restarts: int = 0
    clean_exits: int = 0
    faults_skipped: int = 0  # planned sweeps/restarts whose round had no worker mid-run

    @property
    def sigkills(self) -> int:
        return self.crashpoint_kills + self.external_kills

    def done(self) -> bool:
        return (
            self.sigkills >= KILLS and self.terminate_sweeps >= SWEEPS and self.restarts >= RESTARTS
        )


def _open(store: EmbeddedStore) -> list[tuple[str, str]]:
    """(run_id, holder) of the workspace's runs not yet reconciled."""
    return [(r.run_id, r.holder) for r in store.unreconciled_runs(WS)]


def _holder_pid(holder: str) -> int | None:
    """The pid in a holder ``host/pid-namespace/pid/start-ticks/nonce``."""
    parts = holder.split("/")
    return int(parts[2]) if len(parts) == 5 and parts[2].isdigit() else None


def _pause_on(procs: list[Worker]) -> None:
    """Wait briefly on a running worker (returns early if it exits): a bounded poll step."""
    live = [p for p in procs if p.poll() is None]
    if live:
        with contextlib.suppress(subprocess.TimeoutExpired):
            live[0].wait(timeout=POLL_S)


def _claiming_moment(store: EmbeddedStore, procs: list[Worker], rng: random.Random) -> bool:
    """Wait until every live worker has started its run and one of them is claiming (its
    run's scanned items are recorded and the run is not reconciled), then a random few
    polls more. True when a running worker's run is then still unreconciled."""
    seen: set[int] = set()
    deadline = time.monotonic() + PHASE_TIMEOUT_S
    while True:
        assert time.monotonic() < deadline, f"no worker was claiming within {PHASE_TIMEOUT_S} s"
        runs = {_holder_pid(holder): run_id for run_id, holder in _open(store)}
        seen |= {pid for pid in runs if pid is not None}
        live = [p for p in procs if p.poll() is None]
        if not live:
            return False
        if all(p.pid in seen for p in live):
            mid_run = [runs[p.pid] for p in live if p.pid in runs]
            if not mid_run:
                return False
            if any(store.ledger(run_id) for run_id in mid_run):
                break
        _pause_on(procs)
    for _ in range(rng.randint(0, 8)):
        _pause_on(procs)
    live_pids = {p.pid for p in procs if p.poll() is None}
    return any(_holder_pid(holder) in live_pids for _, holder in _open(store))


def _inject(
    world: World,
    cluster: ThrowawayCluster,
    store: EmbeddedStore,
    fault: str,
    procs: list[Worker],
    rng: random.Random,
    tally: Tally,
) -> EmbeddedStore:
    """Terminate every backend or restart the server while a worker is mid-run; returns
    the (reopened) polling store."""
    if not _claiming_moment(store, procs, rng):
        tally.faults_skipped += 1
        return store
    # The test's own connections are not part of the fault (nor of the count).
    store.close()
    if any(p.poll() is None for p in procs):
        if fault == "sweep":
            ended = cluster.terminate_backends()
            tally.backends_terminated += ended
            if ended:
                tally.terminate_sweeps += 1
            else:
                tally.faults_skipped += 1
        else:
            cluster.restart()
            tally.restarts += 1
    else:
        tally.faults_skipped += 1
    return world.store()


def _kill_at_random_moment(
    store: EmbeddedStore, victim: Worker, rng: random.Random, before: int
) -> bool:
    """SIGKILL the victim at a random moment of its run; True if a signal was sent."""
    if rng.random() < 0.5:
        # Once the store holds a random number of this round's new executions.
        target = before + rng.randint(1, 8)
        deadline = time.monotonic() + PHASE_TIMEOUT_S
        while (
            victim.poll() is None
            and time.monotonic() < deadline
            and store.counts()["executions"] < target
        ):
            _pause_on([victim])
    else:
        # After a random bounded wait on the victim itself (start-up, scan, claims, ...).
        with contextlib.suppress(subprocess.TimeoutExpired):
            victim.wait(timeout=rng.uniform(0.0, KILL_WITHIN_S))
    if victim.poll() is not None:
        return False
    return victim.kill()


def _round(world: World, cluster: ThrowawayCluster, rng: random.Random, tally: Tally) -> None:
    world.deliver(new_threads=3, follow_ups=3)
    fault: str | None = None
    if tally.restarts < RESTARTS and rng.random() < 0.4:
        fault = "restart"
    elif tally.terminate_sweeps < SWEEPS and rng.random() < 0.5:
        fault = "sweep"
    store = world.store()
    try:
        before = store.counts()["executions"]
        specs = [
            f"{rng.choice(crashpoints.POINTS)}:{rng.randint(0, 2)}" if rng.random() < 0.5 else None
            for _ in range(WORKERS)
        ]
        procs = [world.worker(spec) for spec in specs]
        victims = rng.sample(procs, rng.randint(1, 2))
        signalled: set[int] = set()
        try:
            if fault is not None:
                store = _inject(world, cluster, store, fault, procs, rng, tally)
            for victim in victims:
                if _kill_at_random_moment(store, victim, rng, before):
                    signalled.add(victim.pid)
        finally:
            for proc, spec in zip(procs, specs, strict=True):
                code, err = proc.finish(timeout=EXIT_TIMEOUT_S)
                assert code in (0, -signal.SIGKILL), (
                    f"round {tally.rounds} (seed {tally.seed}, fault {fault}, crash point "
                    f"{spec}): worker exited {code}\n{err}"
                )
                if code == 0:
                    tally.clean_exits += 1
                elif proc.pid in signalled:
                    tally.external_kills += 1
                else:
                    tally.crashpoint_kills += 1
    finally:
        store.close()


@pytest.mark.slow
def test_postgres_faults_during_a_multi_worker_run_lose_and_duplicate_nothing(
    tmp_path: Path,
) -> None:
    seed = random.SystemRandom().randrange(2**32)
    rng = random.Random(seed)
    tally = Tally(seed=seed)
    cluster = ThrowawayCluster(max_connections=60)
    try:
        cluster.start()
        with psycopg.connect(cluster.url, autocommit=True) as conn:
            conn.execute("CREATE EXTENSION IF NOT EXISTS amcheck")  # for integrity_check
        world = World(tmp_path, database_url=cluster.url)
        world.deliver(new_threads=30, follow_ups=30)  # a backlog: every run scans a while
        while not tally.done():
            tally.rounds += 1
            assert tally.rounds <= MAX_ROUNDS, f"faults not reached in {MAX_ROUNDS} rounds: {tally}"
            _round(world, cluster, rng, tally)
        try:
            counts = assert_recovered(world)
        except AssertionError as exc:
            raise AssertionError(f"after {tally}: {exc}") from exc
        REPORTED["faults postgres"] = {
            **asdict(tally), "sigkills": tally.sigkills, "messages": world.messages,
            "threads": len(world.threads), "executions": counts["executions"],
        }  # fmt: skip
    finally:
        cluster.destroy()
