"""The routing table of docs/gates.md: evidence -> disposition and owner, one test per row."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest

from agent.domain.dispositions import Disposition, GateKind
from agent.domain.records import TaskAmendment
from agent.domain.states import TaskState
from agent.domain.task import Gate, MessageRef, Task
from agent.services import approvals
from agent.services.intake import ItemOutcome
from tests.conftest import context_yaml
from tests.services.gates_world import (
    APPROVER,
    CLIENT,
    COLLEAGUE,
    MAILBOX,
    World,
    address,
)

pytestmark = pytest.mark.anyio


async def _one(world: World) -> ItemOutcome:
    result = await world.intake()
    claimed = [i for i in result.items if i.claim is not None]
    assert len(claimed) >= 1
    return claimed[-1]


async def _closes_as(world: World, disposition: Disposition) -> None:
    """The next intake closes the single item with ``disposition`` and completes its task."""
    item = await _one(world)
    assert item.disposition is disposition
    assert world.only_task().state is TaskState.COMPLETED


async def _single_gate(world: World, disposition: Disposition) -> Gate:
    """The next intake gives the single item ``disposition``: its task's one open gate."""
    item = await _one(world)
    assert item.disposition is disposition
    [gate] = world.only_task().open_gates
    return gate


async def _queued_from(world: World, sender: str) -> Task:
    """A first message from ``sender`` is queued: the task it opens."""
    world.deliver(sender=sender, thread=1)
    item = await _one(world)
    assert item.disposition is Disposition.QUEUED
    return world.only_task()


async def _client_task(world: World) -> Task:
    """The task a client's first message opens."""
    world.deliver(sender=CLIENT, thread=1)
    await world.intake()
    return world.only_task()


async def test_row_new_request_from_a_verified_client_is_queued_for_the_client_manager(
    world: World,
) -> None:
    task = await _queued_from(world, CLIENT)
    assert task.state is TaskState.TASK_RESOLVED and task.next_action.owner == APPROVER
    assert task.requester is None  # a client is not an internal requester


async def test_row_new_request_from_an_internal_colleague_opens_the_requester_loop(
    world: World,
) -> None:
    assert (await _queued_from(world, COLLEAGUE)).requester == COLLEAGUE


async def test_row_preflight_failure_is_escalated_to_the_escalation_contact(
    make_world: Callable[..., World],
) -> None:
    world = make_world(context_yaml(licence="suspended"))
    world.deliver(sender=CLIENT, thread=1)
    gate = await _single_gate(world, Disposition.ESCALATED)
    assert gate.kind is GateKind.PREFLIGHT and gate.owner == APPROVER


async def test_row_a_bounce_of_a_task_message_joins_its_task_and_is_escalated(world: World) -> None:
    world.deliver(sender=CLIENT, thread=1)
    await world.intake()
    task = world.to_draft_ready(world.only_task().task_id)
    request = await approvals.request_approval(
        world.store, world.box, task.task_id, "d1", world.render(task), (CLIENT,), world.clock
    )
    world.deliver(
        sender="mailer-daemon@fabrikam.test",
        thread="bounce",
        subject="Undelivered Mail Returned to Sender",
        report_type="delivery-status",
        report_failed=True,
        reported_message_id=request.internet_message_id,
    )
    item = await _one(world)
    assert item.disposition is Disposition.ESCALATED and not item.task_created
    task = world.only_task()
    assert any(
        g.kind is GateKind.ESCALATION and "not delivered" in g.reason for g in task.open_gates
    )


async def test_row_a_bounce_linked_to_nothing_is_noise(world: World) -> None:
    world.deliver(
        sender="mailer-daemon@elsewhere.test",
        thread="bounce",
        report_type="delivery-status",
        report_failed=True,
        reported_message_id="<never-seen@elsewhere.test>",
    )
    await _closes_as(world, Disposition.NOISE_EXCLUDED)


async def test_row_an_out_of_office_reply_joins_the_thread_and_keeps_waiting_client(
    world: World,
) -> None:
    task = await _client_task(world)
    world.store.transition_task(task.task_id, TaskState.WAITING_CLIENT, "asked", world.clock.now())
    world.deliver(sender=CLIENT, thread=1, subject="Out of office", auto_submitted="auto-replied")
    item = await _one(world)
    assert item.disposition is Disposition.NOISE_EXCLUDED and item.task_id == task.task_id
    after = world.task(task.task_id)
    assert after.state is TaskState.WAITING_CLIENT and len(after.messages) == 2


@pytest.mark.parametrize(
    "changes",
    [
        {"auto_submitted": "auto-generated"},
        {"precedence": "bulk"},
        {"list_id": "<news.example.test>"},
    ],
)
async def test_row_clear_automated_or_list_mail_from_an_unknown_sender_is_noise(
    world: World, changes: dict[str, Any]
) -> None:
    world.deliver(sender="news@example.test", thread=1, **changes)
    await _closes_as(world, Disposition.NOISE_EXCLUDED)


