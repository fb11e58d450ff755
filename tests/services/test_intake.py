"""Intake beyond the named scenarios: resolution, escalation, preflight, resumption."""

from __future__ import annotations

import socket
import textwrap
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from agent.domain.dispositions import Disposition, GateKind
from agent.domain.envelope import Address
from agent.domain.errors import RegistryError
from agent.domain.run import LedgerEntry
from agent.domain.states import TaskState
from agent.providers.maildir import MaildirProvider
from agent.services import intake, workspaces
from agent.services.holder import _pid_namespace
from agent.storage.sqlite import SqliteStore
from agent.testing import FrozenClock, InMemoryProvider, make_envelope
from tests.conftest import context_yaml
from tests.conftest import run_intake as cycle

pytestmark = pytest.mark.anyio
MAILBOX = "support@fabrikam.test"
SHARED = "shared@fabrikam.test"


def shared_ctx(ws: str, bind: str) -> str:
    return context_yaml(ws, mailbox=SHARED, shared=True, bind_to=(bind,))


def to(env_no: int, recipient: str, thread: int | None = None):

    env = make_envelope(mailbox_id=SHARED, message_no=env_no, thread_no=thread or env_no)
    return env.model_copy(update={"to": (Address(address=recipient),)})


async def test_a_shared_mailbox_item_matching_no_workspace_goes_to_the_station_queue(
    station_store: SqliteStore,
    data_dir: workspaces.DataDir,
    clock: FrozenClock,
    register: Callable[[str], str],
) -> None:
    data_dir.station_file.write_text(
        "unresolved_queue: station-q\nescalation_contact: lead@fabrikam.test\n"
    )
    ws = register(shared_ctx("ws-a", "a@fabrikam.test"))
    box = InMemoryProvider(SHARED)
    box.deliver(to(1, "nobody@fabrikam.test"))
    result = await cycle(station_store, data_dir, ws, clock, box)
    [item] = result.items
    assert item.disposition is Disposition.ESCALATED and item.task_id is None
    [esc] = station_store.list_escalations("station")
    assert (esc.queue, esc.assignee) == ("station-q", "lead@fabrikam.test")
    assert "matched 0 workspaces" in esc.reason
    assert station_store.list_tasks(ws) == [] and box.sent == []
    assert result.reconciliation is not None and result.reconciliation.clean


async def test_an_ambiguous_shared_item_is_escalated_once_whichever_workspace_runs(
    station_store: SqliteStore,
    data_dir: workspaces.DataDir,
    clock: FrozenClock,
    register: Callable[[str], str],
) -> None:
    data_dir.station_file.write_text(
        "unresolved_queue: station-q\nescalation_contact: lead@fabrikam.test\n"
    )
    a = register(shared_ctx("ws-a", "x@fabrikam.test"))
    b = register(shared_ctx("ws-b", "x@fabrikam.test"))
    box = InMemoryProvider(SHARED)
    box.deliver(to(1, "x@fabrikam.test"))
    first = await cycle(station_store, data_dir, a, clock, box)
    second = await cycle(station_store, data_dir, b, clock, box)
    assert first.items[0].disposition is Disposition.ESCALATED
    assert second.items[0].disposition is Disposition.EXECUTION_ALREADY_DONE
    [esc] = station_store.list_escalations("station")
    assert "matched 2 workspaces (ws-a, ws-b)" in esc.reason


async def test_a_missing_station_destination_writes_a_health_record_naming_the_key(
    station_store: SqliteStore,
    data_dir: workspaces.DataDir,
    clock: FrozenClock,
    register: Callable[[str], str],
) -> None:
    data_dir.station_file.write_text("unresolved_queue: station-q\n")
    ws = register(shared_ctx("ws-a", "a@fabrikam.test"))
    box = InMemoryProvider(SHARED)
    box.deliver(to(1, "nobody@fabrikam.test"))
    result = await cycle(station_store, data_dir, ws, clock, box)
    assert result.items[0].disposition is Disposition.ESCALATED
    assert "station.yaml is missing escalation_contact" in result.items[0].detail
    [health] = station_store.list_health()
    assert health.key == "station.yaml: escalation_contact"
    assert box.sent == []


