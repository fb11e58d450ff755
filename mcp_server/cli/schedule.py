"""``outloop schedule show|verify``: the workspace's schedule, and proof that it will run."""

from __future__ import annotations

import getpass
import json
import shlex
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import click

from agent.domain import schedule as cron
from agent.services import schedule
from agent.services.clock import SystemClock
from agent.services.schedule import Verification
from agent.services.workspaces import load_context
from mcp_server.cli.shared import data_dir_option, read_settings, station_for
from mcp_server.composition import (
    BROWSER_EXECUTABLE_ENV,
    BROWSER_STATE_DIR_ENV,
    DATABASE_URL_SETTING,
    VAULT_BACKEND_ENV,
    VAULT_DIR_ENV,
    VAULT_KEY_ENV,
    VAULT_KEY_FILE_ENV,
    Settings,
    installation,
)

EXIT_FAILED = 6

UTC_NAMES = {"UTC", "Etc/UTC", "Etc/Universal", "Universal", "Etc/Zulu", "Zulu", "Etc/UCT", "UCT"}


@click.group("schedule")
def schedule_group() -> None:
    """Show a workspace's schedule, or verify check by check that it will run."""


def _workspace_option(func: Any) -> Any:
    return click.option("--workspace", "workspace_id", required=True, help="The workspace id.")(
        func
    )


def _verified(data_dir: Path | None, workspace_id: str) -> Verification:
    with station_for(data_dir) as station:
        tenant_config = station.data_dir.tenant_config(workspace_id)
        result = schedule.verify(
            station.store,
            station.store,
            tenant_config,
            workspace_id,
            installation(station.data_dir.pack),
            SystemClock().now(),
        )
        if result is None:
            load_context(station.store, workspace_id)  # raises UnknownWorkspace, worded
        assert result is not None
        return result


def _as_json(result: Verification) -> dict[str, Any]:
    return {
        "workspace_id": result.workspace_id,
        "expression": result.expression,
        "timezone": result.timezone,
        "minute": result.minute.minute if result.minute else None,
        "derivation": result.minute.model_dump(mode="json") if result.minute else None,
        "next_runs": [r.isoformat() for r in result.next_runs],
        "ok": result.ok,
        "checks": [
            {"name": c.name, "ok": c.ok, "detail": c.detail, "fix": c.fix} for c in result.checks
        ],
        "dispatchers": [d.model_dump(mode="json") for d in result.dispatchers],
    }


@schedule_group.command("verify")
@_workspace_option
@click.option("--json", "as_json", is_flag=True, help="Print the checks as JSON.")
@data_dir_option
def verify_command(workspace_id: str, as_json: bool, data_dir: Path | None) -> None:
    """Check the stored expression, the next runs in local time, that none falls on a
    Saturday, the workspace binding, the recorded minute, and that exactly one dispatcher is
    active and runs from this installation. Exit 0 when every check passed, 6 otherwise."""
    result = _verified(data_dir, workspace_id)
    if as_json:
        click.echo(json.dumps(_as_json(result), ensure_ascii=False, indent=2))
    else:
        click.echo(f"workspace {workspace_id}: {result.expression} in {result.timezone}")
        for check in result.checks:
            click.echo(f"  {'ok  ' if check.ok else 'FAIL'} {check.name}: {check.detail}")
            if not check.ok and check.fix:
                click.echo(f"       fix: {check.fix}")
    if not result.ok:
        failed = ", ".join(c.name for c in result.checks if not c.ok)
        click.echo(f"schedule verify failed: {failed}", err=True)
        raise SystemExit(EXIT_FAILED)


@schedule_group.command("show")
@_workspace_option
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.option(
    "--systemd",
    "emit_systemd",
    is_flag=True,
    help="Print a systemd service and timer that run one dispatcher cycle at each scheduled "
    "time (OnCalendar carries the schedule's timezone).",
)
@click.option(
    "--crontab",
    "emit_crontab",
    is_flag=True,
    help="Print a crontab line (only when the host's timezone is the schedule's: Debian's "
    "cron has no per-line timezone).",
)
@data_dir_option
def show_command(
    workspace_id: str,
    as_json: bool,
    emit_systemd: bool,
    emit_crontab: bool,
    data_dir: Path | None,
) -> None:
    """The workspace's schedule: expression, timezone, minute and its derivation, the next
    runs in local time, and its dispatchers. A summary, not verification: run 'outloop
    schedule verify' for that."""
    if sum((as_json, emit_systemd, emit_crontab)) > 1:
        raise click.UsageError("give one of --json, --systemd and --crontab")
    result = _verified(data_dir, workspace_id)
    if result.expression is None or result.timezone is None:
        raise click.ClickException(
            f"workspace {workspace_id} has no recorded schedule; run 'outloop workspace update "
            "--context FILE' to record its minute"
        )
    settings = read_settings(data_dir)
    broken = [c.name for c in result.checks if not c.ok and c.name in ("expression", "minute")]
    if (emit_systemd or emit_crontab) and broken:
        raise click.ClickException(
            f"the stored schedule fails verify ({', '.join(broken)}): fix it first (see "
            f"'outloop schedule verify --workspace {workspace_id}'), then emit the units"
        )
    if emit_systemd:
        click.echo(systemd_units(workspace_id, result.expression, result.timezone, settings))
        return
    if emit_crontab:
        click.echo(crontab_line(workspace_id, result.expression, result.timezone, settings))
        return
    if as_json:
        click.echo(json.dumps(_as_json(result), ensure_ascii=False, indent=2))
        return
    click.echo(f"workspace {workspace_id}")
    click.echo(f"  expression {result.expression} (cron: 0 = Sunday, 6 = Saturday)")
    click.echo(f"  timezone   {result.timezone}")
    for check in result.checks:
        if check.name == "minute":
            click.echo(f"  minute     {check.detail}")
    click.echo("  next runs:")
    for moment in result.next_runs:
        click.echo(f"    {moment:%a %Y-%m-%d %H:%M %Z}")
    for row in result.dispatchers:
        click.echo(f"  dispatcher {row.role} {row.holder} (last seen {row.seen_at:%H:%M:%S} UTC)")


