"""The ``outloop`` command line, run as a real subprocess against a data dir in tmp_path."""

from __future__ import annotations

import json
import mailbox
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from email.message import EmailMessage
from email.policy import SMTPUTF8
from pathlib import Path
from typing import Any

import click
import pytest

from agent.domain.mail import Marker, MarkerKind
from agent.domain.records import SendAttempt, SendIntent
from agent.services.workspaces import DataDir
from agent.storage.sqlite import SqliteStore
from mcp_server.cli import main
from tests.conftest import context_yaml, pg_cluster

TIMEOUT = 120  # seconds, for every CLI call
BENCH_TIMEOUT = 600
WORKSPACE_ID = "ws-test-0001"
BENCH_KEYS = {
    "bench",
    "rate_per_s",
    "baseline_per_s",
    "ratio",
    "p50_ms",
    "p99_ms",
    "duplicates",
    "lost",
}


def _outloop_command() -> list[str]:
    """The installed console script of this interpreter, else on PATH, else ``-m``."""
    script = Path(sys.executable).parent / "outloop"
    if script.is_file():
        return [str(script)]
    found = shutil.which("outloop")
    if found:
        return [found]
    return [sys.executable, "-m", "mcp_server.cli"]


OUTLOOP = _outloop_command()


def _walk(group: click.Group, prefix: tuple[str, ...] = ()) -> Iterator[tuple[str, ...]]:
    for name, command in sorted(group.commands.items()):
        path = (*prefix, name)
        yield path
        if isinstance(command, click.Group):
            yield from _walk(command, path)


COMMAND_PATHS: list[tuple[str, ...]] = [(), *_walk(main)]


def _command_at(path: tuple[str, ...]) -> click.Command:
    command: click.Command = main
    for name in path:
        assert isinstance(command, click.Group)
        command = command.commands[name]
    return command


def _words(text: str) -> str:
    return " ".join(text.split())


@dataclass(frozen=True)
class Cli:
    """Runs ``outloop`` with OUTLOOP_DATA_DIR (and XDG_DATA_HOME) inside tmp_path."""

    data_dir: Path
    env: dict[str, str]

    def __call__(
        self, *args: str | Path, timeout: float = TIMEOUT
    ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*OUTLOOP, *(str(a) for a in args)],
            capture_output=True,
            text=True,
            encoding="utf-8",
            env=self.env,
            timeout=timeout,
            check=False,
        )

    def workspaces(self) -> list[dict[str, Any]]:
        """The registry rows, via ``workspace show --json``."""
        done = self("workspace", "show", "--json")
        assert done.returncode == 0, done.stderr
        rows = json.loads(done.stdout)
        assert isinstance(rows, list)
        return rows


@pytest.fixture
def cli(tmp_path: Path) -> Cli:
    data_dir = tmp_path / "data"
    env = {k: v for k, v in os.environ.items() if not k.startswith("OUTLOOP_")}
    env.update(
        {
            "OUTLOOP_DATA_DIR": str(data_dir),
            "XDG_DATA_HOME": str(tmp_path / "xdg"),
            "PYTHONIOENCODING": "utf-8",
        }
    )
    return Cli(data_dir=data_dir, env=env)


def _write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path.resolve()


def _message(subject: str, msgid: str, in_reply_to: str | None = None) -> EmailMessage:
    msg = EmailMessage()
    msg["From"] = "Dana Levi <dana.levi@contoso.test>"
    msg["To"] = "support@fabrikam.test"
    msg["Subject"] = subject
    msg["Date"] = "Mon, 02 Mar 2026 09:00:00 +0000"
    msg["Message-ID"] = msgid
    if in_reply_to:
        msg["In-Reply-To"] = in_reply_to
        msg["References"] = in_reply_to
    msg.set_content(f"Body of {subject}.")
    return msg


@dataclass(frozen=True)
class MaildirWorkspace:
    context_file: Path
    first: str  # item refs of the two messages in one thread, and of the separate one
    reply: str
    separate: str


