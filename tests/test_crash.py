"""Crash: real worker processes (the ``outloop run`` CLI) die by SIGKILL at named points.

Each crash point of agent/crashpoints.py is hit by at least 10 SIGKILLs while fresh mail
keeps arriving; then a clean run takes over every dead holder's claim. Afterwards every
occurrence has exactly one execution and its thread exactly one task, every run's scanned
items equal the sum of its dispositions, and SQLite's integrity check is ok.

Each worker is an OS process of its own, forked from multiprocessing's forkserver with the
command line already imported, that runs ``outloop run`` through the CLI's own entry point
(``mcp_server.cli.main``) in an environment of its own: the same command a started
``python -m mcp_server.cli`` runs, without paying the interpreter's start-up and imports
(most of a short run's cost) in every one of the many workers these tests start and kill.
"""

from __future__ import annotations

import mailbox
import multiprocessing
import os
import random
import signal
import subprocess
import time
from datetime import UTC, datetime
from email.message import EmailMessage
from pathlib import Path

import pytest

from agent import crashpoints
from agent.domain.execution import ExecutionState
from agent.domain.states import TaskState
from agent.ports import EmbeddedStore
from agent.services import workspaces
from agent.services.holder import holder_alive
from agent.storage.backend import DATABASE_URL_SETTING
from agent.storage.postgres import PostgresStore
from agent.storage.sqlite import SqliteStore
from mcp_server.cli import main as outloop
from tests.conftest import REPORTED, context_yaml

MAILBOX = "support@fabrikam.test"
KILLS_PER_POINT = 10
WS = "ws-crash"
# Workers start forked from the forkserver, this module (and with it the CLI) imported there
# when this module starts the server; a server another test started imports it on first use.
FORKSERVER = multiprocessing.get_context("forkserver")


def _run_cli(argv: list[str], env: dict[str, str], stderr: str) -> None:
    """A worker process: the ``outloop`` command line with ``argv`` in the environment
    ``env`` (nothing else of the parent's), its stdout discarded and its stderr written to
    the file ``stderr``."""
    os.environ.clear()
    os.environ.update(env)
    for fd, path in ((1, os.devnull), (2, stderr)):
        opened = os.open(path, os.O_WRONLY)
        os.dup2(opened, fd)
        os.close(opened)
    outloop.main(args=argv, prog_name="outloop")  # exits with the command's status


class Worker:
    """One worker process of a test (what the tests read of it: its pid, whether and how it
    ended, its stderr) and the SIGKILL that ends it from outside."""

    def __init__(self, argv: list[str], env: dict[str, str], stderr: Path) -> None:
        self.stderr = stderr
        stderr.touch()
        self.process = FORKSERVER.Process(target=_run_cli, args=(argv, env, str(stderr)))
        self.process.start()
        assert self.process.pid is not None
        self.pid: int = self.process.pid

    @property
    def returncode(self) -> int | None:
        """None while it runs; then its exit status, or -9 after a SIGKILL."""
        return self.process.exitcode

    def poll(self) -> int | None:
        return self.returncode

    def wait(self, timeout: float) -> int:
        """Its exit status, once it ends within ``timeout`` seconds."""
        self.process.join(timeout)
        if self.returncode is None:
            raise subprocess.TimeoutExpired(f"worker {self.pid}", timeout)
        return self.returncode

    def kill(self) -> bool:
        """SIGKILL it; False when it had already ended (the fork server reaps its children
        at once, so an ended worker's pid is gone)."""
        try:
            os.kill(self.pid, signal.SIGKILL)
        except ProcessLookupError:
            return False
        return True

    def finish(self, timeout: float) -> tuple[int, str]:
        """Its exit status and stderr, once it ends within ``timeout`` seconds."""
        code = self.wait(timeout)
        return code, self.stderr.read_text(errors="replace")


