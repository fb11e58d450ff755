"""A throwaway PostgreSQL cluster on 127.0.0.1 for tests and benchmarks.

``initdb`` runs once into a fresh directory; the server listens on a free loopback port and
on a Unix socket in a short directory. As root, ``initdb`` and ``pg_ctl`` run as the
``postgres`` user through ``runuser``. Durability settings stay at their defaults
(``fsync=on``, ``synchronous_commit=on``, ``full_page_writes=on``) so that benchmarks
measure real commits.
"""

from __future__ import annotations

import os
import pwd
import re
import shlex
import shutil
import socket
import stat
import subprocess
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType

import psycopg

__all__ = ["ClusterError", "ThrowawayCluster", "find_bindir"]

DATABASE = "outloop"
SUPERUSER = "postgres"
HOST = "127.0.0.1"
BINDIR_ENV = "OUTLOOP_PG_BINDIR"
INSTALL_HINT = "install the postgresql package (./scripts/setup does it)"
STOP_MODES = ("smart", "fast", "immediate")
COMMAND_TIMEOUT_S = 60.0
READY_TIMEOUT_S = 30.0
CONNECT_TIMEOUT_S = 5
PORT_ATTEMPTS = 5
# sun_path holds 108 bytes with the terminating NUL; the socket file is ".s.PGSQL.<port>".
SOCKET_PATH_MAX = 107
SOCKET_NAME_MAX = len("/.s.PGSQL.65535")
# Settings the cluster owns: the port and addresses it listens on, and the argument.
RESERVED_SETTINGS = frozenset(
    {"listen_addresses", "port", "unix_socket_directories", "max_connections"}
)
SETTING_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_.]*$")
DEFAULT_SETTINGS: Mapping[str, str] = {
    "shared_buffers": "128MB",
    "fsync": "on",
    "synchronous_commit": "on",
    "full_page_writes": "on",
    "jit": "off",
}


class ClusterError(RuntimeError):
    """The throwaway cluster could not be set up, started, stopped or queried."""


def _version_key(bindir: Path) -> tuple[int, ...]:
    """Sort key for /usr/lib/postgresql/<version>/bin: the version as numbers."""
    return tuple(int(part) for part in re.findall(r"\d+", bindir.parent.name))


def _has_server_tools(bindir: Path) -> bool:
    return (bindir / "initdb").is_file() and (bindir / "pg_ctl").is_file()


def find_bindir() -> Path:
    """The directory holding initdb and pg_ctl: $OUTLOOP_PG_BINDIR, pg_config, or Debian's."""
    override = os.environ.get(BINDIR_ENV)
    if override:
        bindir = Path(override)
        if not _has_server_tools(bindir):
            raise ClusterError(
                f"{BINDIR_ENV}={override} holds no initdb and pg_ctl; {INSTALL_HINT}"
            )
        return bindir
    pg_config = shutil.which("pg_config")
    if pg_config:
        try:
            out = subprocess.run(
                [pg_config, "--bindir"],
                capture_output=True,
                text=True,
                timeout=COMMAND_TIMEOUT_S,
                check=True,
                stdin=subprocess.DEVNULL,
            ).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            out = ""
        if out and _has_server_tools(Path(out)):
            return Path(out)
    candidates = [
        bindir
        for bindir in Path("/usr/lib/postgresql").glob("*/bin")
        if _has_server_tools(bindir) and _version_key(bindir)
    ]
    if candidates:
        return max(candidates, key=_version_key)
    raise ClusterError(f"no PostgreSQL server binaries (initdb, pg_ctl) found; {INSTALL_HINT}")


def _free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listened on a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((HOST, 0))
        port: int = sock.getsockname()[1]
        return port


def _tail(path: Path, lines: int) -> str:
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except FileNotFoundError:
        return ""
    return "\n".join(text.splitlines()[-lines:]) if lines > 0 else ""


