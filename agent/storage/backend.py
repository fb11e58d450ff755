"""Which store backend a station uses: one setting decides.

Unset, the embedded SQLite store lives in the data directory. A ``postgresql://`` URL selects
the shared PostgreSQL store, for many workers on many machines.
"""

from __future__ import annotations

from pathlib import Path

from agent.domain.errors import StoreError
from agent.ports import EmbeddedStore

DATABASE_URL_SETTING = "OUTLOOP_DATABASE_URL"
POSTGRES_SCHEMES = ("postgresql", "postgres")


PROBE_SECONDS = 3.0
"""How long a probe's store (``bounded``) waits for the database before saying it does not
answer."""


def open_store(
    database_url: str | None, sqlite_path: Path, *, bounded: bool = False
) -> EmbeddedStore:
    """The store the setting names; a bad value fails here, naming the setting. ``bounded``:
    a probe's store, which gives up on an unreachable database within ``PROBE_SECONDS``."""
    if database_url is None or not database_url.strip():
        from agent.storage.sqlite import SqliteStore  # noqa: PLC0415 - only what is used

        return SqliteStore(sqlite_path)
    scheme, sep, _ = database_url.strip().partition("://")
    if sep and scheme.lower() in POSTGRES_SCHEMES:
        # psycopg is imported only here
        from agent.storage.postgres import PostgresStore, RetryPolicy  # noqa: PLC0415

        if bounded:
            policy = RetryPolicy(max_attempts=3, deadline_s=PROBE_SECONDS)
            return PostgresStore(
                database_url.strip(), pool_size=1, retry=policy, connect_timeout_s=2,
                query_timeout_ms=int(PROBE_SECONDS * 1000),
            )  # fmt: skip
        return PostgresStore(database_url.strip())
    shown = f"a {scheme!r} URL" if sep else "a value that is not a URL"
    raise StoreError(
        f"{DATABASE_URL_SETTING} must be a postgresql:// URL (for example "
        "postgresql://outloop@db.internal:5432/outloop), or unset for the embedded SQLite "
        f"store in the data directory; it is {shown}"
    )
