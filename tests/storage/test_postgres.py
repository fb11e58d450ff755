"""Behaviour particular to the PostgreSQL store: concurrent migrations, a clear refusal of a
bad OUTLOOP_DATABASE_URL, retried transient faults, unknown commit outcomes resolved by
reading the execution record, racing machines, and the integrity check.

The shared behaviour is the storage contract suites' (agent/testing/storage, run by tests/storage/test_contracts.py).
The fault tests run on a cluster of their own, so its restarts disturb nobody else.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import re
import socket
import subprocess
import sys
import threading
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql

from agent.domain.envelope import work_key
from agent.domain.errors import StoreError
from agent.domain.execution import ClaimOutcome, ExecutionState
from agent.domain.run import LedgerEntry
from agent.services import workspaces
from agent.storage.backend import DATABASE_URL_SETTING, open_store
from agent.storage.postgres import PostgresStore
from agent.storage.postgres import claims as pg_claims
from agent.storage.postgres import store as pg_store_module
from agent.storage.schema import MIGRATIONS
from agent.storage.sql import SqlStore
from agent.testing import FrozenClock, InMemoryProvider, make_envelope
from agent.testing.storage.base import ALIVE, MAILBOX, WS, Harness, env
from bench.pg_cluster import ThrowawayCluster
from tests.conftest import context_yaml, pg_cluster, pg_url_at, run_intake

ROOT = Path(__file__).resolve().parents[2]
PASSWORD = "s3cret-pw"
CHILD_TIMEOUT_S = 90


# -- helpers -------------------------------------------------------------------------------


def schema_url(cluster: ThrowawayCluster, label: str) -> str:
    """A URL on ``cluster`` whose search_path is a new, empty schema."""
    schema = f"s_{label}_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(cluster.url, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(schema)))
    return f"{cluster.url}?options=-csearch_path%3D{schema}"


@contextlib.contextmanager
def released_together(code: str, argvs: list[list[str]]) -> Iterator[list[subprocess.Popen[str]]]:
    """Start one ``python -c code`` per argv; each prints ``ready`` and waits on stdin. Once
    all are ready, one line to each releases them at the same moment."""
    procs: list[subprocess.Popen[str]] = []
    try:
        for argv in argvs:
            procs.append(
                subprocess.Popen(
                    [sys.executable, "-c", code, *argv],
                    stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                    text=True, cwd=ROOT,
                )
            )  # fmt: skip
        for proc in procs:
            assert proc.stdout is not None
            line = proc.stdout.readline()
            if line.strip() != "ready":
                proc.kill()
                _, err = proc.communicate(timeout=CHILD_TIMEOUT_S)
                pytest.fail(f"a child was not ready: {line!r}\n{err}")
        for proc in procs:
            assert proc.stdin is not None
            proc.stdin.write("go\n")
            proc.stdin.flush()
        yield procs
    finally:
        for proc in procs:
            if proc.poll() is None and proc.stdin is not None and not proc.stdin.closed:
                with contextlib.suppress(OSError):
                    proc.stdin.close()
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=CHILD_TIMEOUT_S)
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            for pipe in (proc.stdin, proc.stdout, proc.stderr):
                if pipe is not None and not pipe.closed:
                    pipe.close()


def exception_chain(exc: BaseException) -> list[BaseException]:
    """The exception and every one reachable through __cause__ and __context__."""
    seen: list[BaseException] = []
    todo: list[BaseException | None] = [exc]
    while todo:
        current = todo.pop()
        if current is None or any(current is s for s in seen):
            continue
        seen.append(current)
        todo += [current.__cause__, current.__context__]
    return seen


@pytest.fixture(scope="module")
def fault_cluster() -> Iterator[ThrowawayCluster]:
    """A cluster of this module's own: the fault tests terminate its backends and restart it."""
    with ThrowawayCluster(max_connections=40) as cluster:
        yield cluster


# -- migrations ----------------------------------------------------------------------------

OPEN_ONCE = (
    "import sys\n"
    "from agent.storage.postgres import PostgresStore\n"
    "print('ready', flush=True)\n"
    "sys.stdin.readline()\n"
    "PostgresStore(sys.argv[1]).close()\n"
)


