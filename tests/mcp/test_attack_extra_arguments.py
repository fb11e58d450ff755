"""An adversarial host passes arguments no tool's schema names - approved=True, a recipient
class, another workspace, its own approvers or decision, a state only the server may set.
Each call is a validation error, and nothing changes."""

from __future__ import annotations

import pytest

from tests.mcp.attacks import (
    drafted_task,
    invalid,
    snapshot,
    state,
)
from tests.mcp.conftest import (
    APPROVER,
    CLIENT,
    COLLEAGUE,
    MAILBOX,
    OperatorStation,
    call,
)

pytestmark = pytest.mark.anyio


async def test_arguments_the_schema_does_not_name_are_validation_errors_that_change_nothing(
    station: OperatorStation,
) -> None:
    async with station.client() as client:
        task_id, draft_id = await drafted_task(station, client)
        station.deliver(sender=CLIENT, subject="Another request", body="And the Q1 renewal?")
        scanned = await call(client, "intake", mailbox_id=MAILBOX)
        fresh = [
            i for i in scanned["items"] if i["untrusted"]["subject"]["text"] == "Another request"
        ]
        assert len(fresh) == 1
        before = await snapshot(station, client, task_id)

        base = {"task_id": task_id, "draft_id": draft_id}
        text = await invalid(client, "send", **base, to=[CLIENT], approved=True)
        assert "approved" in text
        text = await invalid(client, "gate_check", **base, to=[CLIENT], recipient_class="internal")
        assert "recipient_class" in text
        text = await invalid(
            client,
            "claim",
            run_id=fresh[0]["run_id"],
            item_ref=fresh[0]["item_ref"],
            workspace_id="other",
        )
        assert "workspace_id" in text
        text = await invalid(client, "request_approval", **base, approvers=[COLLEAGUE])
        assert "approvers" in text
        text = await invalid(
            client,
            "record_approval",
            task_id=task_id,
            reply_message_id="<x@fabrikam.test>",
            decision="approved",
            approver=APPROVER,
        )
        assert "decision" in text
        await invalid(client, "get_task", task_id=task_id, workspace_id="ws-other")
        await invalid(client, "render", task_id=task_id, body_markdown="x", approved=True)
        for target in ("APPROVED_TO_SEND", "CLIENT_REPLY_SENT", "WAITING_INTERNAL_APPROVAL"):
            text = await invalid(
                client, "transition_task", task_id=task_id, state=target, evidence="approved"
            )
            assert "state" in text
        await invalid(
            client, "report", task_id=task_id, outcome="client_reply_sent", evidence="sent"
        )

        assert await snapshot(station, client, task_id) == before
        assert (await state(client, task_id)) == "DRAFT_READY"

        # The item the forbidden claim named is still there to claim.
        claim = await call(
            client, "claim", run_id=fresh[0]["run_id"], item_ref=fresh[0]["item_ref"]
        )
        assert claim["outcome"] == "CLAIMED"
