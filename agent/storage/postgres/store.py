"""The shared store: PostgreSQL for many workers on many machines.

The store's logic is ``agent/storage/sql.py`` (the same statements and migrations as SQLite);
this module supplies pooled connections, explicit transactions and the fault handling:

- Each store keeps a pool of one or two connections in autocommit mode; a write runs
  ``BEGIN`` ... ``COMMIT`` on one connection, in READ COMMITTED. Uniqueness comes from UNIQUE
  constraints (``INSERT ... ON CONFLICT DO NOTHING``), and every read-modify-write of a shared
  row locks it with ``SELECT ... FOR UPDATE``.
- A claim that wins is one statement instead (``claims.py``): a server-side function,
  installed at open, called on the autocommit connection - one statement is one
  transaction, one round trip (``_write_one``).
- Transient faults (a dropped connection, a terminated backend, a server restart, a
  deadlock or serialization failure) are retried by ``RetryPolicy``, with a bound. A fault
  before ``COMMIT`` was sent rolled the transaction back, so the transaction runs again. A
  fault during ``COMMIT`` (or a connection lost during a one-statement write) leaves the
  outcome unknown: the write's own check reads whether it took effect (a claim reads its
  execution record) before anything runs again.
"""

from __future__ import annotations

import contextlib
import re
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, LiteralString, cast
from urllib.parse import unquote, unquote_plus

import psycopg
from psycopg.conninfo import conninfo_to_dict
from psycopg.rows import DictRow, dict_row
from psycopg_pool import ConnectionPool

from agent.domain.errors import StoreError
from agent.storage.backend import DATABASE_URL_SETTING
from agent.storage.postgres.claims import DECLINED, Declined, OneStatementClaims, install_functions
from agent.storage.sql import Cursor, Row, T, Tx, Verified

SETTLE_TIMEOUT_MS = 10_000
"""How long an unknown commit's server process may take to finish before it is read back."""

MIGRATION_LOCK = 7_370_011_001
"""Serializes schema migrations when several workers start together (not used for claims)."""


@dataclass(frozen=True)
class RetryPolicy:
    """How transient faults are retried: attempts and total time are both bounded."""

    max_attempts: int = 60
    deadline_s: float = 60.0  # long enough for a server restart
    first_backoff_s: float = 0.01
    max_backoff_s: float = 1.0

    def backoff(self, attempt: int) -> float:
        return min(self.max_backoff_s, self.first_backoff_s * 2 ** (attempt - 1))


TRANSIENT_STATES = frozenset(
    {
        "40001",  # serialization_failure
        "40P01",  # deadlock_detected
        "53300",  # too_many_connections
        "57P01",  # admin_shutdown (pg_terminate_backend)
        "57P02",  # crash_shutdown
        "57P03",  # cannot_connect_now (starting up, shutting down)
        "25P03",  # idle_in_transaction_session_timeout
        "25P04",  # transaction_timeout
        "57P05",  # idle_session_timeout (a server that ends idle sessions)
        "57014",  # query_canceled (a server-side statement timeout)
        "55P03",  # lock_not_available (a server-side lock timeout)
    }
)


STATEMENT_ROLLED_BACK = frozenset({"40001", "40P01", "57014", "55P03"})
"""Transient faults the server answers a statement with once it rolled it back: a statement
that is its own transaction and got one of these on a live connection did not commit."""


def is_transient(exc: psycopg.Error) -> bool:
    """A fault that running the transaction again can get past: a lost connection (no
    SQLSTATE, or class 08) or one of TRANSIENT_STATES. Bad data, a violated limit or a
    missing object is not: it fails the same way every time."""
    state = exc.sqlstate
    if state is None:
        return isinstance(exc, psycopg.OperationalError | psycopg.InterfaceError)
    return state.startswith("08") or state in TRANSIENT_STATES


def redacted(url: str) -> str:
    """The URL's target without its password, for messages."""
    try:
        parts = conninfo_to_dict(url)
    except psycopg.Error:
        return "an unparsable URL"
    shown = [f"{k}={parts[k]}" for k in ("host", "port", "dbname", "user") if parts.get(k)]
    return " ".join(shown) or "defaults"


