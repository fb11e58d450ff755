"""Workers sharing one data directory: they start together on a fresh database, die between
a claim and its report, lose a report to another holder or defer an item to a retry - and
every item still ends in exactly one outcome, its task whole and never moved back."""

from __future__ import annotations

import multiprocessing
import socket
from collections.abc import Callable
from datetime import timedelta
from multiprocessing.connection import Connection
from multiprocessing.synchronize import Barrier
from pathlib import Path

import pytest

from agent.domain.dispositions import Disposition
from agent.domain.errors import ClaimLost
from agent.domain.execution import ClaimOutcome
from agent.domain.records import ReportRequest
from agent.domain.states import TaskState
from agent.services import intake, workspaces
from agent.services.holder import _pid_namespace
from agent.storage.sql import Tx
from agent.storage.sqlite import SqliteStore
from agent.testing import FrozenClock, InMemoryProvider, make_envelope
from tests.conftest import context_yaml
from tests.conftest import run_intake as cycle

pytestmark = pytest.mark.anyio


MAILBOX = "support@fabrikam.test"
DEAD = f"{socket.gethostname()}/{_pid_namespace()}/999999999/1/dead"


class DiesBeforeReport(SqliteStore):
    """A worker killed between its claim transaction and its report."""

    def report(self, request: ReportRequest, now):  # type: ignore[override]
        raise SystemExit("killed before the report")


PROCESSES = 16
TRIALS = 5
BOUND = 120.0  # seconds any wait on a process of the race may take


def _open_at_once(barrier: Barrier, database: str) -> None:
    """One racing process: wait at the barrier for all the others, then open the store."""
    barrier.wait(timeout=BOUND)
    SqliteStore(Path(database)).close()


def _race_to_open(databases: list[str], out: Connection) -> None:
    """The parent of the racing processes, spawned fresh (one thread, the store imported
    once): for each database in turn, fork PROCESSES processes that wait at one barrier, so
    that all of them create and migrate the new database at the same moment; send their exit
    statuses on ``out``."""
    fork = multiprocessing.get_context("fork")
    for database in databases:
        barrier = fork.Barrier(PROCESSES)
        procs = [
            fork.Process(target=_open_at_once, args=(barrier, database), daemon=True)
            for _ in range(PROCESSES)
        ]
        for proc in procs:
            proc.start()
        for proc in procs:
            proc.join(BOUND)
        out.send([proc.exitcode for proc in procs])


def test_sixteen_processes_opening_a_new_database_together_all_succeed(tmp_path: Path) -> None:
    # Sixteen OS processes, released together by a barrier, race to create and migrate the
    # same database (their tracebacks, if any, are in the captured stderr). They are forked
    # from a helper that imported the store once, not started as interpreters that each
    # import it: the race is the same, without sixteen start-ups per trial.
    databases = [tmp_path / f"t{trial}.db" for trial in range(TRIALS)]
    spawn = multiprocessing.get_context("spawn")
    results, sender = spawn.Pipe(duplex=False)
    helper = spawn.Process(target=_race_to_open, args=([str(db) for db in databases], sender))
    helper.start()
    sender.close()
    try:
        for db in databases:
            assert results.poll(BOUND), "the racing processes did not all end"
            assert results.recv() == [0] * PROCESSES
            store = SqliteStore(db)
            assert store.schema_version() >= 1 and store.integrity_check() == "ok"
            store.close()
        helper.join(BOUND)
        assert helper.exitcode == 0
    finally:
        results.close()
        if helper.is_alive():
            helper.kill()
            helper.join(BOUND)


async def test_a_takeover_after_a_crash_still_triages_the_message_as_new(
    data_dir: workspaces.DataDir, clock: FrozenClock, register: Callable[[str], str]
) -> None:
    ws = register(context_yaml())
    box = InMemoryProvider(MAILBOX)
    box.deliver(make_envelope(mailbox_id=MAILBOX, message_no=1, thread_no=1))
    box.deliver(
        make_envelope(mailbox_id=MAILBOX, message_no=2, thread_no=2, auto_submitted="auto-replied")
    )
    dying = DiesBeforeReport(data_dir.database)
    for _ in range(2):  # each dead run claims one more item, creates its task, then dies
        with pytest.raises(SystemExit):
            await cycle(dying, data_dir, ws, clock, box, holder=DEAD)
    dying.close()
    store = SqliteStore(data_dir.database)
    result = await cycle(store, data_dir, ws, clock, box)
    assert [i.claim for i in result.items] == [ClaimOutcome.CLAIMED] * 2
    states = {t.title: t.state for t in store.list_tasks(ws)}
    assert states == {"Request 1": TaskState.TASK_RESOLVED, "Request 2": TaskState.COMPLETED}
    assert [t.title for t in store.list_queue(ws)] == ["Request 1"]
    store.close()