def _command(workspace_id: str, data_dir: Path) -> str:
    """This installation's own interpreter and CLI: the timer runs the installed copy."""
    parts = [sys.executable, "-m", "mcp_server.cli", "dispatch", "--workspace", workspace_id]
    return shlex.join([*parts, "--once", "--data-dir", str(data_dir.resolve())])


def on_calendar(expression: str, timezone: str) -> str:
    """The systemd calendar event of the schedule (systemd numbers days Mon..Sun)."""
    minute, hours, _, _, days = cron.fields(expression)
    names = ("Sun", "Mon", "Tue", "Wed", "Thu", "Fri", "Sat")
    day_text = ",".join(names[int(d)] for d in sorted(int(d) for d in days))
    hour_text = ",".join(f"{int(h):02d}" for h in hours)
    return f"{day_text} *-*-* {hour_text}:{int(minute[0]):02d}:00 {timezone}"


def _plain_settings(settings: Settings) -> list[tuple[str, str]]:
    """The settings this station runs with that may be written into a unit or a crontab."""
    plain = [
        (VAULT_BACKEND_ENV, settings.vault_backend if settings.vault_backend != "file" else None),
        (VAULT_DIR_ENV, str(settings.vault_dir) if settings.vault_dir else None),
        (VAULT_KEY_FILE_ENV, str(settings.vault_key_file) if settings.vault_key_file else None),
        (BROWSER_EXECUTABLE_ENV, settings.browser_executable),
        (
            BROWSER_STATE_DIR_ENV,
            str(settings.browser_state_dir) if settings.browser_state_dir else None,
        ),
    ]
    return [(name, value) for name, value in plain if value]


def _secret_settings(settings: Settings) -> list[str]:
    """The settings this station runs with that are (or may hold) secrets: never printed."""
    secret = [(DATABASE_URL_SETTING, settings.database_url), (VAULT_KEY_ENV, settings.vault_key)]
    return [name for name, value in secret if value]


def _user() -> list[str]:
    """``User=`` the one running this (the station's files are theirs), when it has a name."""
    try:
        return [f"User={getpass.getuser()}"]
    except (KeyError, OSError):
        return []


def systemd_units(workspace_id: str, expression: str, timezone: str, settings: Settings) -> str:
    name = f"outloop-dispatch-{workspace_id}"
    env_file = settings.data_dir.resolve() / "dispatch.env"
    lines = [f"Environment={shlex.quote(f'{k}={v}')}" for k, v in _plain_settings(settings)]
    secrets = _secret_settings(settings)
    if secrets:
        lines.append(f"# {', '.join(secrets)}: write them to {env_file} (mode 0600)")
    lines.append(f"EnvironmentFile=-{env_file}")
    return (
        f"# {name}.service\n"
        "[Unit]\n"
        f"Description=Outloop dispatcher cycle of workspace {workspace_id}\n\n"
        "[Service]\n"
        "Type=oneshot\n"
        + "".join(f"{line}\n" for line in [*_user(), *lines])
        + f"ExecStart={_command(workspace_id, settings.data_dir)}\n\n"
        f"# {name}.timer\n"
        "[Unit]\n"
        f"Description=Outloop schedule of workspace {workspace_id} ({expression} in {timezone})\n\n"
        "[Timer]\n"
        f"OnCalendar={on_calendar(expression, timezone)}\n"
        "AccuracySec=1s\n"
        "Persistent=true\n\n"
        "[Install]\n"
        "WantedBy=timers.target\n"
    )


def host_timezone() -> str | None:
    """The host's timezone as cron reads it (the /etc/localtime zone), or None."""
    localtime = Path("/etc/localtime")
    try:
        target = str(localtime.resolve())
    except OSError:
        return None
    if "zoneinfo/" in target:
        return target.split("zoneinfo/", 1)[1]
    try:
        return Path("/etc/timezone").read_text(encoding="utf-8").strip() or None
    except OSError:
        return None


def _same_zone(a: str | None, b: str) -> bool:
    return a is not None and (a == b or (a in UTC_NAMES and b in UTC_NAMES))


def crontab_line(
    workspace_id: str,
    expression: str,
    timezone: str,
    settings: Settings,
    host: str | None = None,
) -> str:
    host = host if host is not None else host_timezone()
    if not _same_zone(host, timezone):
        raise click.ClickException(
            f"no crontab line: the host's timezone is {host or 'unknown'} but workspace "
            f"{workspace_id} runs in {timezone}, and Debian's cron has no per-line timezone "
            f"(a line would run at the host's hours); use 'outloop schedule show --workspace "
            f"{workspace_id} --systemd' (OnCalendar carries the timezone) or "
            f"'outloop dispatch --workspace {workspace_id}'"
        )
    stamp = datetime.now(UTC).strftime("%Y-%m-%d")
    lines = [f"# Outloop workspace {workspace_id}, schedule in {timezone} (written {stamp})"]
    secrets = _secret_settings(settings)
    if secrets:
        lines.append(f"# this station also needs {', '.join(secrets)}: add each as NAME=value")
    lines += [f"{k}={v}" for k, v in _plain_settings(settings)]
    lines.append(f"{expression} {_command(workspace_id, settings.data_dir)}")
    return "\n".join(lines)
