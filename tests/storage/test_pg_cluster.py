"""The throwaway PostgreSQL cluster that tests and benchmarks start on 127.0.0.1."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from bench import pg_cluster
from bench.pg_cluster import ClusterError, ThrowawayCluster


@pytest.fixture(scope="module")
def cluster() -> Iterator[ThrowawayCluster]:
    with ThrowawayCluster(max_connections=30) as started:
        yield started


def test_the_url_names_the_outloop_database_on_loopback(cluster: ThrowawayCluster) -> None:
    assert cluster.url == f"postgresql://postgres@127.0.0.1:{cluster.port}/outloop"
    assert cluster.admin_url() == f"postgresql://postgres@127.0.0.1:{cluster.port}/postgres"
    with psycopg.connect(cluster.url, autocommit=True) as conn:
        assert conn.execute("SELECT current_database()").fetchone() == ("outloop",)


def test_max_connections_and_durability_settings_are_applied(cluster: ThrowawayCluster) -> None:
    with psycopg.connect(cluster.url, autocommit=True) as conn:
        shown = {
            name: conn.execute(f"SHOW {name}").fetchone()
            for name in ("max_connections", "fsync", "synchronous_commit", "shared_buffers")
        }
    assert shown == {
        "max_connections": ("30",),
        "fsync": ("on",),
        "synchronous_commit": ("on",),
        "shared_buffers": ("128MB",),
    }


def test_a_table_can_be_created_and_written(cluster: ThrowawayCluster) -> None:
    with psycopg.connect(cluster.url) as conn:
        conn.execute("CREATE TABLE written (id int PRIMARY KEY, body text NOT NULL)")
        conn.execute("INSERT INTO written VALUES (1, 'hello')")
        conn.commit()
        assert conn.execute("SELECT body FROM written WHERE id = 1").fetchone() == ("hello",)


def test_terminate_backends_kills_open_connections(cluster: ThrowawayCluster) -> None:
    with psycopg.connect(cluster.url, autocommit=True) as victim:
        victim.execute("SELECT 1")
        assert cluster.terminate_backends() >= 1
        with pytest.raises(psycopg.OperationalError):
            victim.execute("SELECT 1")
    with psycopg.connect(cluster.url, autocommit=True) as conn:
        assert conn.execute("SELECT 1").fetchone() == (1,)


def test_restart_is_a_crash_that_keeps_committed_data(cluster: ThrowawayCluster) -> None:
    url = cluster.url
    with psycopg.connect(url) as conn:
        conn.execute("CREATE TABLE survives (id int PRIMARY KEY)")
        conn.execute("INSERT INTO survives VALUES (1)")
        conn.commit()
        conn.execute("INSERT INTO survives VALUES (2)")  # left uncommitted by the crash
        cluster.restart()
        with pytest.raises(psycopg.OperationalError):
            conn.execute("SELECT 1")
    assert cluster.url == url
    assert "database system was interrupted" in cluster.log_tail(40)
    with psycopg.connect(url, autocommit=True) as conn:
        assert conn.execute("SELECT id FROM survives ORDER BY id").fetchall() == [(1,)]


def test_destroy_removes_the_directory_and_is_idempotent(tmp_path: Path) -> None:
    with ThrowawayCluster(base_dir=tmp_path / "clusters", max_connections=10) as cluster:
        directory = cluster.directory
        assert directory.parent == tmp_path / "clusters"
        assert "ready to accept connections" in cluster.log_tail()
        url = cluster.url
    assert not directory.exists()
    cluster.destroy()
    assert not cluster.running
    with pytest.raises(psycopg.OperationalError):
        psycopg.connect(url, connect_timeout=2).close()
    with pytest.raises(ClusterError, match="destroyed"):
        cluster.start()


def test_a_port_taken_before_the_server_binds_it_is_retried(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        taken: int = squatter.getsockname()[1]
        free = iter([taken])
        real_free_port = pg_cluster._free_port
        monkeypatch.setattr(pg_cluster, "_free_port", lambda: next(free, None) or real_free_port())
        with ThrowawayCluster(max_connections=10) as cluster:
            assert cluster.port != taken
            assert "Address already in use" in cluster.log_tail()
            with psycopg.connect(cluster.url, autocommit=True) as conn:
                assert conn.execute("SELECT 1").fetchone() == (1,)


def test_missing_server_binaries_say_how_to_install_them(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("OUTLOOP_PG_BINDIR", str(tmp_path))
    cluster = ThrowawayCluster()
    with pytest.raises(ClusterError, match=r"install the postgresql package \(./scripts/setup"):
        cluster.start()
    cluster.destroy()


def test_settings_the_cluster_owns_are_refused() -> None:
    with pytest.raises(ValueError, match="managed by ThrowawayCluster"):
        ThrowawayCluster(settings={"port": "5432"})
