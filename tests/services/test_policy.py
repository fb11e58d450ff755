"""Policy that never gates detection: rollout stages, context gaps, mixed-client isolation."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from agent.domain.dispositions import Disposition, GateKind
from agent.domain.gates import Blocker
from agent.domain.states import TaskState
from agent.services import workspaces
from agent.storage.sqlite import SqliteStore
from agent.testing import FrozenClock, InMemoryProvider
from tests.conftest import context_yaml, run_intake
from tests.services.gates_world import APPROVER, CLIENT, MAILBOX, World

pytestmark = pytest.mark.anyio

DISABLED = ("client_send_policy: draft_for_internal_approval", "client_send_policy: sends_disabled")


def _mixed_mailbox(world: World) -> None:
    """New work, a follow-up, noise, an unreadable item and a context-gap-free request."""
    first = world.deliver(sender=CLIENT, thread=1, text="Quote please")
    world.clock.advance(seconds=1)
    world.deliver(sender=CLIENT, thread=1, in_reply_to=first.internet_message_id)
    world.deliver(sender="news@example.test", thread=2, list_id="<news.example.test>")
    world.deliver(sender="someone@unknown.test", thread=3)
    world.box.deliver_unreadable("broken-1", "no header block could be read")


async def test_sends_disabled_holds_client_sends_and_suppresses_no_detection_or_recording(
    tmp_path: Path,
) -> None:
    """The same mailbox under both policies: identical intake, tasks, classification,
    escalation and reconciliation; only the client send is held."""
    outcomes: dict[str, list[tuple[str, Disposition]]] = {}
    for policy, text in (
        ("default", context_yaml()),
        ("sends_disabled", context_yaml().replace(*DISABLED)),
    ):
        root = tmp_path / policy
        root.mkdir()
        data_dir = workspaces.DataDir(root)
        store = SqliteStore(data_dir.database)
        (root / "ctx.yaml").write_text(text, encoding="utf-8")
        clock = FrozenClock()
        ws = workspaces.add_workspace(store, data_dir, root / "ctx.yaml", clock.now()).workspace_id
        world = World(store, data_dir, ws, clock)
        _mixed_mailbox(world)
        result = await world.intake()
        assert result.reconciliation is not None and result.reconciliation.clean
        outcomes[policy] = sorted((i.item_ref, i.disposition) for i in result.items)
        assert len(store.list_tasks(ws)) == 3  # task creation
        assert len(store.list_escalations(ws)) == 1  # escalation
        task = next(t for t in store.list_tasks(ws) if t.sender_identity == CLIENT)
        world.to_draft_ready(task.task_id)
        internal = world.gate(world.task(task.task_id), world.render(task), (APPROVER,))
        client = world.gate(world.task(task.task_id), world.render(task), (CLIENT,))
        assert internal.ready  # an internal reply is never held by the rollout stage
        blockers = {r.blocker for r in client.reasons}
        if policy == "sends_disabled":
            assert Blocker.SENDS_DISABLED in blockers
        else:
            assert Blocker.SENDS_DISABLED not in blockers
        store.close()
    assert outcomes["default"] == outcomes["sends_disabled"]
    assert {d for _, d in outcomes["default"]} >= {
        Disposition.QUEUED,
        Disposition.NOISE_EXCLUDED,
        Disposition.ESCALATED,
    }


async def test_scenario_04_only_an_operators_context_update_makes_a_kpi_official(
    station_store: SqliteStore,
    data_dir: workspaces.DataDir,
    clock: FrozenClock,
    tmp_path: Path,
) -> None:
    source = tmp_path / "ctx.yaml"
    source.write_text(context_yaml(kpis=False), encoding="utf-8")
    ws = workspaces.add_workspace(station_store, data_dir, source, clock.now()).workspace_id
    world = World(station_store, data_dir, ws, clock)
    world.deliver(sender=CLIENT, thread=1)
    result = await world.intake()
    assert [i.disposition for i in result.items] == [Disposition.CONTEXT_GAP_DISCOVERY]
    gap_task = world.only_task()
    assert gap_task.provisional_basis["first_response_hours"] == "24"
    # Safe discovery continues: the task is worked while the gap is open.
    world.store.transition_task(gap_task.task_id, TaskState.EXECUTING, "discovery", clock.now())
    # Many more runs never turn the provisional value into an official one.
    for n in range(3):
        world.deliver(sender=CLIENT, thread=10 + n)
        await world.intake()
    assert workspaces.load_context(station_store, ws).kpis.official == {}
    # The operator's update is the only path: new work then has no gap, and the old task's
    # provisional basis stays labelled provisional.
    source.write_text(context_yaml(), encoding="utf-8")
    workspaces.update_workspace(station_store, data_dir, source, clock.now())
    assert workspaces.load_context(station_store, ws).kpis.official == {"first_response_hours": 8}
    world.deliver(sender=CLIENT, thread=20)
    result = await world.intake()
    assert [i.disposition for i in result.items if i.task_created] == [Disposition.QUEUED]
    old = world.task(gap_task.task_id)
    assert "never an official KPI" in old.provisional_basis["basis"]
    assert any(g.kind is GateKind.CONTEXT_GAP for g in old.open_gates)


async def test_a_draft_with_another_workspaces_client_data_is_held_by_the_gate(
    station_store: SqliteStore,
    data_dir: workspaces.DataDir,
    clock: FrozenClock,
    register: Callable[[str], str],
) -> None:
    ws = register(context_yaml())
    register(
        context_yaml("ws-tailspin-0002", mailbox="ops@tailspin.test").replace(
            "dana.levi@contoso.test", "avi.cohen@wingtip.test"
        )
    )
    world = World(station_store, data_dir, ws, clock, box=InMemoryProvider(MAILBOX))
    world.deliver(sender=CLIENT, thread=1)
    await run_intake(station_store, data_dir, ws, clock, world.box)
    task = world.to_draft_ready(world.only_task().task_id)
    leaking = world.render(task, "Same terms as we gave avi.cohen@wingtip.test last week.")
    gate = world.gate(task, leaking, (CLIENT,))
    assert Blocker.FOREIGN_CONTENT in {r.blocker for r in gate.reasons}
    clean = world.gate(task, world.render(task), (CLIENT,))
    assert Blocker.FOREIGN_CONTENT not in {r.blocker for r in clean.reasons}
    to_other_client = world.gate(task, world.render(task), ("avi.cohen@wingtip.test",))
    assert Blocker.FOREIGN_RECIPIENT in {r.blocker for r in to_other_client.reasons}