async def test_a_shared_mailbox_item_of_another_workspace_is_not_read_by_this_run(
    station_store: SqliteStore,
    data_dir: workspaces.DataDir,
    clock: FrozenClock,
    register: Callable[[str], str],
) -> None:
    a = register(shared_ctx("ws-a", "a@fabrikam.test"))
    b = register(shared_ctx("ws-b", "b@fabrikam.test"))
    box = InMemoryProvider(SHARED)
    box.deliver(to(1, "a@fabrikam.test"))
    box.deliver(to(2, "b@fabrikam.test"))
    result_a = await cycle(station_store, data_dir, a, clock, box)
    assert [i.item_ref for i in result_a.items] == [f"memory:{SHARED}/pm-1"]
    result_b = await cycle(station_store, data_dir, b, clock, box)
    assert [i.item_ref for i in result_b.items] == [f"memory:{SHARED}/pm-2"]
    assert len(station_store.list_tasks(a)) == len(station_store.list_tasks(b)) == 1


async def test_a_failed_licence_preflight_still_records_claims_and_reconciles(
    station_store: SqliteStore,
    data_dir: workspaces.DataDir,
    clock: FrozenClock,
    register: Callable[[str], str],
) -> None:
    ws = register(context_yaml(licence="suspended"))
    box = InMemoryProvider(MAILBOX)
    box.deliver(make_envelope(mailbox_id=MAILBOX, message_no=1, thread_no=1))
    result = await cycle(station_store, data_dir, ws, clock, box)
    [item] = result.items
    assert item.disposition is Disposition.ESCALATED and item.task_created
    [task] = station_store.list_tasks(ws)
    [gate] = task.open_gates
    assert gate.kind is GateKind.PREFLIGHT and "suspended" in gate.reason
    assert task.next_action.owner == "noa.bar@fabrikam.test"
    assert result.reconciliation is not None and result.reconciliation.clean
    assert box.sent == []


async def test_a_client_reply_resumes_the_same_waiting_task(
    station_store: SqliteStore,
    data_dir: workspaces.DataDir,
    clock: FrozenClock,
    register: Callable[[str], str],
) -> None:
    ws = register(context_yaml())
    box = InMemoryProvider(MAILBOX)
    first = make_envelope(mailbox_id=MAILBOX, message_no=1, thread_no=1)
    box.deliver(first)
    await cycle(station_store, data_dir, ws, clock, box)
    [task] = station_store.list_tasks(ws)
    station_store.transition_task(
        task.task_id, TaskState.WAITING_CLIENT, "asked the client", clock.now()
    )
    # An out-of-office reply in the thread is noise: it resumes nothing.
    box.deliver(
        make_envelope(mailbox_id=MAILBOX, message_no=2, thread_no=1, auto_submitted="auto-replied")
    )
    noise = await cycle(station_store, data_dir, ws, clock, box)
    assert noise.items[-1].disposition is Disposition.NOISE_EXCLUDED
    assert station_store.list_tasks(ws)[0].state is TaskState.WAITING_CLIENT
    # The client's real reply resumes the same task.
    box.deliver(
        make_envelope(
            mailbox_id=MAILBOX, message_no=3, thread_no=1, in_reply_to=first.internet_message_id
        )
    )
    reply = await cycle(station_store, data_dir, ws, clock, box)
    assert reply.items[-1].disposition is Disposition.QUEUED
    assert reply.items[-1].task_id == task.task_id and not reply.items[-1].task_created
    [resumed] = station_store.list_tasks(ws)
    assert resumed.state is TaskState.TASK_RESOLVED and len(resumed.messages) == 3


