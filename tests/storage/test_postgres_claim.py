"""The one-statement claim on PostgreSQL (agent/storage/postgres/claims.py): a won claim is
one statement - one transaction, one round trip - and every path gives what the general
path (and SQLite) gives: the same results, the same task records byte for byte, the same
races decided by the same constraints, and an unknown outcome read back, never claimed
twice."""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, cast

import psycopg
import pytest
from psycopg.rows import DictRow
from psycopg_pool import ConnectionPool

from agent import crashpoints
from agent.domain.envelope import Envelope, work_key
from agent.domain.execution import ClaimOutcome, ExecutionState
from agent.domain.records import ClaimRequest, ClaimResult, EscalationDraft
from agent.domain.task import Task
from agent.ports import EmbeddedStore
from agent.storage.postgres import PostgresStore
from agent.storage.postgres import claims as pg_claims
from agent.storage.postgres import store as pg_store_module
from agent.storage.sql import SqlStore
from agent.storage.sqlite import SqliteStore
from agent.testing import FrozenClock
from agent.testing.storage.base import ALIVE, DEAD, MAILBOX, WS, Harness, alive, env, retry_later
from tests.conftest import pg_cluster, pg_url_at
from tests.storage.test_postgres import CommitCutProxy, schema_url

TASK_CALL = pg_claims.TASK_FUNCTION
ESCALATION_CALL = pg_claims.ESCALATION_FUNCTION
LOCK_WAIT_TIMEOUT_S = 30


# -- helpers -------------------------------------------------------------------------------


Sent = list[tuple[int, str]]


@pytest.fixture
def statements(monkeypatch: pytest.MonkeyPatch) -> Sent:
    """Every statement the PostgreSQL stores opened in this test send, in order, with the
    thread that sent it (each is one round trip: the store never pipelines)."""
    sent: Sent = []

    class Recording(psycopg.Connection[DictRow]):
        def execute(self, query: Any, params: Any = None, **kwargs: Any) -> Any:
            text = query if isinstance(query, str) else repr(query)
            sent.append((threading.get_ident(), text))
            return super().execute(query, params, **kwargs)  # pyright: ignore[reportArgumentType] - recorded as sent

    class RecordingPool(ConnectionPool[Any]):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, connection_class=Recording, **kwargs)

    monkeypatch.setattr(pg_store_module, "ConnectionPool", RecordingPool)
    return sent


def sent_by(statements: Sent, call: Callable[[], Any]) -> tuple[Any, list[str]]:
    """What ``call`` returned, and the statements it sent (from this thread)."""
    start = len(statements)
    result = call()
    me = threading.get_ident()
    return result, [text for thread, text in statements[start:] if thread == me]


def one_statement(sent: list[str], function: str = TASK_CALL) -> bool:
    return len(sent) == 1 and function in sent[0]


def general_path_after(sent: list[str], function: str = TASK_CALL) -> bool:
    """The one statement, then the general path's own transaction."""
    return len(sent) > 3 and function in sent[0] and sent[1] == "BEGIN" and sent[-1] == "COMMIT"


class GeneralPath(PostgresStore):
    """Claims through the general path alone (the reference the one statement must match)."""

    def claim(self, *args: Any, **kwargs: Any) -> ClaimResult:
        return SqlStore.claim(self, *args, **kwargs)


TASK_ID = re.compile(r"task-[0-9a-f]{12}-[0-9a-f]{12}")


def normalized(texts: list[str]) -> list[str]:
    """The texts with every task id (random) replaced by its order of first appearance."""
    names: dict[str, str] = {}

    def name(match: re.Match[str]) -> str:
        return names.setdefault(match.group(0), f"task#{len(names) + 1}")

    return [TASK_ID.sub(name, text) for text in texts]


def records(store: EmbeddedStore) -> list[str]:
    """Every task record as stored, byte for byte."""
    assert isinstance(store, SqlStore)
    return [
        str(r["record"])
        for r in store._read("SELECT record FROM tasks ORDER BY received_at, task_id")  # pyright: ignore[reportPrivateUsage]
    ]