_URL_PASSWORD = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://[^@/?#]*?:([^@]*)@")
_QUERY_PASSWORD = re.compile(r"[?&]password=([^&#]*)")
_KEYWORD_PASSWORD = re.compile(r"\bpassword\s*=\s*('(?:[^'\\]|\\.)*'|\S+)")


def _refuse_ambiguous_userinfo(url: str) -> None:
    """A second @ before the host makes the URL's password end early: the rest of it would
    be read as the host name and show up in messages."""
    scheme, sep, rest = url.partition("://")
    authority = re.split(r"[/?#]", rest, maxsplit=1)[0] if sep else ""
    if scheme and authority.count("@") > 1:
        raise StoreError(
            f"{DATABASE_URL_SETTING} has more than one @ before its host; write an @ inside "
            "the user name or password as %40"
        )


def _secrets(url: str) -> list[str]:
    """Every form in which the URL's password could show up in a message. Found by
    pattern as well as by the driver's parser: a URL that does not parse must not leak."""
    found = [m.group(1) for m in (_URL_PASSWORD.match(url),) if m]
    found += [m.group(1) for m in _QUERY_PASSWORD.finditer(url)]
    found += [m.group(1).strip("'") for m in _KEYWORD_PASSWORD.finditer(url)]
    with contextlib.suppress(psycopg.Error):
        found.append(str(conninfo_to_dict(url).get("password") or ""))
    forms = {f for s in found if s for f in (s, unquote(s), unquote_plus(s))}
    # Longest first, so a password is never left half-masked by a shorter form of it.
    return sorted((f for f in forms if f.strip()), key=len, reverse=True)


def _scrub(message: str, url: str) -> str:
    """One line of ``message`` with the URL and any password in it blanked out."""
    line = " ".join(message.split())
    line = line.replace(url, "<the URL>") if url else line
    for secret in _secrets(url):
        line = line.replace(secret, "***")
        line = line.replace(" ".join(secret.split()), "***")  # as the line folding left it
    return line


RESTARTING = ("57P03", "57P01", "57P02")
"""cannot_connect_now (starting up, shutting down, in recovery), admin and crash shutdown."""


def _is_restarting(exc: psycopg.Error) -> bool:
    if exc.sqlstate in RESTARTING:
        return True
    # A failed connection attempt carries the server's FATAL message but no SQLSTATE.
    text = str(exc)
    return any(
        phrase in text for phrase in ("is starting up", "is shutting down", "is in recovery mode")
    )


_PLACEHOLDERS: dict[str, LiteralString] = {}


def _pg(sql: str) -> LiteralString:
    """The statement with psycopg placeholders (the statements have no other ? or %)."""
    converted = _PLACEHOLDERS.get(sql)
    if converted is None:
        converted = cast(LiteralString, sql.replace("?", "%s"))
        _PLACEHOLDERS[sql] = converted
    return converted


_DDL_TYPES = ((re.compile(r"\bREAL\b"), "DOUBLE PRECISION"), (re.compile(r"\s*WITHOUT ROWID"), ""))


def ddl(statement: str) -> str:
    """A migration statement for PostgreSQL: epoch seconds need double precision (REAL is
    single precision there), and WITHOUT ROWID is SQLite's storage hint."""
    for pattern, replacement in _DDL_TYPES:
        statement = pattern.sub(replacement, statement)
    return statement


IDLE_IN_TRANSACTION_TIMEOUT = "60s"
"""A worker that vanished inside a transaction (its machine died) holds its locks - a claim
insert among them, which every other claim of that occurrence waits on - until the server
ends its session after this long."""


def _session_start(conn: psycopg.Connection[DictRow]) -> Any:
    """Set the session up; the server process's start time (with its pid, its identity)."""
    row = conn.execute(
        "SELECT set_config('idle_in_transaction_session_timeout', %s, false) AS timeout,"
        " (SELECT backend_start FROM pg_stat_activity WHERE pid = pg_backend_pid()) AS started",
        (IDLE_IN_TRANSACTION_TIMEOUT,),
    ).fetchone()
    return None if row is None else row["started"]


