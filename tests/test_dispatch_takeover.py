"""Exactly one dispatcher per workspace across processes sharing one PostgreSQL store: two
started at once, one runs and one stands by; the active one dies by SIGKILL in the middle of
its cycle and the other takes over at once (its holder is proven dead), runs the cycle again,
and the intake reconciles the dead run - nothing lost, nothing doubled. A dispatcher killed
while idle is replaced the same way."""

from __future__ import annotations

import os
import signal
from pathlib import Path

from tests.conftest import REPORTED, pg_url_at, wait_for
from tests.test_crash import WS, Worker, World, assert_nothing_lost_or_doubled

CRASH_AFTER = 7
"""Both dispatchers die (SIGKILL) at their 8th committed claim: the active one mid-cycle; the
one taking over claims the rest (fewer than 8) and lives."""


def dispatcher(world: World, crash: str | None, tag: str) -> Worker:
    env = world.worker_env(crash)
    argv = ["dispatch", "--workspace", WS, "--poll", "0.1", "--lease-seconds", "30",
            "--data-dir", str(world.data_dir.root)]  # fmt: skip
    return Worker(argv, env, world.root / "stderr" / f"dispatcher-{tag}.log")


def roles(world: World) -> dict[int, str]:
    """Each dispatcher process's last reported role, by pid."""
    store = world.store()
    try:
        return {int(d.holder.split("/")[2]): d.role for d in store.list_dispatchers(WS)}
    finally:
        store.close()


def test_two_dispatchers_one_runs_one_stands_by_and_takes_over_a_cycle_killed_midway(
    tmp_path: Path,
) -> None:
    world = World(tmp_path, database_url=pg_url_at(tmp_path))
    pair = [dispatcher(world, f"after_claim_txn:{CRASH_AFTER}", t) for t in "ab"]
    third: Worker | None = None
    try:
        wait_for(lambda: sorted(roles(world).values()) == ["active", "standby"], "one active")
        active = next(w for w in pair if roles(world)[w.pid] == "active")
        standby = next(w for w in pair if w is not active)
        assert f"pid {active.pid}" in standby.stderr.read_text()  # says who holds the lease

        world.deliver(new_threads=6, follow_ups=6)
        os.kill(active.pid, signal.SIGUSR1)  # a cycle now: it dies in it, at its 8th claim
        assert active.wait(60) == -signal.SIGKILL
        wait_for(lambda: roles(world).get(standby.pid) == "active", "the standby takes over")
        wait_for(lambda: _all_done(world), "the interrupted cycle run again to its end")
        assert standby.poll() is None, standby.stderr.read_text()

        # Killed while idle: a new dispatcher takes over at once and runs the new mail.
        assert standby.kill()
        standby.wait(30)
        third = dispatcher(world, None, "c")
        wait_for(lambda: roles(world).get(third.pid) == "active", "a new dispatcher takes over")
        world.deliver(new_threads=2, follow_ups=2)
        os.kill(third.pid, signal.SIGUSR1)
        wait_for(lambda: _all_done(world), "the new mail claimed by the new dispatcher")
        os.kill(third.pid, signal.SIGTERM)  # stops: gives the lease up, reports it
        assert third.wait(30) == 0, third.stderr.read_text()
        assert roles(world)[third.pid] == "stopped"
    finally:
        for worker in (*pair, *([third] if third else [])):
            worker.kill()
    counts = cycles_and_runs(world)
    REPORTED["dispatch takeover (PostgreSQL)"] = {
        "messages": world.messages, "threads": len(world.threads), "cycles": counts["cycles"],
        "runs": counts["runs"],
    }  # fmt: skip


def cycles_done(world: World) -> bool:
    store = world.store()
    try:
        cycles = store.list_cycles(WS)
        return bool(cycles) and all(c.finished_at is not None for c in cycles)
    finally:
        store.close()


def _all_done(world: World) -> bool:
    store = world.store()
    try:
        counts = store.counts()
        return counts["executions_done"] == world.messages and cycles_done(world)
    finally:
        store.close()


def cycles_and_runs(world: World) -> dict[str, int]:
    """Nothing lost or doubled, and every cycle finished (the one interrupted by the kill
    included)."""
    store = world.store()
    try:
        assert_nothing_lost_or_doubled(world, store)
        cycles = store.list_cycles(WS, 100)
        assert all(c.finished_at is not None for c in cycles)
        return {"cycles": len(cycles), "runs": len(store.list_runs())}
    finally:
        store.close()
