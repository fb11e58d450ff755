"""A client reply counts as sent only on the provider's send result and a passing read-back
of its stored copy (seed 000, "Delivery evidence and independence": a local MIME file is
insufficient). A plain Maildir's send writes an outbox copy that reaches no one."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent.testing import FrozenClock
from tests.mcp.conftest import (
    CLIENT,
    OperatorStation,
    approved_draft,
    call,
    refused,
    sent_messages,
    to_draft_ready,
)
from tests.mcp.test_tools import classify, new_task, standing_station

pytestmark = pytest.mark.anyio


async def test_a_client_reply_written_to_a_local_outbox_never_counts_as_sent(
    tmp_path: Path,
) -> None:
    station = OperatorStation(root=tmp_path / "station", clock=FrozenClock(), delivering=False)
    station.register()
    station.deliver(sender=CLIENT)
    async with station.client() as client:
        approved = await approved_draft(client, station)
        task_id, draft_id = approved["task_id"], approved["draft_id"]
        sent = await call(client, "send", task_id=task_id, draft_id=draft_id, to=[CLIENT])
        read = await call(client, "read_back", send_id=sent["send_id"])
        task = await call(client, "get_task", task_id=task_id)
        closing = await refused(
            client, "report", task_id=task_id, outcome="waiting_client", evidence="quote sent"
        )
    assert sent["delivered"] is False and sent["channel"] == "local"
    assert sent["task_state"] == "APPROVED_TO_SEND"
    assert [c["name"] for c in read["checks"] if not c["ok"]] == ["delivered"]
    assert read["ok"] is False
    assert task["state"] == "APPROVED_TO_SEND"
    assert task["communication_state"] != "client_reply_sent"
    assert task["readback_evidence"].endswith("failed delivered")
    assert closing.data is not None and closing.data["refused"] == "task_state"


async def test_a_delivered_client_reply_is_sent_only_after_its_stored_copy_is_read_back(
    station: OperatorStation,
) -> None:
    station.deliver(sender=CLIENT)
    async with station.client() as client:
        approved = await approved_draft(client, station)
        task_id, draft_id = approved["task_id"], approved["draft_id"]
        sent = await call(client, "send", task_id=task_id, draft_id=draft_id, to=[CLIENT])
        handed_over = await call(client, "get_task", task_id=task_id)
        read = await call(client, "read_back", send_id=sent["send_id"])
        proven = await call(client, "get_task", task_id=task_id)
    assert sent["delivered"] is True
    assert handed_over["state"] == "APPROVED_TO_SEND"
    assert read["ok"] is True
    assert proven["state"] == "CLIENT_REPLY_SENT"
    assert proven["communication_state"] == "client_reply_sent"


async def test_no_second_client_reply_goes_out_before_the_first_is_read_back(
    tmp_path: Path,
) -> None:
    station = standing_station(tmp_path)
    async with station.client() as client:
        _, task_id = await new_task(client, station, sender=CLIENT)
        await to_draft_ready(client, task_id)
        first = await call(client, "render", task_id=task_id, body_markdown="We got it.")
        classify(station, task_id, "receipt-confirmation")
        await call(
            client, "record_approval", task_id=task_id, standing_class="receipt-confirmation"
        )
        sent = await call(client, "send", task_id=task_id, draft_id=first["draft_id"], to=[CLIENT])
        second = await call(client, "render", task_id=task_id, body_markdown="One more thing.")
        held = await refused(
            client, "send", task_id=task_id, draft_id=second["draft_id"], to=[CLIENT]
        )
        await call(client, "read_back", send_id=sent["send_id"])
        task = await call(client, "get_task", task_id=task_id)
    assert held.data is not None and "reply_not_read_back" in {
        r["blocker"] for r in held.data["reasons"]
    }
    assert task["state"] == "CLIENT_REPLY_SENT"
    assert len([m for m in sent_messages(station.maildir) if CLIENT in str(m["To"])]) == 1