def wait_for_lock_wait(url: str, waiting: threading.Thread) -> None:
    """Until some session of the store's database waits on a lock (the racing claim)."""
    deadline = time.monotonic() + LOCK_WAIT_TIMEOUT_S
    with psycopg.connect(url, autocommit=True) as conn:
        while time.monotonic() < deadline and waiting.is_alive():
            row = conn.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
                " AND datname = current_database() AND application_name = 'outloop'"
            ).fetchone()
            if row is not None and row[0] > 0:
                return
            waiting.join(timeout=0.01)  # between looks, wait on the racer itself
    pytest.fail("the racing claim never waited on the other worker's lock")


@pytest.fixture
def paused_task_write(
    monkeypatch: pytest.MonkeyPatch,
) -> Iterator[tuple[threading.Event, threading.Event]]:
    """(paused, release): a general-path claim made on a thread named ``holder`` stops at
    its task write - its transaction open, its rows locked - until released."""
    paused, release = threading.Event(), threading.Event()
    hit = crashpoints.hit

    def pausing(name: str) -> None:
        if name == "after_task_write" and threading.current_thread().name == "holder":
            paused.set()
            assert release.wait(timeout=LOCK_WAIT_TIMEOUT_S)
        hit(name)

    monkeypatch.setattr(crashpoints, "hit", pausing)
    yield paused, release
    release.set()


def in_thread(name: str, call: Callable[[], Any]) -> tuple[threading.Thread, list[Any]]:
    out: list[Any] = []

    def run() -> None:
        try:
            out.append(call())
        except BaseException as exc:  # handed to the test
            out.append(exc)

    thread = threading.Thread(target=run, name=name, daemon=True)
    thread.start()
    return thread, out


# -- one round trip ------------------------------------------------------------------------


def test_a_won_claim_is_one_statement_and_one_transaction(tmp_path: Path, statements: Sent) -> None:
    url = pg_url_at(tmp_path)
    store = PostgresStore(url)
    try:
        h = Harness(store, FrozenClock())
        first, follow = env(1, 1), env(2, 1)
        reply = env(3, 2, in_reply_to=first.internet_message_id)
        run_id = h.run(first, follow, reply)
        with psycopg.connect(url, autocommit=True) as watch:

            def next_xid() -> int:
                row = watch.execute(
                    "SELECT pg_snapshot_xmax(pg_current_snapshot())::text::bigint"
                ).fetchone()
                assert row is not None
                return int(row[0])

            for e, created in ((first, True), (follow, False), (reply, False)):
                before = next_xid()
                result, sent = sent_by(statements, lambda e=e: h.claim(run_id, e))
                assert result.outcome is ClaimOutcome.CLAIMED and result.task_created is created
                # One round trip, and no BEGIN or COMMIT: the statement is the transaction
                # (one transaction id, no subtransaction).
                assert one_statement(sent), sent
                assert next_xid() - before == 1
            other_run = h.run(first)
            lost, sent = sent_by(statements, lambda: h.claim(other_run, first, holder="host/3/3/x"))
            assert lost.outcome is ClaimOutcome.EXECUTION_ALREADY_CLAIMED and one_statement(sent)
        task = store.get_task(result.task.task_id)
        assert task is not None and [m.provider_message_id for m in task.messages] == [
            "pm-1",
            "pm-2",
            "pm-3",
        ]
    finally:
        store.close()


def test_reopening_a_store_keeps_the_installed_functions_and_a_changed_one_is_replaced(
    tmp_path: Path,
) -> None:
    url = pg_url_at(tmp_path)
    installed = (
        "SELECT p.proname, p.xmin::text FROM pg_proc p JOIN pg_namespace n"
        " ON n.oid = p.pronamespace WHERE n.nspname = current_schema()"
        " AND p.proname LIKE 'outloop_claim_%' ORDER BY p.proname"
    )
    PostgresStore(url).close()
    with psycopg.connect(url, autocommit=True) as conn:
        first = conn.execute(installed).fetchall()
        assert [name for name, _ in first] == [ESCALATION_CALL, TASK_CALL]
        PostgresStore(url).close()
        assert conn.execute(installed).fetchall() == first  # not replaced
        conn.execute(f"COMMENT ON FUNCTION {TASK_CALL} IS 'an older build'")
        PostgresStore(url).close()
        again = conn.execute(installed).fetchall()
    assert again != first and [name for name, _ in again] == [ESCALATION_CALL, TASK_CALL]


