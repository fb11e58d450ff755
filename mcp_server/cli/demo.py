"""``outloop demo``: the lifecycle end to end on local files.

It seeds a Maildir (Hebrew and English requests, a follow-up in a thread, an auto-reply and
the same message delivered twice), registers a demo workspace, runs one intake cycle, and
shows claims, tasks, dispositions and the reconciliation; then it replays the mailbox to
show that nothing is claimed or created twice. Without --data-dir (or OUTLOOP_DATA_DIR) it
works in a fresh temporary directory.
"""

from __future__ import annotations

import mailbox
import tempfile
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from email.message import EmailMessage
from email.policy import SMTP
from email.utils import format_datetime, make_msgid
from pathlib import Path

import anyio
import click

from agent.domain.context import MailboxBinding
from agent.domain.errors import OutloopError, RegistryError
from agent.providers.maildir import MaildirProvider
from agent.services import intake, workspaces
from mcp_server.cli.shared import data_dir_option, fail, read_settings, run_cycle
from mcp_server.composition import Settings, open_station

WORKSPACE_ID = "ws-demo-0001"
MAILBOX = "support@outloop-demo.test"

CONTEXT = f"""\
workspace_id: {WORKSPACE_ID}
label: Demo support desk
timezone: Asia/Jerusalem
language: he
calendar: {{weekend: [fri, sat], holidays: []}}
mailboxes:
  - {{mailbox_id: {MAILBOX}, provider: maildir, path: Maildir}}
contacts:
  - {{address: dana.levi@client-a.test, name: Dana Levi, side: client, verified_by: crm-record}}
  - {{address: sam.jones@client-b.test, name: Sam Jones, side: client, verified_by: contract}}
  - {{address: noa.bar@outloop-demo.test, name: Noa Bar, side: internal,
     roles: [approver, client_manager], verified_by: directory}}
approval: {{roles: [approver], standing: []}}
default_cc: []
escalation_contact: noa.bar@outloop-demo.test
unresolved_queue: unresolved
receipt_ack: false
reminder_business_days: 2
communication: {{greeting: "שלום", signature: "צוות התמיכה", tone: warm}}
grants: {{licence: active, mailboxes: [{MAILBOX}]}}
client_send_policy: draft_for_internal_approval
classification: {{task_owner_evidence: false}}
kpis: {{official: {{first_response_hours: 8}}}}
task_board: {{provider: embedded, project_id: demo-support, intake_location_id: inbox}}
attachments: {{accepted: [pdf, docx, xlsx, csv, png, jpg]}}
"""

STATION = "unresolved_queue: station-unresolved\nescalation_contact: noa.bar@outloop-demo.test\n"


def _message(
    sender: str,
    subject: str,
    body: str,
    sent: datetime,
    *,
    msgid: str | None = None,
    in_reply_to: str | None = None,
    headers: dict[str, str] | None = None,
) -> EmailMessage:
    msg = EmailMessage(policy=SMTP)
    msg["From"] = sender
    msg["To"] = MAILBOX
    msg["Subject"] = subject
    msg["Date"] = format_datetime(sent)
    msg["Message-ID"] = msgid or make_msgid(domain="mail.example.test")
    threading = {"In-Reply-To": in_reply_to, "References": in_reply_to} if in_reply_to else {}
    for name, value in {**threading, **(headers or {})}.items():
        msg[name] = value
    msg.set_content(body)
    return msg


def seed_maildir(path: Path, now: datetime) -> int:
    """Write the demo mail into a Maildir at ``path``; returns the number of files."""
    box = mailbox.Maildir(str(path), create=True)
    t0 = now - timedelta(hours=3)
    hebrew_id = make_msgid(domain="client-a.test")
    english_id = make_msgid(domain="client-b.test")
    messages = [
        _message(
            "Dana Levi <dana.levi@client-a.test>",
            "בקשה לעדכון חשבונית 2026-118",
            "שלום, אפשר לעדכן את החשבונית INV-2026-118 לסך ₪1,250? תודה, דנה",
            t0,
            msgid=hebrew_id,
        ),
        _message(
            "Sam Jones <sam.jones@client-b.test>",
            "Access for the new analyst",
            "Hi, please give our new analyst access to the Q4 dashboard.",
            t0 + timedelta(minutes=20),
            msgid=english_id,
        ),
        _message(
            "Sam Jones <sam.jones@client-b.test>",
            "RE: Access for the new analyst",
            "Following up: her address is ana@client-b.test.",
            t0 + timedelta(minutes=50),
            in_reply_to=english_id,
        ),
        _message(
            "Dana Levi <dana.levi@client-a.test>",
            "Automatic reply: out of office",
            "I am out of the office until Thursday.",
            t0 + timedelta(minutes=55),
            headers={"Auto-Submitted": "auto-replied"},
        ),
    ]
    duplicate = _message(
        "Lior Katz <lior.katz@client-a.test>",
        "Question about the contract",
        "Is clause 4 still in force?",
        t0 + timedelta(minutes=70),
    )
    for msg in messages:
        box.add(msg.as_bytes())
    # The same message delivered twice: two copies differing only in their delivery trace.
    for hop in ("mx1.outloop-demo.test", "mx2.outloop-demo.test"):
        copy = EmailMessage(policy=SMTP)
        copy["Received"] = f"from relay by {hop}; {format_datetime(t0 + timedelta(minutes=71))}"
        for name, value in duplicate.items():
            copy[name] = value
        copy.set_content(duplicate.get_content())
        box.add(copy.as_bytes())
    return len(messages) + 2


