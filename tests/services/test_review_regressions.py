"""Failure modes found in review, each pinned by a test that failed before its fix."""

from __future__ import annotations

import mailbox
import socket
import subprocess
import sys
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

import pytest

from agent.domain.dispositions import Disposition
from agent.domain.errors import ClaimLost
from agent.domain.execution import ClaimOutcome
from agent.domain.records import ReportRequest
from agent.domain.states import TaskState
from agent.providers.maildir import MaildirProvider
from agent.services import workspaces
from agent.services.holder import _pid_namespace
from agent.storage.sql import Tx
from agent.storage.sqlite import SqliteStore
from agent.testing import FrozenClock, InMemoryProvider, make_envelope
from tests.conftest import context_yaml
from tests.conftest import run_intake as cycle

pytestmark = pytest.mark.anyio
MAILBOX = "support@fabrikam.test"
DEAD = f"{socket.gethostname()}/{_pid_namespace()}/999999999/1/dead"


class DiesBeforeReport(SqliteStore):
    """A worker killed between its claim transaction and its report."""

    def report(self, request: ReportRequest, now):  # type: ignore[override]
        raise SystemExit("killed before the report")


async def test_a_takeover_after_a_crash_still_triages_the_message_as_new(
    data_dir: workspaces.DataDir, clock: FrozenClock, register: Callable[[str], str]
) -> None:
    ws = register(context_yaml())
    box = InMemoryProvider(MAILBOX)
    box.deliver(make_envelope(mailbox_id=MAILBOX, message_no=1, thread_no=1))
    box.deliver(
        make_envelope(mailbox_id=MAILBOX, message_no=2, thread_no=2, auto_submitted="auto-replied")
    )
    dying = DiesBeforeReport(data_dir.database)
    for _ in range(2):  # each dead run claims one more item, creates its task, then dies
        with pytest.raises(SystemExit):
            await cycle(dying, data_dir, ws, clock, box, holder=DEAD)
    dying.close()
    store = SqliteStore(data_dir.database)
    result = await cycle(store, data_dir, ws, clock, box)
    assert [i.claim for i in result.items] == [ClaimOutcome.CLAIMED] * 2
    states = {t.title: t.state for t in store.list_tasks(ws)}
    assert states == {"Request 1": TaskState.TASK_RESOLVED, "Request 2": TaskState.COMPLETED}
    assert [t.title for t in store.list_queue(ws)] == ["Request 1"]
    store.close()


async def test_a_due_retry_finishes_and_unblocks_its_task(
    station_store: SqliteStore, data_dir: workspaces.DataDir, clock: FrozenClock,
    register: Callable[[str], str],
) -> None:  # fmt: skip
    ws = register(context_yaml())
    box = InMemoryProvider(MAILBOX)
    box.deliver(make_envelope(mailbox_id=MAILBOX, message_no=1, thread_no=1))
    first = await cycle(station_store, data_dir, ws, clock, box)
    [task] = station_store.list_tasks(ws)
    # The work on the occurrence hit a transient failure: it is re-claimed and deferred.
    record = station_store.list_executions()[0]
    station_store.start_run("run-retry", ws, "h/0/1/1/x", clock.now())
    station_store.record_scanned([], clock.now())

    def reclaim(conn: Tx) -> None:
        conn.execute(
            "UPDATE executions SET state = 'CLAIMED', holder = 'h/0/1/1/x' WHERE key = ?",
            (record.key,),
        )
        conn.execute(
            "INSERT INTO run_items (run_id, item_ref, occurrence_key, scanned_at) VALUES ('run-retry', 'r', ?, 0)",
            (record.key,),
        )

    station_store._write(reclaim, None)  # pyright: ignore[reportPrivateUsage]
    station_store.report(
        ReportRequest(key=record.key, holder="h/0/1/1/x", run_id="run-retry", item_ref="r",
                      disposition=Disposition.QUEUED, detail="provider timed out",
                      retry_at=clock.now() + timedelta(minutes=5)),
        clock.now(),
    )  # fmt: skip
    blocked = station_store.get_task(task.task_id)
    assert blocked is not None and blocked.state is TaskState.BLOCKED_RETRY_PENDING
    assert blocked.blocked_by == (record.key,)
    clock.advance(minutes=6)
    retried = await cycle(station_store, data_dir, ws, clock, box)
    assert [i.claim for i in retried.items] == [ClaimOutcome.CLAIMED]
    done = station_store.get_task(task.task_id)
    assert done is not None and done.state is TaskState.TASK_RESOLVED and done.blocked_by == ()
    assert first.items[0].task_id == task.task_id


