"""The send gate holds at the moment mail would go: a failed preflight stops every message a
task would send (approval requests, status replies), and an approval counts only while its
approver still holds the role the context records."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from agent.domain.errors import GateRefused
from agent.services import approvals, closure, workspaces
from tests.conftest import context_yaml
from tests.services.gates_world import (
    CLIENT,
    COLLEAGUE,
    TWO_APPROVERS,
    World,
    approved_by_reply,
    ready_for_client,
    with_colleague,
)

pytestmark = pytest.mark.anyio


async def test_a_failed_preflight_stops_reminders_approval_requests_and_status_replies(
    make_world: Callable[..., World], tmp_path: Path
) -> None:
    world = make_world(with_colleague(context_yaml()))
    world.deliver(sender=COLLEAGUE, thread=1, text="Numbers please")
    await world.intake()
    task = world.only_task()
    world.to_draft_ready(task.task_id)
    source = tmp_path / "suspended.yaml"
    source.write_text(with_colleague(context_yaml(licence="suspended")), encoding="utf-8")
    workspaces.update_workspace(world.store, world.data_dir, source, world.clock.now())
    with pytest.raises(GateRefused, match="preflight"):
        await approvals.request_approval(
            world.store, world.box, task.task_id, "d1", world.render(task), (CLIENT,), world.clock
        )
    with pytest.raises(GateRefused, match="preflight"):
        await closure.reply_to_requester(
            world.store, world.box, task.task_id, complete="a", remaining="b", clock=world.clock
        )
    assert world.box.sent == []


async def test_an_approver_removed_from_the_context_no_longer_approves_at_send_time(
    make_world: Callable[..., World], tmp_path: Path
) -> None:
    world = make_world(TWO_APPROVERS)
    task_id, _, _ = await approved_by_reply(world)
    assert ready_for_client(world, task_id)
    source = tmp_path / "demoted.yaml"
    source.write_text(
        TWO_APPROVERS.replace("roles: [approver, client_manager]", "roles: [client_manager]"),
        encoding="utf-8",
    )
    workspaces.update_workspace(world.store, world.data_dir, source, world.clock.now())
    assert not ready_for_client(world, task_id)