@pytest.fixture
def maildir_workspace(tmp_path: Path) -> MaildirWorkspace:
    """A Maildir with a two-message thread and one separate message, and its context file."""
    path = (tmp_path / "mail" / "Maildir").resolve()
    path.parent.mkdir(parents=True)
    box = mailbox.Maildir(str(path), create=True)
    first = box.add(_message("Invoice INV-118", "<inv-118@contoso.test>"))
    reply = box.add(
        _message("RE: Invoice INV-118", "<inv-118-re@contoso.test>", "<inv-118@contoso.test>")
    )
    separate = box.add(_message("Dashboard access", "<access-1@contoso.test>"))
    context = _write(
        tmp_path / "contexts" / "maildir.yaml",
        context_yaml(WORKSPACE_ID, provider="maildir", path=str(path)),
    )
    return MaildirWorkspace(
        context_file=context,
        first=f"maildir:support@fabrikam.test/maildir:{first}",
        reply=f"maildir:support@fabrikam.test/maildir:{reply}",
        separate=f"maildir:support@fabrikam.test/maildir:{separate}",
    )


# -- help ----------------------------------------------------------------------------------


def test_the_command_tree_walk_finds_every_known_command() -> None:
    names = {" ".join(p) for p in COMMAND_PATHS}
    assert {
        "",
        "workspace",
        "workspace add",
        "workspace update",
        "workspace show",
        "run",
        "demo",
        "bench",
        "bench claims",
        "bench reconcile",
        "bench mcp",
        "serve",
    } <= names


@pytest.mark.parametrize("path", COMMAND_PATHS, ids=lambda p: " ".join(("outloop", *p)))
def test_every_command_and_group_prints_its_help_text(cli: Cli, path: tuple[str, ...]) -> None:
    command = _command_at(path)
    assert command.help, f"'{' '.join(('outloop', *path))}' has no help text"
    done = cli(*path, "--help")
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    assert done.stdout.startswith("Usage: ")
    assert " ".join(path) in done.stdout.splitlines()[0]
    first_paragraph = command.help.split("\n\n")[0]
    assert _words(first_paragraph) in _words(done.stdout)
    if isinstance(command, click.Group):
        for name in command.commands:
            assert name in done.stdout


def test_short_help_flag_works_on_nested_commands(cli: Cli) -> None:
    long = cli("workspace", "add", "--help")
    short = cli("workspace", "add", "-h")
    assert short.returncode == 0, short.stderr
    assert short.stdout == long.stdout


# -- workspace -----------------------------------------------------------------------------


def test_a_fresh_data_dir_has_no_workspaces(cli: Cli) -> None:
    assert cli.workspaces() == []
    done = cli("workspace", "show")
    assert done.returncode == 0, done.stderr
    assert "no workspaces registered" in done.stdout
    assert "outloop workspace add" in done.stdout


def test_workspace_add_registers_exactly_one_workspace(cli: Cli, tmp_path: Path) -> None:
    context = _write(tmp_path / "contexts" / "ws.yaml", context_yaml(WORKSPACE_ID))
    done = cli("workspace", "add", "--context", context)
    assert done.returncode == 0, done.stderr
    assert WORKSPACE_ID in done.stdout
    rows = cli.workspaces()
    assert [r["workspace_id"] for r in rows] == [WORKSPACE_ID]
    assert rows[0]["label"] == f"Test workspace {WORKSPACE_ID}"


def test_a_second_add_of_the_same_id_is_refused_and_points_to_update(
    cli: Cli, tmp_path: Path
) -> None:
    context = _write(tmp_path / "contexts" / "ws.yaml", context_yaml(WORKSPACE_ID))
    assert cli("workspace", "add", "--context", context).returncode == 0
    again = cli("workspace", "add", "--context", context)
    assert again.returncode != 0
    assert WORKSPACE_ID in again.stderr
    assert "outloop workspace update" in again.stderr
    assert "Traceback" not in again.stderr
    assert len(cli.workspaces()) == 1