# -- the same results as the general path and SQLite ----------------------------------------

UNICODE_SUBJECT = 'Re: שלום — naïve ✓ "quoted" \\ back\tslash \u2028 😀'


def every_path(
    store: EmbeddedStore,
    clock: FrozenClock,
    sent_per_step: list[tuple[str, list[str]]],
    statements: Sent,
) -> list[str]:
    """Claims through every path; what each claim returned, and the store afterwards."""
    h = Harness(store, clock)
    out: list[str] = []

    def step(label: str, call: Callable[[], Any]) -> Any:
        result, sent = sent_by(statements, call)
        sent_per_step.append((label, sent))
        out.append(f"{label}: {result.model_dump_json()}")
        return result

    first, follow = env(1, 1), env(2, 1)
    reply = env(3, 2, in_reply_to=first.internet_message_id)
    in_linked_thread = env(4, 2)
    # The same provider message again, as another occurrence: the task holds it already.
    again = Envelope.model_validate(
        {**env(2, 1).model_dump(by_alias=True), "content_digest": "x", "subject": "another"}
    )
    dead, expiring, retried = env(5, 3), env(6, 4), env(7, 5)
    wide = env(8, 6, subject=UNICODE_SUBJECT, sender="dana.levi@contoso.test")
    wide_follow = env(9, 6, subject=UNICODE_SUBJECT)
    everything = (
        first,
        follow,
        reply,
        in_linked_thread,
        dead,
        expiring,
        retried,
        wide,
        wide_follow,
    )
    r1 = h.run(*everything)
    r2 = h.run(*everything)
    step("new thread", lambda: h.claim(r1, first))
    step("same thread", lambda: h.claim(r1, follow))
    step("exact linkage", lambda: h.claim(r1, reply))
    step("linked thread", lambda: h.claim(r1, in_linked_thread))
    step("message already on the task", lambda: h.claim(r1, again))
    step("live holder", lambda: h.claim(r2, first, holder="host/3/3/other"))
    h.report(r1, follow)
    step("done", lambda: h.claim(r2, follow, holder="host/3/3/other"))
    escalation = EscalationDraft(
        scope="station", queue="unresolved", assignee="ops@fabrikam.test", reason="no binding",
        provider="memory", mailbox_id=MAILBOX, item_ref="pm-e",
    )  # fmt: skip
    for run_id in (r1, r2):
        step(
            f"escalation {run_id}",
            lambda run_id=run_id: store.claim(
                ClaimRequest(key="station-key", service="s", holder=ALIVE, run_id=run_id, item_ref="pm-e"),
                escalation, clock.now(), alive,
            ),
        )  # fmt: skip
    step("dead holder", lambda: h.claim(r1, dead, holder=DEAD))
    step("dead holder taken over", lambda: h.claim(r2, dead))
    step("expiring lease", lambda: h.claim(r1, expiring, holder="elsewhere/9/9/x", lease=30))
    step("retry", lambda: h.claim(r1, retried))
    retry_later(h, r1, retried, clock, 1)
    step("retry not due", lambda: h.claim(r2, retried, holder="host/5/5/x"))
    clock.advance(minutes=2)
    step("expired lease taken over", lambda: h.claim(r2, expiring))
    step("due retry taken over", lambda: h.claim(r2, retried, holder="host/6/6/y"))
    step("unicode thread", lambda: h.claim(r1, wide))
    clock.advance(seconds=7.123456)  # the joining message moves updated_at
    step("unicode follow-up", lambda: h.claim(r1, wide_follow))
    out += [f"execution: {x.model_dump_json()}" for x in store.list_executions()]
    out += [f"escalation: {x.model_dump_json()}" for x in store.list_escalations()]
    out += [f"record: {r}" for r in records(store)]
    out += [f"thread {w}: {t.task_id if t else None}" for w, t in (
        (w, store.task_for_thread(work_key(WS, e))) for w, e in (("1", first), ("2", reply), ("6", wide))
    )]  # fmt: skip
    out.append(f"counts: {store.counts()}")
    return normalized(out)


