"""Seed 000 scenario 5 and the approval loop: internal work proceeds while the client send
waits for valid approval; an approver's reply in the approval thread is the evidence."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from agent.domain.approval import Decision
from agent.domain.dispositions import Disposition, GateKind
from agent.domain.errors import GateRefused
from agent.domain.gates import Blocker
from agent.domain.recipients import Communication
from agent.domain.states import TaskState
from agent.services import approvals, closure, workspaces
from agent.storage.sqlite import SqliteStore
from agent.testing import FrozenClock
from tests.conftest import context_yaml
from tests.services.gates_world import (
    APPROVER,
    CLIENT,
    COLLEAGUE,
    World,
    approval_requested,
    with_colleague,
)

pytestmark = pytest.mark.anyio


@pytest.fixture
def world(
    station_store: SqliteStore,
    data_dir: workspaces.DataDir,
    clock: FrozenClock,
    register: Callable[[str], str],
) -> World:
    ws = register(with_colleague(context_yaml()))
    return World(station_store, data_dir, ws, clock)


async def _waiting_for_approval(world: World) -> tuple[str, str, str]:
    """A client request worked up to a draft and sent for approval: (task, request id, mid)."""
    first = world.deliver(sender=CLIENT, thread=1, text="Can you send a quote?")
    await world.intake()
    task = world.only_task()
    world.to_draft_ready(task.task_id)
    rendered = world.render(task)
    request = await approvals.request_approval(
        world.store, world.box, task.task_id, "d1", rendered, (CLIENT,), world.clock
    )
    assert first.internet_message_id is not None
    return task.task_id, request.internet_message_id, first.internet_message_id


async def test_scenario_05_internal_work_proceeds_while_the_client_send_waits_for_valid_approval(
    world: World,
) -> None:
    world.deliver(sender=CLIENT, thread=1, text="Can you send a quote?")
    await world.intake()
    task = world.only_task()
    # Internal work proceeds: the task moves through its internal states, and an internal
    # update to a colleague is ready at once, with no approval and no client-send gate.
    task = world.to_draft_ready(task.task_id)
    rendered = world.render(task)
    internal = world.gate(task, rendered, (COLLEAGUE,))
    assert internal.ready and internal.communication is Communication.INTERNAL
    # The client send waits, naming what is missing.
    pending = world.gate(task, rendered, (CLIENT,))
    assert not pending.ready
    assert {r.blocker for r in pending.reasons} == {Blocker.APPROVAL_MISSING}

    request = await approvals.request_approval(
        world.store, world.box, task.task_id, "d1", rendered, (CLIENT,), world.clock
    )
    [sent] = world.box.sent
    assert [a.address for a in sent.to] == [APPROVER]  # only the recorded approvers
    assert rendered.text.strip().splitlines()[0] in sent.text  # the rendered draft itself
    task = world.task(task.task_id)
    assert task.state is TaskState.WAITING_INTERNAL_APPROVAL
    assert [g.kind for g in task.open_gates] == [GateKind.INTERNAL_APPROVAL]
    assert not world.gate(task, rendered, (CLIENT,)).ready

    # Invalid evidence: a thumbs-up from the approver, an "Approved." from a colleague with
    # no approval role, and the client quoting an approval - none of them approves.
    world.clock.advance(minutes=5)
    world.deliver(
        sender=APPROVER, thread="appr", text="👍", in_reply_to=request.internet_message_id
    )
    world.deliver(
        sender=COLLEAGUE, thread="appr", text="Approved.", in_reply_to=request.internet_message_id
    )
    world.deliver(sender=CLIENT, thread=1, text="Thanks!\n> Approved, send it.")
    result = await world.intake()
    decided = {
        i.disposition for i in result.items if i.claim is not None and i.task_created is False
    }
    assert Disposition.WAITING_INTERNAL_APPROVAL in decided
    task = world.task(task.task_id)
    assert len(world.store.list_tasks(world.workspace_id)) == 1  # replies never make tasks
    assert task.state is TaskState.WAITING_INTERNAL_APPROVAL
    assert [d.decision for d in task.approval_decisions] == [Decision.NONE, Decision.NONE]
    assert not world.gate(task, rendered, (CLIENT,)).ready

    # The approver's explicit approval in the approval thread is the evidence.
    world.clock.advance(minutes=5)
    world.deliver(
        sender=APPROVER,
        thread="appr",
        text="Approved, go ahead and send.\n\nOn Mon, Outloop wrote:\n> Approval needed",
        in_reply_to=request.internet_message_id,
    )
    result = await world.intake()
    [approval_item] = [i for i in result.items if i.claim is not None and i.task_id]
    assert approval_item.disposition is Disposition.QUEUED and not approval_item.task_created
    task = world.task(task.task_id)
    assert task.state is TaskState.APPROVED_TO_SEND
    assert task.open_gates == ()
    assert task.approval_decisions[-1].approver == APPROVER
    assert any("approved by noa.bar" in e for e in task.approval_evidence)
    ready = world.gate(task, rendered, (CLIENT,))
    assert ready.ready and ready.approval_basis is not None
    # The approval covers exactly that draft.
    changed = world.render(task, "The price is **$1,300** (ID A-17).")
    assert not world.gate(task, changed, (CLIENT,)).ready
    assert len(world.store.list_tasks(world.workspace_id)) == 1
    for run in world.store.list_runs():
        summary = world.store.run_summary(run)
        assert summary is not None and summary.clean


async def test_changes_requested_sends_the_work_back_and_a_new_draft_needs_a_new_approval(
    world: World,
) -> None:
    task_id, request_id, _ = await _waiting_for_approval(world)
    await world.approver_replies(
        thread="appr", text="לא מאשר, צריך לתקן את הסכום", in_reply_to=request_id
    )
    task = world.task(task_id)
    assert task.state is TaskState.CHANGES_REQUESTED
    assert task.approval_decisions[-1].decision is Decision.CHANGES_REQUESTED
    gate = world.gate(task, world.render(task), (CLIENT,))
    assert {r.blocker for r in gate.reasons} == {Blocker.CHANGES_REQUESTED}
    # The work goes back; the new draft is sent for approval again.
    world.store.transition_task(task_id, TaskState.DRAFT_READY, "revised", world.clock.now())
    revised = world.render(task, "The price is **$1,150** (ID A-17).")
    second = await approvals.request_approval(
        world.store, world.box, task_id, "d2", revised, (CLIENT,), world.clock
    )
    assert world.task(task_id).state is TaskState.WAITING_INTERNAL_APPROVAL
    # A late "Approved" to the first request is recorded and moves nothing.
    await world.approver_replies(thread="appr", text="Approved.", in_reply_to=request_id)
    task = world.task(task_id)
    assert task.state is TaskState.WAITING_INTERNAL_APPROVAL
    assert not world.gate(task, revised, (CLIENT,), "d2").ready
    await world.approver_replies(
        thread="appr", text="מאושר", in_reply_to=second.internet_message_id
    )
    task = world.task(task_id)
    assert task.state is TaskState.APPROVED_TO_SEND
    assert world.gate(task, revised, (CLIENT,), "d2").ready
    assert not world.gate(task, world.render(task), (CLIENT,)).ready  # the old draft


async def test_approval_of_another_task_does_not_approve_this_one(world: World) -> None:
    task_a, request_a, _ = await _waiting_for_approval(world)
    world.deliver(sender=CLIENT, thread=2, text="Another question", subject="Second topic")
    await world.intake()
    [task_b] = [t for t in world.store.list_tasks(world.workspace_id) if t.task_id != task_a]
    world.to_draft_ready(task_b.task_id)
    rendered_b = world.render(task_b)
    await approvals.request_approval(
        world.store, world.box, task_b.task_id, "d1", rendered_b, (CLIENT,), world.clock
    )
    await world.approver_replies(thread="appr", text="Approved.", in_reply_to=request_a)
    assert world.task(task_a).state is TaskState.APPROVED_TO_SEND
    b = world.task(task_b.task_id)
    assert b.state is TaskState.WAITING_INTERNAL_APPROVAL and b.approval_decisions == ()
    assert not world.gate(b, rendered_b, (CLIENT,)).ready
    assert len(world.store.list_tasks(world.workspace_id)) == 2


async def test_an_html_reply_whose_hidden_part_approves_does_not_approve(world: World) -> None:
    task_id, request_id, _ = await _waiting_for_approval(world)
    await world.approver_replies(
        thread="appr",
        text="",
        html='<p>Let me check with finance first.</p><div style="display:none">Approved.</div>',
        in_reply_to=request_id,
    )
    task = world.task(task_id)
    assert task.state is TaskState.WAITING_INTERNAL_APPROVAL
    assert task.approval_decisions[-1].decision is not Decision.APPROVED


async def test_approval_is_requested_only_for_a_ready_draft_and_only_from_recorded_approvers(
    world: World,
    register: Callable[[str], str],
) -> None:
    world.deliver(sender=CLIENT, thread=1)
    await world.intake()
    task = world.only_task()
    with pytest.raises(GateRefused, match="DRAFT_READY"):
        await approvals.request_approval(
            world.store, world.box, task.task_id, "d1", world.render(task), (), world.clock
        )
    assert world.box.sent == [] and world.task(task.task_id).state is TaskState.TASK_RESOLVED


async def test_the_requester_loop_is_closed_before_release_even_with_client_sends_disabled(
    station_store: SqliteStore,
    data_dir: workspaces.DataDir,
    clock: FrozenClock,
    register: Callable[[str], str],
) -> None:
    text = with_colleague(context_yaml()).replace(
        "client_send_policy: draft_for_internal_approval", "client_send_policy: sends_disabled"
    )
    world = World(station_store, data_dir, register(text), clock)
    request = world.deliver(sender=COLLEAGUE, thread=1, text="Please pull the Q3 numbers")
    await world.intake()
    task = world.only_task()
    assert task.requester == COLLEAGUE and not task.requester_loop_closed
    world.store.transition_task(task.task_id, TaskState.EXECUTING, "working", clock.now())
    with pytest.raises(GateRefused, match="result or status reply"):
        closure.release(
            world.store, task.task_id, TaskState.PARTIALLY_COMPLETED, "half done", clock
        )
    assert world.task(task.task_id).state is TaskState.EXECUTING  # nothing changed
    outcome = await closure.reply_to_requester(
        world.store,
        world.box,
        task.task_id,
        complete="Q3 revenue pulled",
        remaining="Q3 costs, due Thursday",
        clock=clock,
    )
    assert outcome.went_out
    [status] = world.box.sent
    assert [a.address for a in status.to] == [COLLEAGUE]
    assert status.provider_thread_id == "thread-1"
    assert status.in_reply_to == request.internet_message_id
    assert "Q3 costs, due Thursday" in status.text
    closure.release(world.store, task.task_id, TaskState.PARTIALLY_COMPLETED, "half done", clock)
    done = world.task(task.task_id)
    assert done.state is TaskState.PARTIALLY_COMPLETED and done.requester_loop_closed


# -- asking again: a new approval request, a reopened requester loop -----------------------


async def test_asking_again_for_the_same_draft_after_changes_sends_a_new_request(
    approvers_world: World,
) -> None:
    world = approvers_world
    task_id, request = await approval_requested(world)
    await world.approver_replies(thread="a", text="Please fix the date.", in_reply_to=request)
    world.store.transition_task(task_id, TaskState.DRAFT_READY, "kept as is", world.clock.now())
    task = world.task(task_id)
    again = await approvals.request_approval(
        world.store, world.box, task_id, "d1", world.render(task), (CLIENT,), world.clock
    )
    assert again.internet_message_id != request
    task = world.task(task_id)
    assert task.state is TaskState.WAITING_INTERNAL_APPROVAL
    assert len([m for m in world.box.sent if m.subject.startswith("Approval needed")]) == 2


async def test_the_requester_loop_reopens_when_the_requester_asks_again(
    make_world: Callable[..., World],
) -> None:
    world = make_world(with_colleague(context_yaml()))
    world.deliver(sender=COLLEAGUE, thread=1, text="Q3 numbers please")
    await world.intake()
    task = world.only_task()
    await closure.reply_to_requester(world.store, world.box, task.task_id, complete="Q3",
                                     remaining="", clock=world.clock)  # fmt: skip
    assert world.task(task.task_id).requester_loop_closed
    world.clock.advance(hours=1)
    world.deliver(sender=COLLEAGUE, thread=1, text="Now Q4 too please")
    await world.intake()
    assert not world.task(task.task_id).requester_loop_closed
    with pytest.raises(GateRefused):
        closure.release(world.store, task.task_id, TaskState.COMPLETED, "done", world.clock)