def test_workspace_update_replaces_the_context(cli: Cli, tmp_path: Path) -> None:
    original = context_yaml(WORKSPACE_ID)
    context = _write(tmp_path / "contexts" / "ws.yaml", original)
    assert cli("workspace", "add", "--context", context).returncode == 0
    renamed = original.replace(f"label: Test workspace {WORKSPACE_ID}", "label: Renamed desk")
    assert renamed != original
    new_context = _write(tmp_path / "contexts" / "ws-renamed.yaml", renamed)
    done = cli("workspace", "update", "--context", new_context)
    assert done.returncode == 0, done.stderr
    assert WORKSPACE_ID in done.stdout
    shown = cli("workspace", "show", "--workspace", WORKSPACE_ID, "--json")
    assert shown.returncode == 0, shown.stderr
    payload = json.loads(shown.stdout)
    assert payload["context"]["workspace_id"] == WORKSPACE_ID
    assert payload["context"]["label"] == "Renamed desk"
    assert payload["queue"] == []
    assert [r["label"] for r in cli.workspaces()] == ["Renamed desk"]


def test_workspace_update_of_an_unknown_id_is_refused_and_points_to_add(
    cli: Cli, tmp_path: Path
) -> None:
    context = _write(tmp_path / "contexts" / "ws.yaml", context_yaml("ws-nobody-0009"))
    done = cli("workspace", "update", "--context", context)
    assert done.returncode != 0
    assert "ws-nobody-0009" in done.stderr
    assert "outloop workspace add" in done.stderr
    assert "Traceback" not in done.stderr
    assert cli.workspaces() == []


def test_show_of_an_unregistered_workspace_fails_naming_it(cli: Cli) -> None:
    done = cli("workspace", "show", "--workspace", "ws-nobody-0009")
    assert done.returncode != 0
    assert "ws-nobody-0009" in done.stderr
    assert "outloop workspace add" in done.stderr


_BASE = context_yaml(WORKSPACE_ID)
INVALID_CONTEXTS = {
    "bad-yaml": (
        _BASE.replace(f"label: Test workspace {WORKSPACE_ID}", "label: [Test workspace"),
        ["not valid YAML", "label", "line 2"],
    ),
    "missing-workspace-id": (
        _BASE.replace(f"workspace_id: {WORKSPACE_ID}\n", ""),
        ["workspace_id", "Field required"],
    ),
    "unknown-timezone": (
        _BASE.replace("timezone: Asia/Jerusalem", "timezone: Mars/Olympus_Mons"),
        ["timezone", "Mars/Olympus_Mons"],
    ),
    "unknown-top-level-key": (
        _BASE + "favourite_colour: teal\n",
        ["favourite_colour", "Extra inputs are not permitted"],
    ),
}


@pytest.mark.parametrize("case", sorted(INVALID_CONTEXTS))
def test_an_invalid_context_is_refused_naming_file_and_key_and_registers_nothing(
    cli: Cli, tmp_path: Path, case: str
) -> None:
    text, fragments = INVALID_CONTEXTS[case]
    assert text != _BASE
    context = _write(tmp_path / "contexts" / f"{case}.yaml", text)
    done = cli("workspace", "add", "--context", context)
    assert done.returncode != 0
    assert "Traceback" not in done.stderr
    assert str(context) in done.stderr
    for fragment in fragments:
        assert fragment in done.stderr
    assert cli.workspaces() == []
    assert not (cli.data_dir / "workspaces").exists()


@pytest.mark.parametrize("case", sorted(INVALID_CONTEXTS))
def test_an_invalid_update_leaves_the_registered_context_unchanged(
    cli: Cli, tmp_path: Path, case: str
) -> None:
    good = _write(tmp_path / "contexts" / "good.yaml", _BASE)
    assert cli("workspace", "add", "--context", good).returncode == 0
    before = cli("workspace", "show", "--workspace", WORKSPACE_ID, "--json")
    bad = _write(tmp_path / "contexts" / f"{case}.yaml", INVALID_CONTEXTS[case][0])
    done = cli("workspace", "update", "--context", bad)
    assert done.returncode != 0
    assert str(bad) in done.stderr
    after = cli("workspace", "show", "--workspace", WORKSPACE_ID, "--json")
    assert after.returncode == 0, after.stderr
    assert after.stdout == before.stdout
    assert len(cli.workspaces()) == 1