class _Tx:
    """The Tx protocol on one psycopg connection."""

    def __init__(self, conn: psycopg.Connection[DictRow]) -> None:
        self._conn = conn

    def execute(self, sql: str, params: Sequence[Any] = (), /) -> Cursor:
        return self._conn.execute(_pg(sql), params)

    def executemany(self, sql: str, params: Iterable[Sequence[Any]], /) -> Any:
        with self._conn.cursor() as cur:
            cur.executemany(_pg(sql), list(params))

    def execute_each(self, sql: str, params: Sequence[Sequence[Any]], /) -> list[Any]:
        if not params:
            return []
        firsts: list[Any] = []
        with self._conn.cursor() as cur:
            cur.executemany(_pg(sql), params, returning=True)
            while True:
                firsts.append(cur.fetchone())
                if not cur.nextset():
                    break
        return firsts

    def run_script(self, script: str) -> None:
        """Send the statements as they are, in one simple query (no placeholders: a
        function body may hold ``?`` and ``%``)."""
        self._conn.execute(cast(LiteralString, script))


class PostgresStore(OneStatementClaims):
    """The Store port on one PostgreSQL database, shared by every worker."""

    FOR_UPDATE = " FOR UPDATE"
    FOR_SHARE = " FOR SHARE"
    DIALECT = "postgresql"

    def __init__(
        self,
        url: str,
        *,
        pool_size: int = 2,
        retry: RetryPolicy | None = None,
        connect_timeout_s: int = 10,
        query_timeout_ms: int | None = None,
    ) -> None:
        _refuse_ambiguous_userinfo(url)
        self.where = redacted(url)
        self.retry = retry or RetryPolicy()
        self.retries = 0  # transient faults survived (for benchmarks and tests)
        self.commit_checks = 0  # commits whose outcome was unknown and was read back
        self._url = url
        self._stats_lock = threading.Lock()
        self._started: weakref.WeakKeyDictionary[psycopg.Connection[DictRow], Any] = (
            weakref.WeakKeyDictionary()
        )
        kwargs: dict[str, Any] = {
            "autocommit": True,
            "row_factory": dict_row,
            "connect_timeout": connect_timeout_s,
            "application_name": "outloop",
            # A peer that vanished (a crashed machine, a cut network) is noticed in about a
            # minute instead of the system's two hours.
            "keepalives": 1,
            "keepalives_idle": 30,
            "keepalives_interval": 10,
            "keepalives_count": 3,
        }
        self._query_timeout_ms = query_timeout_ms
        if query_timeout_ms is not None:  # a peer that stops answering mid-query, too
            kwargs["tcp_user_timeout"] = query_timeout_ms
        self._probe(kwargs)
        self._pool: ConnectionPool[psycopg.Connection[DictRow]] = ConnectionPool(
            url,
            min_size=1,
            max_size=max(1, pool_size),
            kwargs=kwargs,
            open=False,
            name="outloop-store",
            timeout=self.retry.deadline_s,
            reconnect_timeout=self.retry.deadline_s,
            configure=self._configure,
        )
        self._pool.open(wait=False)
        try:
            self._write(self._migrate, None)
        except BaseException:
            self._pool.close()
            raise

    def _probe(self, kwargs: dict[str, Any]) -> None:
        """Fail at start, naming the setting, when the URL is wrong or the server is down.
        The driver's own exception is not chained: its text may quote the URL."""
        problem: str | None = None
        try:
            conninfo_to_dict(self._url)
        except psycopg.Error as exc:
            problem = (
                f"{DATABASE_URL_SETTING} is not a valid PostgreSQL URL: "
                f"{_scrub(str(exc), self._url)}; expected postgresql://user@host:port/dbname"
            )
        deadline = time.monotonic() + self.retry.deadline_s
        attempt = 0
        while problem is None:
            attempt += 1
            try:
                with psycopg.connect(self._url, **kwargs) as conn:
                    conn.execute("SELECT 1")
                break
            except psycopg.Error as exc:
                # A server that is starting up or shutting down answers, and says so: wait
                # for it. Anything else (refused, unknown host, bad credentials) fails now.
                if _is_restarting(exc) and time.monotonic() < deadline:
                    time.sleep(self.retry.backoff(attempt))
                    continue
                problem = (
                    f"{DATABASE_URL_SETTING} names a PostgreSQL server that cannot be used "
                    f"({self.where}): {_scrub(str(exc), self._url)}; check that the server "
                    "runs and the URL's host, port, database and credentials are right"
                )
        if problem is not None:
            raise StoreError(problem)

    def _configure(self, conn: psycopg.Connection[DictRow]) -> None:
        self._started[conn] = _session_start(conn)
        if self._query_timeout_ms is not None:
            conn.execute(
                "SELECT set_config('statement_timeout', %s, false),"
                " set_config('lock_timeout', %s, false)",
                (str(self._query_timeout_ms), str(self._query_timeout_ms)),
            )

    def _migrate(self, conn: Tx) -> None:
        conn.execute(f"SELECT pg_advisory_xact_lock({MIGRATION_LOCK})")
        self._apply_migrations(conn, f"PostgreSQL ({self.where})", ddl)
        assert isinstance(conn, _Tx)
        install_functions(conn, conn.run_script)

    def close(self) -> None:
        self._pool.close()

    # -- transactions -----------------------------------------------------------------------

    def _write(self, body: Callable[[Tx], T], verify: Callable[[Tx], Verified[T]] | None) -> T:
        def attempt(conn: psycopg.Connection[DictRow], committing: Callable[[], None]) -> T:
            # Not pipelined: psycopg's pipeline polls the socket for writing while it waits
            # for results, which spins the CPU whenever a statement waits for a lock (a
            # claim racing another worker's uncommitted claim does).
            try:
                conn.execute("BEGIN")
                result = body(_Tx(conn))
                committing()
                conn.execute("COMMIT")
            except BaseException:
                self._rollback(conn)
                raise
            return result

        return self._attempts(attempt, verify, one_statement=False)

    def _write_one(
        self,
        sql: str,
        params: Sequence[Any],
        result: Callable[[Row | None], T],
        verify: Callable[[Tx], Verified[T]] | None,
    ) -> T:
        def attempt(conn: psycopg.Connection[DictRow], committing: Callable[[], None]) -> T:
            committing()  # autocommit: the statement commits itself
            try:
                row = conn.execute(_pg(sql), params).fetchone()
            except psycopg.Error as exc:
                if exc.sqlstate == DECLINED or isinstance(exc, psycopg.DataError):
                    raise Declined(exc.sqlstate or type(exc).__name__) from None
                raise
            return result(row)

        return self._attempts(attempt, verify, one_statement=True)

    def _attempts(
        self,
        attempt: Callable[[psycopg.Connection[DictRow], Callable[[], None]], T],
        verify: Callable[[Tx], Verified[T]] | None,
        *,
        one_statement: bool,
    ) -> T:
        """The retry loop every write shares. ``attempt`` runs the write once on a
        connection, and calls its second argument just before it sends what commits it
        (COMMIT, or the one statement that is its own transaction). A transient fault from
        then on leaves the outcome unknown - unless the server answered the one statement
        that it rolled it back (STATEMENT_ROLLED_BACK, on a live connection) - and the next
        attempt first settles it and asks ``verify``."""
        unknown_commit = False
        committing_on: tuple[int, Any] = (0, None)  # the server process that was committing
        attempts = 0
        deadline = time.monotonic() + self.retry.deadline_s
        while True:
            attempts += 1
            sent: list[psycopg.Connection[DictRow]] = []  # where what commits was sent
            backend: tuple[int, Any] = (0, None)
            try:
                with self._pool.connection() as conn:
                    if unknown_commit and verify is not None:
                        with self._stats_lock:
                            self.commit_checks += 1
                        self._settle(conn, committing_on)
                        found = verify(_Tx(conn))
                        if found is not None:
                            return found[0]
                    unknown_commit = False
                    backend = (conn.info.backend_pid, self._started.get(conn))
                    return attempt(conn, lambda: sent.append(conn))  # noqa: B023 - called at once
            except psycopg.Error as exc:
                if not is_transient(exc):
                    raise self._refused(exc) from None
                answered = one_statement and exc.sqlstate in STATEMENT_ROLLED_BACK
                if sent and not (answered and not sent[0].broken):
                    # What commits was sent, and nothing says it did not commit.
                    unknown_commit, committing_on = True, backend
                self._wait_before_retry(exc, attempts, deadline)

    def _settle(self, conn: psycopg.Connection[DictRow], backend: tuple[int, Any]) -> None:
        """Make an unknown commit's outcome final before it is read back: the server process
        that was committing may still be finishing (the client saw the link break first).
        It is ended, and waited for until it is gone; then its transaction is committed or
        rolled back for good. The process is named by its pid and its start time, so no other
        session that got the same pid is touched."""
        pid, started = backend
        if not pid or started is None:
            return
        match = "FROM pg_stat_activity WHERE pid = %s AND backend_start = %s"
        with contextlib.suppress(psycopg.errors.InsufficientPrivilege):
            # Not this role's to end: then it is only waited for.
            conn.execute("SELECT pg_terminate_backend(pid) " + match, (pid, started))
        deadline = time.monotonic() + SETTLE_TIMEOUT_MS / 1000
        while conn.execute("SELECT 1 " + match, (pid, started)).fetchall():
            if time.monotonic() > deadline:
                raise psycopg.OperationalError(
                    f"the server process {pid} that was committing has not finished; retrying"
                )
            time.sleep(0.02)

    def _read(self, sql: str, params: Sequence[Any] = ()) -> list[Any]:
        attempt = 0
        deadline = time.monotonic() + self.retry.deadline_s
        while True:
            attempt += 1
            try:
                with self._pool.connection() as conn:
                    return conn.execute(_pg(sql), params).fetchall()
            except psycopg.Error as exc:
                if not is_transient(exc):
                    raise self._refused(exc) from None
                self._wait_before_retry(exc, attempt, deadline)

    def _refused(self, exc: psycopg.Error) -> StoreError:
        return StoreError(
            f"PostgreSQL ({self.where}) refused the operation "
            f"({exc.sqlstate or type(exc).__name__}): {_scrub(str(exc), self._url)}"
        )

    @staticmethod
    def _rollback(conn: psycopg.Connection[DictRow]) -> None:
        if not conn.broken and conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
            # If the connection is gone, the server rolled the transaction back itself.
            with contextlib.suppress(psycopg.Error):
                conn.execute("ROLLBACK")

    def _wait_before_retry(self, exc: Exception, attempt: int, deadline: float) -> None:
        if attempt >= self.retry.max_attempts or time.monotonic() >= deadline:
            raise StoreError(
                f"PostgreSQL ({self.where}) kept failing after {attempt} attempts in "
                f"{self.retry.deadline_s:.0f}s: {_scrub(str(exc), self._url)}; is the server up?"
            ) from exc
        with self._stats_lock:
            self.retries += 1
        time.sleep(min(self.retry.backoff(attempt), max(0.0, deadline - time.monotonic())))

    # -- inspection -------------------------------------------------------------------------

    def integrity_check(self) -> str:
        """``ok``, or what is wrong: invalid indexes, and B-tree corruption where the amcheck
        extension is installed."""
        problems = [
            f"index {r['name']} is invalid"
            for r in self._read(
                "SELECT c.relname AS name FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid"
                " JOIN pg_namespace n ON n.oid = c.relnamespace"
                " WHERE n.nspname = current_schema() AND NOT i.indisvalid"
            )
        ]
        amcheck = self._read(
            "SELECT extnamespace::regnamespace::text AS schema FROM pg_extension"
            " WHERE extname = 'amcheck'"
        )
        if amcheck:
            check = f"SELECT {amcheck[0]['schema']}.bt_index_check(?::regclass)"
            for r in self._read(
                "SELECT c.oid AS oid, c.relname AS name FROM pg_index i"
                " JOIN pg_class c ON c.oid = i.indexrelid JOIN pg_am a ON a.oid = c.relam"
                " JOIN pg_namespace n ON n.oid = c.relnamespace"
                " WHERE n.nspname = current_schema() AND a.amname = 'btree' AND i.indisvalid"
            ):
                try:
                    self._read(check, (r["oid"],))
                except StoreError as exc:  # the index failed its check
                    problems.append(f"index {r['name']}: {exc}")
        return "ok" if not problems else "; ".join(problems)
