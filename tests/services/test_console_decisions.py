"""A person's approval or change request given in the console: judged and recorded in the
core by the rules an emailed one meets, whatever the page posted."""

from __future__ import annotations

import pytest

from agent.domain.approval import CONSOLE_EVIDENCE, Decision, judge_console
from agent.domain.dispositions import GateKind
from agent.domain.errors import GateRefused, TransitionError
from agent.domain.gates import draft_digest
from agent.domain.records import TaskAmendment
from agent.domain.states import TaskState
from agent.domain.task import Task
from agent.rendering.render import RenderedMessage
from agent.services import approvals, console, workspaces
from tests.services.gates_world import APPROVER, CLIENT, COLLEAGUE, World

pytestmark = pytest.mark.anyio


async def waiting(world: World) -> tuple[Task, RenderedMessage, str]:
    """A client request worked up to a draft and sent for approval: (task, draft, request)."""
    world.deliver(sender=CLIENT, thread=1, text="Can you send a quote?")
    await world.intake()
    task = world.to_draft_ready(world.only_task().task_id)
    rendered = world.render(task)
    request = await approvals.request_approval(
        world.store, world.box, task.task_id, "d1", rendered, (CLIENT,), world.clock
    )
    return world.task(task.task_id), rendered, request.internet_message_id


def digest(rendered: RenderedMessage) -> str:
    return draft_digest(rendered.subject, rendered.html, rendered.text)


def decide(world: World, task: Task, rendered: RenderedMessage, **changes: object) -> Task:
    given: dict[str, object] = {
        "approver": APPROVER, "decision": Decision.APPROVED, "draft_digest": digest(rendered),
        "recipients": (CLIENT,), "note": "", "where": "127.0.0.1 (session s-1)",
    }  # fmt: skip
    given.update(changes)
    return console.decide(world.store, task.task_id, world.clock, **given)  # type: ignore[arg-type]


async def test_an_approval_in_the_console_makes_the_send_possible_as_an_emailed_one_does(
    world: World,
) -> None:
    task, rendered, request_id = await waiting(world)
    assert not world.gate(task, rendered, (CLIENT,)).ready
    world.clock.advance(minutes=3)
    decided = decide(world, task, rendered)
    assert decided.state is TaskState.APPROVED_TO_SEND
    assert GateKind.INTERNAL_APPROVAL not in {g.kind for g in decided.open_gates}
    [decision] = decided.approval_decisions
    assert decision.approver == APPROVER and decision.request_message_id == request_id
    assert decision.evidence_message_id.startswith(CONSOLE_EVIDENCE)
    assert world.gate(decided, rendered, (CLIENT,)).ready
    [(_, state, event)] = world.store.task_events(task.task_id)[-1:]
    assert state is TaskState.APPROVED_TO_SEND
    assert f"approved by {APPROVER}" in event and "in the console from 127.0.0.1" in event


async def test_the_same_decision_by_a_person_without_the_approval_role_is_refused_and_changes_nothing(
    world: World,
) -> None:
    task, rendered, _ = await waiting(world)
    with pytest.raises(GateRefused, match="holds no recorded approval role"):
        decide(world, task, rendered, approver=COLLEAGUE)
    assert world.task(task.task_id) == task
    assert not world.gate(task, rendered, (CLIENT,)).ready


@pytest.mark.parametrize(
    ("changes", "why"),
    [
        ({"draft_digest": "0" * 64}, "the draft shown is not the one approval was requested for"),
        ({"recipients": (CLIENT, "someone@else.test")}, "the recipients shown are not the ones"),
        ({"decision": Decision.CHANGES_REQUESTED}, "a change request carries a note"),
        ({"decision": Decision.HELD}, "a person approves or requests changes"),
    ],
)
async def test_a_decision_on_another_draft_or_recipients_or_without_its_note_is_refused(
    world: World, changes: dict[str, object], why: str
) -> None:
    task, rendered, _ = await waiting(world)
    with pytest.raises(GateRefused, match=why):
        decide(world, task, rendered, **changes)
    assert world.task(task.task_id) == task


async def test_a_change_request_in_the_console_moves_the_task_back_with_its_note(
    world: World,
) -> None:
    task, rendered, _ = await waiting(world)
    decided = decide(
        world, task, rendered, decision=Decision.CHANGES_REQUESTED, note="Quote in euros."
    )
    assert decided.state is TaskState.CHANGES_REQUESTED
    assert "Quote in euros." in decided.next_action.description
    assert not world.gate(decided, rendered, (CLIENT,)).ready


async def test_console_and_emailed_decisions_count_together_on_one_request(world: World) -> None:
    task, rendered, request_id = await waiting(world)
    world.clock.advance(minutes=5)
    world.deliver(
        sender=APPROVER, thread="appr", text="Approved, go ahead.", in_reply_to=request_id
    )
    await world.intake()
    assert world.task(task.task_id).state is TaskState.APPROVED_TO_SEND
    world.clock.advance(minutes=5)
    decided = decide(
        world, world.task(task.task_id), rendered, decision=Decision.CHANGES_REQUESTED,
        note="Wait: the price changed.",
    )  # fmt: skip
    assert decided.state is TaskState.CHANGES_REQUESTED
    assert [d.decision for d in decided.approval_decisions] == [
        Decision.APPROVED, Decision.CHANGES_REQUESTED,
    ]  # fmt: skip
    assert not world.gate(decided, rendered, (CLIENT,)).ready


async def test_a_task_with_no_request_waiting_takes_no_decision(world: World) -> None:
    world.deliver(sender=CLIENT, thread=1, text="Can you send a quote?")
    await world.intake()
    task = world.to_draft_ready(world.only_task().task_id)
    with pytest.raises(GateRefused, match="no approval request waiting"):
        decide(world, task, world.render(task))


async def test_a_decision_on_a_request_no_longer_the_latest_is_refused_where_it_is_applied(
    world: World,
) -> None:
    task, rendered, _ = await waiting(world)
    context = workspaces.load_context(world.store, world.workspace_id)
    stale = judge_console(
        context, task.approval_requests[-1], approver=APPROVER, decision=Decision.APPROVED,
        draft_digest=digest(rendered), recipients=(CLIENT,), note="", evidence_id="e1",
        now=world.clock.now(),
    )  # fmt: skip
    assert not isinstance(stale, str)
    decide(world, task, rendered, decision=Decision.CHANGES_REQUESTED, note="Shorter.")
    world.clock.advance(minutes=1)
    world.store.transition_task(task.task_id, TaskState.DRAFT_READY, "revised", world.clock.now())
    revised = world.render(task, "The price is **$1,100** (ID A-17).")
    await approvals.request_approval(
        world.store, world.box, task.task_id, "d2", revised, (CLIENT,), world.clock
    )
    before = world.task(task.task_id)
    amendment = TaskAmendment(
        event="a decision read before the new request", approval_decision=stale
    )
    with pytest.raises(TransitionError, match="newer approval request"):
        world.store.amend_task(task.task_id, amendment, world.clock.now())
    assert world.task(task.task_id) == before
