"""The embedded store: SQLite in WAL mode, every write in a ``BEGIN IMMEDIATE`` transaction.

The store's logic is ``agent/storage/sql.py``; this module supplies the connection. Writers
are serialized by SQLite's write lock, taken up front, so a transaction never upgrades from
read to write (which would fail with SQLITE_BUSY that the busy timeout does not fix).
"""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from agent.domain.errors import StoreError
from agent.storage.sql import SqlStore, T, Tx, Verified

BUSY_TIMEOUT_S = 60.0
"""How long a writer waits for the write lock before the store gives up with an error."""


def connect(path: Path) -> sqlite3.Connection:
    """A connection with the store's settings: WAL, synchronous=FULL, a busy timeout, and
    explicit transactions only (autocommit mode; every write runs in BEGIN IMMEDIATE)."""
    conn = sqlite3.connect(
        str(path), isolation_level=None, timeout=BUSY_TIMEOUT_S, check_same_thread=False
    )
    _switch_to_wal(conn, path)
    conn.execute("PRAGMA synchronous=FULL")
    conn.execute("PRAGMA foreign_keys=ON")
    return conn


def _switch_to_wal(conn: sqlite3.Connection, path: Path) -> None:
    """Switching a new database to WAL needs an exclusive lock that the busy handler does
    not wait for; processes opening a fresh database together retry it, with a bound."""
    deadline = time.monotonic() + BUSY_TIMEOUT_S
    while True:
        try:
            conn.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as exc:
            if not _is_busy(exc) or time.monotonic() > deadline:
                raise StoreError(
                    f"could not open {path} in WAL mode: {exc}; is another program holding it?"
                ) from exc
        time.sleep(0.005)


def _is_busy(exc: sqlite3.OperationalError) -> bool:
    text = str(exc).lower()
    return "locked" in text or "busy" in text


def begin_immediate(conn: sqlite3.Connection, path: Path) -> None:
    """Take the write lock up front. SQLite's busy handler waits up to BUSY_TIMEOUT_S; a
    lock still held after that is an error that says so, never a silent retry loop."""
    try:
        conn.execute("BEGIN IMMEDIATE")
    except sqlite3.OperationalError as exc:
        if _is_busy(exc):
            raise StoreError(
                f"the database {path} stayed locked for {BUSY_TIMEOUT_S:.0f}s; is a process "
                "stuck holding a write transaction?"
            ) from exc
        raise


class _Tx:
    """The Tx protocol on the store's SQLite connection."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self._conn = conn

    def execute(self, sql: str, params: Sequence[Any] = (), /) -> sqlite3.Cursor:
        return self._conn.execute(sql, params)

    def executemany(self, sql: str, params: Iterable[Sequence[Any]], /) -> sqlite3.Cursor:
        return self._conn.executemany(sql, params)

    def execute_each(self, sql: str, params: Sequence[Sequence[Any]], /) -> list[Any]:
        return [self._conn.execute(sql, row).fetchone() for row in params]


class SqliteStore(SqlStore):
    """The Store port on one SQLite database file (thread-safe per instance)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.RLock()
        self._conn = connect(path)
        self._conn.row_factory = sqlite3.Row
        self._tx = _Tx(self._conn)
        self._write(lambda conn: self._apply_migrations(conn, str(path)), None)

    def close(self) -> None:
        with self._lock:
            self._conn.close()

    def _write(self, body: Callable[[Tx], T], verify: Callable[[Tx], Verified[T]] | None) -> T:
        """One ``BEGIN IMMEDIATE`` transaction. A local file has no unknown commit outcome,
        so ``verify`` is never needed here."""
        del verify
        with self._lock:
            begin_immediate(self._conn, self.path)
            try:
                result = body(self._tx)
                self._conn.execute("COMMIT")
            except BaseException:
                if self._conn.in_transaction:  # SQLite may have rolled back already
                    self._conn.execute("ROLLBACK")
                raise
            return result

    def _read(self, sql: str, params: Sequence[Any] = ()) -> list[Any]:
        with self._lock:
            return self._conn.execute(sql, params).fetchall()

    def integrity_check(self) -> str:
        return str(self._read("PRAGMA integrity_check")[0][0])