class ThrowawayCluster:
    """A PostgreSQL cluster in a temporary directory, serving the database ``outloop``."""

    def __init__(
        self,
        *,
        max_connections: int = 100,
        base_dir: Path | None = None,
        settings: Mapping[str, str] | None = None,
    ) -> None:
        if max_connections < 1:
            raise ValueError(f"max_connections must be positive, got {max_connections}")
        extra = dict(settings or {})
        for name in extra:
            if not SETTING_NAME.match(name):
                raise ValueError(f"not a PostgreSQL setting name: {name!r}")
            if name in RESERVED_SETTINGS:
                raise ValueError(f"setting {name!r} is managed by ThrowawayCluster")
        self._max_connections = max_connections
        self._base_dir = base_dir
        self._settings = {**DEFAULT_SETTINGS, **extra}
        self._as_root = os.geteuid() == 0
        self._bindir: Path | None = None
        self._root: Path | None = None
        self._socket_dir: Path | None = None
        self._extra_dirs: list[Path] = []
        self._port: int | None = None
        self._running = False
        self._database_created = False
        self._destroyed = False

    # -- public API ------------------------------------------------------------------------

    def start(self) -> ThrowawayCluster:
        """Run initdb on first use, start the server and create the ``outloop`` database."""
        if self._destroyed:
            raise ClusterError("the cluster was destroyed")
        if self._running:
            return self
        if self._root is None:
            self._initdb()
        if self._port is None:
            self._start_on_free_port()
        else:
            self._start_server(self._port)
        self._wait_ready()
        if not self._database_created:
            self._create_database()
        return self

    @property
    def url(self) -> str:
        """Connection URL of the ``outloop`` database."""
        return f"postgresql://{SUPERUSER}@{HOST}:{self.port}/{DATABASE}"

    def admin_url(self) -> str:
        """Connection URL of the ``postgres`` maintenance database."""
        return f"postgresql://{SUPERUSER}@{HOST}:{self.port}/postgres"

    @property
    def port(self) -> int:
        """The TCP port, fixed at the first start."""
        if self._port is None:
            raise ClusterError("the cluster has not been started")
        return self._port

    @property
    def directory(self) -> Path:
        """The directory holding the data directory; destroy() removes it."""
        if self._root is None:
            raise ClusterError("the cluster has not been started")
        return self._root

    @property
    def data_dir(self) -> Path:
        """The PostgreSQL data directory (PGDATA)."""
        return self.directory / "data"

    @property
    def running(self) -> bool:
        """Whether this object started the server and has not stopped it since."""
        return self._running

    def stop(self, mode: str = "fast") -> None:
        """``pg_ctl stop -m MODE -w``; does nothing when the server is not running."""
        if mode not in STOP_MODES:
            raise ValueError(f"stop mode must be one of {STOP_MODES}, got {mode!r}")
        if not self._running:
            return
        self._pg_ctl(["stop", "-m", mode, "-w", "-t", str(int(COMMAND_TIMEOUT_S))], what="stop")
        self._running = False

    def restart(self) -> None:
        """Crash the server (immediate stop) and start it on the same port and data directory.

        Returns once crash recovery is over and the server accepts connections.
        """
        if self._root is None or self._port is None:
            raise ClusterError("the cluster has not been started")
        self.stop("immediate")
        self._start_server(self._port)
        self._wait_ready()

    def terminate_backends(self) -> int:
        """Terminate every client connection to ``outloop``; returns how many were ended."""
        with psycopg.connect(
            self.admin_url(), autocommit=True, connect_timeout=CONNECT_TIMEOUT_S
        ) as conn:
            # From PostgreSQL 14 the call can wait until the backend has exited.
            terminate = (
                "pg_terminate_backend(pid, 5000)"
                if conn.info.server_version >= 140000
                else "pg_terminate_backend(pid)"
            )
            rows = conn.execute(
                f"SELECT {terminate} FROM pg_stat_activity"
                " WHERE datname = %s AND pid <> pg_backend_pid()"
                " AND backend_type = 'client backend'",
                (DATABASE,),
            ).fetchall()
        return sum(1 for (ended,) in rows if ended)

    def log_tail(self, lines: int = 40) -> str:
        """The last lines of server.log ("" before the first start)."""
        if self._root is None:
            return ""
        return _tail(self.data_dir / "server.log", lines)

    def destroy(self) -> None:
        """Stop the server (immediate) if running and remove every directory; idempotent."""
        if self._destroyed:
            return
        failure: ClusterError | None = None
        try:
            self.stop("immediate")
        except ClusterError as err:
            failure = err
        finally:
            self._running = False
            self._destroyed = True
            for path in [*self._extra_dirs, *([self._root] if self._root else [])]:
                shutil.rmtree(path, ignore_errors=True)
        if failure is not None:
            raise failure

    def __enter__(self) -> ThrowawayCluster:
        try:
            return self.start()
        except BaseException:
            self.destroy()
            raise

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.destroy()

    # -- internals -------------------------------------------------------------------------

    def _owner_command(self, args: Sequence[str]) -> list[str]:
        """Run as the cluster owner: postgres when we are root, ourselves otherwise."""
        if not self._as_root:
            return list(args)
        runuser = shutil.which("runuser")
        if runuser is None:
            raise ClusterError("running as root needs runuser (util-linux) to drop to postgres")
        return [runuser, "-u", SUPERUSER, "--", *args]

    def _run(self, args: Sequence[str], *, what: str) -> subprocess.CompletedProcess[str]:
        command = self._owner_command(args)
        env = {key: value for key, value in os.environ.items() if not key.startswith("PG")}
        try:
            done = subprocess.run(
                command,
                capture_output=True,
                text=True,
                timeout=COMMAND_TIMEOUT_S + 30,
                check=False,
                stdin=subprocess.DEVNULL,
                env=env,
                cwd=self._root,
            )
        except subprocess.TimeoutExpired as err:
            raise ClusterError(
                f"{what} timed out: {shlex.join(command)}\n{self._log_context()}"
            ) from err
        except OSError as err:
            raise ClusterError(f"{what} could not run: {shlex.join(command)}: {err}") from err
        return done

    def _check(self, done: subprocess.CompletedProcess[str], *, what: str) -> None:
        if done.returncode != 0:
            raise ClusterError(
                f"{what} failed (exit {done.returncode}): {shlex.join(done.args)}\n"
                f"stderr: {done.stderr.strip()}\nstdout: {done.stdout.strip()}\n"
                f"{self._log_context()}"
            )

    def _pg_ctl(self, args: Sequence[str], *, what: str) -> None:
        pg_ctl = str(self._tools() / "pg_ctl")
        done = self._run([pg_ctl, "-D", str(self.data_dir), *args], what=what)
        self._check(done, what=what)

    def _log_context(self) -> str:
        tail = self.log_tail()
        return f"server.log tail:\n{tail}" if tail else "server.log is empty or missing"

    def _tools(self) -> Path:
        if self._bindir is None:
            self._bindir = find_bindir()
        return self._bindir

    def _postgres_ids(self) -> tuple[int, int]:
        try:
            entry = pwd.getpwnam(SUPERUSER)
        except KeyError as err:
            raise ClusterError(
                f"running as root needs the {SUPERUSER} user; {INSTALL_HINT}"
            ) from err
        return entry.pw_uid, entry.pw_gid

    def _make_traversable(self, path: Path) -> None:
        """Let the postgres user reach ``path``: add o+x to parents that lack it."""
        for parent in path.parents:
            mode = parent.stat().st_mode
            if not mode & stat.S_IXOTH:
                parent.chmod(stat.S_IMODE(mode) | stat.S_IXOTH)

    def _initdb(self) -> None:
        tools = self._tools()
        ids = self._postgres_ids() if self._as_root else None
        if self._base_dir is not None:
            self._base_dir.mkdir(parents=True, exist_ok=True)
        root = Path(tempfile.mkdtemp(prefix="outloop-pg-", dir=self._base_dir))
        self._root = root
        root.chmod(0o755)
        data = root / "data"
        data.mkdir(mode=0o700)
        socket_dir = root / "s"
        if len(str(socket_dir)) + SOCKET_NAME_MAX > SOCKET_PATH_MAX:
            # The base directory is too deep for a Unix socket path: use a short one.
            socket_dir = Path(tempfile.mkdtemp(prefix="olpg-", dir="/tmp"))
            self._extra_dirs.append(socket_dir)
        else:
            socket_dir.mkdir()
        socket_dir.chmod(0o755)
        self._socket_dir = socket_dir
        if ids is not None:
            self._make_traversable(root)
            self._make_traversable(socket_dir)
            for owned in (data, socket_dir):
                os.chown(owned, *ids)
        done = self._run(
            [
                str(tools / "initdb"),
                "-D",
                str(data),
                "-U",
                SUPERUSER,
                "-A",
                "trust",
                "-E",
                "UTF8",
                "--locale=C.UTF-8",
                "--no-sync",
            ],
            what="initdb",
        )
        self._check(done, what="initdb")

    def _server_options(self, port: int) -> str:
        assert self._socket_dir is not None
        options = [
            "-c",
            f"listen_addresses={HOST}",
            "-p",
            str(port),
            "-k",
            str(self._socket_dir),
            "-c",
            f"max_connections={self._max_connections}",
        ]
        for name, value in self._settings.items():
            options += ["-c", f"{name}={value}"]
        # pg_ctl hands -o to /bin/sh, so every word is quoted.
        return shlex.join(options)

    def _log_size(self) -> int:
        try:
            return (self.data_dir / "server.log").stat().st_size
        except FileNotFoundError:
            return 0

    def _log_since(self, offset: int) -> str:
        try:
            with (self.data_dir / "server.log").open("rb") as log:
                log.seek(offset)
                return log.read().decode("utf-8", errors="replace")
        except FileNotFoundError:
            return ""

    def _try_start(self, port: int) -> tuple[subprocess.CompletedProcess[str], str]:
        pg_ctl = str(self._tools() / "pg_ctl")
        offset = self._log_size()
        done = self._run(
            [
                pg_ctl,
                "-D",
                str(self.data_dir),
                "-l",
                str(self.data_dir / "server.log"),
                "-w",
                "-t",
                str(int(COMMAND_TIMEOUT_S)),
                "-o",
                self._server_options(port),
                "start",
            ],
            what="start",
        )
        return done, self._log_since(offset)

    def _start_server(self, port: int) -> None:
        done, _ = self._try_start(port)
        self._check(done, what=f"start on port {port}")
        self._running = True

    def _start_on_free_port(self) -> None:
        for _ in range(PORT_ATTEMPTS):
            port = _free_port()
            done, log = self._try_start(port)
            if done.returncode == 0:
                self._port = port
                self._running = True
                return
            if "Address already in use" not in log:
                self._check(done, what=f"start on port {port}")
        raise ClusterError(
            f"start failed: {PORT_ATTEMPTS} free ports were taken before the server bound them\n"
            f"{self._log_context()}"
        )

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + READY_TIMEOUT_S
        while True:
            try:
                with psycopg.connect(
                    self.admin_url(), autocommit=True, connect_timeout=CONNECT_TIMEOUT_S
                ) as conn:
                    conn.execute("SELECT 1")
                return
            except psycopg.OperationalError as err:
                if time.monotonic() > deadline:
                    raise ClusterError(
                        f"the server did not accept connections within {READY_TIMEOUT_S} s: "
                        f"{err}\n{self._log_context()}"
                    ) from err
                time.sleep(0.05)

    def _create_database(self) -> None:
        try:
            with psycopg.connect(
                self.admin_url(), autocommit=True, connect_timeout=CONNECT_TIMEOUT_S
            ) as conn:
                exists = conn.execute(
                    "SELECT 1 FROM pg_database WHERE datname = %s", (DATABASE,)
                ).fetchone()
                if exists is None:
                    conn.execute(f"CREATE DATABASE {DATABASE}")
        except psycopg.Error as err:
            raise ClusterError(
                f"creating database {DATABASE} failed: {err}\n{self._log_context()}"
            ) from err
        self._database_created = True
