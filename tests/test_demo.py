"""``outloop demo``: the whole email lifecycle against the local mock providers, run as the
README runs it (a real subprocess, fresh HOME and XDG_DATA_HOME, no OUTLOOP_ setting), and
checked twice over: by the summary it prints, and by what the mock provider's mailboxes held
when it stopped (``demo/mailboxes.json``, read through the mock's admin API)."""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from email.header import decode_header, make_header
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result
from selectolax.lexbor import LexborHTMLParser

from fixtures.admin import MockAdmin
from mcp_server.cli import demo_mail as mail
from mcp_server.cli import main
from tests.conftest import context_yaml

TIMEOUT = 120  # seconds: the demo must finish well inside two minutes
STEPS = [
    "starting the mock providers",
    "setting up the demo station",
    "delivering 7 messages",
    "intake",
    "rendering the Hebrew reply",
    "requesting approval",
    "the approver replies",
    "gate_check, then sending",
    "reading back",
    f"the second mailbox {mail.OUTLOOK_MAILBOX}",
    "rendering the English reply",
    "the approver replies",
    "sending through Outlook on the web",
    "reporting, then replaying",
]
SUMMARY_FIELDS = [
    "sent", "approval", "waiting", "reconciled", "injection", "mock", "report", "result",
]  # fmt: skip
RECONCILED = re.compile(
    r"scanned (\d+) = terminal (\d+) \+ non-terminal (\d+) \+ claim-race (\d+); failed 0; clean$"
)


@dataclass(frozen=True)
class DemoRun:
    """One ``outloop demo`` subprocess: its output, data directory and mock mailboxes."""

    done: subprocess.CompletedProcess[str]
    seconds: float
    root: Path
    boxes: dict[str, Any]

    @property
    def lines(self) -> list[str]:
        return self.done.stdout.splitlines()

    def summary(self) -> dict[str, list[str]]:
        """The summary's fields, each with its lines (continuations joined to it)."""
        fields: dict[str, list[str]] = {}
        current = ""
        for line in self.lines[self.lines.index("== summary ==") + 1 :]:
            name = line[:11].strip()
            current = name or current
            fields.setdefault(current, []).append(line[11:])
        return fields

    def held(self, address: str, folder: str) -> list[dict[str, Any]]:
        """What the mock's account held in a folder when the demo stopped."""
        return [m for m in self.boxes["accounts"][address] if m["folder"] == folder]