class World:
    """A data directory, a Maildir that keeps receiving mail, and worker processes.

    With ``database_url`` the store is that PostgreSQL database (workers get it as
    OUTLOOP_DATABASE_URL); without it, SQLite in the data directory.
    """

    def __init__(self, root: Path, database_url: str | None = None) -> None:
        self.root = root
        self.database_url = database_url
        self.data_dir = workspaces.DataDir(root / "station")
        self.maildir = root / "Maildir"
        self.box = mailbox.Maildir(str(self.maildir), create=True)
        self.messages = 0
        self.threads: list[str] = []  # root Message-ID of each thread
        self.rng = random.Random(7)
        self.workers = 0  # started so far
        (root / "stderr").mkdir()
        ctx = root / "context.yaml"
        ctx.write_text(context_yaml(WS, provider="maildir", path=str(self.maildir)))
        store = self.store()
        try:
            workspaces.add_workspace(store, self.data_dir, ctx, _now())
        finally:
            store.close()

    def deliver(self, new_threads: int, follow_ups: int) -> None:
        for _ in range(new_threads):
            self._add(None)
        for _ in range(follow_ups):
            if self.threads:
                self._add(self.rng.choice(self.threads))

    def _add(self, thread_root: str | None) -> None:
        self.messages += 1
        mid = f"<crash-{self.messages}@contoso.test>"
        msg = EmailMessage()
        msg["From"] = "dana.levi@contoso.test"
        msg["To"] = MAILBOX
        msg["Subject"] = f"Request {self.messages}"
        msg["Message-ID"] = mid
        msg["Date"] = "Mon, 30 Nov 2026 09:00:00 +0000"
        if thread_root is not None:
            msg["In-Reply-To"] = thread_root
            msg["References"] = thread_root
        else:
            self.threads.append(mid)
        msg.set_content(f"message {self.messages}")
        self.box.add(msg.as_bytes())

    def worker(self, crash: str | None = None) -> Worker:
        """A worker running ``outloop run --once`` on this world's station, armed to kill
        itself at the crash point ``crash`` (``name:skip``) if given."""
        env = self.worker_env(crash)
        self.workers += 1
        FORKSERVER.set_forkserver_preload([__name__])  # once the server runs: no effect
        return Worker(
            ["run", "--workspace", WS, "--once", "--quiet", "--json",
             "--data-dir", str(self.data_dir.root)],
            env, self.root / "stderr" / f"worker-{self.workers}.log",
        )  # fmt: skip

    def worker_env(self, crash: str | None = None) -> dict[str, str]:
        """A worker's environment: this world's store, armed at ``crash`` if given."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("OUTLOOP_")}
        if crash:
            env["OUTLOOP_CRASHPOINT"] = crash
        if self.database_url is not None:
            env[DATABASE_URL_SETTING] = self.database_url
        return env

    def store(self) -> EmbeddedStore:
        if self.database_url is not None:
            return PostgresStore(self.database_url)
        return SqliteStore(self.data_dir.database)


def _now():

    return datetime.now(UTC)


def _wait(procs: list[Worker]) -> list[int]:
    codes: list[int] = []
    for proc in procs:
        code, err = proc.finish(timeout=120)
        assert code in (0, -signal.SIGKILL), err
        codes.append(code)
    return codes


def assert_recovered(world: World) -> dict[str, int]:
    """The guarantees after the crashes, checked after one clean run and a reconcile."""
    store = world.store()
    try:
        # Before recovery: every unfinished claim is held by a provably dead holder, so it
        # is cleanly claimable.
        unfinished = store.list_executions(ExecutionState.CLAIMED)
        assert all(not holder_alive(e.holder) for e in unfinished)
    finally:
        store.close()
    # Three clean workers race to take over the dead holders' claims and finish the work.
    assert _wait([world.worker() for _ in range(3)]) == [0, 0, 0]
    store = world.store()
    try:
        counts = assert_nothing_lost_or_doubled(world, store)
        for run_id in store.list_runs()[-3:]:
            last = store.run_summary(run_id)
            assert last is not None and last.clean, last
        return counts
    finally:
        store.close()


def _unexecuted(world: World, store: EmbeddedStore) -> str:
    """The messages no execution names, with their delivery times: what a lost one shows."""
    refs = {e.item_ref for e in store.list_executions()}
    lost = [
        f"{path.name} ({world.box[key]['Subject']}, ctime_ns {path.stat().st_ctime_ns})"
        for key in world.box.iterkeys()
        if f"maildir:{key}" not in refs
        for path in world.maildir.glob(f"*/{key}*")
    ]
    return f"{store.counts()}; now {time.time_ns()}; not executed: {lost}"


def assert_nothing_lost_or_doubled(world: World, store: EmbeddedStore) -> dict[str, int]:
    """Every run reconciled (scanned = the sum of its dispositions), every message executed
    once, one task per thread, each triaged by the claim that created it."""
    # The clean run reconciled every earlier run its dead workers left open.
    assert store.unreconciled_runs(WS) == []
    for run_id in store.list_runs():
        rec = store.run_summary(run_id)
        assert rec is not None, f"run {run_id} was never reconciled"
        ledger = store.ledger(run_id)
        assert all(e.disposition is not None for e in ledger)
        assert rec.scanned == len(ledger)
        assert rec.scanned == (
            rec.terminal + rec.non_terminal + rec.claim_race + rec.reconciliation_failed
        )
    counts = store.counts()
    assert counts["executions"] == counts["executions_done"] == world.messages, _unexecuted(
        world, store
    )
    assert counts["tasks"] == len(world.threads)  # one task per verified thread
    assert counts["task_messages"] == world.messages
    # Every task was triaged by the claim that created it, even when that claim was taken
    # over from a dead worker: none is left half-made.
    for task in store.list_tasks(WS):
        assert task.state is TaskState.TASK_RESOLVED, (task.title, task.state)
        assert task.execution_outcome == "QUEUED" and task.created_by
    assert store.integrity_check() == "ok"
    return counts


@pytest.mark.slow
@pytest.mark.parametrize("point", crashpoints.INTAKE_POINTS)
def test_workers_killed_at_a_named_crash_point_lose_and_duplicate_nothing(
    point: str, tmp_path: Path
) -> None:
    world = World(tmp_path)
    world.deliver(new_threads=6, follow_ups=6)
    kills = rounds = 0
    while kills < KILLS_PER_POINT:
        rounds += 1
        assert rounds <= 60, f"only {kills} kills at {point} in 60 rounds"
        world.deliver(new_threads=2, follow_ups=2)
        skip = 0 if point == "mid_reconcile" else world.rng.randint(0, 3)
        codes = _wait([world.worker(f"{point}:{skip}"), world.worker(f"{point}:{skip + 1}")])
        kills += codes.count(-signal.SIGKILL)
    counts = assert_recovered(world)
    REPORTED[f"crash point {point}"] = {
        "sigkills": kills, "rounds": rounds, "messages": world.messages,
        "threads": len(world.threads), "executions": counts["executions"],
    }  # fmt: skip


@pytest.mark.slow
def test_workers_killed_from_outside_at_random_moments_lose_and_duplicate_nothing(
    tmp_path: Path,
) -> None:
    world = World(tmp_path)
    kills = 0
    for _ in range(12):
        world.deliver(new_threads=12, follow_ups=12)
        procs = [world.worker() for _ in range(3)]
        victim = world.rng.choice(procs)
        target = world.rng.randint(1, 20)
        store = world.store()
        try:
            before = store.counts()["executions"]
            deadline = time.monotonic() + 60
            # Poll (waiting on the victim itself between looks) until it is mid-run.
            while time.monotonic() < deadline and store.counts()["executions"] < before + target:
                try:
                    victim.wait(timeout=0.02)
                    break
                except subprocess.TimeoutExpired:
                    continue
        finally:
            store.close()
        if victim.poll() is None:
            victim.kill()
        kills += _wait(procs).count(-signal.SIGKILL)
    counts = assert_recovered(world)
    REPORTED["crash external random SIGKILL"] = {
        "sigkills": kills, "messages": world.messages, "executions": counts["executions"],
    }  # fmt: skip
    assert kills >= 5
