"""Shared fixtures: a data directory with a registered workspace, stores of every backend."""

from __future__ import annotations

import hashlib
import json
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
import stamina
from psycopg import sql

from agent.ports import EmbeddedStore, MailProvider
from agent.services import intake, workspaces
from agent.storage.postgres import PostgresStore
from agent.storage.sqlite import SqliteStore
from agent.testing import FrozenClock
from agent.testing.contexts import context_yaml  # noqa: F401 - the tests import it from here
from bench.pg_cluster import ThrowawayCluster
from fixtures.admin import MockAdmin, MockServer
from fixtures.dovecot import Dovecot

# The session's leak canary: a secret planted in a vault and looked for everywhere else.
pytest_plugins = ["tests.leak_canary"]

_cluster: ThrowawayCluster | None = None


def pytest_configure() -> None:
    # Declared retries (agent/providers/retry.py) make one attempt and never wait in tests; a
    # test of the retry rules asks for more attempts with stamina.set_testing(True, attempts=n).
    stamina.set_testing(True)


def pg_cluster() -> ThrowawayCluster:
    """The session's throwaway PostgreSQL cluster on 127.0.0.1, started on first use and
    destroyed when the session ends."""
    global _cluster  # noqa: PLW0603 - one cluster per test session
    if _cluster is None:
        _cluster = ThrowawayCluster(max_connections=120).start()
        with psycopg.connect(_cluster.url, autocommit=True) as conn:
            conn.execute("CREATE EXTENSION IF NOT EXISTS amcheck")
    return _cluster


def pytest_sessionfinish() -> None:
    if _cluster is not None:
        _cluster.destroy()
    if _dovecot is not None:
        _dovecot.destroy()
        shutil.rmtree(_dovecot.root, ignore_errors=True)
    if _mock is not None:
        _mock.stop()


_dovecot: Dovecot | None = None


def session_dovecot() -> Dovecot:
    """The session's private Dovecot on 127.0.0.1 (IMAP and LMTP), started on first use
    and destroyed when the session ends. Each test signs in as a user of its own
    (``add_user``), so no test sees another's mail."""
    global _dovecot  # noqa: PLW0603 - one server per test session
    if _dovecot is None:
        root = Path(tempfile.mkdtemp(prefix="outloop-dovecot-"))
        _dovecot = Dovecot(root).start()
    return _dovecot


_mock: MockServer | None = None


def session_mock() -> MockAdmin:
    """The session's mock providers (``outloop fixtures serve`` on a free loopback port),
    started on first use and stopped when the session ends. Tests create accounts of their
    own (unique addresses), so none sees another's mail; a test that sets fault switches
    clears them (``clear_faults``) when it ends."""
    global _mock  # noqa: PLW0603 - one server per test session
    if _mock is None:
        log = Path(tempfile.mkdtemp(prefix="outloop-mock-")) / "stderr.log"
        _mock = MockServer(log)
        _mock.start()
    assert _mock.admin is not None
    return _mock.admin


def pg_url_at(where: Path) -> str:
    """A PostgreSQL URL whose schema belongs to this location (created on first use): the
    same location reopens the same data, as a SQLite file would."""
    cluster = pg_cluster()
    schema = "t_" + hashlib.sha256(str(where).encode()).hexdigest()[:16]
    with psycopg.connect(cluster.url, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(sql.Identifier(schema)))
    return f"{cluster.url}?options=-csearch_path%3D{schema}"


# Every EmbeddedStore backend: a name and how to open a store at a location. The EmbeddedStore contract
# suite runs on each one.
BACKENDS: dict[str, Callable[[Path], EmbeddedStore]] = {
    "sqlite": lambda where: SqliteStore(where / "store.db"),
    "postgres": lambda where: PostgresStore(pg_url_at(where)),
}

# Figures the slow guarantees report at the end of the run (kills per crash point, ...).
REPORTED: dict[str, Any] = {}


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if REPORTED:
        terminalreporter.section("guarantee figures")
        for name, value in REPORTED.items():
            terminalreporter.write_line(f"{name}: {json.dumps(value, sort_keys=True)}")


@pytest.fixture
def clock() -> FrozenClock:
    return FrozenClock()


@pytest.fixture(params=sorted(BACKENDS))
def open_store(
    request: pytest.FixtureRequest, tmp_path: Path
) -> Iterator[Callable[[], EmbeddedStore]]:
    """Opens (and later closes) a store of each backend, always at the same location."""
    opener = BACKENDS[str(request.param)]
    opened: list[EmbeddedStore] = []

    def _open() -> EmbeddedStore:
        opened.append(opener(tmp_path))
        return opened[-1]

    yield _open
    for s in opened:
        s.close()


@pytest.fixture
def store(open_store: Callable[[], EmbeddedStore]) -> EmbeddedStore:
    """A fresh store of each backend (the EmbeddedStore contract suite runs on every one)."""
    return open_store()


@pytest.fixture
def data_dir(tmp_path: Path) -> workspaces.DataDir:
    root = tmp_path / "station"
    root.mkdir()
    return workspaces.DataDir(root)


@pytest.fixture
def station_store(data_dir: workspaces.DataDir) -> Iterator[SqliteStore]:
    s = SqliteStore(data_dir.database)
    yield s
    s.close()


@pytest.fixture
def register(
    station_store: SqliteStore, data_dir: workspaces.DataDir, clock: FrozenClock, tmp_path: Path
) -> Callable[[str], str]:
    """Register a workspace from context text; returns its id."""
    counter = iter(range(1000))

    def _register(text: str) -> str:
        path = tmp_path / f"context-{next(counter)}.yaml"
        path.write_text(text, encoding="utf-8")
        return workspaces.add_workspace(station_store, data_dir, path, clock.now()).workspace_id

    return _register


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


async def run_intake(
    store: EmbeddedStore,
    data_dir: workspaces.DataDir,
    workspace_id: str,
    clock: FrozenClock,
    *mailboxes: MailProvider,
    holder: str | None = None,
    from_start: bool = False,
) -> intake.RunResult:
    """One intake cycle over the given mailboxes (each serves the binding with its id);
    ``from_start``: a replay of each whole mailbox, not only what arrived since."""
    by_id = {m.mailbox_id: m for m in mailboxes}
    return await intake.run_cycle(
        store=store,
        data_dir=data_dir,
        workspace_id=workspace_id,
        provider_for=lambda _workspace, binding: by_id[binding.mailbox_id],
        clock=clock,
        holder=holder,
        from_start=from_start,
    )


def wait_for(predicate: Callable[[], bool], what: str, seconds: float = 60.0) -> None:
    """Poll ``predicate`` until it holds, failing with ``what`` after ``seconds``: for a
    condition another process brings about (nothing a test drives itself)."""
    deadline = time.monotonic() + seconds
    while not predicate():
        assert time.monotonic() < deadline, f"not within {seconds} s: {what}"
        time.sleep(0.05)