def test_eight_processes_opening_a_fresh_schema_together_migrate_it_exactly_once(
    tmp_path: Path,
) -> None:
    url = pg_url_at(tmp_path)
    with psycopg.connect(url, autocommit=True) as conn:
        assert conn.execute("SELECT to_regclass('schema_version')").fetchone() == (None,)
    with released_together(OPEN_ONCE, [[url]] * 8) as procs:
        outcomes = [p.communicate(timeout=CHILD_TIMEOUT_S) for p in procs]
        codes = [p.returncode for p in procs]
    assert codes == [0] * 8, [err for _, err in outcomes if err][:1]
    with psycopg.connect(url, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT version, count(*) FROM schema_version GROUP BY version ORDER BY version"
        ).fetchall()
    assert rows == [(version, 1) for version, _ in MIGRATIONS]
    store = PostgresStore(url)
    try:
        assert store.schema_version() == MIGRATIONS[-1][0]
        assert store.list_workspaces() == []
    finally:
        store.close()


# -- a bad OUTLOOP_DATABASE_URL ------------------------------------------------------------


@pytest.fixture
def closed_port() -> Iterator[int]:
    """A loopback port that refuses connections: bound (so nobody else takes it), not
    listening."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        yield sock.getsockname()[1]


BAD_URLS = {
    "not-postgres": "mysql://u:{pw}@127.0.0.1:{port}/db",
    "bad-port": "postgresql://u:{pw}@127.0.0.1:99999x/db",
    "unknown-parameter": "postgresql://u:{pw}@127.0.0.1:{port}/db?bogus=1",
    # libpq quotes a URI it cannot parse: the password must be blanked out of that too.
    "unparsable-host": "postgresql://u:{pw}@[::1/db",
    "password-echoed-in-an-option": "postgresql://u:{pw}@127.0.0.1:{port}/db?sslmode={pw}",
    "password-in-the-query": "postgresql://u@127.0.0.1:{port}/db?password={pw}%zz&sslmode=require",
    "spaced-password-in-the-query": "postgresql://u@127.0.0.1:{port}/db?password={pw}%20x",
    "unencoded-at-in-the-password": "postgresql://u:{pw}@x@127.0.0.1:{port}/db",
    "unreachable": "postgresql://u:{pw}@127.0.0.1:{port}/db",
}


@pytest.mark.parametrize("kind", sorted(BAD_URLS))
def test_a_bad_database_url_fails_at_open_naming_the_setting_without_the_password(
    kind: str, closed_port: int, tmp_path: Path
) -> None:
    url = BAD_URLS[kind].format(pw=PASSWORD, port=closed_port)
    with pytest.raises(StoreError) as raised:
        open_store(url, tmp_path / "store.db")
    assert DATABASE_URL_SETTING in str(raised.value)
    for exc in exception_chain(raised.value):
        assert PASSWORD not in str(exc) and PASSWORD not in repr(exc), (type(exc), exc)
    # A URL never falls back to the embedded store.
    assert not (tmp_path / "store.db").exists()


@pytest.mark.parametrize("kind", sorted(BAD_URLS))
def test_the_cli_refuses_a_bad_database_url_with_one_line_and_no_password(
    kind: str, closed_port: int, tmp_path: Path
) -> None:
    url = BAD_URLS[kind].format(pw=PASSWORD, port=closed_port)
    done = subprocess.run(
        [sys.executable, "-m", "mcp_server.cli", "workspace", "show", "--data-dir", str(tmp_path)],
        check=False, capture_output=True, text=True, cwd=ROOT, timeout=CHILD_TIMEOUT_S,
        env={**os.environ, DATABASE_URL_SETTING: url}, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert done.returncode != 0
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("Error: ") and DATABASE_URL_SETTING in lines[0]
    assert "Traceback" not in done.stderr
    assert PASSWORD not in done.stderr and PASSWORD not in done.stdout


# -- transient faults ----------------------------------------------------------------------


def test_terminated_backends_are_retried_and_the_store_keeps_working(
    fault_cluster: ThrowawayCluster,
) -> None:
    clock = FrozenClock()
    store = PostgresStore(schema_url(fault_cluster, "terminate"))
    try:
        h = Harness(store, clock)
        first, second = env(1, 1), env(2, 2)
        run_id = h.run(first, second)
        assert h.claim(run_id, first).outcome is ClaimOutcome.CLAIMED
        assert store.retries == 0
        assert fault_cluster.terminate_backends() >= 1
        # A read, then a claim: both succeed on fresh connections.
        record = store.get_execution(h.key(first))
        assert record is not None and record.state is ExecutionState.CLAIMED
        assert store.retries >= 1
        assert fault_cluster.terminate_backends() >= 1
        before = store.retries
        assert h.claim(run_id, second).outcome is ClaimOutcome.CLAIMED
        assert store.retries > before
        counts = store.counts()
        assert (counts["executions"], counts["tasks"]) == (2, 2)
    finally:
        store.close()


def test_a_server_shutting_down_is_waited_for_and_a_refused_connection_is_not(
    fault_cluster: ThrowawayCluster, closed_port: int
) -> None:
    # A smart shutdown waits for the open session; meanwhile the server answers every new
    # connection with "the database system is shutting down" - a restart in progress.
    held = psycopg.connect(fault_cluster.url, autocommit=True)
    stopping = threading.Thread(target=fault_cluster.stop, args=("smart",))
    stopping.start()
    try:
        shutting_down: psycopg.OperationalError | None = None
        for _ in range(500):  # bounded: the shutdown begins within moments
            try:
                psycopg.connect(fault_cluster.url, connect_timeout=2).close()
            except psycopg.OperationalError as exc:
                shutting_down = exc
                break
            stopping.join(timeout=0.01)
        assert shutting_down is not None and "shutting down" in str(shutting_down)
        assert pg_store_module._is_restarting(shutting_down)  # pyright: ignore[reportPrivateUsage]
    finally:
        held.close()
        stopping.join(timeout=60)
        fault_cluster.start()
    with pytest.raises(psycopg.OperationalError) as refused:
        psycopg.connect(f"postgresql://u@127.0.0.1:{closed_port}/db", connect_timeout=2)
    assert not pg_store_module._is_restarting(refused.value)  # pyright: ignore[reportPrivateUsage]


def test_a_full_server_restart_is_survived_and_committed_data_is_intact(
    fault_cluster: ThrowawayCluster,
) -> None:
    clock = FrozenClock()
    store = PostgresStore(schema_url(fault_cluster, "restart"))
    try:
        h = Harness(store, clock)
        first, second = env(1, 1), env(2, 1)
        run_id = h.run(first, second)
        claimed = h.claim(run_id, first)
        assert claimed.task is not None
        h.report(run_id, first)
        fault_cluster.restart()
        record = store.get_execution(h.key(first))
        assert record is not None and record.state is ExecutionState.DONE
        assert store.retries >= 1
        follow = h.claim(run_id, second)
        assert follow.outcome is ClaimOutcome.CLAIMED and follow.task is not None
        assert follow.task.task_id == claimed.task.task_id
        task = store.get_task(claimed.task.task_id)
        assert task is not None and [m.provider_message_id for m in task.messages] == [
            "pm-1",
            "pm-2",
        ]
        assert [e.item_ref for e in store.ledger(run_id)] == ["pm-1", "pm-2"]
        counts = store.counts()
        assert (counts["executions"], counts["executions_done"], counts["tasks"]) == (2, 1, 1)
    finally:
        store.close()


# -- unknown commit outcomes ---------------------------------------------------------------

READY_FOR_QUERY_AT_END = re.compile(rb"Z\x00\x00\x00\x05[ITE]\Z")


class _Link:
    """One proxied client connection: a pump each way."""

    def __init__(self, proxy: CommitCutProxy, client: socket.socket, server: socket.socket):
        self.proxy = proxy
        self.client = client
        self.server = server
        self.swallow = False  # the COMMIT went to the server: keep its reply from the client
        self.reply = bytearray()
        self._closed = False
        self._lock = threading.Lock()
        self.threads = [
            threading.Thread(target=self._up, daemon=True),
            threading.Thread(target=self._down, daemon=True),
        ]

    def start(self) -> None:
        for thread in self.threads:
            thread.start()

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
        for sock in (self.client, self.server):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()

    def _up(self) -> None:
        """Client to server; the armed cut acts on the first chunk holding COMMIT."""
        while True:
            try:
                data = self.client.recv(65536)
            except OSError:
                break
            if not data:
                break
            mode = self.proxy.take_armed(data)
            if mode == "before":
                # Fired before the cut: the client may read back and the test check the
                # moment the connection drops.
                self.proxy.fired.set()
                self.close()  # the server never sees COMMIT: it rolls back
                return
            if mode == "after":
                self.swallow = True
            try:
                self.server.sendall(data)
            except OSError:
                break
        self.close()

    def _down(self) -> None:
        """Server to client; once swallowing, cut the client when the commit is answered."""
        while True:
            try:
                data = self.server.recv(65536)
            except OSError:
                break
            if not data:
                break
            if self.swallow:
                self.reply += data
                if b"COMMIT\x00" in self.reply or READY_FOR_QUERY_AT_END.search(self.reply):
                    self.proxy.commit_acknowledged = self.proxy.acknowledges(bytes(self.reply))
                    self.proxy.fired.set()  # before the cut, as above
                    self.close()
                    return
                continue
            try:
                self.client.sendall(data)
            except OSError:
                break
        self.close()


class CommitCutProxy:
    """A TCP proxy on 127.0.0.1 to the server that, once armed, cuts the client connection
    that sends COMMIT: ``after`` the server answered it (the commit happened, the client
    never hears so), or ``before`` the server gets it (the transaction never commits).
    Armed with another marker, it cuts the connection that sends the statement holding it
    (a statement that is its own transaction, as a one-statement claim is). It fires once
    and disarms."""

    def __init__(self, upstream_port: int) -> None:
        self._upstream = ("127.0.0.1", upstream_port)
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self._lock = threading.Lock()
        self._mode: str | None = None
        self._marker = b"COMMIT"  # what the armed cut waits for
        self._cut = b"COMMIT"  # what the last cut cut
        self._links: list[_Link] = []
        self._stopped = False
        self.fired = threading.Event()
        self.commit_acknowledged = False
        self._acceptor = threading.Thread(target=self._accept, daemon=True)
        self._acceptor.start()

    def arm(self, mode: str, marker: bytes = b"COMMIT") -> None:
        assert mode in ("after", "before")
        with self._lock:
            self._mode = mode
            self._marker = marker
            self.fired.clear()
            self.commit_acknowledged = False

    def take_armed(self, chunk: bytes) -> str | None:
        with self._lock:
            if self._mode is None or self._marker not in chunk:
                return None
            mode, self._mode, self._cut = self._mode, None, self._marker
            return mode

    def acknowledges(self, reply: bytes) -> bool:
        """Whether the server's reply to the cut chunk says it committed: COMMIT's own tag;
        for a statement that is its own transaction, its completion without an error."""
        if self._cut == b"COMMIT":
            return b"COMMIT\x00" in reply
        kinds: set[bytes] = set()
        at = 0
        while at + 5 <= len(reply):  # type byte, then the length (which counts itself)
            kinds.add(reply[at : at + 1])
            at += 1 + int.from_bytes(reply[at + 1 : at + 5], "big")
        return b"C" in kinds and b"E" not in kinds

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return  # the listener was shut down
            try:
                server = socket.create_connection(self._upstream, timeout=10)
            except OSError:
                client.close()
                continue
            server.settimeout(None)
            link = _Link(self, client, server)
            with self._lock:
                stopped = self._stopped
                if not stopped:
                    self._links.append(link)
            if stopped:
                link.close()
                return
            link.start()

    def stop(self) -> None:
        with self._lock:
            self._stopped = True
            links = list(self._links)
        with contextlib.suppress(OSError):
            self._listener.shutdown(socket.SHUT_RDWR)
        self._listener.close()
        self._acceptor.join(timeout=10)
        for link in links:
            link.close()
        for thread in [t for link in links for t in link.threads]:
            thread.join(timeout=10)
        alive = [
            t for t in [self._acceptor, *(t for ln in links for t in ln.threads)] if t.is_alive()
        ]
        assert not alive, f"{len(alive)} proxy threads did not stop"


@pytest.mark.parametrize("cut", ["after", "before"])
def test_an_unknown_commit_outcome_is_read_back_and_never_claims_twice(
    fault_cluster: ThrowawayCluster, cut: str
) -> None:
    clock = FrozenClock()
    url = schema_url(fault_cluster, f"commit_{cut}")
    proxy = CommitCutProxy(fault_cluster.port)
    direct = PostgresStore(url)
    proxied: PostgresStore | None = None
    try:
        proxied = PostgresStore(
            url.replace(f"@127.0.0.1:{fault_cluster.port}/", f"@127.0.0.1:{proxy.port}/")
        )
        e = env(1, 1)
        run_id = Harness(direct, clock).run(e)  # the ledger is written on the direct store
        through = Harness(proxied, clock)
        key = through.key(e)

        # A won claim is one statement on PostgreSQL (agent/storage/postgres/claims.py):
        # the statement itself is the commit.
        proxy.arm(cut, pg_claims.TASK_FUNCTION.encode())
        result = through.claim(run_id, e)
        assert proxy.fired.is_set(), "the proxy never saw the claim's commit"
        assert proxy.commit_acknowledged is (cut == "after")
        assert result.outcome is ClaimOutcome.CLAIMED
        assert result.task is not None and result.task_created
        assert result.execution.generation == 1 and not result.taken_over
        assert proxied.commit_checks >= 1
        [execution] = direct.list_executions()
        assert (execution.key, execution.generation, execution.holder) == (key, 1, ALIVE)
        assert execution.task_id == result.task.task_id
        [task] = direct.list_tasks(WS)
        assert task.task_id == result.task.task_id
        assert [m.provider_message_id for m in task.messages] == ["pm-1"]

        if cut == "after":
            # A report whose commit happened unheard returns normally: it is read back,
            # not run again (which the execution record would refuse).
            checks = proxied.commit_checks
            proxy.arm("after")
            record = through.report(run_id, e)
            assert proxy.fired.is_set() and proxy.commit_acknowledged
            assert record.state is ExecutionState.DONE and record.key == key
            assert proxied.commit_checks > checks
            [done] = direct.list_executions(ExecutionState.DONE)
            assert (done.key, done.generation) == (key, 1)
            assert [(x.item_ref, x.disposition) for x in direct.ledger(run_id)] == [
                ("pm-1", record.outcome)
            ]
        counts = direct.counts()
        assert (counts["executions"], counts["tasks"], counts["task_messages"]) == (1, 1, 1)
    finally:
        if proxied is not None:
            proxied.close()
        direct.close()
        proxy.stop()


# -- two machines racing -------------------------------------------------------------------

THREADS = 50
PER_THREAD = 4


def race_envelopes() -> list[tuple[int, int]]:
    """(message number, thread number) of the raced occurrences."""
    return [(t * PER_THREAD + i + 1, t + 1) for t in range(THREADS) for i in range(PER_THREAD)]


def race_worker(url: str, seed: int, holder: str) -> None:
    """One machine (a child process): claims every occurrence in its own random order."""
    store = PostgresStore(url)
    clock = FrozenClock()
    h = Harness(store, clock)
    envs = [env(n, t) for n, t in race_envelopes()]
    random.Random(seed).shuffle(envs)
    run_id = f"run-{holder}"
    store.start_run(run_id, WS, holder, clock.now())
    print("ready", flush=True)
    sys.stdin.readline()
    outcomes: dict[str, int] = {}
    for e in envs:
        outcome = h.claim(run_id, e, holder=holder).outcome
        outcomes[outcome.value] = outcomes.get(outcome.value, 0) + 1
    print(json.dumps({"outcomes": outcomes, "retries": store.retries}), flush=True)
    store.close()


RACE = (
    "import sys\n"
    "from tests.storage.test_postgres import race_worker\n"
    "race_worker(sys.argv[1], int(sys.argv[2]), sys.argv[3])\n"
)


def test_two_machines_claiming_the_same_occurrences_claim_each_once_and_lose_no_message(
    tmp_path: Path,
) -> None:
    url = pg_url_at(tmp_path)
    PostgresStore(url).close()  # migrated before the race
    holders = ["machine-a/1/1/w", "machine-b/2/2/w"]
    argvs = [[url, str(seed), holder] for seed, holder in enumerate(holders, start=7)]
    with released_together(RACE, argvs) as procs:
        outcomes = [p.communicate(timeout=CHILD_TIMEOUT_S) for p in procs]
        codes = [p.returncode for p in procs]
    assert codes == [0, 0], [err for _, err in outcomes][:2]
    reports = [json.loads(out.strip().splitlines()[-1]) for out, _ in outcomes]
    total: dict[str, int] = {}
    for report in reports:
        for outcome, n in report["outcomes"].items():
            total[outcome] = total.get(outcome, 0) + n
    occurrences = THREADS * PER_THREAD
    # Both machines won some claims: they really raced.
    assert all(r["outcomes"].get(ClaimOutcome.CLAIMED.value, 0) > 0 for r in reports), reports
    assert total == {
        ClaimOutcome.CLAIMED.value: occurrences,
        ClaimOutcome.EXECUTION_ALREADY_CLAIMED.value: occurrences,
    }
    store = PostgresStore(url)
    try:
        counts = store.counts()
        assert counts["executions"] == occurrences
        assert (counts["tasks"], counts["task_threads"]) == (THREADS, THREADS)
        assert counts["task_messages"] == occurrences
        assert {e.holder for e in store.list_executions()} <= set(holders)
        assert all(e.generation == 1 for e in store.list_executions())
        tasks = store.list_tasks(WS)
        assert len(tasks) == THREADS
        expected = {
            f"thread-{t}": {f"pm-{n}" for n, thread in race_envelopes() if thread == t}
            for t in range(1, THREADS + 1)
        }
        for task in tasks:
            assert len(task.messages) == PER_THREAD, (task.provider_thread_id, task.messages)
            got = {m.provider_message_id for m in task.messages}
            assert got == expected[task.provider_thread_id]
        assert store.integrity_check() == "ok"
    finally:
        store.close()


# -- integrity -----------------------------------------------------------------------------


def test_integrity_check_is_ok_on_a_healthy_store_with_amcheck(tmp_path: Path) -> None:
    with psycopg.connect(pg_cluster().url, autocommit=True) as conn:
        assert conn.execute("SELECT 1 FROM pg_extension WHERE extname = 'amcheck'").fetchone()
    store = PostgresStore(pg_url_at(tmp_path))
    try:
        h = Harness(store, FrozenClock())
        envs = [env(n, n % 3) for n in range(1, 10)]
        run_id = h.run(*envs)
        for e in envs:
            h.claim(run_id, e)
        h.report(run_id, envs[0])
        assert store.counts()["tasks"] == 3
        assert store.integrity_check() == "ok"
    finally:
        store.close()


@pytest.mark.parametrize("amcheck", [False, True])
def test_integrity_check_names_an_invalid_index(
    fault_cluster: ThrowawayCluster, tmp_path: Path, amcheck: bool
) -> None:
    # The fault cluster has no amcheck (only the catalog's validity flags are read); the
    # session cluster has it, and an invalid index must not be handed to it to check.
    url = pg_url_at(tmp_path) if amcheck else schema_url(fault_cluster, "invalid_index")
    store = PostgresStore(url)
    try:
        clock = FrozenClock()
        store.record_health("a", "same", clock.now())
        store.record_health("b", "same", clock.now())
        assert store.integrity_check() == "ok"
        with (
            psycopg.connect(url, autocommit=True) as conn,
            pytest.raises(psycopg.errors.UniqueViolation),
        ):
            conn.execute("CREATE UNIQUE INDEX CONCURRENTLY health_detail ON health (detail)")
        assert store.integrity_check() == "index health_detail is invalid"
    finally:
        store.close()


@pytest.mark.anyio
async def test_a_second_machine_runs_a_workspace_registered_on_the_first(tmp_path: Path) -> None:
    # Two data directories (two machines) share one PostgreSQL store: the second has no
    # copy of the context file, and reads the registered context from the store.
    url = pg_url_at(tmp_path)
    first, second = (workspaces.DataDir(tmp_path / name) for name in ("machine-a", "machine-b"))
    for data_dir in (first, second):
        data_dir.root.mkdir()
    source = tmp_path / "context.yaml"
    source.write_text(context_yaml(WS, mailbox=MAILBOX), encoding="utf-8")
    clock = FrozenClock()
    store_a, store_b = PostgresStore(url), PostgresStore(url)
    try:
        workspaces.add_workspace(store_a, first, source, clock.now())
        source.unlink()  # the operator's file is gone; machine A keeps its own copy
        assert not second.context_file(WS).exists()
        box = InMemoryProvider(MAILBOX)
        box.deliver(make_envelope(mailbox_id=MAILBOX, message_no=1, thread_no=1))
        result = await run_intake(store_b, second, WS, clock, box)
        assert result.reconciliation is not None and result.reconciliation.clean
        [task] = store_a.list_tasks(WS)
        assert task.workspace_id == WS
    finally:
        store_a.close()
        store_b.close()


# -- interleavings that only concurrent writers can produce --------------------------------


class PausesInClaim(PostgresStore):
    """Runs ``between`` once, on another connection, at a chosen point of its next claim."""

    def __init__(self, url: str) -> None:
        super().__init__(url)
        self.after_contest: Callable[[], object] | None = None
        self.after_linkage: Callable[[], object] | None = None

    def claim(self, request: Any, draft: Any, now: Any, holder_alive: Any) -> Any:
        if self.after_linkage is not None:
            # The pause sits in the general path's linkage read: the one-statement claim
            # reads linkage inside its statement (tests/storage/test_postgres_claim.py races
            # that one with a lock).
            return SqlStore.claim(self, request, draft, now, holder_alive)
        return super().claim(request, draft, now, holder_alive)

    def _contest(self, existing: Any, now: Any, holder_alive: Any) -> Any:
        outcome = super()._contest(existing, now, holder_alive)
        hook, self.after_contest = self.after_contest, None
        if hook is not None:
            hook()
        return outcome

    def _find_task_id(self, conn: Any, draft: Any, *, thread_read: bool = False) -> Any:
        found = super()._find_task_id(conn, draft, thread_read=thread_read)
        hook, self.after_linkage = self.after_linkage, None
        if hook is not None and found[0] is not None and not found[1]:
            hook()
        return found


def test_a_takeover_never_overwrites_a_report_that_landed_after_its_read(
    tmp_path: Path,
) -> None:
    url = pg_url_at(tmp_path)
    first, second = PostgresStore(url), PausesInClaim(url)
    try:
        clock = FrozenClock()
        h1, h2 = Harness(first, clock), Harness(second, clock)
        h2.runs = 100  # its runs get their own ids
        e = env(1, 1)
        run_id = h1.run(e)
        assert h1.claim(run_id, e, lease=60).outcome is ClaimOutcome.CLAIMED
        clock.advance(minutes=5)  # the first holder stalled past its lease, then reports
        run2 = h2.run(e)
        second.after_contest = lambda: h1.report(run_id, e)
        result = h2.claim(run2, e, holder="machine-b/1/1/1/x")
        # The takeover read an expired claim, but the report committed before its update:
        # the execution is finished, and nobody handles it a second time.
        assert result.outcome is ClaimOutcome.EXECUTION_ALREADY_DONE
        record = first.get_execution(h1.key(e))
        assert record is not None
        assert (record.state, record.holder, record.generation) == (ExecutionState.DONE, ALIVE, 1)
    finally:
        first.close()
        second.close()


def test_a_reply_linked_to_another_task_joins_its_own_thread_when_that_thread_won_first(
    tmp_path: Path,
) -> None:
    url = pg_url_at(tmp_path)
    first, second = PostgresStore(url), PausesInClaim(url)
    try:
        clock = FrozenClock()
        h1, h2 = Harness(first, clock), Harness(second, clock)
        original = env(1, 1)  # thread 1: its own task
        opener = env(2, 2)  # thread 2's first message
        reply = env(3, 2, in_reply_to="<m1@example.test>")  # thread 2, replying to thread 1
        run_id = h1.run(original, opener, reply)
        h1.claim(run_id, original)
        # The reply finds thread 1's task by exact linkage; before it points thread 2 at
        # that task, another worker creates thread 2's own task and commits.
        second.after_linkage = lambda: h1.claim(run_id, opener)
        assert h2.claim(run_id, reply).outcome is ClaimOutcome.CLAIMED
        thread_2 = first.task_for_thread(work_key(WS, opener))
        thread_1 = first.task_for_thread(work_key(WS, original))
        assert thread_1 is not None and thread_2 is not None
        assert thread_1.task_id != thread_2.task_id
        assert [m.provider_message_id for m in thread_1.messages] == ["pm-1"]
        assert sorted(m.provider_message_id for m in thread_2.messages) == ["pm-2", "pm-3"]
    finally:
        first.close()
        second.close()


def test_data_the_database_refuses_fails_at_once_with_a_store_error(tmp_path: Path) -> None:
    store = PostgresStore(pg_url_at(tmp_path))
    try:
        clock = FrozenClock()
        store.start_run("run-1", WS, ALIVE, clock.now())
        # No retry can make a NUL byte acceptable to a text column: it is refused at once.
        with pytest.raises(StoreError, match="refused the operation") as refused:
            store.record_scanned([LedgerEntry(run_id="run-1", item_ref="a\x00b")], clock.now())
        assert store.retries == 0
        assert refused.value.__cause__ is None
        assert store.ledger("run-1") == []
    finally:
        store.close()
