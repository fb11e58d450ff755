"""``outloop workspace add|update|show``: the registry of workspaces in the data directory."""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import datetime
from functools import partial
from pathlib import Path
from typing import Any

import anyio
import click

from agent.domain.errors import OutloopError
from agent.domain.records import LearningProposal, WorkspaceRow
from agent.domain.task import Task
from agent.domain.untrusted import flag
from agent.ports import Registry
from agent.services import bootstrap, workspaces
from agent.services.clock import SystemClock
from agent.services.workspaces import DataDir
from mcp_server.cli.shared import (
    data_dir_option,
    fail,
    open_station,
    read_settings,
    station_for,
    worded,
)
from mcp_server.composition import Providers, Station

ContextChange = Callable[[Registry, DataDir, Path, datetime], WorkspaceRow]


@click.group()
def workspace() -> None:
    """Register, update and show workspaces (resolved by immutable workspace id only)."""


def context_file_option(help_text: str) -> Any:
    return click.option(
        "--context",
        "context_file",
        required=True,
        type=click.Path(exists=True, dir_okay=False, path_type=Path),
        help=help_text,
    )


def _from_file(change: ContextChange, context_file: Path, data_dir: Path | None) -> WorkspaceRow:
    """Register or update a workspace from its context file, on this command's station."""
    with station_for(data_dir) as station:
        return change(station.store, station.data_dir, context_file, SystemClock().now())


@workspace.command("add")
@context_file_option("The Workspace Context YAML file (see docs/workspace-context.md).")
@data_dir_option
def workspace_add(context_file: Path, data_dir: Path | None) -> None:
    """Register one workspace from its context file. A duplicate id is refused."""
    row = _from_file(workspaces.add_workspace, context_file, data_dir)
    click.echo(f"registered workspace {row.workspace_id} ({row.label or 'no label'})")


@workspace.command("update")
@context_file_option("The new Workspace Context file; its workspace_id picks the workspace.")
@data_dir_option
def workspace_update(context_file: Path, data_dir: Path | None) -> None:
    """Replace a registered workspace's context (re-read on every run)."""
    row = _from_file(workspaces.update_workspace, context_file, data_dir)
    click.echo(f"updated workspace {row.workspace_id}")


@workspace.command("bootstrap")
@context_file_option("The Workspace Context YAML file of the workspace being installed.")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@data_dir_option
def workspace_bootstrap(context_file: Path, as_json: bool, data_dir: Path | None) -> None:
    """Install one workspace: read every mailbox it binds back live from its provider (it
    answers and is the bound one), then register only this workspace with its schedule
    minute, read the exact row back, and report runtime_operational or name what is
    missing. Nothing is written when a mailbox is not verified or the workspace is already
    registered. Exit 0 operational, 1 refused (nothing written), 8 registered but something
    the runtime needs is missing."""
    settings = read_settings(data_dir)
    station = open_station(settings)
    providers = Providers(settings, registered=False)
    try:
        report = anyio.run(
            partial(
                bootstrap.bootstrap,
                station.store,
                station.data_dir,
                context_file,
                providers,
                SystemClock().now(),
            )
        )
    except OutloopError as exc:
        if as_json:  # the refusal as JSON too: a script reads one shape
            shown = {"runtime_operational": False, "registered": False, "error": worded(exc)}
            click.echo(json.dumps(shown, indent=2, ensure_ascii=False))
        fail(exc)
    finally:
        anyio.run(providers.aclose)
        station.close()
    _echo_bootstrap(report, as_json)
    if not report.runtime_operational:
        raise SystemExit(EXIT_NOT_OPERATIONAL)


EXIT_NOT_OPERATIONAL = 8


