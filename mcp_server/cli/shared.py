"""What every command shares: the --data-dir option, the settings, the station, and turning
the core's errors into one line on stderr."""

from __future__ import annotations

from collections.abc import Callable, Generator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, NoReturn, TypeVar

import click

from agent import crashpoints
from agent.domain.errors import OutloopError, UnknownWorkspace, WorkspaceExists
from agent.services import intake
from agent.services.clock import SystemClock
from agent.services.intake import ProviderFactory
from mcp_server import composition
from mcp_server.composition import DATA_DIR_ENV, Settings, Station

F = TypeVar("F", bound=Callable[..., Any])


def data_dir_option(func: F) -> F:
    return click.option(
        "--data-dir",
        type=click.Path(file_okay=False, path_type=Path),
        envvar=DATA_DIR_ENV,
        default=None,
        help=f"Outloop data directory (env {DATA_DIR_ENV}; default: the XDG data directory).",
    )(func)


def fail(exc: OutloopError) -> NoReturn:
    """Exit with the error's sentence, and the command that clears it, as one line on stderr
    (status 1)."""
    raise click.ClickException(worded(exc)) from exc


def worded(exc: OutloopError) -> str:
    """The core says what happened; the CLI adds what to run about it."""
    if isinstance(exc, WorkspaceExists):
        return f"{exc}; use 'outloop workspace update' to replace its context"
    if isinstance(exc, UnknownWorkspace):
        return (
            f"{exc}; register it with 'outloop workspace bootstrap --context FILE' (or "
            "'outloop workspace add --context FILE', without the live check)"
        )
    return str(exc)


def read_settings(data_dir: Path | None) -> Settings:
    """The settings of this command: its --data-dir, and the environment read once. A crash
    test's OUTLOOP_CRASHPOINT is armed here, before anything runs."""
    settings = composition.read_settings(data_dir=data_dir)
    if settings.crashpoint:  # test-only switch used by the crash tests
        crashpoints.arm_from_spec(settings.crashpoint)
    return settings


def open_station(settings: Settings) -> Station:
    """The station, or a clear error (a bad OUTLOOP_DATABASE_URL, an unreadable data dir)."""
    try:
        return composition.open_station(settings)
    except OutloopError as exc:
        fail(exc)


@contextmanager
def station_for(data_dir: Path | None) -> Generator[Station]:
    """The station of this command's data directory, closed when the command ends; a core
    error inside becomes one line on stderr (status 1)."""
    station = open_station(read_settings(data_dir))
    try:
        yield station
    except OutloopError as exc:
        fail(exc)
    finally:
        station.close()


def number_option(flag: str, kind: click.ParamType[Any], default: float, help_text: str) -> Any:
    """A counted or timed option with its range, default and help."""
    return click.option(flag, type=kind, default=default, show_default=True, help=help_text)


def choice_option(flag: str, choices: Sequence[str], default: str, help_text: str) -> Any:
    return click.option(
        flag, type=click.Choice(choices), default=default, show_default=True, help=help_text
    )


async def run_cycle(
    station: Station,
    workspace_id: str,
    progress: Callable[[intake.Progress], None] | None,
    from_start: bool = False,
    provider_for: ProviderFactory | None = None,
) -> intake.RunResult:
    """One intake cycle of the workspace on this station, now (``from_start``: reading
    every mailbox again from its beginning, not from its cursor; ``provider_for``: the
    channels to read through, else the access order); the browser it started is stopped."""
    try:
        return await intake.run_cycle(
            store=station.store,
            data_dir=station.data_dir,
            workspace_id=workspace_id,
            provider_for=provider_for or station.provider_for,
            clock=SystemClock(),
            on_progress=progress,
            from_start=from_start,
        )
    finally:
        await station.aclose_channels()