async def test_the_same_file_name_in_two_mailboxes_is_two_items(
    station_store: SqliteStore, data_dir: workspaces.DataDir, clock: FrozenClock,
    register: Callable[[str], str], tmp_path: Path,
) -> None:  # fmt: skip
    paths = {name: tmp_path / name / "Maildir" for name in ("ops", "archive")}
    for n, path in enumerate(paths.values()):
        path.parent.mkdir()
        mailbox.Maildir(str(path), create=True)
        (path / "new" / "archive-0001.eml").write_bytes(
            f"From: dana.levi@contoso.test\nTo: {MAILBOX}\nSubject: Copy {n}\nMessage-ID: <c{n}@x.test>\n\nbody {n}\n".encode()
        )
    text = (
        context_yaml(provider="maildir", path=str(paths["ops"]))
        .replace(
            "mailboxes:\n",
            f"mailboxes:\n  - {{mailbox_id: archive@fabrikam.test, provider: maildir, path: {paths['archive']}}}\n",
        )
        .replace(
            "grants: {licence: active, mailboxes: [",
            "grants: {licence: active, mailboxes: [archive@fabrikam.test, ",
        )
    )
    ws = register(text)
    providers = {
        MAILBOX: MaildirProvider(paths["ops"], MAILBOX),
        "archive@fabrikam.test": MaildirProvider(paths["archive"], "archive@fabrikam.test"),
    }
    result = await cycle(station_store, data_dir, ws, clock, *providers.values())
    assert len(result.items) == 2 and {i.disposition for i in result.items} == {Disposition.QUEUED}
    assert result.reconciliation is not None and result.reconciliation.clean


async def test_a_lost_report_is_recorded_and_the_run_goes_on(
    data_dir: workspaces.DataDir, clock: FrozenClock, register: Callable[[str], str]
) -> None:
    ws = register(context_yaml())

    class LosesTheFirstReport(SqliteStore):
        lost = False

        def report(self, request: ReportRequest, now):  # type: ignore[override]
            if not self.lost:
                self.lost = True
                raise ClaimLost("lease expired; another holder took the occurrence over")
            return super().report(request, now)

    store = LosesTheFirstReport(data_dir.database)
    box = InMemoryProvider(MAILBOX)
    for n in (1, 2):
        box.deliver(make_envelope(mailbox_id=MAILBOX, message_no=n, thread_no=n))
    result = await cycle(store, data_dir, ws, clock, box)
    assert [i.disposition for i in result.items] == [
        Disposition.EXECUTION_ALREADY_CLAIMED, Disposition.QUEUED,
    ]  # fmt: skip
    assert result.reconciliation is not None and result.reconciliation.clean
    store.close()


async def test_malformed_files_in_a_maildir_are_recorded_and_nothing_stops_the_run(
    station_store: SqliteStore, data_dir: workspaces.DataDir, clock: FrozenClock,
    register: Callable[[str], str], tmp_path: Path,
) -> None:  # fmt: skip
    path = tmp_path / "Maildir"
    mailbox.Maildir(str(path), create=True)
    nested = (
        b"".join(
            f'Content-Type: multipart/mixed; boundary="b{i}"\n\n--b{i}\n'.encode()
            for i in range(100)
        )
        + b"Content-Type: text/plain\n\ndeep\n"
    )
    files = {
        "a-no-msgid.eml": b"From: a@contoso.test\nTo: support@fabrikam.test\nSubject: no id\n\nhello\n",
        "b-far-future.eml": b"From: b@contoso.test\nDate: Fri, 31 Dec 9999 23:59:59 -0100\nMessage-ID: <f@x>\nSubject: future\n\nx\n",
        "c-bad-charset.eml": b"From: =?bogus?Q?x?= <c@contoso.test>\nSubject: =?utf-8?B?####?=\nContent-Type: text/plain; charset=x-unknown\nMessage-ID: <c@x>\n\n\xff\xfe\n",
        "d-cr-in-header.eml": b"From: d@contoso.test\nSubject: one\rtwo\nMessage-ID: <d@x>\n\nx\n",
        "e-empty-body.eml": b"From: e@contoso.test\nMessage-ID: <e@x>\nSubject: empty\n\n",
        "f-nested.eml": b"From: f@contoso.test\nMessage-ID: <f2@x>\nMIME-Version: 1.0\n" + nested,
        "g-empty.eml": b"",
        "h-dup-id-1.eml": b"From: h@contoso.test\nMessage-ID: <dup@x>\nSubject: first\n\none\n",
        "i-dup-id-2.eml": b"From: i@other.test\nMessage-ID: <dup@x>\nSubject: second\n\ntwo\n",
    }
    for name, data in files.items():
        (path / "new" / name).write_bytes(data)
    ws = register(context_yaml(provider="maildir", path=str(path)))
    result = await cycle(station_store, data_dir, ws, clock, MaildirProvider(path, MAILBOX))
    by_name = {i.item_ref.rsplit(":", 1)[-1]: i for i in result.items}
    assert set(by_name) == set(files)
    assert by_name["g-empty.eml"].disposition is Disposition.ESCALATED
    assert "could not be normalized" in by_name["g-empty.eml"].detail
    for name in set(files) - {"g-empty.eml"}:
        assert by_name[name].disposition is Disposition.QUEUED, name
    # Two different messages sharing a Message-ID are two occurrences and two tasks.
    assert by_name["h-dup-id-1.eml"].task_id != by_name["i-dup-id-2.eml"].task_id
    rec = result.reconciliation
    assert rec is not None and rec.clean and rec.scanned == len(files)


