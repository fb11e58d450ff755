"""An adversarial host sends one draft twice: again after it went, with its recipients
spelled, ordered or split between To and Cc differently, with one more recipient, or from two
hosts at once. The draft goes out once; every repeat is refused naming the send it went out
as."""

from __future__ import annotations

from typing import Any

import anyio
import pytest
from mcp import Client
from mcp.shared.exceptions import MCPError

from mcp_server.runtime import REFUSED
from tests.mcp.attacks import (
    approved,
    approved_task,
    blockers,
    client_copies,
    client_task,
    drafted,
    snapshot,
    state,
)
from tests.mcp.conftest import (
    APPROVER,
    CLIENT,
    COLLEAGUE,
    OperatorStation,
    call,
    intake_and_claim,
    refused,
    sent_messages,
)

pytestmark = pytest.mark.anyio


async def test_an_approved_draft_goes_out_once_and_a_second_send_is_refused(
    station: OperatorStation,
) -> None:
    async with station.client() as client:
        task_id, draft_id = await approved_task(station, client)
        unsent = await snapshot(station, client, task_id)
        sent = await call(client, "send", task_id=task_id, draft_id=draft_id, to=[CLIENT])
        assert sent["status"] == "sent"
        assert sent["task_state"] == "APPROVED_TO_SEND"  # sent once read back
        assert len(client_copies(station)) == 1
        before = await snapshot(station, client, task_id)
        # The snapshot sees a real send in every part it compares.
        assert before.counts != unsent.counts
        assert before.sends != unsent.sends
        assert before.tasks != unsent.tasks
        assert before.records != unsent.records
        assert before.outbox != unsent.outbox

        refusal = await refused(client, "send", task_id=task_id, draft_id=draft_id, to=[CLIENT])
        assert refusal.data["refused"] == "already_sent"
        assert refusal.data["send_id"] == sent["send_id"]
        assert refusal.data["internet_message_id"] == sent["internet_message_id"]
        assert await snapshot(station, client, task_id) == before
        assert len(client_copies(station)) == 1

        # The same approved draft again, with the recipients spelled differently.
        refusal = await refused(
            client, "send", task_id=task_id, draft_id=draft_id, to=[CLIENT.upper()]
        )
        assert refusal.data["refused"] == "already_sent"
        assert refusal.data["send_id"] == sent["send_id"]
        assert await snapshot(station, client, task_id) == before

        # The same approved draft with another recipient added: a client draft goes out
        # once, whoever a later call names.
        refusal = await refused(
            client, "send", task_id=task_id, draft_id=draft_id, to=[CLIENT], cc=[COLLEAGUE]
        )
        assert refusal.data["refused"] == "already_sent"
        assert refusal.data["send_id"] == sent["send_id"]
        assert await snapshot(station, client, task_id) == before

        # A new draft after the send is a new client message: it needs its own approval.
        other = await call(client, "render", task_id=task_id, body_markdown="One more thing.")
        before = await snapshot(station, client, task_id)
        refusal = await refused(
            client, "send", task_id=task_id, draft_id=other["draft_id"], to=[CLIENT]
        )
        # ...and nothing more goes to the client before the first reply is read back.
        assert blockers(refusal) == {"approval_missing", "reply_not_read_back"}
        assert await snapshot(station, client, task_id) == before
        assert len(client_copies(station)) == 1


async def test_an_internal_draft_goes_once_to_a_set_of_recipients_however_to_and_cc_are_ordered(
    station: OperatorStation,
) -> None:
    async with station.client() as client:
        station.deliver(sender=CLIENT, body="Please send the Q4 quote.")
        _, [claimed] = await intake_and_claim(client)
        task_id = claimed["task_id"]
        draft = await call(
            client, "render", task_id=task_id, body_markdown="Internal: quote ready.", language="en"
        )
        draft_id = draft["draft_id"]
        first = await call(
            client, "send", task_id=task_id, draft_id=draft_id, to=[COLLEAGUE, APPROVER]
        )
        assert first["status"] == "sent"
        for recipients in (
            {"to": [APPROVER, COLLEAGUE]},
            {"to": [APPROVER], "cc": [COLLEAGUE]},
        ):
            refusal = await refused(
                client, "send", task_id=task_id, draft_id=draft_id, **recipients
            )
            assert isinstance(refusal.data, dict)
            assert refusal.data["refused"] == "already_sent", refusal.data
            assert refusal.data["send_id"] == first["send_id"]
    assert len(sent_messages(station.maildir)) == 1


async def test_two_hosts_sending_the_same_approved_draft_at_once_make_one_client_copy(
    station: OperatorStation,
) -> None:
    async with station.client() as first, station.client() as second:
        task_id, _ = await client_task(station, first)
        draft_id = await drafted(first, task_id)
        await approved(station, first, task_id, draft_id)
        outcomes: list[dict[str, Any] | MCPError] = []

        async def attempt(client: Client) -> None:
            try:
                outcomes.append(
                    await call(client, "send", task_id=task_id, draft_id=draft_id, to=[CLIENT])
                )
            except MCPError as exc:
                outcomes.append(exc)

        async with anyio.create_task_group() as group:
            group.start_soon(attempt, first)
            group.start_soon(attempt, second)

        assert len(outcomes) == 2
        sent = [o for o in outcomes if isinstance(o, dict)]
        assert sent, outcomes
        assert {o["internet_message_id"] for o in sent} == {sent[0]["internet_message_id"]}
        for other in outcomes:
            if isinstance(other, MCPError):
                assert other.code == REFUSED
        assert len(client_copies(station)) == 1
        store = station.store()
        try:
            client_sends = [
                s for s in store.list_sends(station.workspace_id) if s.kind == "client_reply"
            ]
        finally:
            store.close()
        assert len(client_sends) == 1
        assert (await state(first, task_id)) == "APPROVED_TO_SEND"  # handed over once
