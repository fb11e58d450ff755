"""What every SQL module shares: the transaction and row protocols a backend supplies, time
as stored, and ``SqlBase`` - the transaction core (``_write(body, verify)``, ``_read``) and
the schema.

Uniqueness comes from UNIQUE constraints alone (no check-then-act, no advisory lock).
Statements are written once, with ``?`` placeholders; backends (``agent/storage/sqlite.py``,
``agent/storage/postgres``) supply connections, transactions and their dialect. Where writers
run concurrently (PostgreSQL, READ COMMITTED), a read-modify-write of a task or a run locks
its row first (``FOR UPDATE``), and a change decided on an unlocked read is a compare-and-set
on everything that read saw; SQLite's write lock serializes every writer anyway.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator, Sequence
from datetime import UTC, datetime
from typing import Any, Literal, Protocol, TypeVar

from pydantic import BaseModel

from agent.domain.errors import StoreError
from agent.storage.schema import MIGRATIONS

T = TypeVar("T")


class Row(Protocol):
    """A result row, read by column name."""

    def __getitem__(self, key: str, /) -> Any: ...


class Cursor(Protocol):
    """Results are read with fetchone/fetchall (where statements are pipelined, a fetch is
    what waits for the server)."""

    def fetchone(self) -> Any: ...

    def fetchall(self) -> list[Any]: ...


class Tx(Protocol):
    """One open transaction. Statements use ``?`` placeholders."""

    def execute(self, sql: str, params: Sequence[Any] = (), /) -> Cursor: ...

    def executemany(self, sql: str, params: Iterable[Sequence[Any]], /) -> Any: ...

    def execute_each(self, sql: str, params: Sequence[Sequence[Any]], /) -> list[Any]:
        """Run the statement once per parameter row; the first result row of each run (or
        None), in order. Drivers that can send them together do."""
        ...


Verified = tuple[T] | None
"""What a commit check found: ``(result,)`` when the transaction committed, else None."""


CHUNK_ROWS = 100
"""Rows per multi-row statement: under every database's parameter limit, and short enough
for drivers to cache the statement text."""


def chunks(items: Sequence[T]) -> Iterator[Sequence[T]]:
    for start in range(0, len(items), CHUNK_ROWS):
        yield items[start : start + CHUNK_ROWS]


def ts(moment: datetime) -> float:
    return moment.timestamp()


def dt(value: float | None) -> datetime | None:
    return None if value is None else datetime.fromtimestamp(value, UTC)


M = TypeVar("M", bound=BaseModel)


def record_of(
    model: type[M],
    row: Row,
    *,
    times: Sequence[str] = (),
    lists: Sequence[str] = (),
    **given: Any,
) -> M:
    """The record a row holds, its columns named as the model's fields: ``times`` are
    stored as seconds since the epoch, ``lists`` as JSON arrays; ``given`` are fields that
    are not columns."""
    values: dict[str, Any] = {}
    for name in model.model_fields:
        if name in given:
            continue
        value = row[name]
        if name in times:
            value = dt(value)
        elif name in lists:
            value = tuple(json.loads(value))
        values[name] = value
    return model.model_validate({**values, **given})


Dialect = Literal["sqlite", "postgresql"]


def apply_migrations(
    conn: Tx,
    where: str,
    dialect: Dialect,
    translate: Callable[[str], str] = lambda s: s,
    upto: int | None = None,
) -> None:
    """Apply the migrations this database lacks (up to ``upto``, default all), inside the
    caller's transaction. ``translate`` adapts each statement to the backend's DDL."""
    conn.execute("CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL)")
    row = conn.execute("SELECT max(version) AS v FROM schema_version").fetchone()
    current = int(row["v"] or 0)
    known = MIGRATIONS[-1][0]
    if current > known:
        raise StoreError(
            f"the database {where} has schema version {current}, newer than this "
            f"Outloop knows ({known}); upgrade Outloop before opening it"
        )
    for version, steps in MIGRATIONS:
        if version <= current or (upto is not None and version > upto):
            continue
        for step in steps:
            if isinstance(step, str):
                statements: tuple[str, ...] = (step,)
            else:
                statements = step.sqlite if dialect == "sqlite" else step.postgresql
            for statement in statements:
                conn.execute(translate(statement))
        conn.execute("INSERT INTO schema_version (version) VALUES (?)", (version,))


class SqlBase:
    """The transaction core; a backend supplies ``_write``, ``_read`` and its dialect."""

    FOR_UPDATE = ""
    """The clause that locks the rows a read-modify-write selects."""

    FOR_SHARE = ""
    """The clause that keeps the rows a write depends on from changing until it commits."""

    DIALECT: Dialect = "sqlite"
    """Which side of a ``PerBackend`` migration step this backend runs."""

    def _write(self, body: Callable[[Tx], T], verify: Callable[[Tx], Verified[T]] | None) -> T:
        """Run ``body`` in one write transaction and commit. When the commit's outcome is
        unknown (the connection died during it), ``verify`` reads whether it took effect;
        without ``verify`` the body is safe to run again."""
        raise NotImplementedError

    def _read(self, sql: str, params: Sequence[Any] = ()) -> list[Any]:
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError

    def integrity_check(self) -> str:
        raise NotImplementedError

    def _apply_migrations(
        self, conn: Tx, where: str, translate: Callable[[str], str] = lambda s: s
    ) -> None:
        """Apply the migrations this database lacks, inside the caller's transaction."""
        apply_migrations(conn, where, self.DIALECT, translate)

    def schema_version(self) -> int:
        return int(self._read("SELECT max(version) AS v FROM schema_version")[0]["v"])

    def counts(self) -> dict[str, int]:
        tables = (
            "executions",
            "tasks",
            "task_threads",
            "task_messages",
            "runs",
            "run_items",
            "escalations",
            "sends",
        )
        out = {t: int(self._read(f"SELECT count(*) AS n FROM {t}")[0]["n"]) for t in tables}
        out["executions_done"] = int(
            self._read("SELECT count(*) AS n FROM executions WHERE state = 'DONE'")[0]["n"]
        )
        return out