async def test_a_reused_message_id_does_not_pull_a_new_request_into_another_thread(
    station_store: SqliteStore, data_dir: workspaces.DataDir, clock: FrozenClock,
    register: Callable[[str], str], tmp_path: Path,
) -> None:  # fmt: skip
    path = tmp_path / "Maildir"
    box = mailbox.Maildir(str(path), create=True)

    def add(sender: str, mid: str, subject: str, parent: str | None = None) -> None:
        head = f"From: {sender}\r\nTo: {MAILBOX}\r\nSubject: {subject}\r\nMessage-ID: {mid}\r\n"
        if parent:
            head += f"In-Reply-To: {parent}\r\nReferences: {parent}\r\n"
        box.add((head + "\r\nbody\r\n").encode())

    add("dana.levi@contoso.test", "<x@contoso.test>", "Contoso contract")
    add("dana.levi@contoso.test", "<dup@mailer.test>", "Re: Contoso contract", "<x@contoso.test>")
    add("someone@other-client.test", "<dup@mailer.test>", "Unrelated new request")
    ws = register(context_yaml(provider="maildir", path=str(path)))
    await cycle(station_store, data_dir, ws, clock, MaildirProvider(path, MAILBOX))
    senders = sorted(
        tuple(sorted({m.sender for m in t.messages})) for t in station_store.list_tasks(ws)
    )
    assert senders == [("dana.levi@contoso.test",), ("someone@other-client.test",)]


def test_sixteen_processes_opening_a_new_database_together_all_succeed(tmp_path: Path) -> None:
    # Each child imports everything, says it is ready, then waits on its stdin: the parent
    # releases all sixteen at once, so they race to create and migrate the same database.
    code = (
        "import sys, pathlib\n"
        "from agent.storage.sqlite import SqliteStore\n"
        "print('ready', flush=True)\n"
        "sys.stdin.readline()\n"
        "SqliteStore(pathlib.Path(sys.argv[1])).close()\n"
    )
    for trial in range(5):
        db = tmp_path / f"t{trial}.db"
        procs = [
            subprocess.Popen(
                [sys.executable, "-c", code, str(db)],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            )
            for _ in range(16)
        ]  # fmt: skip
        for proc in procs:
            assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        for proc in procs:
            assert proc.stdin is not None
            proc.stdin.write("go\n")
            proc.stdin.flush()
        errors = [p.communicate(timeout=120)[1] for p in procs]
        assert [p.returncode for p in procs] == [0] * 16, [e for e in errors if e][:1]
        store = SqliteStore(db)
        assert store.schema_version() >= 1 and store.integrity_check() == "ok"
        store.close()


async def test_a_takeover_after_the_agent_moved_the_task_on_does_not_poison_later_runs(
    data_dir: workspaces.DataDir, clock: FrozenClock, register: Callable[[str], str]
) -> None:
    ws = register(context_yaml())
    box = InMemoryProvider(MAILBOX)
    for n in (1, 2):
        box.deliver(make_envelope(mailbox_id=MAILBOX, message_no=n, thread_no=n))
    dying = DiesBeforeReport(data_dir.database)
    with pytest.raises(SystemExit):
        await cycle(dying, data_dir, ws, clock, box, holder=DEAD)
    dying.close()
    store = SqliteStore(data_dir.database)
    [task] = store.list_tasks(ws)
    for state in (TaskState.IN_DISCOVERY, TaskState.EXECUTING):  # the agent host works it
        store.transition_task(task.task_id, state, "agent host", clock.now())
    result = await cycle(store, data_dir, ws, clock, box)
    assert result.reconciliation is not None and result.reconciliation.clean
    assert [i.claim for i in result.items] == [ClaimOutcome.CLAIMED] * 2
    moved = store.get_task(task.task_id)
    assert moved is not None and moved.state is TaskState.EXECUTING  # the agent's move stands
    store.close()


