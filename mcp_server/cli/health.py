"""``outloop health``: the station's health for hosts without HTTP probes (a systemd timer,
a container's HEALTHCHECK, a cron job that mails an operator)."""

from __future__ import annotations

import json
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import click

from agent.domain.errors import OutloopError, StoreError, UnknownWorkspace
from agent.ports import EmbeddedStore
from agent.services import status
from agent.services.workspaces import DataDir
from agent.storage.backend import open_store
from mcp_server.cli.shared import data_dir_option, read_settings, worded

EXIT_PROBLEMS = 1
EXIT_UNREACHABLE = 2
EXIT_REFUSED = 3


@click.command("health")
@click.option("--workspace", "workspace_id", default=None, help="Only this workspace.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object on stdout.")
@data_dir_option
def health_command(workspace_id: str | None, as_json: bool, data_dir: Path | None) -> None:
    """Check that the store answers, and each workspace: a clean run within its last two
    scheduled slots, no send left UNCERTAIN or WITH_PERSON, no sign-in challenge waiting on
    a person. Every problem is named with what clears it.

    Exit status: 0 healthy, 1 a problem was found, 2 the store does not answer (or there is
    none at the data directory), 3 the request was refused (an unknown --workspace)."""
    settings = read_settings(data_dir)
    report: dict[str, Any] = {"status": "ok", "store": "answers", "workspaces": [], "problems": []}
    database = DataDir(settings.data_dir).database
    try:
        if settings.database_url is None and not database.is_file():
            raise StoreError(
                f"no store at {database}: give the station's --data-dir (or "
                "OUTLOOP_DATA_DIR), or OUTLOOP_DATABASE_URL when it shares PostgreSQL"
            )
        store = open_store(settings.database_url, database, bounded=True)
        try:
            found = _statuses(store, workspace_id)
        finally:
            store.close()
    except StoreError as exc:
        report.update(status="unready", store="unreachable", problems=[str(exc)])
        _finish(report, as_json)
        sys.exit(EXIT_UNREACHABLE)
    except OutloopError as exc:
        if as_json:
            click.echo(json.dumps({"status": "error", "error": worded(exc)}))
        else:
            click.echo(f"Error: {worded(exc)}", err=True)
        sys.exit(EXIT_REFUSED)
    report["workspaces"] = [s.model_dump(mode="json") for s in found]
    report["problems"] = [p for s in found for p in s.problems]
    if not found:
        report["problems"].append(
            "no workspace is registered in this station: register one with 'outloop "
            "workspace bootstrap --context FILE'"
        )
    if report["problems"]:
        report["status"] = "problems"
    _finish(report, as_json)
    if report["problems"]:
        sys.exit(EXIT_PROBLEMS)


def _statuses(store: EmbeddedStore, workspace_id: str | None) -> list[status.WorkspaceStatus]:
    now = datetime.now(UTC)
    if workspace_id is None:
        return status.of_station(store, now)
    if store.get_workspace(workspace_id) is None:
        raise UnknownWorkspace(workspace_id)
    return [status.of_workspace(store, workspace_id, now)]


def _finish(report: dict[str, Any], as_json: bool) -> None:
    if as_json:
        click.echo(json.dumps(report, ensure_ascii=False))
        return
    click.echo(f"store: {report['store']}")
    for ws in report["workspaces"]:
        tasks = sum(ws["open_tasks"].values())
        clean = ws["last_clean_run_at"] or "never"
        click.echo(f"workspace {ws['workspace_id']}: {tasks} open task(s), last clean run {clean}")
    for problem in report["problems"]:
        click.echo(f"problem: {problem}")
    if report["status"] == "ok":
        click.echo("healthy")
