"""Calls that overlap: two sends of one approved client draft (in one session, or from two
servers), a request for approval and a transition of its task, two claims of one item. Each
ends as if the calls had come one after the other: one copy sent, one claim, and the task
records exactly the mail that went. The overlap is made deterministic by holding the first
call open at the provider (``tests.mcp.hooked``)."""

from __future__ import annotations

from dataclasses import dataclass
from email.message import EmailMessage
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client
from mcp.shared.exceptions import MCPError

from agent.testing import FrozenClock
from mcp_server.runtime import REFUSED
from tests.mcp.conftest import (
    APPROVER,
    CLIENT,
    COLLEAGUE,
    MAILBOX,
    OperatorStation,
    approve_by_reply,
    call,
    draft_ready,
    reconcile_all,
    sent_messages,
    station_context,
)
from tests.mcp.hooked import WAIT, Held, Hooks, hooked_client

pytestmark = pytest.mark.anyio


BOSS = "boss@contoso.test"
BOSS_LINE = "  - {address: boss@contoso.test, name: Boss, side: client, verified_by: crm-record}\n"


# -- calls whose outcome is not known in advance -----------------------------------------------


@dataclass
class Answer:
    """What one tool call came back with: a result, a refusal or a tool error."""

    result: dict[str, Any] | None = None
    error: MCPError | None = None
    tool_error: str | None = None


async def attempt(client: Client, tool: str, **arguments: Any) -> Answer:
    try:
        result = await client.call_tool(tool, arguments)
    except MCPError as exc:
        return Answer(error=exc)
    if result.is_error:
        text = result.content[0]
        assert text.type == "text"
        return Answer(tool_error=text.text)
    assert result.structured_content is not None
    return Answer(result=result.structured_content)


def is_refusal(answer: Answer) -> bool:
    return answer.error is not None and answer.error.code == REFUSED


def refused_as_a_repeat(answer: Answer) -> bool:
    """A second send of a draft refused because the first one was made (or is being made)."""
    error = answer.error
    if error is None or error.code != REFUSED or not isinstance(error.data, dict):
        return False
    kind = error.data.get("refused")
    if kind == "already_sent":
        return True
    return kind == "policy" and (
        "being made" in error.message or "unfinished send" in error.message
    )


# -- what went out -----------------------------------------------------------------------------


def client_copies(station: OperatorStation) -> list[EmailMessage]:
    return [m for m in sent_messages(station.maildir) if CLIENT in str(m["To"] or "")]


def approval_emails(station: OperatorStation) -> list[EmailMessage]:
    return [m for m in sent_messages(station.maildir) if APPROVER in str(m["To"] or "")]


def plain_text(message: EmailMessage) -> str:
    part = message.get_body(("plain",))
    assert part is not None
    return str(part.get_content())


async def approved_client_draft(station: OperatorStation, client: Client) -> tuple[str, str]:
    """A client's request worked to an approved draft (APPROVED_TO_SEND); task and draft."""
    task_id, draft_id, scanned = await draft_ready(station, client, "The Q4 quote is **$1,200**.")
    request = await call(client, "request_approval", task_id=task_id, draft_id=draft_id)
    await reconcile_all(client, scanned)
    await approve_by_reply(station, client, [request])
    assert (await call(client, "get_task", task_id=task_id))["state"] == "APPROVED_TO_SEND"
    return task_id, draft_id


# -- a client-facing draft goes out once -------------------------------------------------------


async def test_two_concurrent_sends_of_one_approved_client_draft_in_one_session_send_one_copy(
    station: OperatorStation,
) -> None:
    hooks = Hooks()
    with anyio.fail_after(WAIT):
        async with hooked_client(station, hooks) as client:
            task_id, draft_id = await approved_client_draft(station, client)
            assert client_copies(station) == []
            hooks.send = held = Held()
            answers: dict[str, Answer] = {}

            async def send(name: str, **recipients: list[str]) -> None:
                answers[name] = await attempt(
                    client, "send", task_id=task_id, draft_id=draft_id, **recipients
                )

            async with anyio.create_task_group() as tg:
                tg.start_soon(lambda: send("to", to=[CLIENT]))
                await held.entered.wait()  # the first send is at the provider
                tg.start_soon(lambda: send("to+cc", to=[CLIENT], cc=[COLLEAGUE]))
                await anyio.wait_all_tasks_blocked()  # the second went as far as it can
                held.release()
            task = await call(client, "get_task", task_id=task_id)
    assert len(client_copies(station)) == 1
    sent = [a for a in answers.values() if a.result is not None]
    assert [a.result["status"] for a in sent if a.result] == ["sent"], answers
    [other] = [a for a in answers.values() if a.result is None]
    assert refused_as_a_repeat(other), other
    assert task["state"] == "APPROVED_TO_SEND"  # handed over once; sent once read back
    assert task["sent_message_id"] == client_copies(station)[0]["Message-ID"]


async def test_two_servers_sending_one_approved_client_draft_at_once_send_one_copy(
    station: OperatorStation,
) -> None:
    hooks = Hooks()
    with anyio.fail_after(WAIT):
        async with hooked_client(station, hooks) as first, station.client() as second:
            task_id, draft_id = await approved_client_draft(station, first)
            hooks.send = held = Held()
            answers: dict[str, Answer] = {}

            async def send_first() -> None:
                answers["first"] = await attempt(
                    first, "send", task_id=task_id, draft_id=draft_id, to=[CLIENT]
                )

            async with anyio.create_task_group() as tg:
                tg.start_soon(send_first)
                await held.entered.wait()  # server one is at the provider, not yet sent
                answers["second"] = await attempt(
                    second, "send", task_id=task_id, draft_id=draft_id, to=[CLIENT], cc=[COLLEAGUE]
                )
                held.release()
    assert len(client_copies(station)) == 1
    assert answers["first"].result is not None, answers
    assert answers["first"].result["status"] == "sent"
    assert refused_as_a_repeat(answers["second"]), answers["second"]