ONE_STATEMENT_STEPS = {
    "new thread", "same thread", "exact linkage", "linked thread", "message already on the task",
    "live holder", "done", "escalation run-1", "escalation run-2", "dead holder",
    "expiring lease", "retry", "retry not due", "unicode thread", "unicode follow-up",
}  # fmt: skip
TAKEOVERS = {"dead holder taken over", "expired lease taken over", "due retry taken over"}


def test_every_path_gives_what_sqlite_gives_and_writes_the_same_records_byte_for_byte(
    tmp_path: Path, statements: Sent
) -> None:
    lite = SqliteStore(tmp_path / "store.db")
    pg = PostgresStore(pg_url_at(tmp_path))
    try:
        on_sqlite = every_path(lite, FrozenClock(), [], statements)
        steps: list[tuple[str, list[str]]] = []
        on_postgres = every_path(pg, FrozenClock(), steps, statements)
    finally:
        lite.close()
        pg.close()
    assert on_postgres == on_sqlite
    for label, sent in steps:
        function = ESCALATION_CALL if label.startswith("escalation") else TASK_CALL
        if label in ONE_STATEMENT_STEPS:
            assert one_statement(sent, function), (label, sent)
        else:
            assert label in TAKEOVERS and general_path_after(sent, function), (label, sent)
    # Every record PostgreSQL wrote is exactly what pydantic writes for that task.
    for line in on_postgres:
        if line.startswith("record: "):
            text = line.removeprefix("record: ")
            assert Task.model_validate_json(text).model_dump_json() == text


def test_the_general_path_and_the_one_statement_leave_the_same_store(
    tmp_path: Path, statements: Sent
) -> None:
    general = GeneralPath(pg_url_at(tmp_path / "general"))
    one = PostgresStore(pg_url_at(tmp_path / "one"))
    try:
        assert every_path(general, FrozenClock(), [], statements) == every_path(
            one, FrozenClock(), [], statements
        )
    finally:
        general.close()
        one.close()


@contextmanager
def two_workers(tmp_path: Path) -> Iterator[tuple[str, PostgresStore, Harness, Harness]]:
    """(url, store, other's harness, this worker's harness): another worker on the general
    path and this one on the one-statement path, sharing one store."""
    url = pg_url_at(tmp_path)
    other, store = GeneralPath(url), PostgresStore(url)
    try:
        clock = FrozenClock()
        yield url, store, Harness(other, clock), Harness(store, clock)
    finally:
        other.close()
        store.close()


Race = Callable[[str, Callable[[], Any], Callable[[], Any]], tuple[Any, Any, list[str]]]


@pytest.fixture
def race_while_held(
    statements: Sent, paused_task_write: tuple[threading.Event, threading.Event]
) -> Race:
    """``race(url, hold, race)``: ``hold`` runs as the other worker and stops at its task
    write; ``race`` runs meanwhile until it waits on that worker's lock; then both finish.
    Their results, and what ``race`` sent."""
    paused, release = paused_task_write

    def run(url: str, hold: Callable[[], Any], race: Callable[[], Any]) -> Any:
        holder, held = in_thread("holder", hold)
        assert paused.wait(timeout=LOCK_WAIT_TIMEOUT_S)
        racer, raced = in_thread("racer", lambda: sent_by(statements, race))
        wait_for_lock_wait(url, racer)
        release.set()
        holder.join(LOCK_WAIT_TIMEOUT_S)
        racer.join(LOCK_WAIT_TIMEOUT_S)
        [created] = held
        [(result, sent)] = raced
        return created, result, sent

    return run