async def test_a_takeover_after_the_agent_moved_the_task_on_does_not_poison_later_runs(
    data_dir: workspaces.DataDir, clock: FrozenClock, register: Callable[[str], str]
) -> None:
    ws = register(context_yaml())
    box = InMemoryProvider(MAILBOX)
    for n in (1, 2):
        box.deliver(make_envelope(mailbox_id=MAILBOX, message_no=n, thread_no=n))
    dying = DiesBeforeReport(data_dir.database)
    with pytest.raises(SystemExit):
        await cycle(dying, data_dir, ws, clock, box, holder=DEAD)
    dying.close()
    store = SqliteStore(data_dir.database)
    [task] = store.list_tasks(ws)
    for state in (TaskState.IN_DISCOVERY, TaskState.EXECUTING):  # the agent host works it
        store.transition_task(task.task_id, state, "agent host", clock.now())
    result = await cycle(store, data_dir, ws, clock, box)
    assert result.reconciliation is not None and result.reconciliation.clean
    assert [i.claim for i in result.items] == [ClaimOutcome.CLAIMED] * 2
    moved = store.get_task(task.task_id)
    assert moved is not None and moved.state is TaskState.EXECUTING  # the agent's move stands
    store.close()


async def test_an_auto_reply_that_opened_a_thread_never_leaves_it_half_made(
    data_dir: workspaces.DataDir, clock: FrozenClock, register: Callable[[str], str]
) -> None:
    ws = register(context_yaml())
    box = InMemoryProvider(MAILBOX)
    box.deliver(
        make_envelope(
            mailbox_id=MAILBOX, message_no=1, thread_no=1, auto_submitted="auto-generated"
        )
    )
    box.deliver(
        make_envelope(
            mailbox_id=MAILBOX,
            message_no=2,
            thread_no=1,
            sender="dana.levi@contoso.test",
            in_reply_to="<m1@example.test>",
        )
    )
    dying = DiesBeforeReport(data_dir.database)
    with pytest.raises(SystemExit):  # the auto-reply's worker, on another host, dies
        await cycle(dying, data_dir, ws, clock, box, holder="other-host.test/1/4242/77/x")
    dying.close()
    store = SqliteStore(data_dir.database)
    await cycle(store, data_dir, ws, clock, box)  # its run's lease still runs
    clock.advance(seconds=301)
    await cycle(store, data_dir, ws, clock, box)  # its claim's lease ran out: taken over
    clock.advance(seconds=intake.RUN_LEASE.total_seconds())
    await cycle(store, data_dir, ws, clock, box)  # its run's lease ran out: the reply too
    [task] = store.list_tasks(ws)
    assert task.state is TaskState.TASK_RESOLVED
    assert task.next_action.description != "none: automated message"
    store.close()


async def test_a_lost_report_is_recorded_and_the_run_goes_on(
    data_dir: workspaces.DataDir, clock: FrozenClock, register: Callable[[str], str]
) -> None:
    ws = register(context_yaml())

    class LosesTheFirstReport(SqliteStore):
        lost = False

        def report(self, request: ReportRequest, now):  # type: ignore[override]
            if not self.lost:
                self.lost = True
                raise ClaimLost("lease expired; another holder took the occurrence over")
            return super().report(request, now)

    store = LosesTheFirstReport(data_dir.database)
    box = InMemoryProvider(MAILBOX)
    for n in (1, 2):
        box.deliver(make_envelope(mailbox_id=MAILBOX, message_no=n, thread_no=n))
    result = await cycle(store, data_dir, ws, clock, box)
    assert [i.disposition for i in result.items] == [
        Disposition.EXECUTION_ALREADY_CLAIMED, Disposition.QUEUED,
    ]  # fmt: skip
    assert result.reconciliation is not None and result.reconciliation.clean
    store.close()


async def test_a_due_retry_finishes_and_unblocks_its_task(
    station_store: SqliteStore, data_dir: workspaces.DataDir, clock: FrozenClock,
    register: Callable[[str], str],
) -> None:  # fmt: skip
    ws = register(context_yaml())
    box = InMemoryProvider(MAILBOX)
    box.deliver(make_envelope(mailbox_id=MAILBOX, message_no=1, thread_no=1))
    first = await cycle(station_store, data_dir, ws, clock, box)
    [task] = station_store.list_tasks(ws)
    # The work on the occurrence hit a transient failure: it is re-claimed and deferred.
    record = station_store.list_executions()[0]
    station_store.start_run("run-retry", ws, "h/0/1/1/x", clock.now())
    station_store.record_scanned([], clock.now())

    def reclaim(conn: Tx) -> None:
        conn.execute(
            "UPDATE executions SET state = 'CLAIMED', holder = 'h/0/1/1/x' WHERE key = ?",
            (record.key,),
        )
        conn.execute(
            "INSERT INTO run_items (run_id, item_ref, occurrence_key, scanned_at) VALUES ('run-retry', 'r', ?, 0)",
            (record.key,),
        )

    station_store._write(reclaim, None)  # pyright: ignore[reportPrivateUsage]
    station_store.report(
        ReportRequest(key=record.key, holder="h/0/1/1/x", run_id="run-retry", item_ref="r",
                      disposition=Disposition.QUEUED, detail="provider timed out",
                      retry_at=clock.now() + timedelta(minutes=5)),
        clock.now(),
    )  # fmt: skip
    blocked = station_store.get_task(task.task_id)
    assert blocked is not None and blocked.state is TaskState.BLOCKED_RETRY_PENDING
    assert blocked.blocked_by == (record.key,)
    clock.advance(minutes=6)
    retried = await cycle(station_store, data_dir, ws, clock, box)
    assert [i.claim for i in retried.items] == [ClaimOutcome.CLAIMED]
    done = station_store.get_task(task.task_id)
    assert done is not None and done.state is TaskState.TASK_RESOLVED and done.blocked_by == ()
    assert first.items[0].task_id == task.task_id