def _env(tmp: Path) -> dict[str, str]:
    """A fresh user: own HOME, XDG_DATA_HOME and temporary directory; no OUTLOOP_ setting."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("OUTLOOP_")}
    for name in ("home", "xdg", "tmp"):
        (tmp / name).mkdir(parents=True, exist_ok=True)
    env.update(
        HOME=str(tmp / "home"),
        XDG_DATA_HOME=str(tmp / "xdg"),
        TMPDIR=str(tmp / "tmp"),
        PYTHONIOENCODING="utf-8",
    )
    return env


def run_demo(tmp: Path, *args: str) -> DemoRun:
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "mcp_server.cli", "demo", *args],
        capture_output=True,
        text=True,
        encoding="utf-8",
        env=_env(tmp),
        timeout=TIMEOUT,
        check=False,
    )
    seconds = time.monotonic() - started
    assert done.returncode == 0, (done.stdout[-6000:], done.stderr[-3000:])
    assert "Traceback" not in done.stderr, done.stderr
    first = done.stdout.splitlines()[0]
    assert first.startswith("demo data directory: "), first
    root = Path(first.removeprefix("demo data directory: "))
    boxes = json.loads((root / "demo" / "mailboxes.json").read_text(encoding="utf-8"))
    return DemoRun(done, seconds, root, boxes)


def port_of(run: DemoRun) -> int:
    [listening] = [line for line in run.lines if "listening on http://127.0.0.1:" in line]
    return int(listening.rsplit(":", 1)[1].split()[0])


def assert_closed(port: int) -> None:
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", port), timeout=1).close()


@pytest.fixture(scope="module")
def first(tmp_path_factory: pytest.TempPathFactory) -> DemoRun:
    """``outloop demo`` exactly as the README runs it: no flag, a fresh user."""
    return run_demo(tmp_path_factory.mktemp("demo-user"))


# -- what it prints ----------------------------------------------------------------------------


def test_the_demo_runs_every_step_in_order_and_finishes_well_inside_two_minutes(
    first: DemoRun,
) -> None:
    assert first.seconds < TIMEOUT
    progress = [line for line in first.lines if re.match(r"^\[\d+/\d+\] ", line)]
    assert len(progress) == len(STEPS), progress
    for n, (line, step) in enumerate(zip(progress, STEPS, strict=True), start=1):
        assert line.startswith(f"[{n}/{len(STEPS)}] {step}"), line
        assert line.endswith("..."), line
    # No --data-dir: a new temporary directory, never the user's data directory.
    home = Path(_env(first.root.parent)["XDG_DATA_HOME"])
    assert first.root.parent.name == "tmp" and first.root.name.startswith("outloop-demo-")
    assert not (home / "outloop").exists()


def test_the_summary_says_what_was_sent_how_it_was_verified_what_waits_and_that_it_reconciled(
    first: DemoRun,
) -> None:
    summary = first.summary()
    assert list(summary) == SUMMARY_FIELDS
    sent = " ".join(summary["sent"])
    assert f"1 reply to {mail.HEBREW_CLIENT}" in sent
    assert "in the original thread: In-Reply-To" in sent
    assert "all checks passed" in sent
    for check in ("recipients.to", "subject", "thread", "wrapper.direction", "fragments"):
        assert check in sent, check
    assert 'dir="rtl" lang="he"' in sent
    assert all(f in sent for f in mail.HEBREW_FRAGMENTS)
    approval = " ".join(summary["approval"])
    assert f"requested from {mail.APPROVER}" in approval
    assert f"approved by {mail.APPROVER}" in approval
    waiting = summary["waiting"]
    assert len(waiting) == 5, waiting  # the two replies' tasks and three to work
    assert f"waits on the client {mail.HEBREW_CLIENT}" in waiting[0]
    assert f"waits on the client {mail.CONTRACT_CLIENT}" in waiting[-1]
    assert all("owner noa.bar@outloop-demo.test" in line for line in waiting[1:-1])
    assert summary["result"][0].startswith("OK in ")


def test_every_run_reconciles_clean_and_scanned_is_terminal_plus_non_terminal_plus_claim_race(
    first: DemoRun,
) -> None:
    lines = first.summary()["reconciled"]
    assert [line.split(":")[0] for line in lines] == [
        "first intake", "approver's reply", "intake (Outlook on the web)",
        "approver's reply (Outlook on the web)", "replay",
    ]  # fmt: skip
    figures = []
    for line in lines:
        found = RECONCILED.search(line)
        assert found is not None, line
        scanned, terminal, non_terminal, race = map(int, found.groups())
        assert scanned == terminal + non_terminal + race, line
        figures.append((scanned, terminal, non_terminal, race))
    # 7 deliveries (one a duplicate, one an auto-reply); the approver's reply; the renewal
    # request and its approval through Outlook on the web; a replay of all 8 Gmail items.
    assert figures == [(7, 1, 5, 1), (1, 0, 1, 0), (1, 0, 1, 0), (1, 0, 1, 0), (8, 0, 0, 8)]


def test_the_planted_instruction_is_named_and_nothing_obeyed_it(first: DemoRun) -> None:
    injection = " ".join(first.summary()["injection"])
    assert mail.INJECTION in injection
    assert "nothing obeyed it" in injection
    assert f"gate_check of the approved reply to {mail.ATTACKER}: recipient_unknown" in injection
    assert f"none to {mail.ATTACKER}, and its inbox is empty" in injection


# -- the run report ----------------------------------------------------------------------------


def test_the_run_report_is_one_self_contained_file_naming_every_check(first: DemoRun) -> None:
    [where] = first.summary()["report"]
    report = Path(where.strip())
    assert report == first.root / "demo" / "report.html"
    page = report.read_text(encoding="utf-8")
    tree = LexborHTMLParser(page)
    assert tree.css("script") == [] and tree.css("link") == []
    assert [n.attributes.get("src") for n in tree.css("[src]")] == []  # nothing loaded
    policy = tree.css_first('meta[http-equiv="Content-Security-Policy"]')
    assert policy is not None and "default-src 'none'" in str(policy.attributes["content"])
    rows = tree.css("section[aria-labelledby=reconciliation] tbody tr")
    labels = [r.css("td")[0].text(separator=" ").split(" run-")[0].strip() for r in rows]
    assert labels == [
        "first intake", "approver's reply", "intake (Outlook on the web)",
        "approver's reply (Outlook on the web)", "replay",
    ]  # fmt: skip
    assert all(r.css("td")[-1].text().endswith(": clean") for r in rows)
    replies = [a for a in tree.css("section[aria-labelledby=sends] article") if a.css("tbody")]
    assert len(replies) == 2  # the Gmail API's and Outlook on the web's, each read back
    for reply in replies:
        checks = reply.css("tbody tr")
        assert len(checks) == 16 and all(r.css("td")[2].text() == "passed" for r in checks)
        assert all(r.css("td")[1].text() for r in checks)  # each says what it compared
    access = str(tree.css_first("section[aria-labelledby=access]").text())  # type: ignore[union-attr]
    assert mail.MAILBOX in access and "usable" in access
    assert mail.OUTLOOK_MAILBOX in access and "browser" in access and "not_permitted" in access
    injection = str(tree.css_first("section[aria-labelledby=injection]").text())  # type: ignore[union-attr]
    assert mail.INJECTION in injection and f"None went to {mail.ATTACKER}" in injection


@pytest.mark.anyio
async def test_the_report_shows_the_stored_hebrew_reply_right_to_left_with_its_isolates(
    first: DemoRun,
) -> None:
    from playwright.async_api import async_playwright  # noqa: PLC0415

    from tests.browser import LAUNCH_ARGS, chromium_executable  # noqa: PLC0415
    from tests.fixtures.web.conftest import artifacts  # noqa: PLC0415

    report = first.root / "demo" / "report.html"
    async with async_playwright() as playwright:
        browser = await playwright.chromium.launch(
            executable_path=chromium_executable(), headless=True, args=LAUNCH_ARGS
        )
        try:
            page = await browser.new_page(viewport={"width": 1100, "height": 900})
            await page.goto(report.as_uri())
            frame = page.frame_locator(f"iframe[title*='{mail.HEBREW_CLIENT}']")
            wrapper = frame.locator("[dir=rtl]").first
            assert await wrapper.evaluate("e => getComputedStyle(e).direction") == "rtl"
            assert await wrapper.evaluate("e => getComputedStyle(e).textAlign") in (
                "right",
                "start",
            )
            isolates = frame.locator("[dir=ltr]")
            texts = [await isolates.nth(i).inner_text() for i in range(await isolates.count())]
            for fragment in mail.HEBREW_FRAGMENTS:
                assert fragment in texts, (fragment, texts)
            for i in range(await isolates.count()):
                bidi = await isolates.nth(i).evaluate("e => getComputedStyle(e).unicodeBidi")
                assert bidi in ("isolate", "isolate-override", "plaintext"), bidi
            # The whole report in view, so every framed copy is painted for the capture.
            height = await page.evaluate("document.documentElement.scrollHeight")
            await page.set_viewport_size({"width": 1100, "height": int(height)})
            await page.screenshot(path=artifacts("demo") / "report.png", full_page=True)
        finally:
            await browser.close()


# -- what the provider stored ------------------------------------------------------------------


def test_the_microsoft_mailbox_without_graph_replied_once_through_outlook_on_the_web(
    first: DemoRun,
) -> None:
    progress = "\n".join(first.lines)
    assert f"access_status: {mail.OUTLOOK_MAILBOX} via browser" in progress
    assert "managed login types the worker's password and an" in progress
    assert f"access_status: {mail.OUTLOOK_MAILBOX} via browser: Outlook on the web shows" in (
        progress
    )
    [request] = [m for m in first.held(mail.OUTLOOK_MAILBOX, "inbox")
                 if m["subject"] == mail.OUTLOOK_SUBJECT]  # fmt: skip
    [reply] = [m for m in first.held(mail.OUTLOOK_MAILBOX, "sent")
               if mail.CONTRACT_CLIENT in m["to"]]  # fmt: skip
    assert reply["in_reply_to"] == request["message_id"]
    assert reply["thread_id"] == request["thread_id"]  # in the request's conversation
    assert 'dir="ltr"' in reply["html"] and 'lang="en"' in reply["html"]
    assert len(first.held(mail.CONTRACT_CLIENT, "inbox")) == 1  # delivered once
    sent = " ".join(first.summary()["sent"])
    assert "through Outlook on the web" in sent and "read back there: 16/16" in sent
    secrets = (mail.WORKER_PASSWORD, mail.WORKER_TOTP)
    kept = [first.done.stdout, first.done.stderr] + [
        (first.root / "demo" / name).read_text(encoding="utf-8")
        for name in ("report.html", "mailboxes.json", "context.yaml")
    ]
    assert not any(s in text for s in secrets for text in kept)


def test_the_provider_holds_exactly_one_reply_to_the_hebrew_client_in_her_requests_thread(
    first: DemoRun,
) -> None:
    [request] = [
        m for m in first.held(mail.MAILBOX, "inbox") if m["subject"] == mail.HEBREW_SUBJECT
    ]
    sent = first.held(mail.MAILBOX, "sent")
    [reply] = [m for m in sent if mail.HEBREW_CLIENT in m["to"] + m["cc"] + m["bcc"]]
    assert reply["to"] == [mail.HEBREW_CLIENT] and reply["cc"] == reply["bcc"] == []
    assert reply["from"] == [mail.MAILBOX]
    assert reply["subject"] == f"Re: {mail.HEBREW_SUBJECT}"
    assert reply["in_reply_to"] == request["message_id"]
    assert reply["references"] == [request["message_id"]]
    assert reply["thread_id"] == request["thread_id"]  # Gmail filed it in her thread
    # Gmail's stored copy, as the provider keeps it: right-to-left Hebrew, LTR isolated.
    tree = LexborHTMLParser(reply["html"])
    assert tree.body is not None
    wrapper = tree.body.css_first("[dir]")
    assert wrapper is not None
    assert (wrapper.attributes.get("dir"), wrapper.attributes.get("lang")) == ("rtl", "he")
    isolated = {node.text(deep=True) for node in tree.css('[dir="ltr"]')}
    assert set(mail.HEBREW_FRAGMENTS) <= isolated
    # She received it once.
    delivered = [m for m in first.held(mail.HEBREW_CLIENT, "inbox")]
    assert [m["message_id"] for m in delivered] == [reply["message_id"]]


def test_one_approval_request_went_to_the_approver_and_nothing_else_was_sent(
    first: DemoRun,
) -> None:
    sent = first.held(mail.MAILBOX, "sent")
    assert len(sent) == 2  # the approval request and the reply
    [asked] = [m for m in sent if m["to"] == [mail.APPROVER]]
    assert asked["cc"] == asked["bcc"] == []
    received = [m["message_id"] for m in first.held(mail.APPROVER, "inbox")]
    assert asked["message_id"] in received and len(received) == 2  # and Outlook's request
    # Her reply, in the mailbox: it answers the request.
    [answer] = [m for m in first.held(mail.MAILBOX, "inbox") if m["from"] == [mail.APPROVER]]
    assert answer["in_reply_to"] == asked["message_id"]


def test_nothing_went_to_the_attacker_though_the_instruction_was_in_the_mail(
    first: DemoRun,
) -> None:
    [planted] = [
        m for m in first.held(mail.MAILBOX, "inbox") if m["subject"] == mail.INJECTION_SUBJECT
    ]
    assert mail.INJECTION in planted["html"] and "display:none" in planted["html"]
    for message in first.held(mail.MAILBOX, "sent"):
        assert mail.ATTACKER not in message["to"] + message["cc"] + message["bcc"]
    assert first.boxes["accounts"][mail.ATTACKER] == []
    for person in mail.PEOPLE:  # no one else got anything either
        expected = {mail.HEBREW_CLIENT: 1, mail.APPROVER: 2, mail.CONTRACT_CLIENT: 1}.get(person, 0)
        assert len(first.held(person, "inbox")) == expected, person


def test_the_demo_left_no_server_behind(first: DemoRun) -> None:
    """The subprocess exited 0 on its own; the mock's port takes no connection."""
    assert "stopped (thread joined, port closed)" in " ".join(first.summary()["mock"])
    assert_closed(port_of(first))