async def test_row_list_mail_from_a_known_contact_goes_to_a_human_not_to_silence(
    world: World,
) -> None:
    world.deliver(sender=CLIENT, thread=1, list_id="<clients.contoso.test>")
    gate = await _single_gate(world, Disposition.AWAITING_ASSIGNMENT)
    assert gate.kind is GateKind.ASSIGNMENT and gate.owner == APPROVER


async def test_row_the_workspaces_own_mail_come_back_is_a_loop(world: World) -> None:
    world.deliver(sender=MAILBOX, thread=1)
    item = await _one(world)
    assert item.disposition is Disposition.NOISE_EXCLUDED and "own mailbox" in item.detail


async def test_row_a_sender_with_conflicting_class_is_escalated(
    make_world: Callable[..., World],
) -> None:
    text = context_yaml().replace("default_cc: []", "default_cc: [dana.levi@contoso.test]")
    world = make_world(text)
    world.deliver(sender=CLIENT, thread=1)
    item = await _one(world)
    assert item.disposition is Disposition.ESCALATED
    assert [g.kind for g in world.only_task().open_gates] == [GateKind.ESCALATION]


async def test_row_no_owner_in_the_context_awaits_assignment_in_the_unresolved_queue(
    make_world: Callable[..., World],
) -> None:
    text = (
        context_yaml()
        .replace("roles: [approver, client_manager]", "roles: [approver]")
        .replace("escalation_contact: noa.bar@fabrikam.test\n", "")
    )
    world = make_world(text)
    world.deliver(sender=CLIENT, thread=1)
    item = await _one(world)
    assert item.disposition is Disposition.AWAITING_ASSIGNMENT
    kinds = {g.kind: g for g in world.only_task().open_gates}
    assert kinds[GateKind.ASSIGNMENT].owner == "unresolved"
    assert GateKind.CONTEXT_GAP in kinds  # the missing escalation contact is also a gap


async def test_row_an_attachment_in_a_format_outside_the_context_asks_for_clarification(
    world: World,
) -> None:
    world.deliver(
        sender=CLIENT,
        thread=1,
        attachment_refs=("pm-x/0", "pm-x/1"),
        attachment_names=("contract.pdf", "figures.numbers"),
    )
    item = await _one(world)
    assert item.disposition is Disposition.QUEUED
    task = world.only_task()
    # The attachment is named by its position: its name is untrusted text.
    assert "attachment 2 (of 2)" in task.next_action.description
    assert "figures.numbers" not in task.next_action.description
    assert task.attachment_names == ("contract.pdf", "figures.numbers")


async def test_row_an_internal_fyi_with_the_mailbox_only_in_cc_needs_no_reply(world: World) -> None:
    world.deliver(
        sender=COLLEAGUE,
        thread=1,
        to=(address("someone@fabrikam.test"),),
        cc=(address(MAILBOX),),
    )
    await _closes_as(world, Disposition.CLOSED_NO_REPLY_NEEDED)


async def test_row_a_message_older_than_the_threads_sent_reply_is_already_answered(
    world: World,
) -> None:
    task = await _client_task(world)
    world.store.amend_task(
        task.task_id,
        TaskAmendment(
            event="reply sent (recorded by the send service)",
            sent_message=MessageRef(
                provider_message_id="sent-1",
                internet_message_id="<sent-1@fabrikam.test>",
                direction="client_reply",
                received_at=world.clock.now(),
                sender=MAILBOX,
            ),
        ),
        world.clock.now(),
    )
    # A message written before that reply reaches the scan late (delayed delivery).
    late = world.deliver(
        sender=CLIENT, thread=1, received_at=world.clock.now() - timedelta(minutes=30)
    )
    result = await world.intake()
    [item] = [i for i in result.items if i.item_ref.endswith("/" + late.provider_message_id)]
    assert item.disposition is Disposition.ALREADY_ANSWERED


async def test_row_a_client_reply_resumes_a_task_waiting_on_the_client(world: World) -> None:
    task = await _client_task(world)
    world.store.transition_task(task.task_id, TaskState.WAITING_CLIENT, "asked", world.clock.now())
    world.clock.advance(hours=1)
    world.deliver(sender=CLIENT, thread=1)
    item = await _one(world)
    assert item.disposition is Disposition.QUEUED
    assert world.task(task.task_id).state is TaskState.TASK_RESOLVED


async def test_row_a_display_name_with_a_bidi_override_is_flagged_wherever_it_is_shown(
    world: World,
) -> None:
    world.deliver(
        sender=CLIENT,
        sender_name="Dana \u202eecnaniF",
        thread=1,
        attachment_names=("invoice\u202efdp.exe",),
        attachment_refs=("pm-1/0",),
    )
    await world.intake()
    task = world.only_task()
    assert task.sender_name == "⚠ Dana [U+202E]ecnaniF"
    assert task.attachment_names == ("⚠ invoice[U+202E]fdp.exe",)
    flags = " | ".join(task.content_flags)
    assert "sender display name: bidi control" in flags and "attachment" in flags