def _show_run(
    result: intake.RunResult, subjects: dict[str, str], echo: Callable[[str], None]
) -> None:
    echo("")
    echo(f"{'message':<34} {'claim':<24} {'disposition':<24} task")
    for item in result.items:
        claim = item.claim.value if item.claim else "-"
        task = (item.task_id or "-") + (" (new)" if item.task_created else "")
        subject = subjects.get(item.item_ref, item.item_ref)
        echo(f"{subject[:33]:<34} {claim:<24} {item.disposition.value:<24} {task}")
    _show_reconciliation(result, echo)


def _show_reconciliation(result: intake.RunResult, echo: Callable[[str], None]) -> None:
    rec = result.reconciliation
    assert rec is not None
    echo(
        f"reconciliation: scanned {rec.scanned} = terminal {rec.terminal} + non-terminal "
        f"{rec.non_terminal} + claim-race {rec.claim_race}; failed "
        f"{rec.reconciliation_failed}; {'clean' if rec.clean else 'NOT clean'}"
    )


async def _subjects(maildir: Path) -> dict[str, str]:
    """Subjects by item, for display only (the demo's own sample mail)."""
    binding = MailboxBinding(mailbox_id=MAILBOX, provider="maildir", path=str(maildir))
    provider = MaildirProvider(maildir, MAILBOX)
    subjects: dict[str, str] = {}
    cursor: str | None = None
    while True:
        page = await provider.changes(cursor)
        for item in page.items:
            if item.envelope is not None:
                subjects[intake.item_ref(binding, item.item_ref)] = item.envelope.subject
        cursor = page.cursor
        if not page.more:
            return subjects


@click.command("demo")
@data_dir_option
def demo_command(data_dir: Path | None) -> None:
    """Seed a Maildir with sample mail, run one cycle, show claims, tasks and reconciliation."""
    root = data_dir if data_dir is not None else Path(tempfile.mkdtemp(prefix="outloop-demo-"))
    click.echo(f"demo data directory: {root}")
    try:
        run(read_settings(root), click.echo)
    except OutloopError as exc:
        fail(exc)


def run(settings: Settings, echo: Callable[[str], None]) -> None:
    now = datetime.now(UTC)
    root = settings.data_dir
    station = open_station(settings)
    try:
        demo_dir = root / "demo"
        maildir = demo_dir / "Maildir"
        context_file = demo_dir / "context.yaml"
        others = [
            w.workspace_id
            for w in station.store.list_workspaces()
            if w.workspace_id != WORKSPACE_ID
        ]
        if others:
            raise RegistryError(
                f"{root} already holds workspaces ({', '.join(others)}); the demo registers its "
                "own workspace and never touches a real station: run it with an empty or new "
                "--data-dir"
            )
        if station.store.get_workspace(WORKSPACE_ID) is None:
            demo_dir.mkdir(parents=True, exist_ok=True)
            count = seed_maildir(maildir, now)
            echo(f"seeded {count} messages into {maildir}")
            context_file.write_text(CONTEXT, encoding="utf-8")
            if not station.data_dir.station_file.exists():
                station.data_dir.station_file.write_text(STATION, encoding="utf-8")
            workspaces.add_workspace(station.store, station.data_dir, context_file, now)
            echo(f"registered workspace {WORKSPACE_ID} (the registry started empty)")
        else:
            echo(f"workspace {WORKSPACE_ID} already registered here; reusing it")

        subjects = anyio.run(_subjects, maildir)

        def progress(p: intake.Progress) -> None:
            subject = subjects.get(p.outcome.item_ref, p.outcome.item_ref)
            echo(f"  [{p.done}/{p.total}] {subject[:40]} -> {p.outcome.disposition}")

        echo("\n== first cycle ==")
        result = anyio.run(run_cycle, station, WORKSPACE_ID, progress)
        _show_run(result, subjects, echo)

        echo("\n== replay of the same mailbox ==")
        replay = anyio.run(run_cycle, station, WORKSPACE_ID, None, True)
        kinds = sorted({i.disposition.value for i in replay.items})
        echo(
            f"{len(replay.items)} items, outcomes: {', '.join(kinds)} "
            "(nothing is claimed or created twice)"
        )
        _show_reconciliation(replay, echo)

        echo("\n== tasks (one per verified thread) ==")
        for task in station.store.list_tasks(WORKSPACE_ID):
            echo(f"{task.task_id}  {task.state.value:<14} {len(task.messages)} msg  {task.title}")
            echo(f"{'':30}  next: {task.next_action.description}")
            echo(f"{'':30}  owner: {task.next_action.owner}")
        queue = station.board.list_queue(WORKSPACE_ID)
        echo(f"\nqueue (non-terminal tasks, oldest first): {len(queue)}")
    finally:
        station.close()