def test_data_dir_option_overrides_the_environment(cli: Cli, tmp_path: Path) -> None:
    context = _write(tmp_path / "contexts" / "ws.yaml", context_yaml(WORKSPACE_ID))
    assert cli("workspace", "add", "--context", context).returncode == 0
    other = tmp_path / "other-data"
    done = cli("workspace", "show", "--json", "--data-dir", other)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == []
    assert len(cli.workspaces()) == 1


# -- run -----------------------------------------------------------------------------------


def _run_json(cli: Cli, *extra: str) -> tuple[dict[str, Any], str]:
    done = cli("run", "--workspace", WORKSPACE_ID, "--once", "--json", *extra)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert len(lines) == 1, done.stdout
    return json.loads(lines[0]), done.stderr


def test_run_once_json_reconciles_a_maildir_into_one_task_per_thread(
    cli: Cli, maildir_workspace: MaildirWorkspace
) -> None:
    assert cli("workspace", "add", "--context", maildir_workspace.context_file).returncode == 0
    result, stderr = _run_json(cli)
    assert result["workspace_id"] == WORKSPACE_ID
    rec = result["reconciliation"]
    assert rec["scanned"] == 3
    assert rec["clean"] is True
    assert rec["reconciliation_failed"] == 0
    tasks = {item["item_ref"]: item["task_id"] for item in result["items"]}
    assert set(tasks) == {
        maildir_workspace.first,
        maildir_workspace.reply,
        maildir_workspace.separate,
    }
    assert None not in tasks.values()
    assert len(set(tasks.values())) == 2
    assert tasks[maildir_workspace.first] == tasks[maildir_workspace.reply]
    assert tasks[maildir_workspace.separate] != tasks[maildir_workspace.first]
    # Per-item progress goes to stderr, one line per item.
    progress = stderr.splitlines()
    assert [line.split(" ")[0] for line in progress] == ["[1/3]", "[2/3]", "[3/3]"]
    for line, item in zip(progress, result["items"], strict=True):
        assert line.endswith(f"{item['item_ref']}: {item['disposition']}")


def test_a_second_run_reads_nothing_new_and_a_replay_finds_every_item_already_done(
    cli: Cli, maildir_workspace: MaildirWorkspace
) -> None:
    assert cli("workspace", "add", "--context", maildir_workspace.context_file).returncode == 0
    first, _ = _run_json(cli)
    nothing_new, _ = _run_json(cli)
    assert nothing_new["items"] == [] and nothing_new["reconciliation"]["clean"] is True
    second, _ = _run_json(cli, "--from-start")
    assert second["run_id"] != first["run_id"]
    assert [i["disposition"] for i in second["items"]] == ["EXECUTION_ALREADY_DONE"] * 3
    assert all(not i["task_created"] for i in second["items"])
    rec = second["reconciliation"]
    assert (rec["scanned"], rec["claim_race"], rec["clean"]) == (3, 3, True)


def test_run_quiet_prints_no_progress(cli: Cli, maildir_workspace: MaildirWorkspace) -> None:
    assert cli("workspace", "add", "--context", maildir_workspace.context_file).returncode == 0
    result, stderr = _run_json(cli, "--quiet")
    assert stderr == ""
    assert result["reconciliation"]["clean"] is True


def test_run_without_json_prints_a_clean_reconciliation_line(
    cli: Cli, maildir_workspace: MaildirWorkspace
) -> None:
    assert cli("workspace", "add", "--context", maildir_workspace.context_file).returncode == 0
    done = cli("run", "--workspace", WORKSPACE_ID, "--once", "--quiet")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert len(lines) == 1
    assert "scanned 3 = terminal" in lines[0]
    assert lines[0].endswith("(clean)")


def test_run_for_an_unregistered_workspace_fails_and_points_to_add(cli: Cli) -> None:
    done = cli("run", "--workspace", "ws-nobody-0009", "--once")
    assert done.returncode != 0
    assert done.stdout == ""
    assert "ws-nobody-0009" in done.stderr
    assert "outloop workspace add" in done.stderr
    assert "Traceback" not in done.stderr


# -- bench ---------------------------------------------------------------------------------