async def test_a_follow_up_on_a_task_awaiting_approval_keeps_it_waiting(
    station_store: SqliteStore,
    data_dir: workspaces.DataDir,
    clock: FrozenClock,
    register: Callable[[str], str],
) -> None:
    ws = register(context_yaml())
    box = InMemoryProvider(MAILBOX)
    box.deliver(make_envelope(mailbox_id=MAILBOX, message_no=1, thread_no=1))
    await cycle(station_store, data_dir, ws, clock, box)
    [task] = station_store.list_tasks(ws)
    for state in (TaskState.EXECUTING, TaskState.DRAFT_READY, TaskState.WAITING_INTERNAL_APPROVAL):
        station_store.transition_task(task.task_id, state, "work", clock.now())
    box.deliver(make_envelope(mailbox_id=MAILBOX, message_no=2, thread_no=1))
    result = await cycle(station_store, data_dir, ws, clock, box)
    assert result.items[-1].disposition is Disposition.WAITING_INTERNAL_APPROVAL
    [same] = station_store.list_tasks(ws)
    assert same.state is TaskState.WAITING_INTERNAL_APPROVAL and len(same.messages) == 2


async def test_the_context_is_re_read_on_every_run(
    station_store: SqliteStore, data_dir: workspaces.DataDir, clock: FrozenClock,
    register: Callable[[str], str], tmp_path: Path,
) -> None:  # fmt: skip
    ws = register(context_yaml())
    box = InMemoryProvider(MAILBOX)
    box.deliver(make_envelope(mailbox_id=MAILBOX, message_no=1, thread_no=1))
    assert (await cycle(station_store, data_dir, ws, clock, box)).items[
        0
    ].disposition is Disposition.QUEUED
    thin = tmp_path / "thin.yaml"
    thin.write_text(context_yaml(kpis=False))
    workspaces.update_workspace(station_store, data_dir, thin, clock.now())
    box.deliver(make_envelope(mailbox_id=MAILBOX, message_no=2, thread_no=2))
    result = await cycle(station_store, data_dir, ws, clock, box)
    assert result.items[-1].disposition is Disposition.CONTEXT_GAP_DISCOVERY


async def test_items_are_handled_oldest_first_whatever_order_the_provider_lists_them(
    station_store: SqliteStore,
    data_dir: workspaces.DataDir,
    clock: FrozenClock,
    register: Callable[[str], str],
) -> None:
    ws = register(context_yaml())
    box = InMemoryProvider(MAILBOX)
    for n in (5, 1, 3):
        box.deliver(make_envelope(mailbox_id=MAILBOX, message_no=n, thread_no=n))
    result = await cycle(station_store, data_dir, ws, clock, box)
    assert [i.item_ref for i in result.items] == [f"memory:{MAILBOX}/pm-{n}" for n in (1, 3, 5)]
    assert [t.provider_thread_id for t in station_store.list_queue(ws)] == [
        "thread-1",
        "thread-3",
        "thread-5",
    ]


async def test_a_run_for_an_unregistered_workspace_fails_with_what_to_do(
    station_store: SqliteStore, data_dir: workspaces.DataDir, clock: FrozenClock
) -> None:
    with pytest.raises(RegistryError, match="outloop workspace add"):
        await cycle(station_store, data_dir, "ws-nobody", clock, InMemoryProvider(MAILBOX))


async def test_an_unreadable_mailbox_is_an_access_gap_and_the_other_mailboxes_still_run(
    station_store: SqliteStore, data_dir: workspaces.DataDir, clock: FrozenClock,
    register: Callable[[str], str], tmp_path: Path,
) -> None:  # fmt: skip
    extra = f"""\
    mailboxes:
      - {{mailbox_id: {MAILBOX}, provider: memory}}
      - {{mailbox_id: archive@fabrikam.test, provider: maildir, path: {tmp_path / "missing"}}}
    """
    text = context_yaml().replace(
        f"mailboxes:\n  - {{mailbox_id: {MAILBOX}, provider: memory}}\n", ""
    )
    ws = register(text + textwrap.dedent(extra))
    box = InMemoryProvider(MAILBOX)
    box.deliver(make_envelope(mailbox_id=MAILBOX, message_no=1, thread_no=1))
    archive = MaildirProvider(tmp_path / "missing", "archive@fabrikam.test")
    result = await cycle(station_store, data_dir, ws, clock, box, archive)
    assert [i.disposition for i in result.items] == [Disposition.QUEUED]
    [error] = result.access_errors
    assert error.startswith("archive@fabrikam.test: no Maildir at") and "create it" in error
    [health] = station_store.list_health()
    assert health.key == "mailbox archive@fabrikam.test (maildir)"
    assert result.reconciliation is not None and result.reconciliation.scanned == 1