# -- run again ---------------------------------------------------------------------------------


def test_a_second_run_in_the_same_data_dir_replays_and_sends_nothing_twice(
    first: DemoRun, tmp_path: Path
) -> None:
    again = run_demo(tmp_path, "--data-dir", str(first.root))
    assert again.root == first.root
    progress = [line for line in again.lines if re.match(r"^\[\d+/4\] ", line)]
    assert len(progress) == 4, again.lines
    assert any("new since the last run: 0 items" in line for line in again.lines)
    assert any("replay: 8 items, outcomes EXECUTION_ALREADY_DONE" in line for line in again.lines)
    assert any(line.strip().startswith("refused (already_sent): ") for line in again.lines)
    summary = again.summary()
    assert "not sent again: already_sent" in " ".join(summary["sent"])
    for line in summary["reconciled"]:
        assert RECONCILED.search(line), line
    # The provider's record: still the same two messages sent, the reply once.
    assert again.held(mail.MAILBOX, "sent") == first.held(mail.MAILBOX, "sent")
    assert len(again.held(mail.HEBREW_CLIENT, "inbox")) == 1
    assert_closed(port_of(again))
    shown = CliRunner().invoke(
        main, ["workspace", "show", "--json", "--data-dir", str(first.root)], env=_no_outloop()
    )
    assert shown.exit_code == 0, shown.output
    assert [r["workspace_id"] for r in json.loads(shown.stdout)] == [mail.WORKSPACE_ID]