def _bench(cli: Cli, root: Path) -> dict[str, Any]:
    done = cli(
        "bench",
        "claims",
        "--workers",
        "2",
        "--items",
        "200",
        "--json",
        "--data-dir",
        root,
        timeout=BENCH_TIMEOUT,
    )
    assert done.returncode == 0, done.stderr
    last = done.stdout.splitlines()[-1]
    result = json.loads(last)
    assert isinstance(result, dict)
    return result


def test_bench_claims_json_reports_no_duplicates_and_no_losses(cli: Cli, tmp_path: Path) -> None:
    result = _bench(cli, tmp_path / "bench")
    assert set(result) >= BENCH_KEYS
    assert result["bench"] == "claims"
    assert result["duplicates"] == 0
    assert result["lost"] == 0


def test_bench_claims_measures_metrics_on_against_off_in_the_same_run(
    cli: Cli, tmp_path: Path
) -> None:
    done = cli("bench", "claims", "--workers", "2", "--items", "100", "--metrics-rounds", "1",
               "--json", "--data-dir", tmp_path / "bench", timeout=BENCH_TIMEOUT)  # fmt: skip
    assert done.returncode == 0, done.stderr
    figures = json.loads(done.stdout.splitlines()[-1])["metrics"]
    assert figures["rounds"] == 1 and figures["off_per_s"] > 0 and figures["on_per_s"] > 0
    assert figures["ratio"] == pytest.approx(figures["on_per_s"] / figures["off_per_s"], abs=0.002)
    # With metrics on every claim attempt of both workers made its record; off, none was made.
    assert (figures["records_on"], figures["records_off"]) == (200, 0)


def test_bench_claims_can_run_twice_in_the_same_data_dir(cli: Cli, tmp_path: Path) -> None:
    root = tmp_path / "bench"
    for _ in range(2):
        result = _bench(cli, root)
        assert (result["duplicates"], result["lost"]) == (0, 0)


def test_bench_claims_on_postgres_reports_its_baseline_and_no_duplicates(
    cli: Cli, tmp_path: Path
) -> None:
    done = cli(
        "bench", "claims", "--backend", "postgres", "--database-url", pg_cluster().url,
        "--workers", "2", "--items", "200", "--json", "--data-dir", tmp_path / "bench",
        timeout=BENCH_TIMEOUT,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.splitlines()[-1])
    assert set(result) >= BENCH_KEYS
    assert (result["bench"], result["backend"]) == ("claims", "postgres")
    assert result["baseline_per_s"] > 0 and result["claims"] == 200
    assert (result["duplicates"], result["lost"]) == (0, 0)


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_bench_reconcile_counts_every_item_into_one_class(
    cli: Cli, tmp_path: Path, backend: str
) -> None:
    url = ["--database-url", pg_cluster().url] if backend == "postgres" else []
    done = cli(
        "bench", "reconcile", "--backend", backend, *url, "--items", "3000", "--json",
        "--data-dir", tmp_path / "bench", timeout=BENCH_TIMEOUT,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.splitlines()[-1])
    assert {"bench", "rate_per_s", "baseline_per_s", "ratio", "lost"} <= set(result)
    assert result["bench"] == "reconcile" and result["lost"] == 0
    figures = result["backends"][backend]
    assert figures["scanned"] == 3000
    assert figures["reconciliation_failed"] == figures["undecided_before"] == 30


def test_workspace_show_writes_out_bidi_controls_and_shows_the_tasks_flags(
    cli: Cli, maildir_workspace: MaildirWorkspace, tmp_path: Path
) -> None:
    box = mailbox.Maildir(str(tmp_path / "mail" / "Maildir"), create=False)
    msg = _message("Invoice \u202egpj.exe", "<spoof-1@contoso.test>")
    msg.replace_header("From", '"Dana \u202eiveL" <dana.levi@contoso.test>')
    box.add(msg.as_bytes(policy=SMTPUTF8))
    assert cli("workspace", "add", "--context", maildir_workspace.context_file).returncode == 0
    _run_json(cli, "--quiet")
    done = cli("workspace", "show", "--workspace", WORKSPACE_ID)
    assert done.returncode == 0, done.stderr
    assert "\u202e" not in done.stdout
    [line] = [ln for ln in done.stdout.splitlines() if "gpj.exe" in ln]
    assert "⚠ Invoice [U+202E]gpj.exe" in line and "from ⚠ Dana [U+202E]iveL" in line
    assert "⚠ sender display name: bidi control characters [U+202E]" in done.stdout


