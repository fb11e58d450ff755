"""The whole lifecycle as a host drives it, over any transport."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from mcp import Client

from tests.mcp.conftest import (
    APPROVER,
    CLIENT,
    OperatorStation,
    call,
    intake_and_claim,
    to_draft_ready,
)


async def render_draft(
    client: Client, task_id: str, body_markdown: str, language: str = "en"
) -> dict[str, Any]:
    """render a draft of the task from ``body_markdown``, in English unless told; the
    draft's view."""
    return await call(
        client, "render", task_id=task_id, body_markdown=body_markdown, language=language
    )


async def check_gate(client: Client, task_id: str, draft_id: str, to: list[str]) -> dict[str, Any]:
    """gate_check of a draft for the recipients ``to``; the gate's answer."""
    return await call(client, "gate_check", task_id=task_id, draft_id=draft_id, to=to)


async def send_draft(client: Client, task_id: str, draft_id: str, to: list[str]) -> dict[str, Any]:
    """send a draft to the recipients ``to``; the send's view."""
    return await call(client, "send", task_id=task_id, draft_id=draft_id, to=to)


async def drive_lifecycle(
    client: Client, station: OperatorStation, *, wall_clock: bool = False
) -> dict[str, Any]:
    """A client request from intake to a read-back reply; returns what each step gave.

    ``wall_clock``: the server runs on the system clock (a subprocess), so the mail is
    dated by it too; it runs the plain Maildir adapter, whose send writes an outbox copy
    that reaches no one, so the reply is read back but never counts as sent.
    """
    if wall_clock:
        station.clock.moment = datetime.now(UTC) - timedelta(minutes=1)
    station.deliver(sender=CLIENT, sender_name="Dana Levi", body="Please send the Q4 quote.")
    first, [claimed] = await intake_and_claim(client)
    assert claimed["outcome"] == "CLAIMED" and claimed["task_created"]
    task_id = claimed["task_id"]
    await to_draft_ready(client, task_id)
    draft = await render_draft(client, task_id, "The Q4 quote is **$1,200**.")
    pending = await check_gate(client, task_id, draft["draft_id"], [CLIENT])
    assert not pending["ready"]
    requested = await call(client, "request_approval", task_id=task_id, draft_id=draft["draft_id"])
    assert requested["task_state"] == "WAITING_INTERNAL_APPROVAL"
    first_rec = await call(client, "reconcile", run_id=first["run_id"])
    assert first_rec["clean"]

    if wall_clock:
        station.clock.moment = datetime.now(UTC) + timedelta(seconds=1)
    else:
        station.clock.advance(minutes=5)
    station.deliver(
        sender=APPROVER,
        subject="Re: Approval needed",
        body="Approved.",
        in_reply_to=requested["request_message_id"],
    )
    second, claims = await intake_and_claim(client)
    assert [c["outcome"] for c in claims] == ["CLAIMED"]  # only the approver's reply is new
    task = await call(client, "get_task", task_id=task_id)
    assert task["state"] == "APPROVED_TO_SEND"
    ready = await check_gate(client, task_id, draft["draft_id"], [CLIENT])
    assert ready["ready"]
    sent = await call(client, "send", task_id=task_id, draft_id=draft["draft_id"], to=[CLIENT])
    # Handed over, but not yet proven: the task waits for the stored copy to be read back.
    assert sent["status"] == "sent" and sent["task_state"] == "APPROVED_TO_SEND"
    assert sent["delivered"] is not wall_clock  # a Maildir outbox copy is never a delivery
    read = await call(client, "read_back", send_id=sent["send_id"])
    failed = [c["name"] for c in read["checks"] if not c["ok"]]
    task = await call(client, "get_task", task_id=task_id)
    if wall_clock:
        assert failed == ["delivered"] and task["state"] == "APPROVED_TO_SEND", read
    else:
        assert read["ok"] and task["state"] == "CLIENT_REPLY_SENT", read
        reported = await call(
            client, "report", task_id=task_id, outcome="waiting_client", evidence="quote sent"
        )
        assert reported["state"] == "WAITING_CLIENT"
    second_rec = await call(client, "reconcile", run_id=second["run_id"])
    assert second_rec["clean"] and second_rec["scanned"] == 1
    return {"task_id": task_id, "sent": sent, "read_back": read}
