"""What is particular to the SQLite backend (the contract suite covers the rest)."""

from __future__ import annotations

import hashlib
import sqlite3
from pathlib import Path

import pytest

from agent.domain.errors import StoreError
from agent.storage.schema import MIGRATIONS
from agent.storage.sqlite import SqliteStore


def test_the_store_runs_in_wal_with_full_sync(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "s.db")
    store.close()
    conn = sqlite3.connect(tmp_path / "s.db")
    try:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    finally:
        conn.close()


def test_a_database_from_a_newer_outloop_is_refused(tmp_path: Path) -> None:
    SqliteStore(tmp_path / "s.db").close()
    conn = sqlite3.connect(tmp_path / "s.db")
    with conn:
        newer = conn.execute("SELECT max(version) FROM schema_version").fetchone()[0] + 1
        conn.execute("INSERT INTO schema_version (version) VALUES (?)", (newer,))
    conn.close()
    with pytest.raises(StoreError, match=f"schema version {newer}, newer than this Outloop"):
        SqliteStore(tmp_path / "s.db")


# Migration 1 is the first released schema. A released migration never changes: a schema
# change is a new migration, so every database ever created can be upgraded in order.
RELEASED = {1: "1b9cc222c579b2034381884370b567d70e28e9e57c3a283752a4e3116f775704"}


def test_released_migrations_are_never_edited() -> None:
    for version, statements in MIGRATIONS:
        if version in RELEASED:
            digest = hashlib.sha256(repr((version, statements)).encode()).hexdigest()
            assert digest == RELEASED[version], f"migration {version} was edited; add a new one"
    assert [v for v, _ in MIGRATIONS] == list(range(1, len(MIGRATIONS) + 1))
