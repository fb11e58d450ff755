"""An adversarial host crosses into another workspace of the same station: its task ids,
drafts and approvals under this workspace's tasks, its client as a recipient or named in a
draft (however the name is hidden from plain matching, or behind a link), and workspaces,
mailboxes and tasks that are not registered. Each is refused or a clear error, and nothing
changes."""

from __future__ import annotations

import mailbox
from email.message import EmailMessage
from email.policy import SMTP
from email.utils import format_datetime, make_msgid
from pathlib import Path

import pytest

from agent.services import workspaces
from tests.conftest import context_yaml
from tests.mcp.attacks import (
    approved,
    assert_unchanged,
    blockers,
    claimed_task,
    client_task,
    drafted,
    invalid,
    reason_for,
    snapshot,
    staged_approval,
    staged_draft,
)
from tests.mcp.conftest import (
    CLIENT,
    OperatorStation,
    call,
    draft_ready,
    intake_and_claim,
    refused,
    sent_messages,
    station_context,
    tool_error,
)

pytestmark = pytest.mark.anyio

OTHER_WS = "ws-test-0002"
OTHER_MAILBOX = "help@northwind.test"
OTHER_CLIENT = "sam.jones@tailspin.test"


def register_other(station: OperatorStation) -> Path:
    """A second workspace in the same data dir: its own mailbox, Maildir and client."""
    text = (
        station_context(OTHER_WS, mailbox=OTHER_MAILBOX)
        .replace("path: Maildir", "path: Maildir2")
        .replace("dana.levi@contoso.test, name: Dana Levi", f"{OTHER_CLIENT}, name: Sam Jones")
    )
    assert OTHER_CLIENT in text
    assert CLIENT not in text
    source = station.root / "contexts" / f"{OTHER_WS}.yaml"
    source.write_text(text, encoding="utf-8")
    maildir = station.root / "contexts" / "Maildir2"
    mailbox.Maildir(str(maildir), create=True)
    store = station.store()
    try:
        workspaces.add_workspace(
            store, workspaces.DataDir(station.data_dir), source, station.clock.now()
        )
    finally:
        store.close()
    return maildir


def deliver_to(maildir: Path, station: OperatorStation, sender: str, subject: str) -> str:
    msg = EmailMessage(policy=SMTP)
    msg["From"] = sender
    msg["To"] = OTHER_MAILBOX
    msg["Subject"] = subject
    msg["Date"] = format_datetime(station.clock.now())
    mid = make_msgid(domain=sender.rsplit("@", 1)[-1])
    msg["Message-ID"] = mid
    msg.set_content("Please renew our support contract.")
    mailbox.Maildir(str(maildir), create=True).add(msg.as_bytes())
    return mid


# Another workspace, whose client the link targets below name.
OTHERCORP_WS = "ws-other-0002"
OTHERCORP_CLIENT = "ceo@othercorp.test"


def register_othercorp_workspace(station: OperatorStation) -> None:
    """A second workspace in the same data dir whose client is OTHERCORP_CLIENT."""
    text = context_yaml(
        OTHERCORP_WS, mailbox="help@othersupport.test", provider="maildir", path="Maildir2"
    ).replace(CLIENT, OTHERCORP_CLIENT)
    assert OTHERCORP_CLIENT in text and CLIENT not in text
    source = station.root / "contexts" / f"{OTHERCORP_WS}.yaml"
    source.write_text(text, encoding="utf-8")
    mailbox.Maildir(str(station.root / "contexts" / "Maildir2"), create=True)
    store = station.store()
    try:
        workspaces.add_workspace(
            store, workspaces.DataDir(station.data_dir), source, station.clock.now()
        )
    finally:
        store.close()


# -- ids, drafts and approvals -----------------------------------------------------------------


async def test_another_workspaces_ids_drafts_and_approvals_do_not_cross_over(
    station: OperatorStation,
) -> None:
    maildir2 = register_other(station)
    async with station.client() as client:
        task_1, _ = await client_task(station, client)
        draft_1 = await drafted(client, task_1)
        reply_1 = await approved(station, client, task_1, draft_1)

        deliver_to(maildir2, station, OTHER_CLIENT, "Contract renewal")
        claim_2 = claimed_task((await intake_and_claim(client, OTHER_MAILBOX)).claims)
        task_2 = claim_2["task_id"]
        assert (await call(client, "get_task", task_id=task_2))["workspace_id"] == OTHER_WS
        draft_2 = await drafted(client, task_2, "Your renewal is under way.")
        before = await snapshot(station, client, task_1, task_2)

        # Workspace 1's approved draft under workspace 2's task, and the other way round.
        refusal = await refused(client, "send", task_id=task_2, draft_id=draft_1, to=[CLIENT])
        assert "another task" in refusal.message
        refusal = await refused(client, "send", task_id=task_2, draft_id=draft_1, to=[OTHER_CLIENT])
        assert "another task" in refusal.message
        refusal = await refused(client, "send", task_id=task_1, draft_id=draft_2, to=[CLIENT])
        assert "another task" in refusal.message
        # Workspace 1's approver reply as workspace 2's evidence.
        refusal = await refused(client, "record_approval", task_id=task_2, reply_message_id=reply_1)
        assert "no approver's reply" in refusal.message
        # Workspace 1's approved draft to workspace 2's client.
        refusal = await refused(client, "send", task_id=task_1, draft_id=draft_1, to=[OTHER_CLIENT])
        assert reason_for(refusal, "recipient_unknown")["recipient"] == OTHER_CLIENT
        refusal = await refused(
            client, "send", task_id=task_1, draft_id=draft_1, to=[CLIENT], cc=[OTHER_CLIENT]
        )
        assert "recipient_unknown" in blockers(refusal)
        # Naming the other workspace is not an argument any tool takes.
        await invalid(client, "get_task", task_id=task_1, workspace_id=OTHER_WS)
        await invalid(
            client, "send", task_id=task_1, draft_id=draft_1, to=[CLIENT], workspace_id=OTHER_WS
        )

        queue_2 = await call(client, "list_queue", workspace_id=OTHER_WS)
        assert [t["task_id"] for t in queue_2["tasks"]] == [task_2]
        queue_1 = await call(client, "list_queue", workspace_id=station.workspace_id)
        assert [t["task_id"] for t in queue_1["tasks"]] == [task_1]

        assert await snapshot(station, client, task_1, task_2) == before
        assert sent_messages(maildir2) == []


