"""Intake beyond the named scenarios: resolution, escalation, preflight, resumption."""

from __future__ import annotations

import logging
import mailbox
import socket
import textwrap
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from agent import events
from agent.domain.dispositions import Disposition, GateKind
from agent.domain.envelope import Address
from agent.domain.errors import RegistryError, UnknownWorkspace
from agent.domain.run import LedgerEntry
from agent.domain.states import TaskState
from agent.providers.maildir import MaildirProvider
from agent.services import intake, workspaces
from agent.services.holder import _pid_namespace
from agent.storage.sqlite import SqliteStore
from agent.testing import FrozenClock, InMemoryProvider, make_envelope
from tests.conftest import context_yaml
from tests.conftest import run_intake as cycle
from tests.services.conftest import Station, new_maildir
from tests.services.gates_world import APPROVER, CLIENT, World, with_colleague

pytestmark = pytest.mark.anyio
MAILBOX = "support@fabrikam.test"
SHARED = "shared@fabrikam.test"


def shared_ctx(ws: str, bind: str) -> str:
    return context_yaml(ws, mailbox=SHARED, shared=True, bind_to=(bind,))


def to(env_no: int, recipient: str, thread: int | None = None):

    env = make_envelope(mailbox_id=SHARED, message_no=env_no, thread_no=thread or env_no)
    return env.model_copy(update={"to": (Address(address=recipient),)})


async def test_a_shared_mailbox_item_matching_no_workspace_goes_to_the_station_queue(
    station: Station,
) -> None:
    station.data_dir.station_file.write_text(
        "unresolved_queue: station-q\nescalation_contact: lead@fabrikam.test\n"
    )
    ws, box = station.inbox(shared_ctx("ws-a", "a@fabrikam.test"), SHARED)
    box.deliver(to(1, "nobody@fabrikam.test"))
    result = await station.cycle(ws, box)
    [item] = result.items
    assert item.disposition is Disposition.ESCALATED and item.task_id is None
    [esc] = station.store.list_escalations("station")
    assert (esc.queue, esc.assignee) == ("station-q", "lead@fabrikam.test")
    assert "matched 0 workspaces" in esc.reason
    assert station.store.list_tasks(ws) == [] and box.sent == []
    assert result.reconciliation is not None and result.reconciliation.clean


async def test_an_ambiguous_shared_item_is_escalated_once_whichever_workspace_runs(
    station: Station,
) -> None:
    station.data_dir.station_file.write_text(
        "unresolved_queue: station-q\nescalation_contact: lead@fabrikam.test\n"
    )
    a = station.register(shared_ctx("ws-a", "x@fabrikam.test"))
    b, box = station.inbox(shared_ctx("ws-b", "x@fabrikam.test"), SHARED)
    box.deliver(to(1, "x@fabrikam.test"))
    first = await station.cycle(a, box)
    second = await station.cycle(b, box)
    assert first.items[0].disposition is Disposition.ESCALATED
    assert second.items[0].disposition is Disposition.EXECUTION_ALREADY_DONE
    [esc] = station.store.list_escalations("station")
    assert "matched 2 workspaces (ws-a, ws-b)" in esc.reason


async def test_a_missing_station_destination_writes_a_health_record_naming_the_key(
    station: Station,
) -> None:
    station.data_dir.station_file.write_text("unresolved_queue: station-q\n")
    ws, box = station.inbox(shared_ctx("ws-a", "a@fabrikam.test"), SHARED)
    box.deliver(to(1, "nobody@fabrikam.test"))
    result = await station.cycle(ws, box)
    assert result.items[0].disposition is Disposition.ESCALATED
    assert "station.yaml is missing escalation_contact" in result.items[0].detail
    [health] = station.store.list_health()
    assert health.key == "station.yaml: escalation_contact"
    assert box.sent == []


async def test_a_shared_mailbox_item_of_another_workspace_is_not_read_by_this_run(
    station: Station,
) -> None:
    a = station.register(shared_ctx("ws-a", "a@fabrikam.test"))
    b, box = station.inbox(shared_ctx("ws-b", "b@fabrikam.test"), SHARED)
    box.deliver(to(1, "a@fabrikam.test"))
    box.deliver(to(2, "b@fabrikam.test"))
    result_a = await station.cycle(a, box)
    assert [i.item_ref for i in result_a.items] == [f"memory:{SHARED}/pm-1"]
    result_b = await station.cycle(b, box)
    assert [i.item_ref for i in result_b.items] == [f"memory:{SHARED}/pm-2"]
    assert len(station.store.list_tasks(a)) == len(station.store.list_tasks(b)) == 1


