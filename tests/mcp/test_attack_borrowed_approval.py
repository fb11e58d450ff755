"""An adversarial host borrows an approval that is not this draft's: another task's approved
draft or approver's reply, or an approver's earlier reply the approver has since withdrawn.
Each is refused, and nothing changes."""

from __future__ import annotations

import pytest
from mcp import Client
from mcp.shared.exceptions import MCPError

from tests.mcp.attacks import (
    approved,
    assert_unchanged,
    blockers,
    client_copies,
    client_task,
    drafted,
    drafted_task,
    outcome,
    request,
    snapshot,
    state,
)
from tests.mcp.conftest import (
    APPROVER,
    CLIENT,
    OperatorStation,
    call,
    intake_and_claim,
    refused,
)

pytestmark = pytest.mark.anyio


async def _two_drafted_tasks(station: OperatorStation, client: Client) -> tuple[str, str, str, str]:
    """A quote request and an invoice request taken in, then each drafted:
    (task_a, draft_a, task_b, draft_b)."""
    task_a, _ = await client_task(station, client, subject="Quote request")
    task_b, _ = await client_task(station, client, subject="Invoice copy")
    draft_a = await drafted(client, task_a)
    return task_a, draft_a, task_b, await drafted(client, task_b, "Your invoice copy is attached.")


# -- another task's approval -------------------------------------------------------------------


async def test_one_tasks_approval_cannot_be_used_for_another_task(
    station: OperatorStation,
) -> None:
    async with station.client() as client:
        task_a, draft_a, task_b, draft_b = await _two_drafted_tasks(station, client)
        assert task_a != task_b
        reply_a = await approved(station, client, task_a, draft_a)
        before = await snapshot(station, client, task_a, task_b)

        refusal = await refused(client, "send", task_id=task_b, draft_id=draft_a, to=[CLIENT])
        assert refusal.data["refused"] == "policy"
        assert "another task" in refusal.message
        assert await snapshot(station, client, task_a, task_b) == before

        refusal = await refused(client, "gate_check", task_id=task_b, draft_id=draft_a, to=[CLIENT])
        assert "another task" in refusal.message

        refusal = await refused(client, "record_approval", task_id=task_b, reply_message_id=reply_a)
        assert "no approver's reply" in refusal.message
        assert await snapshot(station, client, task_a, task_b) == before

        refusal = await refused(client, "send", task_id=task_b, draft_id=draft_b, to=[CLIENT])
        assert blockers(refusal) == {"approval_missing"}

        # B's own approval request cannot borrow A's draft either.
        refusal = await refused(client, "request_approval", task_id=task_b, draft_id=draft_a)
        assert "another task" in refusal.message

        assert await snapshot(station, client, task_a, task_b) == before
        assert (await state(client, task_a)) == "APPROVED_TO_SEND"
        assert (await state(client, task_b)) == "DRAFT_READY"
        assert client_copies(station) == []


async def test_an_approvers_reply_to_task_a_does_not_approve_task_b_waiting_for_its_own(
    station: OperatorStation,
) -> None:
    async with station.client() as client:
        task_a, draft_a, task_b, draft_b = await _two_drafted_tasks(station, client)
        await request(client, task_b, draft_b)
        reply_a = await approved(station, client, task_a, draft_a)
        before = await snapshot(station, client, task_a, task_b)

        assert (await state(client, task_b)) == "WAITING_INTERNAL_APPROVAL"
        await refused(client, "record_approval", task_id=task_b, reply_message_id=reply_a)
        refusal = await refused(client, "send", task_id=task_b, draft_id=draft_b, to=[CLIENT])
        assert blockers(refusal) == {"approval_missing"}
        assert await snapshot(station, client, task_a, task_b) == before


# -- a withdrawn approval ----------------------------------------------------------------------


async def test_a_withdrawn_approval_is_not_revived_by_pointing_at_the_earlier_reply(
    station: OperatorStation,
) -> None:
    async with station.client() as client:
        task_id, draft_id = await drafted_task(station, client)
        reply = await approved(station, client, task_id, draft_id)
        request_mid = (await call(client, "get_task", task_id=task_id))["approval_requests"][-1][
            "request_message_id"
        ]
        station.clock.advance(minutes=5)
        station.deliver(
            sender=APPROVER,
            subject="Re: Approval needed",
            body="Wait, do not send it yet. I need to check the price first.",
            in_reply_to=reply,
            headers={"References": f"{request_mid} {reply}"},
        )
        await intake_and_claim(client)
        assert (await state(client, task_id)) == "CHANGES_REQUESTED"
        before = await snapshot(station, client, task_id)

        result = await outcome(client, "record_approval", task_id=task_id, reply_message_id=reply)
        if not isinstance(result, MCPError):
            assert result["task_state"] == "CHANGES_REQUESTED"
        assert await snapshot(station, client, task_id) == before
        refusal = await refused(client, "send", task_id=task_id, draft_id=draft_id, to=[CLIENT])
        assert blockers(refusal) == {"changes_requested"}
        await assert_unchanged(station, client, before, task_id)