# -- races the statement settles itself ----------------------------------------------------


def test_a_thread_whose_task_another_worker_creates_meanwhile_joins_that_task(
    tmp_path: Path,
    race_while_held: Race,
) -> None:
    with two_workers(tmp_path) as (url, store, h_other, h):
        first, second = env(1, 7), env(2, 7)
        run_id = h.run(first, second)
        # The other worker has created thread 7's task and not committed yet; this one's
        # thread link waits on the other's.
        created, result, sent = race_while_held(
            url,
            lambda: h_other.claim(run_id, first, holder="host/8/8/other"),
            lambda: h.claim(run_id, second),
        )
        assert created.outcome is ClaimOutcome.CLAIMED and created.task_created
        # UNIQUE(work_key) decided it inside the one statement: the message joined that task.
        assert one_statement(sent), sent
        assert result.outcome is ClaimOutcome.CLAIMED and not result.task_created
        assert result.task.task_id == created.task.task_id == result.execution.task_id
        task = store.get_task(created.task.task_id)
        assert task is not None and [m.provider_message_id for m in task.messages] == [
            "pm-1",
            "pm-2",
        ]
        counts = store.counts()
        assert (counts["tasks"], counts["task_threads"], counts["task_messages"]) == (1, 1, 2)


def test_a_reply_linked_to_another_task_joins_its_own_thread_when_that_thread_won_meanwhile(
    tmp_path: Path,
    race_while_held: Race,
) -> None:
    with two_workers(tmp_path) as (url, store, h_other, h):
        original = env(1, 1)  # thread 1: its own task
        opener = env(2, 2)  # thread 2's first message
        reply = env(3, 2, in_reply_to="<m1@example.test>")  # thread 2, replying to thread 1
        run_id = h.run(original, opener, reply)
        h.claim(run_id, original)
        # The other worker is creating thread 2's own task; the reply finds thread 1's task
        # by exact linkage, and its thread link waits on the other's.
        created, result, sent = race_while_held(
            url,
            lambda: h_other.claim(run_id, opener, holder="host/8/8/other"),
            lambda: h.claim(run_id, reply),
        )
        assert created.outcome is ClaimOutcome.CLAIMED
        assert one_statement(sent) and result.outcome is ClaimOutcome.CLAIMED, sent
        thread_2 = store.task_for_thread(work_key(WS, opener))
        thread_1 = store.task_for_thread(work_key(WS, original))
        assert thread_1 is not None and thread_2 is not None
        assert thread_1.task_id != thread_2.task_id == result.task.task_id
        assert [m.provider_message_id for m in thread_1.messages] == ["pm-1"]
        assert sorted(m.provider_message_id for m in thread_2.messages) == ["pm-2", "pm-3"]


def test_what_the_statement_cannot_read_it_leaves_to_the_general_path(
    tmp_path: Path, statements: Sent
) -> None:
    url = pg_url_at(tmp_path)
    store = PostgresStore(url)
    try:
        h = Harness(store, FrozenClock())
        first, follow = env(1, 1), env(2, 1)
        run_id = h.run(first, follow)
        created = h.claim(run_id, first)
        # A record without a messages field (the model's default): the statement declines
        # to splice it, rolls back, and the general path reads it as the model does.
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("UPDATE tasks SET record = (record::jsonb - 'messages')::text")
        result, sent = sent_by(statements, lambda: h.claim(run_id, follow))
        assert general_path_after(sent), sent
        assert result.outcome is ClaimOutcome.CLAIMED and not result.task_created
        assert result.task is not None and created.task is not None
        assert result.task.task_id == created.task.task_id
        assert [m.provider_message_id for m in result.task.messages] == ["pm-2"]
        assert store.get_task(created.task.task_id) == result.task
        execution = store.get_execution(h.key(follow))
        assert execution is not None
        assert (execution.generation, execution.task_id) == (1, created.task.task_id)
        assert store.counts()["task_messages"] == 2
    finally:
        store.close()


