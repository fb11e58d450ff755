"""``outloop run``: the intake cycle (one dispatcher cycle with --once, else one every
--interval seconds), with per-item progress on stderr."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import anyio
import click

from agent.domain.errors import OutloopError
from agent.domain.mail import Channel
from agent.services import intake
from mcp_server.cli.observe import logs_at
from mcp_server.cli.shared import data_dir_option, fail, open_station, read_settings, run_cycle
from mcp_server.composition import Providers, Settings


def _print_progress(progress: intake.Progress) -> None:
    item = progress.outcome
    click.echo(f"[{progress.done}/{progress.total}] {item.item_ref}: {item.disposition}", err=True)


def _run_once(
    settings: Settings, workspace_id: str, quiet: bool, from_start: bool, access: str | None
) -> intake.RunResult:
    station = open_station(settings)
    try:
        progress = None if quiet else _print_progress
        only = None
        if access is not None and isinstance(station.provider_for, Providers):
            only = station.provider_for.only(Channel(access))
        return anyio.run(run_cycle, station, workspace_id, progress, from_start, only)
    finally:
        station.close()


def _summary(result: intake.RunResult) -> dict[str, Any]:
    rec = result.reconciliation
    return {
        "run_id": result.run_id,
        "workspace_id": result.workspace_id,
        "items": [
            {
                "item_ref": i.item_ref,
                "disposition": i.disposition.value,
                "claim": i.claim.value if i.claim else None,
                "task_id": i.task_id,
                "task_created": i.task_created,
                "detail": i.detail,
            }
            for i in result.items
        ],
        "reconciliation": rec.model_dump(mode="json") if rec else None,
        "access_errors": result.access_errors,
        "item_errors": result.item_errors,
        "reminders": result.reminders,
    }


def _echo_reconciliation(result: intake.RunResult) -> None:
    rec = result.reconciliation
    assert rec is not None
    click.echo(
        f"run {rec.run_id}: scanned {rec.scanned} = terminal {rec.terminal} + non-terminal "
        f"{rec.non_terminal} + claim-race {rec.claim_race}"
        + (
            f" + RECONCILIATION_FAILED {rec.reconciliation_failed}"
            if rec.reconciliation_failed
            else ""
        )
        + (" (clean)" if rec.clean else " (NOT clean)")
    )


@click.command("run")
@click.option("--workspace", "workspace_id", required=True, help="The workspace id to run.")
@click.option("--once", is_flag=True, help="Run one dispatcher cycle and exit.")
@click.option(
    "--interval",
    type=click.FloatRange(min=1),
    default=300.0,
    show_default=True,
    help="Seconds between cycles when not --once.",
)
@click.option("--json", "as_json", is_flag=True, help="Print each run's result as JSON.")
@click.option("--quiet", is_flag=True, help="No per-item progress on stderr.")
@click.option(
    "--from-start",
    is_flag=True,
    help="Read every mailbox again from its beginning (a replay: items already done are "
    "recorded as EXECUTION_ALREADY_DONE, nothing is created twice). Default: only what "
    "arrived since the last run.",
)
@click.option(
    "--access",
    type=click.Choice([Channel.BROWSER.value]),
    default=None,
    help="Reach every mailbox through this channel only: 'browser' is an operator's "
    "headless browser session (each mailbox's web app, signed in by managed login). "
    "Default: each mailbox's permitted channels in the access order.",
)
@logs_at("warning")
@data_dir_option
def run_command(
    workspace_id: str,
    once: bool,
    interval: float,
    as_json: bool,
    quiet: bool,
    from_start: bool,
    access: str | None,
    data_dir: Path | None,
) -> None:
    """Run the intake cycle: read each mailbox's new mail since its cursor, normalize,
    resolve, claim, task, triage, report, reconcile.

    Exit status with --once: 0 clean, 3 the run did not reconcile clean, 4 a mailbox could
    not be read (named on stderr and in a health record; the other mailboxes still ran).
    """
    settings = read_settings(data_dir)
    while True:
        try:
            result = _run_once(settings, workspace_id, quiet, from_start, access)
            from_start = False  # a replay is one cycle; the next ones read what is new
        except OutloopError as exc:
            fail(exc)
        if as_json:
            click.echo(json.dumps(_summary(result), ensure_ascii=False))
        else:
            _echo_reconciliation(result)
        for error in result.access_errors:
            click.echo(f"mailbox not read: {error}", err=True)
        for error in result.item_errors:
            click.echo(f"item not handled (a later run retries it): {error}", err=True)
        if not quiet:
            for line in result.reminders:
                click.echo(f"reminder {line}", err=True)
        clean = result.reconciliation is not None and result.reconciliation.clean
        if once:
            sys.exit(4 if result.access_errors else 0 if clean else 3)
        time.sleep(interval)
