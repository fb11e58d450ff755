"""A SQLite file several test processes share (the file-backed fake mailbox, the fault
switches of wrapped channels): each process opens its own connection, and a forked child
reconnects instead of using its parent's."""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")

_INHERITED: list[sqlite3.Connection] = []
"""Connections a forked child inherited: kept, never used nor closed (closing one would
touch the parent's file locks)."""


class SharedFile:
    """Short transactions on a shared SQLite file (WAL; BEGIN IMMEDIATE for writes)."""

    path: Path
    _db: sqlite3.Connection | None = None
    _pid: int = -1

    def _connection(self) -> sqlite3.Connection:
        if self._db is None or self._pid != os.getpid():
            if self._db is not None:
                _INHERITED.append(self._db)
            db = sqlite3.connect(self.path, timeout=120, isolation_level=None)
            db.execute("PRAGMA busy_timeout = 120000")
            db.execute("PRAGMA journal_mode = WAL")
            db.execute("PRAGMA synchronous = NORMAL")
            self._db, self._pid = db, os.getpid()
        return self._db

    def _write(self, body: Callable[[sqlite3.Connection], T]) -> T:
        db = self._connection()
        db.execute("BEGIN IMMEDIATE")
        try:
            result = body(db)
        except BaseException:
            db.execute("ROLLBACK")
            raise
        db.execute("COMMIT")
        return result

    def _read(self, sql: str, *params: object) -> list[Any]:
        return self._connection().execute(sql, params).fetchall()

    def close(self) -> None:
        if self._db is not None and self._pid == os.getpid():
            self._db.close()
        self._db = None
