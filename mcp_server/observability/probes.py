"""``/metrics``, ``/healthz`` and ``/readyz`` on a loopback port of their own, for a scraper
and an orchestrator's probes. Every request needs ``Authorization: Bearer <token>`` with the
token from ``OUTLOOP_METRICS_TOKEN``.

- ``/healthz``: 200 while the process serves (it is up).
- ``/readyz``: 200 when the store answers and the process can do its work (a dispatcher
  holds its workspace's lease or stands by for it); 503 otherwise. Both answer JSON naming
  what is wrong.
- ``/metrics``: the Prometheus text format.

The server runs in threads of its own, with a store connection of its own that gives up
within a few seconds, so a probe never waits on (or for) the work the process does.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import json
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Final

from agent.domain.errors import StoreError
from agent.ports import EmbeddedStore
from agent.services import status
from agent.services.status import WorkspaceStatus
from agent.storage.backend import PROBE_SECONDS
from mcp_server.binding import MIN_TOKEN_CHARS, ServeError, is_loopback
from mcp_server.composition import METRICS_TOKEN_ENV
from mcp_server.observability import metrics

ROUTES: Final = ("/metrics", "/healthz", "/readyz")
WAIT_SECONDS: Final = 2 * PROBE_SECONDS
"""How long a probe waits for the one before it on the same store connection."""


class StoreProbe:
    """The probes' own store: opened on first use, and opened again after it failed."""

    def __init__(self, opener: Callable[[], EmbeddedStore]) -> None:
        self._opener = opener
        self._store: EmbeddedStore | None = None
        self._lock = threading.Lock()

    def answers(self) -> str | None:
        """None when the store answers now, else what is wrong."""
        return self._with(lambda store: store.schema_version())

    def statuses(self) -> list[WorkspaceStatus] | None:
        """Every workspace's status now; None when the store does not answer."""
        found: list[WorkspaceStatus] = []

        def read(store: EmbeddedStore) -> None:
            found.extend(status.of_station(store, datetime.now(UTC)))

        return None if self._with(read) is not None else found

    def _with(self, use: Callable[[EmbeddedStore], object]) -> str | None:
        if not self._lock.acquire(timeout=WAIT_SECONDS):
            return (
                "the store does not answer: the previous probe still waits on it (over "
                f"{WAIT_SECONDS:.0f} s)"
            )
        try:
            if self._store is None:
                self._store = self._opener()
            use(self._store)
        except (StoreError, OSError) as exc:
            self._drop()
            return f"the store does not answer: {exc}"
        finally:
            self._lock.release()
        return None

    def _drop(self) -> None:
        if self._store is not None:
            with contextlib.suppress(Exception):  # it failed already; the next opens another
                self._store.close()
        self._store = None

    def close(self) -> None:
        if self._lock.acquire(timeout=WAIT_SECONDS):  # else a probe still holds it: leave it
            try:
                self._drop()
            finally:
                self._lock.release()


Role = Callable[[], tuple[bool, str]]
"""What the process says of its own work: ready or not, and why."""


@dataclass
class Probes:
    """What the three routes answer."""

    store: StoreProbe
    """Readiness's store connection."""
    gauges: StoreProbe
    """The gauges' (a scrape reads every workspace: a readiness probe never waits on it)."""
    what: str
    """The process, as a probe's answer names it (``dispatcher of ws-1``, ``mcp server``)."""
    role: Role | None = None
    roles: Callable[[], Mapping[str, str]] = dict
    """Each workspace's dispatcher role in this process (exported as a gauge)."""
    started: datetime = field(default_factory=lambda: datetime.now(UTC))

    def healthz(self) -> tuple[int, dict[str, Any]]:
        return 200, {"status": "ok", "process": self.what, "since": self.started.isoformat()}

    def readyz(self) -> tuple[int, dict[str, Any]]:
        problems: list[str] = []
        detail = ""
        wrong = self.store.answers()
        if wrong is not None:
            problems.append(wrong)
        if self.role is not None:
            ready, detail = self.role()
            if not ready:
                problems.append(detail)
        body: dict[str, Any] = {
            "status": "ready" if not problems else "unready",
            "process": self.what,
            "store": "answers" if wrong is None else "unreachable",
        }
        if detail:
            body["role"] = detail
        if problems:
            body["problems"] = problems
        return (200 if not problems else 503), body

    def metrics(self) -> bytes:
        return metrics.exposition(metrics.StationGauges(self.gauges.statuses, self.roles))

    def close(self) -> None:
        self.store.close()
        self.gauges.close()


def check_token(token: str | None) -> str:
    if not token:
        raise ServeError(
            f"serving metrics requires a bearer token: set {METRICS_TOKEN_ENV} (at least "
            f"{MIN_TOKEN_CHARS} random characters) and give it to the scraper as "
            "'Authorization: Bearer <token>'"
        )
    if len(token) < MIN_TOKEN_CHARS:
        raise ServeError(
            f"the token in {METRICS_TOKEN_ENV} has {len(token)} characters; use at least "
            f"{MIN_TOKEN_CHARS} random ones"
        )
    return token


class ProbeServer:
    """The three routes on ``host:port`` (loopback only), in a thread of its own."""

    def __init__(self, probes: Probes, host: str, port: int, token: str | None) -> None:
        if not is_loopback(host):
            raise ServeError(f"metrics are served on loopback only, not {host}")
        digest = hashlib.sha256(check_token(token).encode()).digest()
        try:
            self._server = ThreadingHTTPServer((host.strip("[]"), port), _handler(probes, digest))
        except OSError as exc:
            raise ServeError(f"cannot serve metrics on {host}:{port}: {exc.strerror}") from exc
        self._server.daemon_threads = True
        self._probes = probes
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="outloop-probes", daemon=True
        )

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    def start(self) -> ProbeServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)
        self._probes.close()


def _handler(probes: Probes, digest: bytes) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        server_version = "outloop-probes"
        sys_version = ""

        def do_GET(self) -> None:
            path = self.path.split("?", 1)[0]
            if not self._authorized():
                self._answer(401, {"error": f"send 'Authorization: Bearer <{METRICS_TOKEN_ENV}>'"})
                return
            if path not in ROUTES:
                self._answer(404, {"error": f"no route {path}; the routes are {', '.join(ROUTES)}"})
                return
            if path == "/metrics":
                self._send(200, metrics.CONTENT_TYPE, probes.metrics())
            elif path == "/healthz":
                self._answer(*probes.healthz())
            else:
                self._answer(*probes.readyz())

        def _authorized(self) -> bool:
            scheme, _, offered = (self.headers.get("Authorization") or "").partition(" ")
            given = hashlib.sha256(offered.strip().encode()).digest()
            return scheme.lower() == "bearer" and hmac.compare_digest(given, digest)

        def _answer(self, code: int, body: Mapping[str, Any]) -> None:
            self._send(code, "application/json", json.dumps(body).encode())

        def _send(self, code: int, kind: str, data: bytes) -> None:
            self.send_response(code, HTTPStatus(code).phrase)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(data)))
            self.send_header("Cache-Control", "no-store")
            if code == 401:
                self.send_header("WWW-Authenticate", 'Bearer realm="outloop-metrics"')
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: Any) -> None:
            return  # a scraper's every request is not a log record

    return Handler
