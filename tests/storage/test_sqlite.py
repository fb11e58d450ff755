"""What is particular to the SQLite backend (the contract suite covers the rest)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from agent.domain.errors import StoreError
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
