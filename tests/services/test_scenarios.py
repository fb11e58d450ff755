"""Seed 000 section 12 acceptance scenarios for the lifecycle core, each a named test."""

from __future__ import annotations

import hashlib
import multiprocessing
import random
from collections.abc import Callable
from email.message import EmailMessage
from pathlib import Path
from typing import Any

import anyio
import pytest
import yaml

from agent.domain.context import MailboxBinding
from agent.domain.dispositions import CLAIM_RACE, NON_TERMINAL, TERMINAL, Disposition
from agent.domain.execution import ClaimOutcome
from agent.domain.states import TaskState
from agent.providers.maildir import MaildirProvider
from agent.services import bootstrap, intake, workspaces
from agent.storage.sqlite import SqliteStore
from agent.testing import FrozenClock, InMemoryProvider, make_envelope
from tests.conftest import context_yaml
from tests.services.conftest import Station, new_maildir

pytestmark = pytest.mark.anyio
MAILBOX = "support@fabrikam.test"


async def test_scenario_01_a_new_message_resolves_one_workspace_claims_once_and_creates_one_task(
    station: Station,
) -> None:
    ws, box = station.inbox(context_yaml())
    box.deliver(
        make_envelope(
            mailbox_id=MAILBOX, message_no=1, thread_no=1, sender="dana.levi@contoso.test"
        )
    )
    result = await station.cycle(ws, box)
    [item] = result.items
    assert item.claim is ClaimOutcome.CLAIMED and item.task_created
    assert item.disposition is Disposition.QUEUED
    [task] = station.store.list_tasks(ws)
    assert task.task_id == item.task_id and task.workspace_id == ws
    assert task.state is TaskState.TASK_RESOLVED and task.sender_side == "client"
    assert task.next_action.owner == "noa.bar@fabrikam.test"
    assert task.title == "Request 1" and task.original_subject == "Request 1"
    assert station.store.counts()["executions"] == 1
    assert result.reconciliation is not None and result.reconciliation.clean