async def test_a_new_run_reconciles_the_open_runs_of_dead_workers(
    station_store: SqliteStore,
    data_dir: workspaces.DataDir,
    clock: FrozenClock,
    register: Callable[[str], str],
) -> None:
    ws = register(context_yaml())
    station_store.start_run(
        "run-dead", ws, f"{socket.gethostname()}/{_pid_namespace()}/999999999/1/dead", clock.now()
    )
    station_store.start_run("run-elsewhere", ws, "another-host.test/1/1/x", clock.now())
    result = await cycle(station_store, data_dir, ws, clock, InMemoryProvider(MAILBOX))
    assert [r.run_id for r in result.reconciled_stale] == ["run-dead"]
    # A run held on another machine cannot be proven dead from here: it stays open.
    [elsewhere] = station_store.unreconciled_runs(ws)
    assert (elsewhere.run_id, elsewhere.holder) == ("run-elsewhere", "another-host.test/1/1/x")


async def test_a_run_on_another_machine_is_reconciled_once_its_lease_ran_out(
    station_store: SqliteStore,
    data_dir: workspaces.DataDir,
    clock: FrozenClock,
    register: Callable[[str], str],
) -> None:
    ws = register(context_yaml())
    other = "another-host.test/1/1/x"
    start = clock.now()
    station_store.start_run("run-leased", ws, other, start, start + intake.RUN_LEASE)
    station_store.record_scanned([LedgerEntry(run_id="run-leased", item_ref="a")], start)
    first = await cycle(station_store, data_dir, ws, clock, InMemoryProvider(MAILBOX))
    assert first.reconciled_stale == []  # its lease still runs: the other machine works on
    clock.advance(minutes=14)
    assert station_store.renew_run("run-leased", other, clock.now() + intake.RUN_LEASE)
    clock.advance(minutes=14)
    second = await cycle(station_store, data_dir, ws, clock, InMemoryProvider(MAILBOX))
    assert second.reconciled_stale == []  # renewed in time
    clock.advance(minutes=2)
    third = await cycle(station_store, data_dir, ws, clock, InMemoryProvider(MAILBOX))
    [stale] = third.reconciled_stale
    assert stale.run_id == "run-leased" and stale.reconciliation_failed == 1
    # The machine that lost its run can no longer renew it.
    assert not station_store.renew_run("run-leased", other, clock.now() + intake.RUN_LEASE)


async def test_a_long_run_renews_its_own_lease_as_it_goes(
    station_store: SqliteStore,
    data_dir: workspaces.DataDir,
    clock: FrozenClock,
    register: Callable[[str], str],
) -> None:
    ws = register(context_yaml())
    box = InMemoryProvider(MAILBOX)
    for n in range(1, 4):
        box.deliver(make_envelope(mailbox_id=MAILBOX, message_no=n, thread_no=n))
    renewals: list[datetime] = []
    real_claim = station_store.claim

    def slow_claim(*args: Any, **kwargs: Any) -> Any:
        clock.advance(minutes=6)  # every item takes six minutes of the run's lease
        return real_claim(*args, **kwargs)

    real_renew = station_store.renew_run

    def renew(run_id: str, holder: str, until: datetime) -> bool:
        renewals.append(until)
        return real_renew(run_id, holder, until)

    setattr(station_store, "claim", slow_claim)  # noqa: B010
    setattr(station_store, "renew_run", renew)  # noqa: B010
    result = await cycle(station_store, data_dir, ws, clock, box)
    assert result.reconciliation is not None and result.reconciliation.clean
    # Once when the scan is recorded, then before the second and the third item (6 and 12
    # minutes in).
    assert len(renewals) == 3
    assert renewals == sorted(renewals)
