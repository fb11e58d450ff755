"""The options long-running commands share: where their log records go (``--log-format``,
``--log-level``) and the port their metrics and probes are served on (``--metrics-port``)."""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Generator, Mapping
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, TypeVar

import click

from agent.domain.errors import OutloopError
from agent.ports import EmbeddedStore
from agent.services.workspaces import DataDir
from agent.storage.backend import open_store
from mcp_server.cli.shared import fail
from mcp_server.composition import Settings
from mcp_server.observability import logs, multiprocess_dir

if TYPE_CHECKING:
    from mcp_server.observability.probes import ProbeServer, Role

F = TypeVar("F", bound=Callable[..., Any])

METRICS_HOST = "127.0.0.1"


def logs_at(default_level: str) -> Callable[[F], F]:
    """``--log-format text|json`` and ``--log-level`` (from ``default_level``), applied
    before the command runs."""

    def decorate(func: F) -> F:
        @click.option(
            "--log-format",
            type=click.Choice(logs.FORMATS),
            envvar=logs.FORMAT_ENV,
            default="text",
            show_default=True,
            help=f"Log records on stderr as text lines or JSON lines (env {logs.FORMAT_ENV}).",
        )
        @click.option(
            "--log-level",
            type=click.Choice(logs.LEVELS),
            envvar=logs.LEVEL_ENV,
            default=default_level,
            show_default=True,
            help=f"The least severe record shown (env {logs.LEVEL_ENV}).",
        )
        @functools.wraps(func)
        def wrapper(*args: Any, log_format: str, log_level: str, **kwargs: Any) -> Any:
            logs.configure(log_format, log_level, decisions=_counting(kwargs))
            if multiprocess_dir() is not None:
                _count_decisions()  # the host's processes share their counters
            return func(*args, **kwargs)

        return wrapper  # type: ignore[return-value]

    return decorate


log_options = logs_at("info")
"""A server's: every decision record on stderr."""


def _counting(kwargs: Mapping[str, Any]) -> bool:
    return kwargs.get("metrics_port") is not None or multiprocess_dir() is not None


def _count_decisions() -> None:
    # The metrics (and the Prometheus client) are loaded by the commands that count only.
    from mcp_server.observability import metrics  # noqa: PLC0415

    metrics.count_decisions()


def metrics_option(func: F) -> F:
    return click.option(
        "--metrics-port",
        type=click.IntRange(0, 65535),
        default=None,
        help="Serve /metrics, /healthz and /readyz on 127.0.0.1 at this port (0: a free "
        "one), each request with 'Authorization: Bearer <OUTLOOP_METRICS_TOKEN>'. Off unless "
        "given. A JSON line on stderr names the URL once it serves.",
    )(func)


@contextmanager
def serving_probes(
    settings: Settings,
    port: int | None,
    what: str,
    role: Role | None = None,
    roles: Callable[[], Mapping[str, str]] = dict,
) -> Generator[ProbeServer | None]:
    """The probe server while the command runs (none without ``port``); this process's
    decision records are counted whenever metrics are served or shared on the host."""
    if port is None and multiprocess_dir() is None:
        yield None
        return
    _count_decisions()
    if port is None:
        yield None
        return

    def opener() -> EmbeddedStore:
        return open_store(settings.database_url, DataDir(settings.data_dir).database, bounded=True)

    from mcp_server.observability.probes import Probes, ProbeServer, StoreProbe  # noqa: PLC0415

    probes = Probes(StoreProbe(opener), StoreProbe(opener), what, role, roles)
    try:
        server = ProbeServer(probes, METRICS_HOST, port, settings.metrics_token)
    except OutloopError as exc:
        fail(exc)
    server.start()
    url = f"http://{METRICS_HOST}:{server.port}"
    click.echo(json.dumps({"metrics": f"{url}/metrics", "readyz": f"{url}/readyz"}), err=True)
    try:
        yield server
    finally:
        server.stop()