async def test_a_failed_licence_preflight_still_records_claims_and_reconciles(
    station: Station,
) -> None:
    ws, box = station.inbox(context_yaml(licence="suspended"))
    box.deliver(make_envelope(mailbox_id=MAILBOX, message_no=1, thread_no=1))
    result = await station.cycle(ws, box)
    [item] = result.items
    assert item.disposition is Disposition.ESCALATED and item.task_created
    [task] = station.store.list_tasks(ws)
    [gate] = task.open_gates
    assert gate.kind is GateKind.PREFLIGHT and "suspended" in gate.reason
    assert task.next_action.owner == "noa.bar@fabrikam.test"
    assert result.reconciliation is not None and result.reconciliation.clean
    assert box.sent == []


async def test_a_client_reply_resumes_the_same_waiting_task(station: Station) -> None:
    ws, box = station.inbox(context_yaml())
    first = make_envelope(mailbox_id=MAILBOX, message_no=1, thread_no=1)
    box.deliver(first)
    await station.cycle(ws, box)
    [task] = station.store.list_tasks(ws)
    station.store.transition_task(
        task.task_id, TaskState.WAITING_CLIENT, "asked the client", station.clock.now()
    )
    # An out-of-office reply in the thread is noise: it resumes nothing.
    box.deliver(
        make_envelope(mailbox_id=MAILBOX, message_no=2, thread_no=1, auto_submitted="auto-replied")
    )
    noise = await station.cycle(ws, box)
    assert noise.items[-1].disposition is Disposition.NOISE_EXCLUDED
    assert station.store.list_tasks(ws)[0].state is TaskState.WAITING_CLIENT
    # The client's real reply resumes the same task.
    box.deliver(
        make_envelope(
            mailbox_id=MAILBOX, message_no=3, thread_no=1, in_reply_to=first.internet_message_id
        )
    )
    reply = await station.cycle(ws, box)
    assert reply.items[-1].disposition is Disposition.QUEUED
    assert reply.items[-1].task_id == task.task_id and not reply.items[-1].task_created
    [resumed] = station.store.list_tasks(ws)
    assert resumed.state is TaskState.TASK_RESOLVED and len(resumed.messages) == 3


async def test_a_follow_up_on_a_task_awaiting_approval_keeps_it_waiting(station: Station) -> None:
    ws, box = station.inbox(context_yaml())
    box.deliver(make_envelope(mailbox_id=MAILBOX, message_no=1, thread_no=1))
    await station.cycle(ws, box)
    [task] = station.store.list_tasks(ws)
    for state in (TaskState.EXECUTING, TaskState.DRAFT_READY, TaskState.WAITING_INTERNAL_APPROVAL):
        station.store.transition_task(task.task_id, state, "work", station.clock.now())
    box.deliver(make_envelope(mailbox_id=MAILBOX, message_no=2, thread_no=1))
    result = await station.cycle(ws, box)
    assert result.items[-1].disposition is Disposition.WAITING_INTERNAL_APPROVAL
    [same] = station.store.list_tasks(ws)
    assert same.state is TaskState.WAITING_INTERNAL_APPROVAL and len(same.messages) == 2


async def test_the_context_is_re_read_on_every_run(
    station: Station,
    tmp_path: Path,
) -> None:
    ws = station.register(context_yaml())
    box = InMemoryProvider(MAILBOX)
    box.deliver(make_envelope(mailbox_id=MAILBOX, message_no=1, thread_no=1))
    assert (await station.cycle(ws, box)).items[0].disposition is Disposition.QUEUED
    thin = tmp_path / "thin.yaml"
    thin.write_text(context_yaml(kpis=False))
    workspaces.update_workspace(station.store, station.data_dir, thin, station.clock.now())
    box.deliver(make_envelope(mailbox_id=MAILBOX, message_no=2, thread_no=2))
    result = await station.cycle(ws, box)
    assert result.items[-1].disposition is Disposition.CONTEXT_GAP_DISCOVERY


async def test_items_are_handled_oldest_first_whatever_order_the_provider_lists_them(
    station: Station,
) -> None:
    ws, box = station.inbox(context_yaml())
    for n in (5, 1, 3):
        box.deliver(make_envelope(mailbox_id=MAILBOX, message_no=n, thread_no=n))
    result = await station.cycle(ws, box)
    assert [i.item_ref for i in result.items] == [f"memory:{MAILBOX}/pm-{n}" for n in (1, 3, 5)]
    assert [t.provider_thread_id for t in station.store.list_queue(ws)] == [
        "thread-1",
        "thread-3",
        "thread-5",
    ]


async def test_a_run_for_an_unregistered_workspace_fails_naming_the_workspace(
    station_store: SqliteStore, data_dir: workspaces.DataDir, clock: FrozenClock
) -> None:
    # The core names the workspace; each front end says what to run (tests/test_cli.py and
    # tests/mcp/test_bad_input.py, for list_queue and access_status, check that wording).
    with pytest.raises(UnknownWorkspace, match="workspace ws-nobody is not registered") as caught:
        await cycle(station_store, data_dir, "ws-nobody", clock, InMemoryProvider(MAILBOX))
    assert isinstance(caught.value, RegistryError) and caught.value.workspace_id == "ws-nobody"