async def test_an_auto_reply_that_opened_a_thread_never_leaves_it_half_made(
    data_dir: workspaces.DataDir, clock: FrozenClock, register: Callable[[str], str]
) -> None:
    ws = register(context_yaml())
    box = InMemoryProvider(MAILBOX)
    box.deliver(
        make_envelope(
            mailbox_id=MAILBOX, message_no=1, thread_no=1, auto_submitted="auto-generated"
        )
    )
    box.deliver(
        make_envelope(
            mailbox_id=MAILBOX,
            message_no=2,
            thread_no=1,
            sender="dana.levi@contoso.test",
            in_reply_to="<m1@example.test>",
        )
    )
    dying = DiesBeforeReport(data_dir.database)
    with pytest.raises(SystemExit):  # the auto-reply's worker, on another host, dies
        await cycle(dying, data_dir, ws, clock, box, holder="other-host.test/1/4242/77/x")
    dying.close()
    store = SqliteStore(data_dir.database)
    await cycle(store, data_dir, ws, clock, box)  # its lease still runs
    clock.advance(seconds=301)
    await cycle(store, data_dir, ws, clock, box)  # lease expired: taken over
    [task] = store.list_tasks(ws)
    assert task.state is TaskState.TASK_RESOLVED
    assert task.next_action.description != "none: automated message"
    store.close()


async def test_an_auto_reply_never_resumes_a_task_waiting_for_the_client_even_with_a_gate_open(
    station_store: SqliteStore, data_dir: workspaces.DataDir, clock: FrozenClock,
    register: Callable[[str], str],
) -> None:  # fmt: skip
    ws = register(context_yaml(licence="suspended"))  # every task carries a preflight gate
    box = InMemoryProvider(MAILBOX)
    box.deliver(make_envelope(mailbox_id=MAILBOX, message_no=1, thread_no=1))
    await cycle(station_store, data_dir, ws, clock, box)
    [task] = station_store.list_tasks(ws)
    station_store.transition_task(task.task_id, TaskState.WAITING_CLIENT, "asked", clock.now())
    box.deliver(
        make_envelope(
            mailbox_id=MAILBOX,
            message_no=2,
            thread_no=1,
            in_reply_to="<m1@example.test>",
            auto_submitted="auto-replied",
        )
    )
    await cycle(station_store, data_dir, ws, clock, box)
    [same] = station_store.list_tasks(ws)
    assert same.state is TaskState.WAITING_CLIENT


async def test_reused_message_ids_never_file_a_reply_on_another_senders_task(
    station_store: SqliteStore, data_dir: workspaces.DataDir, clock: FrozenClock,
    register: Callable[[str], str], tmp_path: Path,
) -> None:  # fmt: skip
    path = tmp_path / "Maildir"
    box = mailbox.Maildir(str(path), create=True)

    def add(sender: str, mid: str, subject: str, date: str, parent: str | None = None) -> None:
        head = f"From: {sender}\r\nTo: {MAILBOX}\r\nSubject: {subject}\r\nMessage-ID: {mid}\r\nDate: {date}\r\n"
        if parent:
            head += f"In-Reply-To: {parent}\r\nReferences: {parent}\r\n"
        box.add((head + f"\r\n{subject} body\r\n").encode())

    add(
        "someone@other-client.test",
        "<x@contoso.test>",
        "Unrelated new request",
        "Mon, 30 Nov 2026 07:00:00 +0000",
    )
    add(
        "dana.levi@contoso.test",
        "<x@contoso.test>",
        "Contoso contract",
        "Mon, 30 Nov 2026 08:00:00 +0000",
    )
    add(
        "dana.levi@contoso.test",
        "<b@contoso.test>",
        "Re: Contoso contract",
        "Mon, 30 Nov 2026 08:30:00 +0000",
        "<x@contoso.test>",
    )
    add(
        "dana.levi@contoso.test",
        "<dup@mailer.test>",
        "Re: Contoso contract",
        "Mon, 30 Nov 2026 08:40:00 +0000",
        "<x@contoso.test>",
    )
    add("other@third.test", "<dup@mailer.test>", "Third request", "Mon, 30 Nov 2026 09:00:00 +0000")
    add(
        "other@third.test",
        "<c@third.test>",
        "Re: Third request",
        "Mon, 30 Nov 2026 10:00:00 +0000",
        "<dup@mailer.test>",
    )
    ws = register(context_yaml(provider="maildir", path=str(path)))
    await cycle(station_store, data_dir, ws, clock, MaildirProvider(path, MAILBOX))
    for task in station_store.list_tasks(ws):
        senders = {m.sender for m in task.messages}
        assert len(senders) == 1, (task.title, senders)
