"""``outloop mail``: each verb makes the tool's call and prints its answer; refusals exit 2
with the code; the operator's session (watch) keeps the mailbox reachable while it runs."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from mcp_server.cli import main
from mcp_server.cli.mail import mail_group
from tests.conftest import wait_for


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    return tmp_path / "data"


def mail(data_dir: Path, *args: str, user: str = "ops/noa") -> Any:
    result = CliRunner().invoke(
        main,
        ["mail", *args, "--data-dir", str(data_dir), "--as", user],
        catch_exceptions=False,
    )
    return result


def as_json(data_dir: Path, *args: str, user: str = "ops/noa") -> dict[str, Any]:
    result = mail(data_dir, *args, "--json", user=user)
    return json.loads(result.output)


def test_every_mail_command_has_help() -> None:
    for name in mail_group.commands:
        result = CliRunner().invoke(main, ["mail", name, "--help"])
        assert result.exit_code == 0 and "Usage:" in result.output, name


def test_send_check_read_and_reply_from_the_command_line(data_dir: Path) -> None:
    runner = CliRunner()
    register = runner.invoke(
        main,
        [
            "mail",
            "register",
            "triage",
            "--kind",
            "operator",
            "--name",
            "Triage",
            "--data-dir",
            str(data_dir),
        ],
    )
    assert register.exit_code == 0, register.output
    assert mail(data_dir, "presence", "on", user="triage").exit_code == 0
    sent = as_json(data_dir, "send", "triage", "-m", "can you take INV-7?", "--subject", "INV-7")
    assert sent["status"] == "sent"
    listed = mail(data_dir, "check", user="triage")
    assert "INV-7" in listed.output and listed.output.startswith("*")
    [entry] = as_json(data_dir, "check", user="triage")["emails"]
    read = mail(data_dir, "read", entry["email_id"], user="triage")
    assert "can you take INV-7?" in read.output
    assert mail(data_dir, "presence", "on").exit_code == 0
    replied = as_json(data_dir, "reply", entry["email_id"], "-m", "yes", user="triage")
    assert replied["to"] == ["ops/noa"]
    assert "Re: INV-7" in mail(data_dir, "check").output


def test_a_refusal_exits_2_with_its_code(data_dir: Path) -> None:
    result = mail(data_dir, "send", "noa@fabrikam.test", "-m", "x")
    assert result.exit_code == 2 and "INVALID_INPUT" in result.output
    raw = mail(
        data_dir, "call", json.dumps({"action": "check", "input": {"query": "x"}, "reasoning": "r"})
    )
    assert raw.exit_code == 2 and json.loads(raw.output)["code"] == "INVALID_INPUT"


def test_a_raw_call_returns_the_result_with_its_unread_lane(data_dir: Path) -> None:
    mail(data_dir, "send", "ops/noa", "-m", "note to self")
    raw = mail(data_dir, "call", json.dumps({"action": "check", "input": {}, "reasoning": "r"}))
    result = json.loads(raw.output)
    lane = result["_meta"]["agent_meta"]["notifications"]["persistent"]["email"]
    assert lane["total"] == 1 and lane["entries"][0]["message"] == "note to self"


def test_contacts_settings_and_manual_from_the_command_line(data_dir: Path) -> None:
    assert (
        mail(data_dir, "add-contact", "triage", "Triage desk", "--note", "weekdays").exit_code == 0
    )
    assert mail(data_dir, "edit-contact", "triage", "--name", "Triage").exit_code == 0
    assert "triage: Triage weekdays" in mail(data_dir, "contacts").output
    assert mail(data_dir, "remove-contact", "triage").exit_code == 0
    settings = mail(data_dir, "settings").output
    assert "send.body_char_limit: 50000" in settings
    assert "internal mail" in mail(data_dir, "manual").output.lower()


def test_presence_is_for_operators_only(data_dir: Path) -> None:
    CliRunner().invoke(
        main,
        [
            "mail",
            "register",
            "agents/a",
            "--kind",
            "agent",
            "--name",
            "A",
            "--data-dir",
            str(data_dir),
        ],
    )
    result = mail(data_dir, "presence", "on", user="agents/a")
    assert result.exit_code == 1 and "presence is for operators" in result.output


def test_watch_keeps_an_operator_reachable_and_shows_arrivals_until_stopped(
    data_dir: Path, tmp_path: Path
) -> None:
    env = {**os.environ, "OUTLOOP_DATA_DIR": str(data_dir)}
    shown = tmp_path / "watch.out"
    command = [sys.executable, "-m", "mcp_server.cli", "mail", "watch", "--as", "ops/noa"]
    with shown.open("w") as out:
        watcher = subprocess.Popen(
            [*command, "--poll", "0.05"], env=env, stdout=out, stderr=subprocess.DEVNULL
        )
    heartbeat = data_dir / "mail" / "ops" / "noa" / "heartbeat.json"
    try:
        wait_for(heartbeat.exists, "the watch session's heartbeat")
        sent = as_json(data_dir, "send", "ops/noa", "-m", "are you there?", user="triage")
        assert sent["status"] == "sent"
        wait_for(lambda: "<triage>" in shown.read_text(), "the watcher shows the arrival")
    finally:
        watcher.send_signal(signal.SIGTERM)
        watcher.wait(timeout=30)
    assert watcher.returncode == 0
    assert not heartbeat.exists()


def test_deliver_and_footprint_from_the_command_line(data_dir: Path) -> None:
    mail(data_dir, "send", "ops/noa", "-m", "later", "--delay", "5")
    deliver = CliRunner().invoke(main, ["mail", "deliver", "--data-dir", str(data_dir)])
    assert deliver.exit_code == 0 and "delivered 0" in deliver.output
    report = json.loads(mail(data_dir, "footprint").output)
    assert report["folders"]["sent"]["files"] == 1 and report["removable"]["count"] == 0