async def test_an_unreadable_mailbox_is_an_access_gap_and_the_other_mailboxes_still_run(
    station: Station,
    tmp_path: Path,
) -> None:
    extra = f"""\
    mailboxes:
      - {{mailbox_id: {MAILBOX}, provider: memory}}
      - {{mailbox_id: archive@fabrikam.test, provider: maildir, path: {tmp_path / "missing"}}}
    """
    text = context_yaml().replace(
        f"mailboxes:\n  - {{mailbox_id: {MAILBOX}, provider: memory}}\n", ""
    )
    ws = station.register(text + textwrap.dedent(extra))
    box = InMemoryProvider(MAILBOX)
    box.deliver(make_envelope(mailbox_id=MAILBOX, message_no=1, thread_no=1))
    archive = MaildirProvider(tmp_path / "missing", "archive@fabrikam.test")
    result = await station.cycle(ws, box, archive)
    assert [i.disposition for i in result.items] == [Disposition.QUEUED]
    [error] = result.access_errors
    assert error.startswith("archive@fabrikam.test: no Maildir at") and "create it" in error
    [health] = station.store.list_health()
    assert health.key == "mailbox archive@fabrikam.test (maildir)"
    assert result.reconciliation is not None and result.reconciliation.scanned == 1


async def test_a_new_run_reconciles_the_open_runs_of_dead_workers(station: Station) -> None:
    ws = station.register(context_yaml())
    station.store.start_run(
        "run-dead",
        ws,
        f"{socket.gethostname()}/{_pid_namespace()}/999999999/1/dead",
        station.clock.now(),
    )
    station.store.start_run("run-elsewhere", ws, "another-host.test/1/1/x", station.clock.now())
    result = await station.cycle(ws, InMemoryProvider(MAILBOX))
    assert [r.run_id for r in result.reconciled_stale] == ["run-dead"]
    # A run held on another machine cannot be proven dead from here: it stays open.
    [elsewhere] = station.store.unreconciled_runs(ws)
    assert (elsewhere.run_id, elsewhere.holder) == ("run-elsewhere", "another-host.test/1/1/x")


async def test_a_run_on_another_machine_is_reconciled_once_its_lease_ran_out(
    station: Station,
) -> None:
    ws = station.register(context_yaml())
    other = "another-host.test/1/1/x"
    start = station.clock.now()
    station.store.start_run("run-leased", ws, other, start, start + intake.RUN_LEASE)
    station.store.record_scanned([LedgerEntry(run_id="run-leased", item_ref="a")], start)
    first = await station.cycle(ws, InMemoryProvider(MAILBOX))
    assert first.reconciled_stale == []  # its lease still runs: the other machine works on
    station.clock.advance(minutes=14)
    assert station.store.renew_run("run-leased", other, station.clock.now() + intake.RUN_LEASE)
    station.clock.advance(minutes=14)
    second = await station.cycle(ws, InMemoryProvider(MAILBOX))
    assert second.reconciled_stale == []  # renewed in time
    station.clock.advance(minutes=2)
    third = await station.cycle(ws, InMemoryProvider(MAILBOX))
    [stale] = third.reconciled_stale
    assert stale.run_id == "run-leased" and stale.reconciliation_failed == 1
    # The machine that lost its run can no longer renew it.
    assert not station.store.renew_run("run-leased", other, station.clock.now() + intake.RUN_LEASE)


async def test_a_long_run_renews_its_own_lease_as_it_goes(station: Station) -> None:
    ws, box = station.inbox(context_yaml())
    for n in range(1, 4):
        box.deliver(make_envelope(mailbox_id=MAILBOX, message_no=n, thread_no=n))
    renewals: list[datetime] = []
    real_claim = station.store.claim

    def slow_claim(*args: Any, **kwargs: Any) -> Any:
        station.clock.advance(minutes=6)  # every item takes six minutes of the run's lease
        return real_claim(*args, **kwargs)

    real_renew = station.store.renew_run

    def renew(run_id: str, holder: str, until: datetime) -> bool:
        renewals.append(until)
        return real_renew(run_id, holder, until)

    setattr(station.store, "claim", slow_claim)  # noqa: B010
    setattr(station.store, "renew_run", renew)  # noqa: B010
    result = await station.cycle(ws, box)
    assert result.reconciliation is not None and result.reconciliation.clean
    # Once when the scan is recorded, then before the second and the third item (6 and 12
    # minutes in).
    assert len(renewals) == 3
    assert renewals == sorted(renewals)


# -- every item of a run gets its own outcome, whatever it holds ---------------------------