def _echo_bootstrap(report: bootstrap.BootstrapReport, as_json: bool) -> None:
    row = report.row
    if as_json:
        shown = {
            "workspace_id": report.workspace_id,
            "runtime_operational": report.runtime_operational,
            "missing": report.missing,
            "mailboxes": [
                {"mailbox_id": m.mailbox_id, "provider": m.provider, "detail": m.detail}
                for m in report.mailboxes
            ],
            "schedule": {
                "expression": row.schedule_expression,
                "minute": row.schedule_minute,
                "derivation": json.loads(row.schedule_derivation or "null"),
            },
            "registered": True,
            "registry_row_confirmed": True,
        }
        click.echo(json.dumps(shown, indent=2, ensure_ascii=False))
        return
    for mailbox in report.mailboxes:
        click.echo(f"verified {mailbox.mailbox_id} ({mailbox.provider}): {mailbox.detail}")
    click.echo(f"registered workspace {row.workspace_id}; the row read back matches")
    click.echo(f"schedule {row.schedule_expression} (recorded in tenant-config.md)")
    if report.runtime_operational:
        click.echo("runtime_operational")
        click.echo(f"next: 'outloop dispatch --workspace {row.workspace_id}' runs its schedule")
        return
    click.echo("not operational yet; missing:")
    for item in report.missing:
        click.echo(f"  - {item}")


@workspace.command("show")
@click.option(
    "--workspace",
    "workspace_id",
    default=None,
    help="Show this workspace's context and queue; default: list all.",
)
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@data_dir_option
def workspace_show(workspace_id: str | None, as_json: bool, data_dir: Path | None) -> None:
    """List registered workspaces, or show one with its queue."""
    with station_for(data_dir) as station:
        if workspace_id is None:
            _list_workspaces(station, as_json)
        else:
            _show_workspace(station, workspace_id, as_json)


def _list_workspaces(station: Station, as_json: bool) -> None:
    """Every registered workspace, one per line (or as JSON)."""
    rows = station.store.list_workspaces()
    if as_json:
        click.echo(json.dumps([r.model_dump(mode="json") for r in rows], indent=2))
        return
    if not rows:
        click.echo("no workspaces registered (add one with 'outloop workspace add --context FILE')")
    for row in rows:
        click.echo(f"{row.workspace_id}\t{row.label}\t{row.context_path}")


def _show_workspace(station: Station, workspace_id: str, as_json: bool) -> None:
    """One workspace: its context, its queue oldest first, and queued learning proposals."""
    context = workspaces.load_context(station.store, workspace_id)
    queue = station.board.list_queue(workspace_id)
    proposals = station.store.list_proposals(workspace_id)
    if as_json:
        shown = {
            "context": context.model_dump(mode="json", by_alias=True),
            "queue": [t.model_dump(mode="json") for t in queue],
            "learning_proposals": [p.model_dump(mode="json") for p in proposals],
        }
        click.echo(json.dumps(shown, indent=2, ensure_ascii=False))
        return
    click.echo(f"workspace {context.workspace_id} ({context.label})")
    click.echo(f"  timezone {context.timezone}, language {context.language}")
    for mailbox in context.mailboxes:
        click.echo(f"  mailbox {mailbox.mailbox_id} via {mailbox.provider}")
    _echo_queue(queue)
    _echo_proposals([p for p in proposals if p.state.value == "queued"])


def _echo_queue(queue: list[Task]) -> None:
    click.echo(f"  queue: {len(queue)} open task(s), oldest first")
    for task in queue:
        # Titles and names are untrusted: control characters are written out, and the
        # task's flags are shown with them.
        title = flag(task.title).shown
        sender = f" from {task.sender_name}" if task.sender_name else ""
        click.echo(
            f"    {task.received_at:%Y-%m-%d %H:%M} {task.state:<26} {title}"
            f"{sender} <{task.sender_identity}>"
        )
        for warning in task.content_flags:
            click.echo(f"      ⚠ {warning}")


def _echo_proposals(queued: list[LearningProposal]) -> None:
    if not queued:
        return
    # An agent wrote these while reading client mail: shown, never applied.
    click.echo(
        f"  learning proposals: {len(queued)} queued (agent-written; accept or reject them "
        "in 'outloop console', or edit the context file and run 'outloop workspace update')"
    )
    for proposal in queued:
        click.echo(f"    {proposal.proposal_id} [{proposal.kind}] {flag(proposal.summary).shown}")
