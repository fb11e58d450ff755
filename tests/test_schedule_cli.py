"""``outloop schedule show|verify`` and ``outloop dispatch`` on one data directory: verify proves
each check (stored expression, next runs, no Saturday, binding, recorded minute, exactly one
dispatcher from this installation) and fails on exactly the one that does not hold, saying how
to fix it; the host-scheduler units it emits fire when croniter says the schedule runs."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import click
import pytest
from click.testing import CliRunner

from agent.domain import schedule
from agent.domain.records import DispatcherRow
from agent.services.holder import current_holder
from agent.services.workspaces import DataDir
from agent.storage.sqlite import SqliteStore
from agent.testing.contexts import context_yaml
from mcp_server.cli import main
from mcp_server.cli.schedule import crontab_line, on_calendar
from mcp_server.composition import Settings
from tests.conftest import wait_for

WS = "ws-schedule-0001"


@dataclass
class Station:
    root: Path

    @property
    def data_dir(self) -> Path:
        return self.root / "data"

    @property
    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("OUTLOOP_")}
        env["OUTLOOP_DATA_DIR"] = str(self.data_dir)
        return env

    def outloop(self, *args: str) -> tuple[int, str]:
        done = CliRunner().invoke(main, list(args), env=dict(self.env))
        return done.exit_code, done.stdout + done.stderr

    def add(self, workspace_id: str = WS) -> Path:
        maildir = self.root / f"mail-{workspace_id}"
        for sub in ("cur", "new", "tmp"):
            (maildir / sub).mkdir(parents=True, exist_ok=True)
        context = self.root / f"{workspace_id}.yaml"
        context.write_text(
            context_yaml(workspace_id, provider="maildir", path=str(maildir)), encoding="utf-8"
        )
        code, shown = self.outloop("workspace", "add", "--context", str(context))
        assert code == 0, shown
        return context

    def verify(self) -> tuple[int, dict[str, Any]]:
        code, shown = self.outloop("schedule", "verify", "--workspace", WS, "--json")
        return code, json.loads(shown[: shown.rindex("}") + 1])

    def sql(self, statement: str, *params: object) -> None:
        with sqlite3.connect(DataDir(self.data_dir).database) as conn:
            conn.execute(statement, params)

    def dispatcher(self, *extra: str) -> subprocess.Popen[str]:
        return subprocess.Popen(
            [sys.executable, "-m", "mcp_server.cli", "dispatch", "--workspace", WS,
             "--poll", "0.2", "--lease-seconds", "30", *extra],
            env=self.env, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True,
        )  # fmt: skip


def failed(report: dict[str, Any]) -> dict[str, str]:
    return {c["name"]: c["detail"] + " / fix: " + c["fix"] for c in report["checks"] if not c["ok"]}


@pytest.fixture
def station(tmp_path: Path) -> Station:
    station = Station(tmp_path)
    station.add()
    return station


def active_roles(station: Station) -> list[str]:
    store = SqliteStore(DataDir(station.data_dir).database)
    try:
        return [d.role for d in store.list_dispatchers(WS)]
    finally:
        store.close()


@pytest.fixture
def running(station: Station) -> Iterator[subprocess.Popen[str]]:
    daemon = station.dispatcher()
    wait_for(lambda: "active" in active_roles(station), "the dispatcher is active")
    yield daemon
    if daemon.poll() is None:
        daemon.kill()
        daemon.communicate(timeout=30)


def test_a_fresh_install_fails_verify_on_exactly_the_missing_dispatcher(station: Station) -> None:
    code, report = station.verify()
    assert code == 6
    assert list(failed(report)) == ["dispatcher"]
    assert f"outloop dispatch --workspace {WS}" in failed(report)["dispatcher"]
    minute = schedule.derive_minute(WS)
    assert report["expression"] == schedule.expression(minute)
    assert len(report["next_runs"]) == 7


def test_one_running_dispatcher_passes_verify_and_a_host_timer_beside_it_is_two(
    station: Station, running: subprocess.Popen[str]
) -> None:
    code, report = station.verify()
    assert code == 0, failed(report)
    [row] = report["dispatchers"]
    assert row["role"] == "active" and row["install"] == str(Path.cwd())
    timer = subprocess.run(
        [sys.executable, "-m", "mcp_server.cli", "dispatch", "--workspace", WS, "--once"],
        check=False, env=station.env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert timer.returncode == 7 and "the lease is held by" in timer.stderr
    code, report = station.verify()
    assert code == 6 and list(failed(report)) == ["dispatcher"]
    assert "2 dispatchers run this workspace" in failed(report)["dispatcher"]
    running.send_signal(signal.SIGTERM)
    _, err = running.communicate(timeout=30)
    assert running.returncode == 0, err
    assert "stopped" in active_roles(station)


def test_a_second_dispatcher_stands_by_naming_the_holder_or_exits_with_no_wait(
    station: Station, running: subprocess.Popen[str]
) -> None:
    second = station.dispatcher("--no-wait")
    _, err = second.communicate(timeout=60)
    assert second.returncode == 7
    assert f"pid {running.pid}" in err and "lease is held by" in err


def test_verify_catches_a_hand_edited_expression_in_the_registry(station: Station) -> None:
    minute = schedule.derive_minute(WS)
    station.sql("UPDATE workspaces SET schedule_expression = ?", f"{minute} 9 * * 0-5")
    _, report = station.verify()
    assert "expression" in failed(report) and "is not the schedule" in failed(report)["expression"]
    # ``workspace update`` records the minute tenant-config.md holds again
    code, shown = station.outloop(
        "workspace", "update", "--context", str(station.root / f"{WS}.yaml")
    )
    assert code == 0, shown
    _, report = station.verify()
    assert list(failed(report)) == ["dispatcher"]


def test_verify_catches_a_hand_edited_tenant_config(station: Station) -> None:
    path = DataDir(station.data_dir).tenant_config(WS)
    text = path.read_text(encoding="utf-8")
    path.write_text(text.replace('8,10,12,14,16,18,20 * * 0-5"', '8,10,12,14,16,18,20 * * *"'))
    _, report = station.verify()
    assert "tenant-config.md records" in failed(report)["expression"]


def test_verify_catches_a_wrong_minute(station: Station) -> None:
    wrong = schedule.derive_minute(WS) % 59 + 1
    station.sql(
        "UPDATE workspaces SET schedule_minute = ?, schedule_expression = ?",
        wrong, schedule.expression(wrong),
    )  # fmt: skip
    _, report = station.verify()
    assert "minute" in failed(report)
    assert f"holds minute {wrong}" in failed(report)["minute"]


def test_verify_catches_a_saturday(station: Station) -> None:
    minute = schedule.derive_minute(WS)
    station.sql(
        "UPDATE workspaces SET schedule_expression = ?", f"{minute} 8,10,12,14,16,18,20 * * 0-6"
    )
    _, report = station.verify()
    assert "Saturday" in failed(report)["no_saturday"]
    assert "expression" in failed(report)


def test_verify_catches_a_missing_binding(station: Station) -> None:
    station.sql("DELETE FROM mailbox_bindings WHERE workspace_id = ?", WS)
    code, report = station.verify()
    assert code == 6 and "no binding" in failed(report)["binding"]


def test_verify_catches_a_dispatcher_running_from_another_installation(station: Station) -> None:
    now = datetime.now(UTC)
    store = SqliteStore(DataDir(station.data_dir).database)
    try:
        store.record_dispatcher(
            DispatcherRow(
                holder=current_holder(), workspace_id=WS, role="active",
                executable="/opt/outloop-old/bin/python", install="/opt/outloop-old",
                version="0.0.9", started_at=now, seen_at=now,
            )
        )  # fmt: skip
    finally:
        store.close()
    _, report = station.verify()
    assert "another installation" in failed(report)["dispatcher"]
    assert "/opt/outloop-old" in failed(report)["dispatcher"]


def test_a_reinstall_reads_recorded_minutes_back_whatever_the_registration_order(
    tmp_path: Path,
) -> None:
    station = Station(tmp_path)
    derived = schedule.derive_minute(WS)
    rival = next(
        f"ws-rival-{n}" for n in range(10_000) if schedule.derive_minute(f"ws-rival-{n}") == derived
    )
    station.add(WS)
    station.add(rival)

    def minutes() -> dict[str, int | None]:
        store = SqliteStore(DataDir(station.data_dir).database)
        try:
            return {r.workspace_id: r.schedule_minute for r in store.list_workspaces()}
        finally:
            store.close()

    first = minutes()
    assert first == {WS: derived, rival: derived % 59 + 1}
    DataDir(station.data_dir).database.unlink()  # a fresh registry; the data directory kept
    station.add(rival)
    station.add(WS)
    assert minutes() == first


def test_show_emits_a_systemd_timer_in_the_schedule_timezone(station: Station) -> None:
    code, shown = station.outloop("schedule", "show", "--workspace", WS, "--systemd")
    assert code == 0, shown
    minute = schedule.derive_minute(WS)
    assert (
        f"OnCalendar=Sun,Mon,Tue,Wed,Thu,Fri *-*-* 08,10,12,14,16,18,20:{minute:02d}:00 Asia/Jerusalem"
        in shown
    )
    assert f"-m mcp_server.cli dispatch --workspace {WS} --once --data-dir" in shown
    assert "AccuracySec=1s" in shown and "EnvironmentFile=-" in shown
    code, shown = station.outloop("schedule", "show", "--workspace", WS, "--crontab")
    assert code == 1 and "no per-line timezone" in shown and "--systemd" in shown


def test_the_systemd_timer_fires_when_croniter_says_the_schedule_runs() -> None:
    expr, timezone = schedule.expression(41), "Asia/Jerusalem"
    calendar = on_calendar(expr, timezone)
    elapses: list[datetime] = []
    expected: list[datetime] = []
    for _ in range(2):  # a run falling between the two readings: read both again
        now = datetime.now(UTC)
        expected = [r.astimezone(UTC) for r in schedule.next_runs(expr, timezone, now, 10)]
        out = subprocess.run(
            ["systemd-analyze", "calendar", "--iterations", "10", calendar],
            capture_output=True, text=True, check=True, env={"TZ": "UTC", "LC_ALL": "C"},
        ).stdout  # fmt: skip
        elapses = [
            datetime.strptime(line.split(": ", 1)[1].strip(), "%a %Y-%m-%d %H:%M:%S UTC").replace(
                tzinfo=UTC
            )
            for line in out.splitlines()
            if "Next elapse:" in line or "Iter. #" in line
        ]
        if elapses == expected:
            return
    pytest.fail(f"systemd's elapses {elapses} are not croniter's {expected}")


def test_a_crontab_line_is_given_only_when_the_host_runs_in_the_schedule_timezone(
    tmp_path: Path,
) -> None:
    expr = schedule.expression(5)
    settings = Settings(data_dir=tmp_path, database_url="postgresql://u:hunter2@db/outloop")
    line = crontab_line("ws-a", expr, "UTC", settings, host="Etc/UTC")
    assert "hunter2" not in line and "OUTLOOP_DATABASE_URL" in line
    assert line.splitlines()[-1].startswith(f"{expr} ")
    assert "--once" in line and "--workspace ws-a" in line
    with pytest.raises(click.ClickException, match="no per-line timezone"):
        crontab_line("ws-a", expr, "Asia/Jerusalem", settings, host="Etc/UTC")


def test_dispatch_and_verify_of_an_unknown_workspace_say_how_to_register_it(
    station: Station,
) -> None:
    for command in (("dispatch", "--once"), ("schedule", "verify")):
        code, shown = station.outloop(*command, "--workspace", "ws-nobody")
        assert code == 1 and "Traceback" not in shown
        assert "ws-nobody" in shown and "outloop workspace bootstrap" in shown


def test_a_dispatcher_of_a_workspace_with_no_recorded_minute_says_what_to_run(
    station: Station,
) -> None:
    station.sql("UPDATE workspaces SET schedule_minute = NULL, schedule_expression = NULL")
    code, shown = station.outloop("dispatch", "--workspace", WS)
    assert code == 1 and "no recorded schedule" in shown and "workspace update" in shown
    code, report = station.verify()
    assert code == 6 and "records no schedule" in failed(report)["expression"]


def test_only_the_latest_host_timer_run_counts_as_the_dispatcher(station: Station) -> None:
    for _ in range(2):  # two timer runs: the newest is the host timer
        code, shown = station.outloop("dispatch", "--workspace", WS, "--once")
        assert code == 0, shown
    code, report = station.verify()
    assert code == 0, failed(report)
    assert [d["role"] for d in report["dispatchers"]] == ["one-shot"]


def test_a_reinstall_refuses_a_tenant_config_whose_minute_was_edited_by_hand(
    tmp_path: Path,
) -> None:
    station = Station(tmp_path)
    context = station.add(WS)
    derived = schedule.derive_minute(WS)
    path = DataDir(station.data_dir).tenant_config(WS)
    edited = path.read_text(encoding="utf-8").replace(
        f'"minute": {derived},', f'"minute": {derived % 59 + 1},'
    )
    path.write_text(edited, encoding="utf-8")
    DataDir(station.data_dir).database.unlink()  # a reinstall: a fresh registry
    code, shown = station.outloop("workspace", "add", "--context", str(context))
    assert code == 1 and "does not re-run to it" in shown and str(path) in shown
    store = SqliteStore(DataDir(station.data_dir).database)
    try:
        assert store.list_workspaces() == []
    finally:
        store.close()
