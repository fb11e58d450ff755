"""An adversarial host sends a client draft around the approval: with none, while it is only
requested, after changing the approved draft, or while the workspace's client sends are
disabled. Each send is refused naming what blocks it, and nothing changes."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.mcp.attacks import (
    approved_task,
    assert_unchanged,
    blockers,
    client_copies,
    client_task,
    custom_station,
    drafted,
    drafted_task,
    reason_for,
    request,
    snapshot,
    staged_approval,
    staged_draft,
    state,
)
from tests.mcp.conftest import (
    CLIENT,
    COLLEAGUE,
    OperatorStation,
    call,
    refused,
)

pytestmark = pytest.mark.anyio


# -- no approval, or one only requested --------------------------------------------------------


async def test_a_client_draft_without_approval_is_refused_as_approval_missing_and_nothing_changes(
    station: OperatorStation,
) -> None:
    async with station.client() as client:
        task_id, draft_id, before = await staged_draft(station, client)

        gate = await call(client, "gate_check", task_id=task_id, draft_id=draft_id, to=[CLIENT])
        assert gate["ready"] is False
        assert {r["blocker"] for r in gate["reasons"]} == {"approval_missing"}

        refusal = await refused(client, "send", task_id=task_id, draft_id=draft_id, to=[CLIENT])
        assert refusal.data["refused"] == "gate"
        assert blockers(refusal) == {"approval_missing"}
        assert "request internal approval" in reason_for(refusal, "approval_missing")["detail"]

        assert await snapshot(station, client, task_id) == before
        assert (await state(client, task_id)) == "DRAFT_READY"


async def test_a_send_while_the_approval_is_only_requested_is_refused_and_nothing_changes(
    station: OperatorStation,
) -> None:
    async with station.client() as client:
        task_id, draft_id = await drafted_task(station, client)
        await request(client, task_id, draft_id)
        before = await snapshot(station, client, task_id)

        refusal = await refused(client, "send", task_id=task_id, draft_id=draft_id, to=[CLIENT])
        assert blockers(refusal) == {"approval_missing"}
        assert "WAITING_INTERNAL_APPROVAL" in reason_for(refusal, "approval_missing")["detail"]

        await assert_unchanged(station, client, before, task_id)


# -- editing after approval --------------------------------------------------------------------


async def test_a_draft_changed_after_approval_is_not_covered_by_it(
    station: OperatorStation,
) -> None:
    async with station.client() as client:
        task_id, draft_id = await approved_task(station, client, "Here is the quote: 120 USD.")
        changed = await call(
            client, "render", task_id=task_id, body_markdown="Here is the quote: 12 USD."
        )
        assert changed["draft_id"] != draft_id
        before = await snapshot(station, client, task_id)

        gate = await call(
            client, "gate_check", task_id=task_id, draft_id=changed["draft_id"], to=[CLIENT]
        )
        assert gate["ready"] is False
        refusal = await refused(
            client, "send", task_id=task_id, draft_id=changed["draft_id"], to=[CLIENT]
        )
        assert blockers(refusal) == {"approval_missing"}
        assert changed["digest"][:12] in reason_for(refusal, "approval_missing")["detail"]
        await assert_unchanged(station, client, before, task_id)

        # The approved draft itself is still what the approval covers.
        gate = await call(client, "gate_check", task_id=task_id, draft_id=draft_id, to=[CLIENT])
        assert gate["ready"] is True


# -- sends_disabled ----------------------------------------------------------------------------


def disabled_station(root: Path) -> OperatorStation:
    return custom_station(root, sends_disabled=True)


async def test_sends_disabled_holds_a_client_send_without_approval(tmp_path: Path) -> None:
    station = disabled_station(tmp_path / "disabled")
    async with station.client() as client:
        task_id, _ = await client_task(station, client)
        task = await call(client, "get_task", task_id=task_id)
        assert task["client_send_policy"] == "sends_disabled"
        draft_id = await drafted(client, task_id)
        before = await snapshot(station, client, task_id)

        refusal = await refused(client, "send", task_id=task_id, draft_id=draft_id, to=[CLIENT])
        assert "sends_disabled" in blockers(refusal)
        assert "sends_disabled" in reason_for(refusal, "sends_disabled")["detail"]
        assert await snapshot(station, client, task_id) == before


async def test_sends_disabled_holds_a_client_send_even_with_an_approvers_approval(
    tmp_path: Path,
) -> None:
    station = disabled_station(tmp_path / "disabled")
    async with station.client() as client:
        task_id, draft_id, before = await staged_approval(station, client)

        refusal = await refused(client, "send", task_id=task_id, draft_id=draft_id, to=[CLIENT])
        assert blockers(refusal) == {"sends_disabled"}
        await assert_unchanged(station, client, before, task_id)


async def test_sends_disabled_still_lets_an_internal_reply_go_to_a_colleague(
    tmp_path: Path,
) -> None:
    station = disabled_station(tmp_path / "disabled")
    async with station.client() as client:
        task_id, draft_id = await drafted_task(
            station, client, "Eli, the quote is ready for review."
        )

        sent = await call(client, "send", task_id=task_id, draft_id=draft_id, to=[COLLEAGUE])
        assert sent["status"] == "sent"
        assert sent["to"] == [COLLEAGUE]
        assert len(client_copies(station, COLLEAGUE)) == 1
        assert client_copies(station) == []
        assert (await state(client, task_id)) == "DRAFT_READY"