async def test_the_same_file_name_in_two_mailboxes_is_two_items(
    station: Station,
    tmp_path: Path,
) -> None:
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
    ws = station.register(text)
    providers = {
        MAILBOX: MaildirProvider(paths["ops"], MAILBOX),
        "archive@fabrikam.test": MaildirProvider(paths["archive"], "archive@fabrikam.test"),
    }
    result = await station.cycle(ws, *providers.values())
    assert len(result.items) == 2 and {i.disposition for i in result.items} == {Disposition.QUEUED}
    assert result.reconciliation is not None and result.reconciliation.clean


async def test_malformed_files_in_a_maildir_are_recorded_and_nothing_stops_the_run(
    station: Station,
    tmp_path: Path,
) -> None:
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
    ws = station.register(context_yaml(provider="maildir", path=str(path)))
    result = await station.cycle(ws, MaildirProvider(path, MAILBOX))
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


class Exploding(InMemoryProvider):
    async def fetch_body(self, body_ref: str) -> object:  # type: ignore[override]
        if body_ref == "pm-1":
            raise ValueError("a bug in an adapter")
        return await super().fetch_body(body_ref)


async def test_an_unexpected_error_in_one_item_does_not_stop_the_others(
    make_world: Callable[..., World], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger=events.ROOT)
    acks = "receipt_ack: true\ncommunication: {ack_templates: {en: We got it.}}\n"
    world = make_world(context_yaml(extra=acks).replace("receipt_ack: false\n", ""))
    world.box = Exploding(MAILBOX)
    world.deliver(sender=CLIENT, thread=1, text="first")
    world.deliver(sender=CLIENT, thread=2, text="second")
    result = await world.intake()
    assert len(result.item_errors) == 1 and "ValueError" in result.item_errors[0]
    assert [i.disposition for i in result.items] == [Disposition.ACK_SENT]
    assert any("intake item" in h.key for h in world.store.list_health())
    found = [f[1] for r in caplog.records if (f := events.of(r)) and f[0] == "disposition"]
    assert [(d.get("disposition"), d.get("outcome"), d.get("reason")) for d in found] == [
        (None, "item_failed", "ValueError"), ("ACK_SENT", None, None),
    ]  # fmt: skip


# -- which task a message joins ------------------------------------------------------------


async def test_a_reused_message_id_does_not_pull_a_new_request_into_another_thread(
    station: Station,
    tmp_path: Path,
) -> None:
    path, box = new_maildir(tmp_path)

    def add(sender: str, mid: str, subject: str, parent: str | None = None) -> None:
        head = f"From: {sender}\r\nTo: {MAILBOX}\r\nSubject: {subject}\r\nMessage-ID: {mid}\r\n"
        if parent:
            head += f"In-Reply-To: {parent}\r\nReferences: {parent}\r\n"
        box.add((head + "\r\nbody\r\n").encode())

    add("dana.levi@contoso.test", "<x@contoso.test>", "Contoso contract")
    add("dana.levi@contoso.test", "<dup@mailer.test>", "Re: Contoso contract", "<x@contoso.test>")
    add("someone@other-client.test", "<dup@mailer.test>", "Unrelated new request")
    ws = station.register(context_yaml(provider="maildir", path=str(path)))
    await station.cycle(ws, MaildirProvider(path, MAILBOX))
    senders = sorted(
        tuple(sorted({m.sender for m in t.messages})) for t in station.store.list_tasks(ws)
    )
    assert senders == [("dana.levi@contoso.test",), ("someone@other-client.test",)]


async def test_reused_message_ids_never_file_a_reply_on_another_senders_task(
    station: Station,
    tmp_path: Path,
) -> None:
    path, box = new_maildir(tmp_path)

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
    ws = station.register(context_yaml(provider="maildir", path=str(path)))
    await station.cycle(ws, MaildirProvider(path, MAILBOX))
    for task in station.store.list_tasks(ws):
        senders = {m.sender for m in task.messages}
        assert len(senders) == 1, (task.title, senders)


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


async def test_a_colleagues_reply_to_a_reminder_does_not_resume_a_task_waiting_on_the_client(
    make_world: Callable[..., World],
) -> None:
    world = make_world(with_colleague(context_yaml()))
    world.deliver(sender=CLIENT, thread=1)
    await world.intake()
    task = world.only_task()
    world.store.transition_task(task.task_id, TaskState.WAITING_CLIENT, "asked", world.clock.now())
    world.clock.advance(hours=1)
    world.deliver(sender=APPROVER, thread=1, text="I'll call them tomorrow")
    result = await world.intake()
    assert [i.disposition for i in result.items if i.task_id][-1] is Disposition.WAITING_CLIENT
    after = world.task(task.task_id)
    assert after.state is TaskState.WAITING_CLIENT and after.requester is None