# -- an unknown outcome --------------------------------------------------------------------


@pytest.mark.parametrize("cut", ["after", "before"])
def test_a_joining_claim_whose_outcome_is_unknown_is_read_back_and_never_claimed_twice(
    cut: str,
) -> None:
    cluster = pg_cluster()
    clock = FrozenClock()
    url = schema_url(cluster, f"join_{cut}")
    proxy = CommitCutProxy(cluster.port)
    direct = PostgresStore(url)
    proxied: PostgresStore | None = None
    try:
        proxied = PostgresStore(
            url.replace(f"@127.0.0.1:{cluster.port}/", f"@127.0.0.1:{proxy.port}/")
        )
        first, follow = env(1, 1), env(2, 1)
        h = Harness(direct, clock)
        run_id = h.run(first, follow)
        created = h.claim(run_id, first)
        through = Harness(proxied, clock)
        proxy.arm(cut, TASK_CALL.encode())
        result = through.claim(run_id, follow)
        assert proxy.fired.is_set() and proxy.commit_acknowledged is (cut == "after")
        assert proxied.commit_checks >= 1
        assert result.outcome is ClaimOutcome.CLAIMED and not result.task_created
        assert not result.taken_over and result.execution.generation == 1
        assert created.task is not None
        assert result.task is not None and result.task.task_id == created.task.task_id
        task = direct.get_task(created.task.task_id)
        assert task is not None and task == result.task
        assert [m.provider_message_id for m in task.messages] == ["pm-1", "pm-2"]
        record = direct.get_execution(through.key(follow))
        assert record is not None and record.state is ExecutionState.CLAIMED
        assert (record.holder, record.generation, record.task_id) == (ALIVE, 1, task.task_id)
        counts = direct.counts()
        assert (counts["executions"], counts["tasks"], counts["task_messages"]) == (2, 1, 2)
    finally:
        if proxied is not None:
            proxied.close()
        direct.close()
        proxy.stop()


def test_a_statement_the_server_rolled_back_runs_again_and_a_lost_one_is_read_back_first(
    tmp_path: Path,
) -> None:
    url = pg_url_at(tmp_path)
    store = PostgresStore(url)
    try:
        with psycopg.connect(url, autocommit=True) as conn:
            # Each function fails its first call only (a sequence is not rolled back): with a
            # deadlock the server answers, or by ending its own server process mid-statement.
            conn.execute("CREATE SEQUENCE first_deadlock")
            conn.execute("CREATE SEQUENCE first_lost")
            conn.execute(
                "CREATE FUNCTION deadlocks_once() RETURNS int LANGUAGE plpgsql AS $$ BEGIN"
                " IF nextval('first_deadlock') = 1 THEN"
                " RAISE EXCEPTION 'deadlock' USING ERRCODE = '40P01'; END IF; RETURN 1; END $$"
            )
            conn.execute(
                "CREATE FUNCTION lost_once() RETURNS int LANGUAGE plpgsql AS $$ BEGIN"
                " IF nextval('first_lost') = 1 THEN PERFORM pg_terminate_backend(pg_backend_pid());"
                " PERFORM pg_sleep(5); END IF; RETURN 1; END $$"
            )
        checked: list[str] = []

        def verify(label: str) -> Callable[[Any], None]:
            def check(_tx: Any) -> None:
                checked.append(label)

            return check

        def write_one(function: str) -> int:
            return store._write_one(  # pyright: ignore[reportPrivateUsage]
                f"SELECT {function}() AS v",
                (),
                lambda row: int(cast(Any, row)["v"]),
                verify(function),
            )

        # The server said it rolled the statement back: it runs again, nothing is read back.
        assert write_one("deadlocks_once") == 1
        assert (store.retries, store.commit_checks, checked) == (1, 0, [])
        # The connection was lost mid-statement: the outcome is unknown, so it is read back
        # (here: found not committed) before the statement runs again.
        assert write_one("lost_once") == 1
        assert store.retries == 2 and store.commit_checks == 1 and checked == ["lost_once"]
    finally:
        store.close()