async def test_unregistered_workspaces_mailboxes_and_tasks_are_clear_errors(
    station: OperatorStation,
) -> None:
    async with station.client() as client:
        task_id, draft_id, before = await staged_draft(station, client)

        text = await tool_error(client, "list_queue", workspace_id="ws-not-registered")
        assert "ws-not-registered" in text
        text = await tool_error(client, "access_status", workspace_id="ws-not-registered")
        assert "ws-not-registered" in text
        text = await tool_error(client, "intake", mailbox_id="nobody@elsewhere.test")
        assert "no registered workspace binds mailbox" in text
        text = await tool_error(client, "get_task", task_id="task-forged-000000")
        assert "task-forged-000000" in text
        text = await tool_error(
            client, "send", task_id="task-forged-000000", draft_id=draft_id, to=[CLIENT]
        )
        assert "task-forged-000000" in text
        text = await tool_error(
            client, "send", task_id=task_id, draft_id="draft-forged-0000", to=[CLIENT]
        )
        assert "no draft" in text
        text = await tool_error(client, "claim", run_id="run-forged", item_ref="maildir:x")
        assert "run-forged" in text
        text = await tool_error(client, "read_back", send_id="reply|draft-x|to=a@b.test|cc=")
        assert "no send" in text

        assert await snapshot(station, client, task_id) == before


# -- another workspace's client named in a draft -----------------------------------------------


async def test_an_approved_draft_naming_another_workspaces_client_is_refused(
    station: OperatorStation,
) -> None:
    register_other(station)
    async with station.client() as client:
        task_id, _ = await client_task(station, client)
        draft_id = await drafted(
            client, task_id, f"As with {OTHER_CLIENT} last week, the price is 120 USD."
        )
        await approved(station, client, task_id, draft_id)
        before = await snapshot(station, client, task_id)

        refusal = await refused(client, "send", task_id=task_id, draft_id=draft_id, to=[CLIENT])
        assert blockers(refusal) == {"foreign_content"}
        assert OTHER_CLIENT in reason_for(refusal, "foreign_content")["detail"]
        await assert_unchanged(station, client, before, task_id)


@pytest.mark.parametrize(
    "body",
    [
        "As with sam.jones@tail\u00adspin.test last week, the price is 120 USD.",  # soft hyphen
        "As with sam.jones@tail\u200bspin.test last week, the price is 120 USD.",  # ZW space
        "As with sam.jones@tails\u200dpin.test last week, the price is 120 USD.",  # ZW joiner
        "As with ｓａｍ.ｊｏｎｅｓ@ｔａｉｌｓｐｉｎ.ｔｅｓｔ last week, the price is 120 USD.",
        "As with the team at eu.tailspin.test last week, the price is 120 USD.",  # subdomain
        "As with sam.jones@tail\u0455pin.test last week, the price is 120 USD.",  # Cyrillic
        "As with sam.jones@tailspin\u3002test last week, the price is 120 USD.",  # IDNA dot
        "Prices as [agreed](https://portal.tail\u00adspin.test/q4) last week: 120 USD.",  # link
    ],
    ids=["soft-hyphen", "zero-width-space", "zero-width-joiner", "fullwidth", "subdomain",
         "cyrillic-letter", "ideographic-full-stop", "link-target"],
)  # fmt: skip
async def test_another_workspaces_client_hidden_from_plain_matching_is_still_refused(
    station: OperatorStation, body: str
) -> None:
    register_other(station)
    async with station.client() as client:
        task_id, draft_id, before = await staged_approval(station, client, body)
        refusal = await refused(client, "send", task_id=task_id, draft_id=draft_id, to=[CLIENT])
        assert blockers(refusal) == {"foreign_content"}
        await assert_unchanged(station, client, before, task_id)


@pytest.mark.parametrize(
    "body",
    [
        "Contact [our partner](mailto:ceo@othercorp.test) for details.",
        "See [the contract](https://othercorp.test/x) for details.",
        "Contact [our partner](mailto:ceo%40othercorp.test) for details.",
    ],
    ids=["mailto", "https", "percent-encoded-mailto"],
)
async def test_a_draft_whose_link_target_names_another_workspaces_client_is_blocked_as_foreign_content(
    station: OperatorStation, body: str
) -> None:
    register_othercorp_workspace(station)
    async with station.client() as client:
        task_id, draft_id, _ = await draft_ready(station, client, body)
        assert (await call(client, "get_task", task_id=task_id))["state"] == "DRAFT_READY"
        gate = await call(client, "gate_check", task_id=task_id, draft_id=draft_id, to=[CLIENT])
        refusal = await refused(client, "send", task_id=task_id, draft_id=draft_id, to=[CLIENT])
    assert not gate["ready"]
    assert "foreign_content" in {r["blocker"] for r in gate["reasons"]}, gate["reasons"]
    assert isinstance(refusal.data, dict)
    assert refusal.data["refused"] == "gate"
    assert "foreign_content" in {r["blocker"] for r in refusal.data["reasons"]}
    assert [m for m in sent_messages(station.maildir) if CLIENT in str(m["To"] or "")] == []