def _race_worker(db: str, ctx_root: str, ws: str, seed: int, barrier: Any) -> None:
    store = SqliteStore(Path(db))
    box = InMemoryProvider(MAILBOX)
    for n in range(20):
        box.deliver(make_envelope(mailbox_id=MAILBOX, message_no=n, thread_no=n // 2))
    random.Random(seed).shuffle(box.inbox)
    barrier.wait(timeout=60)
    anyio.run(
        lambda: intake.run_cycle(
            store=store, data_dir=workspaces.DataDir(Path(ctx_root)), workspace_id=ws,
            provider_for=lambda _w, _b: box, clock=FrozenClock(),
        )
    )  # fmt: skip
    store.close()


def test_scenario_02_two_workers_racing_on_the_same_occurrences_create_one_claim_and_one_task(
    station_store: SqliteStore, data_dir: workspaces.DataDir, register: Callable[[str], str]
) -> None:
    ws = register(context_yaml())
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(2)
    procs = [
        ctx.Process(
            target=_race_worker,
            args=(str(data_dir.database), str(data_dir.root), ws, seed, barrier),
        )
        for seed in (1, 2)
    ]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=120)
        assert p.exitcode == 0
    counts = station_store.counts()
    assert counts["executions"] == 20 and counts["executions_done"] == 20
    assert counts["tasks"] == 10  # one per thread
    claimed = [
        e for run in station_store.list_runs() for e in station_store.ledger(run)
        if e.disposition not in CLAIM_RACE
    ]  # fmt: skip
    assert len(claimed) == 20  # each occurrence claimed by exactly one of the two workers


async def test_scenario_03_a_replay_after_completion_creates_nothing_and_is_fully_reconciled(
    station: Station,
) -> None:
    ws, box = station.inbox(context_yaml())
    for n in range(4):
        box.deliver(make_envelope(mailbox_id=MAILBOX, message_no=n, thread_no=n // 2))
    await station.cycle(ws, box)
    before = station.store.counts()
    tasks_before = station.store.list_tasks(ws)
    nothing_new = await station.cycle(ws, box)
    assert nothing_new.items == [] and nothing_new.reconciliation is not None
    assert nothing_new.reconciliation.clean and nothing_new.reconciliation.scanned == 0
    replay = await station.cycle(ws, box, from_start=True)
    assert {i.disposition for i in replay.items} == {Disposition.EXECUTION_ALREADY_DONE}
    after = station.store.counts()
    assert after["tasks"] == before["tasks"] == 2
    assert after["executions"] == before["executions"]
    assert station.store.list_tasks(ws) == tasks_before
    rec = replay.reconciliation
    assert rec is not None and rec.clean and rec.scanned == rec.claim_race == 4


async def test_scenario_04_missing_context_is_a_context_gap_and_no_provisional_value_becomes_official(
    station: Station,
) -> None:
    ws, box = station.inbox(context_yaml(kpis=False))
    box.deliver(make_envelope(mailbox_id=MAILBOX, message_no=1, thread_no=1))
    box.deliver(make_envelope(mailbox_id=MAILBOX, message_no=2, thread_no=2))
    result = await station.cycle(ws, box)
    assert [i.disposition for i in result.items] == [Disposition.CONTEXT_GAP_DISCOVERY] * 2
    for task in station.store.list_tasks(ws):
        # Safe discovery continues: the task exists, is queued and names the gap and its owner.
        assert task.state is TaskState.IN_DISCOVERY
        [gate] = task.open_gates
        assert "kpis.official" in gate.reason and gate.owner == "noa.bar@fabrikam.test"
        assert task.provisional_basis["first_response_hours"] == "24"
        assert "never an official KPI" in task.provisional_basis["basis"]
    assert len(station.store.list_queue(ws)) == 2
    # The live context is untouched: still no official KPI.
    live = workspaces.load_context(station.store, ws)
    assert live.kpis.official == {}
    stored = yaml.safe_load(Path(station.store.get_workspace(ws).context_path).read_text())  # type: ignore[union-attr]
    assert stored["kpis"] == {"official": {}}


async def test_scenario_12_a_clean_install_has_zero_rows_and_registers_only_its_own_workspace(
    station_store: SqliteStore, data_dir: workspaces.DataDir, tmp_path: Path
) -> None:
    assert station_store.list_workspaces() == []
    assert station_store.counts()["tasks"] == 0
    maildir_path, _ = new_maildir(tmp_path)
    source = tmp_path / "context.yaml"
    source.write_text(context_yaml("ws-only-mine", provider="maildir", path=str(maildir_path)))

    def provider_for(workspace_id: str, binding: MailboxBinding) -> MaildirProvider:
        assert (workspace_id, binding.mailbox_id) == ("ws-only-mine", MAILBOX)
        return MaildirProvider(maildir_path, binding.mailbox_id)

    report = await bootstrap.bootstrap(
        station_store, data_dir, source, provider_for, FrozenClock().now()
    )
    assert report.runtime_operational and report.missing == []
    assert [m.ok for m in report.mailboxes] == [True]
    assert [w.workspace_id for w in station_store.list_workspaces()] == ["ws-only-mine"]
    assert [b.workspace_id for b in station_store.bindings_for_mailbox("maildir", MAILBOX)] == [
        "ws-only-mine"
    ]
    assert sorted(p.name for p in (data_dir.root / "workspaces").iterdir()) == ["ws-only-mine"]
    assert station_store.counts()["tasks"] == 0


def _tree_digest(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file() and not str(p.relative_to(root)).startswith(".Sent")
    }


async def test_scenario_13_no_provider_label_folder_or_flag_is_runtime_state(
    station: Station,
    tmp_path: Path,
) -> None:
    maildir_path, md = new_maildir(tmp_path)
    for n in range(3):
        msg = EmailMessage()
        msg["From"], msg["To"], msg["Subject"] = "dana.levi@contoso.test", MAILBOX, f"Question {n}"
        msg["Message-ID"] = f"<q{n}@contoso.test>"
        msg.set_content("body")
        md.add(msg.as_bytes())
    ws = station.register(context_yaml(provider="maildir", path=str(maildir_path)))
    before = _tree_digest(maildir_path)
    box = MaildirProvider(maildir_path, MAILBOX)
    first = await station.cycle(ws, box)
    second = await station.cycle(ws, box, from_start=True)
    # Byte-identical: no file moved from new/ to cur/, no flag suffix, no folder written.
    assert _tree_digest(maildir_path) == before
    assert not (maildir_path / ".Sent").exists()
    # State lives in the store: the replay knows the items are done without any mark.
    assert {i.disposition for i in first.items} == {Disposition.QUEUED}
    assert {i.disposition for i in second.items} == {Disposition.EXECUTION_ALREADY_DONE}


async def test_scenario_14_every_scanned_item_is_reconciled_to_exactly_one_outcome(
    station: Station,
) -> None:
    ws, box = station.inbox(context_yaml())
    first = make_envelope(mailbox_id=MAILBOX, message_no=1, thread_no=1)
    box.deliver(first)
    box.deliver(
        make_envelope(
            mailbox_id=MAILBOX, message_no=2, thread_no=1, in_reply_to=first.internet_message_id
        )
    )
    box.deliver(
        make_envelope(mailbox_id=MAILBOX, message_no=3, thread_no=3, auto_submitted="auto-replied")
    )
    dup = make_envelope(mailbox_id=MAILBOX, message_no=4, thread_no=4)
    box.deliver(dup)
    box.deliver(dup.model_copy(update={"provider_message_id": "pm-4-copy"}))  # delivered twice
    box.deliver_unreadable("pm-broken", "no header block could be read")
    result = await station.cycle(ws, box)
    ledger = station.store.ledger(result.run_id)
    assert len(ledger) == 6 and all(e.disposition is not None for e in ledger)
    by_item = {e.item_ref.removeprefix(f"memory:{MAILBOX}/"): e.disposition for e in ledger}
    assert by_item == {
        "pm-1": Disposition.QUEUED,
        "pm-2": Disposition.QUEUED,
        "pm-3": Disposition.NOISE_EXCLUDED,
        "pm-4": Disposition.QUEUED,
        "pm-4-copy": Disposition.EXECUTION_ALREADY_DONE,
        "pm-broken": Disposition.ESCALATED,
    }
    rec = result.reconciliation
    assert rec is not None and rec.clean
    assert rec.scanned == 6 == rec.terminal + rec.non_terminal + rec.claim_race
    assert (rec.terminal, rec.non_terminal, rec.claim_race) == (1, 4, 1)
    assert all(d in TERMINAL | NON_TERMINAL | CLAIM_RACE for d in by_item.values())
    [escalation] = station.store.list_escalations(ws)
    assert escalation.queue == "unresolved" and escalation.assignee == "noa.bar@fabrikam.test"
    assert "could not be normalized" in escalation.reason
    assert box.sent == []  # nothing is sent by intake


def test_scenario_tests_cover_the_core_scenarios() -> None:
    names = [n for n in globals() if n.startswith("test_scenario_")]
    numbers = sorted({n.split("_")[2] for n in names if n.split("_")[2].isdigit()})
    assert numbers == ["01", "02", "03", "04", "12", "13", "14"]