# -- request_approval and a concurrent transition ----------------------------------------------


async def test_request_approval_and_a_concurrent_transition_leave_no_approval_email_the_task_does_not_record(
    station: OperatorStation,
) -> None:
    hooks = Hooks()
    with anyio.fail_after(WAIT):
        async with hooked_client(station, hooks) as client:
            task_id, draft_id, _ = await draft_ready(station, client, "Quote: $1,200")
            hooks.send = held = Held()
            answers: dict[str, Answer] = {}

            async def request() -> None:
                answers["request"] = await attempt(
                    client, "request_approval", task_id=task_id, draft_id=draft_id, to=[CLIENT]
                )

            async def transition() -> None:
                answers["transition"] = await attempt(
                    client, "transition_task", task_id=task_id, state="EXECUTING", evidence="more"
                )

            async with anyio.create_task_group() as tg:
                tg.start_soon(request)
                await held.entered.wait()  # the approval email is at the provider
                tg.start_soon(transition)
                await anyio.wait_all_tasks_blocked()
                held.release()
            task = await call(client, "get_task", task_id=task_id)
    emails = approval_emails(station)
    if emails:
        # The request won: the task records exactly the email that went, and the
        # transition, which came second, was refused.
        [email] = emails
        assert answers["request"].result is not None, answers
        assert task["state"] == "WAITING_INTERNAL_APPROVAL"
        [recorded] = task["approval_requests"]
        assert recorded["request_message_id"] == email["Message-ID"]
        assert is_refusal(answers["transition"]), answers["transition"]
    else:
        assert answers["request"].result is None, answers


async def test_a_new_approval_request_for_other_recipients_never_reuses_a_refused_requests_message_id(
    tmp_path: Path,
) -> None:
    station = OperatorStation(root=tmp_path / "station", clock=FrozenClock())
    station.register(station_context().replace("contacts:\n", "contacts:\n" + BOSS_LINE, 1))
    hooks = Hooks()
    with anyio.fail_after(WAIT):
        async with hooked_client(station, hooks) as first, station.client() as second:
            task_id, draft_id, _ = await draft_ready(station, first, "Quote: $1,200")
            hooks.send = held = Held()
            answers: dict[str, Answer] = {}

            async def request() -> None:
                answers["request"] = await attempt(
                    first, "request_approval", task_id=task_id, draft_id=draft_id, to=[CLIENT]
                )

            # Another server moves the task on while the approval email is being sent: the
            # email goes, the request is refused and the task records no request.
            async with anyio.create_task_group() as tg:
                tg.start_soon(request)
                await held.entered.wait()
                await call(
                    second, "transition_task", task_id=task_id, state="EXECUTING", evidence="more"
                )
                held.release()
            assert is_refusal(answers["request"]), answers["request"]
            [orphan] = approval_emails(station)
            assert CLIENT in plain_text(orphan)

            await call(
                first, "transition_task", task_id=task_id, state="DRAFT_READY", evidence="back"
            )
            again = await call(
                first, "request_approval", task_id=task_id, draft_id=draft_id, to=[BOSS]
            )
            task = await call(first, "get_task", task_id=task_id)
    assert again["recipients"] == [BOSS]
    assert again["request_message_id"] != orphan["Message-ID"]
    emails = approval_emails(station)
    assert len(emails) == 2
    [fresh] = [m for m in emails if m["Message-ID"] == again["request_message_id"]]
    assert BOSS in plain_text(fresh)
    [recorded] = task["approval_requests"]
    assert recorded["request_message_id"] == again["request_message_id"]
    assert recorded["recipients"] == [BOSS]


# -- claims ------------------------------------------------------------------------------------


async def test_two_concurrent_claims_of_one_item_give_the_same_answer_and_the_run_reconciles_clean(
    station: OperatorStation,
) -> None:
    hooks = Hooks()
    station.deliver(sender=CLIENT, body="Please send the Q4 quote.")
    with anyio.fail_after(WAIT):
        async with hooked_client(station, hooks) as client:
            scanned = await call(client, "intake", mailbox_id=MAILBOX)
            [item] = scanned["items"]
            hooks.body = held = Held()
            answers: list[Answer] = []

            async def claim() -> None:
                answers.append(
                    await attempt(client, "claim", run_id=item["run_id"], item_ref=item["item_ref"])
                )

            async with anyio.create_task_group() as tg:
                tg.start_soon(claim)
                await held.entered.wait()  # the first claim is reading the body
                tg.start_soon(claim)
                await anyio.wait_all_tasks_blocked()
                held.release()
            reconciliation = await attempt(client, "reconcile", run_id=item["run_id"])
    first, second = answers
    assert first.result is not None, first
    assert first.result["outcome"] == "CLAIMED"
    assert second.result == first.result
    assert reconciliation.result is not None, reconciliation
    assert reconciliation.result["clean"] is True
    assert reconciliation.result["reconciliation_failed"] == 0
