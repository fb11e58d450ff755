"""A send some recipients refused is a partial delivery, never a plain success: the ledger
records who was refused, and the read-back leaves the task open for a person."""

from __future__ import annotations

import pytest

from agent.domain.mail import Handover, SendResult
from agent.domain.records import SendState
from agent.domain.states import TaskState
from agent.services import replies
from agent.testing import InMemoryProvider
from tests.services.gates_world import APPROVER, CLIENT, World, approved_by_reply

pytestmark = pytest.mark.anyio

REFUSAL = "550 5.1.1 mailbox unavailable"


class RefusingTheClient(InMemoryProvider):
    """A channel that hands the message over but reports the client's address refused."""

    async def send(self, handover: Handover) -> SendResult:
        result = await super().send(handover)
        return result.model_copy(update={"refused": ((CLIENT, REFUSAL),)})


async def test_a_send_with_a_refused_recipient_is_recorded_as_partial_and_not_as_sent(
    world: World,
) -> None:
    task_id, _, _ = await approved_by_reply(world)
    channel = RefusingTheClient.through(world.box.state)
    done = await replies.send_reply(
        world.store, channel, task_id, "d1", to=(CLIENT,), cc=(APPROVER,), clock=world.clock
    )
    record = done.outcome.record
    assert record.state is SendState.CONFIRMED and record.partial
    assert record.refused == ((CLIENT, REFUSAL),)
    assert "partial delivery" in record.detail and CLIENT in record.detail

    checked = await replies.read_back(world.store, lambda _task: channel, record, world.clock)
    task = world.task(task_id)
    # The stored copy itself reads back right, but the client did not get it: the task is not
    # CLIENT_REPLY_SENT, and its evidence says who was refused and why.
    assert checked.report.ok
    assert task.state is TaskState.APPROVED_TO_SEND
    assert task.readback_evidence is not None
    assert f"{CLIENT} refused ({REFUSAL})" in task.readback_evidence