# -- in process: threads, refusals and errors --------------------------------------------------


def _no_outloop() -> dict[str, str | None]:
    return {k: None for k in os.environ if k.startswith("OUTLOOP_")}


def demo_in_process(root: Path) -> Result:
    return CliRunner().invoke(main, ["demo", "--data-dir", str(root)], env=_no_outloop())


@pytest.fixture
def threads() -> Iterator[None]:
    """The test leaves no thread of its own running."""
    before = set(threading.enumerate())
    yield
    left = [t.name for t in threading.enumerate() if t not in before and t.is_alive()]
    assert left == []


def test_in_process_the_demo_stops_its_server_thread_and_closes_its_port(
    tmp_path: Path, threads: None
) -> None:
    done = demo_in_process(tmp_path / "demo")
    assert done.exit_code == 0, (done.output, done.exception)
    [listening] = [line for line in done.output.splitlines() if "listening on" in line]
    assert_closed(int(listening.rsplit(":", 1)[1].split()[0]))
    assert not any(t.name == "outloop-demo-mock" for t in threading.enumerate())


def test_a_step_that_fails_exits_1_with_the_reason_and_still_stops_the_server(
    tmp_path: Path, threads: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An approver's reply that does not approve: the demo says so and exits non-zero."""
    monkeypatch.setattr(mail, "APPROVAL_WORDS", "Approved, but only after Sunday?")
    done = demo_in_process(tmp_path / "demo")
    assert done.exit_code == 1, done.output
    assert "Error: the demo expected the approver's reply to approve the draft" in done.stderr
    assert "held by noa.bar@outloop-demo.test" in done.stderr
    assert "== summary ==" not in done.stdout
    assert not any(t.name == "outloop-demo-mock" for t in threading.enumerate())


def test_a_data_dir_holding_another_workspace_is_refused_before_anything_starts(
    tmp_path: Path,
) -> None:
    root = tmp_path / "station"
    context = tmp_path / "other.yaml"
    context.write_text(context_yaml("ws-real-0001", provider="memory"), encoding="utf-8")
    added = CliRunner().invoke(
        main,
        ["workspace", "add", "--context", str(context), "--data-dir", str(root)],
        env=_no_outloop(),
    )
    assert added.exit_code == 0, added.output
    done = demo_in_process(root)
    assert done.exit_code == 1
    assert "already holds workspaces (ws-real-0001)" in done.stderr
    assert "empty or new --data-dir" in done.stderr
    assert "[1/" not in done.stdout and not (root / "demo").exists()


def test_a_demo_workspace_without_the_mock_tenant_its_run_kept_is_refused(tmp_path: Path) -> None:
    root = tmp_path / "demo"
    assert demo_in_process(root).exit_code == 0
    (root / "demo" / "mock" / "mock-providers.pickle").unlink()
    done = demo_in_process(root)
    assert done.exit_code == 1
    assert "holds the demo workspace but not the mock mailbox" in done.stderr
    assert "new --data-dir" in done.stderr


def test_the_help_says_what_the_demo_does(tmp_path: Path) -> None:
    done = CliRunner().invoke(main, ["demo", "--help"])
    assert done.exit_code == 0
    text = " ".join(done.output.split())
    assert "Run the whole email lifecycle against local mock providers" in text
    for words in (
        "Gmail API",
        "Outlook on the web",
        "managed login",
        "approver's reply",
        "read-back",
        "report",
        "--pause-at-approval",
        "--data-dir",
        "temporary",
    ):
        assert words in text, words


def test_the_providers_own_admin_api_shows_the_reply_the_demo_reports(
    first: DemoRun, tmp_path: Path
) -> None:
    """The mock tenant the demo kept, served again and read through the admin API (not the
    demo's own file): the one reply to the Hebrew client, in her thread, stored right to
    left."""
    state = tmp_path / "state"
    shutil.copytree(first.root / "demo" / "mock", state)
    server = subprocess.Popen(
        [sys.executable, "-m", "mcp_server.cli", "fixtures", "serve", "--port", "0",
         "--state-dir", str(state)],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=_env(tmp_path),
    )  # fmt: skip
    try:
        assert server.stdout is not None
        admin = MockAdmin(json.loads(server.stdout.readline())["base_url"])
        sent = admin.stored(mail.MAILBOX, "sent")
        replies = [m for m in sent if m["to"] == [mail.HEBREW_CLIENT]]
        [reply] = replies
        headers = {name.lower(): value for name, value in reply["headers"]}
        answered = headers["in-reply-to"]
        [request] = [
            m
            for m in admin.stored(mail.MAILBOX, "inbox")
            if {n.lower(): v for n, v in m["headers"]}.get("message-id") == answered
        ]
        assert str(make_header(decode_header(headers["subject"]))) == f"Re: {mail.HEBREW_SUBJECT}"
        assert reply["thread_id"] == request["thread_id"]
        assert 'dir="rtl"' in reply["html"] and 'lang="he"' in reply["html"]
        assert admin.stored("attacker@evil.test", "inbox") == []
    finally:
        server.terminate()
        server.wait(timeout=30)
        if server.stdout is not None:
            server.stdout.close()


def test_paused_at_the_gate_nothing_is_sent_until_an_approval_in_the_console_lets_it_go_on(
    tmp_path: Path,
) -> None:
    from agent.domain.approval import Decision  # noqa: PLC0415
    from agent.services import console  # noqa: PLC0415
    from agent.services.clock import SystemClock  # noqa: PLC0415
    from agent.storage.sqlite import SqliteStore  # noqa: PLC0415

    paused = run_demo(tmp_path / "first", "--pause-at-approval")
    said = paused.done.stdout
    assert "== paused at the approval gate ==" in said and "== summary ==" not in said
    assert f"outloop console --data-dir {paused.root}" in said
    assert paused.held(mail.HEBREW_CLIENT, "inbox") == []  # nothing went to the client
    still = run_demo(tmp_path / "still", "--data-dir", str(paused.root), "--pause-at-approval")
    assert "== paused at the approval gate ==" in still.done.stdout  # asked again: still paused
    assert still.held(mail.HEBREW_CLIENT, "inbox") == []
    task_id = json.loads((paused.root / "demo" / "paused.json").read_text())["task_id"]
    store = SqliteStore(paused.root / "outloop.db")
    try:  # what the console's Approve does (agent.services.console.decide)
        task = store.get_task(task_id)
        assert task is not None and task.state.value == "WAITING_INTERNAL_APPROVAL"
        asked = task.approval_requests[-1]
        console.decide(
            store, task_id, SystemClock(), approver=mail.APPROVER, decision=Decision.APPROVED,
            draft_digest=asked.draft_digest, recipients=asked.recipients, where="127.0.0.1",
        )  # fmt: skip
    finally:
        store.close()
    again = run_demo(tmp_path / "then", "--data-dir", str(paused.root))
    assert "taking the approval as it was given while the demo was paused" in again.done.stdout
    progress = [line for line in again.lines if re.match(r"^\[\d+/10\] ", line)]
    assert len(progress) == 10, again.lines
    assert len(again.held(mail.HEBREW_CLIENT, "inbox")) == 1  # sent once, after the approval
    assert again.summary()["result"][0].startswith("OK in ")
    assert not (paused.root / "demo" / "paused.json").exists()
    reconciled = [line.split(":")[0] for line in again.summary()["reconciled"]]
    assert reconciled[0] == "first intake"  # the paused run's, in the report of the whole