def test_bench_mcp_reports_gate_check_and_get_task_against_the_no_op_tool_on_both_transports(
    cli: Cli,
) -> None:
    done = cli("bench", "mcp", "--calls", "20", "--json", timeout=BENCH_TIMEOUT)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.splitlines()[-1])
    assert {"bench", "rate_per_s", "baseline_per_s", "ratio", "p50_ms", "p99_ms"} <= set(result)
    assert result["bench"] == "mcp"
    for transport in ("in_process", "stdio"):
        figures = result[transport]
        assert set(figures) == {"noop", "get_task", "gate_check"}
        for tool in ("get_task", "gate_check"):
            assert figures[tool]["p50_ms"] <= figures[tool]["p99_ms"]
            assert figures[tool]["ratio_p50_to_noop"] > 0
    assert result["within_target"] == (result["worst_p50_ratio"] <= result["target_p50_ratio"])


def _unsettled_send(cli: Cli, context_file: Path) -> str:
    """A registered workspace whose one send lost its outcome on a channel that keeps no
    sent copy: handed to a person. Its key."""
    assert cli("workspace", "add", "--context", context_file).returncode == 0
    store = SqliteStore(DataDir(cli.data_dir).database)
    try:
        now = datetime(2026, 11, 30, 9, tzinfo=UTC)
        marker = Marker(kind=MarkerKind.MESSAGE_ID, value="<s-1@fabrikam.test>")
        intent = SendIntent(
            key="reply|draft-1|client", workspace_id=WORKSPACE_ID, kind="client_reply",
            task_id=None, internet_message_id="<s-1@fabrikam.test>",
            recipients=("dana.levi@contoso.test",), automated=False, holder="host/1/1/w",
            marker=marker,
        )  # fmt: skip
        store.begin_send(intent, now)
        attempt = SendAttempt(
            channel="browser", marker=marker, keeps_sent_copy=False, sent_copy_latency=timedelta(0)
        )
        assert store.attempt_send(intent.key, intent.holder, attempt, now) is not None
        store.mark_uncertain(intent.key, intent.holder, "OutcomeUnknown: the page closed", now)
        store.hand_to_person(intent.key, "the browser keeps no sent copy to check", now)
    finally:
        store.close()
    return intent.key


def test_sends_show_and_settle_a_send_no_channel_could_settle_with_an_audit_trail(
    cli: Cli, maildir_workspace: MaildirWorkspace
) -> None:
    key = _unsettled_send(cli, maildir_workspace.context_file)
    listed = cli("sends", "list", "--workspace", WORKSPACE_ID, "--unsettled", "--json")
    assert listed.returncode == 0, listed.stderr
    [row] = [json.loads(line) for line in listed.stdout.splitlines()]
    assert (row["key"], row["state"], row["channel"]) == (key, "with_person", "browser")
    undecided = cli("sends", "settle", key, "--evidence", "looked")
    assert undecided.returncode == 2 and "--sent or --not-sent" in undecided.stderr
    settled = cli(
        "sends", "settle", key, "--not-sent", "--by", "noa",
        "--evidence", "not in the recipient's inbox (checked with Dana by phone)",
    )  # fmt: skip
    assert settled.returncode == 0, settled.stderr
    assert "one more attempt may go" in settled.stdout
    shown = json.loads(cli("sends", "show", key, "--json").stdout)
    assert shown["state"] == "intent" and shown["resend_allowed"] is True
    assert [(e["state"], e["actor"]) for e in shown["events"]][-2:] == [
        ("with_person", "host/1/1/w"), ("intent", "noa"),
    ]  # fmt: skip
    assert "checked with Dana by phone" in shown["events"][-1]["detail"]
    again = cli("sends", "settle", key, "--sent", "--evidence", "twice")
    assert again.returncode == 1 and "only a send whose outcome is unknown" in again.stderr
    missing = cli("sends", "show", "reply|nothing|client")
    assert missing.returncode == 1 and "no send" in missing.stderr
