"""Seed 000 section 12 acceptance scenarios 1-7, driven purely through the MCP tools.

The server is configured the way an operator leaves it: a data directory and one Workspace
Context file that binds a local Maildir (the ``station`` fixture). Mail arrives as files in
that Maildir; everything else - intake, claims, work, drafts, gates, approvals, sends and
read-back - goes through the MCP server. The store and the Maildir are only inspected.

The Maildir provider's send writes an outbox copy into its ``.Sent`` folder: that copy is
what read_back checks, and it is never a delivery (``delivered`` stays False).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Awaitable, Callable
from contextlib import AsyncExitStack
from email.message import EmailMessage
from functools import partial
from pathlib import Path
from typing import Any

import anyio
import pytest
import yaml
from mcp import Client
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.types import TextResourceContents
from selectolax.lexbor import LexborHTMLParser

from agent.providers.maildir import MaildirProvider
from agent.storage.backend import DATABASE_URL_SETTING
from agent.testing import FrozenClock
from mcp_server.composition import DATA_DIR_ENV
from mcp_server.runtime import REFUSED
from tests.mcp.conftest import (
    APPROVER,
    CLIENT,
    COLLEAGUE,
    MAILBOX,
    READ_BACK_CHECKS,
    OperatorStation,
    approve_by_reply,
    approved_by_reply,
    assert_one_task_of,
    by_name,
    call,
    claim_the_new_request,
    complete_the_request_and_its_follow_up,
    inbox_thread_id,
    intake_and_claim,
    read_back_the_client_reply,
    reconcile_all,
    refused,
    replay_after_completion,
    sent_messages,
    station_context,
    to_draft_ready,
)
from tests.mcp.lifecycle import check_gate, render_draft, send_draft

pytestmark = pytest.mark.anyio

RACERS = 4
"""Server processes racing on one occurrence (the test machine has two cores)."""

HEBREW_SUBJECT = "בקשת הצעת מחיר"
HEBREW_BODY = (
    "שלום דנה, ההצעה המעודכנת זמינה בכתובת https://contoso.test/quotes/118 "
    "והמחיר הוא ₪1,250 לחשבונית INV-2026-118."
)
HEBREW_FRAGMENTS = ("https://contoso.test/quotes/118", "₪1,250", "INV-2026-118")
ENGLISH_BODY = (
    "Hello Dana, the updated quote is at https://contoso.test/quotes/119 "
    "and the price is USD 1,250 for invoice INV-2026-119."
)


# -- helpers: MCP calls ---------------------------------------------------------------------


async def context_resource(client: Client, workspace_id: str) -> dict[str, Any]:
    result = await client.read_resource(f"outloop://workspaces/{workspace_id}/context")
    [content] = result.contents
    assert isinstance(content, TextResourceContents)
    return yaml.safe_load(content.text)  # JSON is YAML


# -- helpers: inspecting the Maildir outbox --------------------------------------------------


def sent_by_message_id(station: OperatorStation) -> dict[str, EmailMessage]:
    """The Maildir provider's outbox copies (its .Sent folder), by Message-ID."""
    return {str(m["Message-ID"]): m for m in sent_messages(station.maildir)}


def part(message: EmailMessage, subtype: str) -> str:
    body = message.get_body(preferencelist=(subtype,))
    assert isinstance(body, EmailMessage), f"the copy has no text/{subtype} part"
    content = body.get_content()
    assert isinstance(content, str)
    return content


async def provider_thread_of(station: OperatorStation, internet_message_id: str) -> str:
    """The provider's own thread id for an inbox message (read from the Maildir itself)."""
    return await inbox_thread_id(MaildirProvider(station.maildir, MAILBOX), internet_message_id)


# -- scenario 1 ------------------------------------------------------------------------------


async def test_scenario_01_a_new_maildir_message_resolves_the_registered_workspace_claims_once_and_creates_one_task(
    station: OperatorStation,
) -> None:
    message_id = station.deliver(sender=CLIENT)
    async with station.client() as client:
        _, claim, task = await claim_the_new_request(client, station)
    assert claim["message"]["body_text"].startswith("Could you send me a quote")
    assert task["workspace_id"] == station.workspace_id
    assert task["untrusted"]["sender"] == CLIENT
    assert task["untrusted"]["original_subject"]["text"] == "Quote request"

    store = station.store()
    try:
        assert [w.workspace_id for w in store.list_workspaces()] == [station.workspace_id]
        assert_one_task_of(store, station.workspace_id, message_id)
    finally:
        store.close()


# -- scenario 2 ------------------------------------------------------------------------------


def assert_one_claim_and_one_task(
    station: OperatorStation, claims: list[dict[str, Any]], reconciliations: list[dict[str, Any]]
) -> None:
    winners = [c for c in claims if c["outcome"] == "CLAIMED"]
    assert len(winners) == 1, claims
    [winner] = winners
    assert winner["task_created"] is True and winner["task_id"] is not None
    for loser in claims:
        if loser is winner:
            continue
        assert loser["outcome"] in {"EXECUTION_ALREADY_CLAIMED", "EXECUTION_ALREADY_DONE"}
        assert loser["disposition"] == loser["outcome"]
        assert loser["task_id"] is None and loser["task_created"] is False
    # Every worker's run is reconciled: one holds the item, the others lost the race.
    assert all(r["clean"] and r["scanned"] == 1 for r in reconciliations), reconciliations
    assert sum(r["non_terminal"] + r["terminal"] for r in reconciliations) == 1
    assert sum(r["claim_race"] for r in reconciliations) == len(claims) - 1

    store = station.store()
    try:
        counts = store.counts()
        assert counts["executions"] == 1 and counts["executions_done"] == 1
        assert counts["tasks"] == 1 and counts["task_messages"] == 1
        [task] = store.list_tasks(station.workspace_id)
        assert task.task_id == winner["task_id"]
        execution = store.get_execution(task.created_by)
        assert execution is not None and execution.state.value == "DONE"
        claimed = [
            entry
            for run in store.list_runs()
            for entry in store.ledger(run)
            if entry.disposition is not None
            and entry.disposition.value
            not in {"EXECUTION_ALREADY_CLAIMED", "EXECUTION_ALREADY_DONE"}
        ]
        assert len(claimed) == 1 and claimed[0].occurrence_key == task.created_by
    finally:
        store.close()


async def test_scenario_02_two_servers_racing_on_the_same_occurrence_create_one_claim_and_one_task(
    station: OperatorStation,
) -> None:
    station.deliver(sender=CLIENT)
    async with AsyncExitStack() as stack:
        # Two independent servers: each Client enters its own lifespan and store connection.
        first = await stack.enter_async_context(station.client())
        second = await stack.enter_async_context(station.client())
        # The second server reads the mailbox from its start while the first run is open
        # (as a worker whose cursor lagged would): both runs hold the same occurrence.
        scans = [
            await call(c, "intake", mailbox_id=MAILBOX, from_start=replay)
            for c, replay in ((first, False), (second, True))
        ]
        assert scans[0]["run_id"] != scans[1]["run_id"]
        assert scans[0]["items"][0]["item_ref"] == scans[1]["items"][0]["item_ref"]
        claims: list[dict[str, Any]] = [{}, {}]

        async def claim(index: int, client: Client, scanned: dict[str, Any]) -> None:
            [item] = scanned["items"]
            claims[index] = await call(
                client, "claim", run_id=item["run_id"], item_ref=item["item_ref"]
            )

        with anyio.fail_after(30):
            async with anyio.create_task_group() as tg:
                for index, (client, scanned) in enumerate(zip((first, second), scans, strict=True)):
                    tg.start_soon(claim, index, client, scanned)
        reconciliations = [
            (await reconcile_all(client, scanned))[0]
            for client, scanned in zip((first, second), scans, strict=True)
        ]
    assert_one_claim_and_one_task(station, claims, reconciliations)


@pytest.mark.slow
async def test_scenario_02_four_server_processes_racing_on_the_same_occurrence_create_one_claim_and_one_task(
    station: OperatorStation, tmp_path: Path
) -> None:
    station.deliver(sender=CLIENT)
    outloop = Path(sys.executable).with_name("outloop")
    assert outloop.is_file(), (
        f"the outloop console script is not installed next to {sys.executable}"
    )
    env = {k: v for k, v in os.environ.items() if k != DATABASE_URL_SETTING}
    env[DATA_DIR_ENV] = str(station.data_dir)
    params = StdioServerParameters(
        command=str(outloop), args=["serve", "--data-dir", str(station.data_dir)], env=env
    )
    claims: list[dict[str, Any]] = [{} for _ in range(RACERS)]
    reconciliations: list[dict[str, Any]] = [{} for _ in range(RACERS)]
    scanned_all = anyio.Event()
    scanned_count = 0
    logs = [tmp_path / f"server-{n}.log" for n in range(RACERS)]

    async def racer(index: int, client: Client) -> None:
        nonlocal scanned_count
        # Every server reads the mailbox from its start (as workers whose cursors lag behind
        # would), so every run holds the same occurrence.
        scanned = await call(client, "intake", mailbox_id=MAILBOX, from_start=True)
        [item] = scanned["items"]
        assert item["workspace_id"] == station.workspace_id
        # Every server has scanned the same occurrence before any of them claims it.
        scanned_count += 1
        if scanned_count == RACERS:
            scanned_all.set()
        await scanned_all.wait()
        claims[index] = await call(
            client, "claim", run_id=item["run_id"], item_ref=item["item_ref"]
        )
        [reconciliations[index]] = await reconcile_all(client, scanned)

    try:
        with anyio.fail_after(120):
            async with AsyncExitStack() as stack:
                clients: list[Client] = []
                for log in logs:
                    errlog = stack.enter_context(log.open("w", encoding="utf-8"))
                    clients.append(
                        await stack.enter_async_context(Client(stdio_client(params, errlog=errlog)))
                    )
                async with anyio.create_task_group() as tg:
                    for index, client in enumerate(clients):
                        tg.start_soon(racer, index, client)
    except BaseException:
        for log in logs:
            print(f"--- {log.name}\n{log.read_text(encoding='utf-8')}")
        raise
    assert_one_claim_and_one_task(station, claims, reconciliations)


# -- scenario 3 ------------------------------------------------------------------------------


async def test_scenario_03_a_replay_after_completion_creates_nothing_and_is_fully_reconciled(
    station: OperatorStation,
) -> None:
    first = station.deliver(sender=CLIENT)
    station.clock.advance(minutes=1)
    station.deliver(
        sender=CLIENT,
        subject="Re: Quote request",
        body="Also for the Q1 licences, please.",
        in_reply_to=first,
    )
    completed = await complete_the_request_and_its_follow_up(station)
    outbox_before = sent_by_message_id(station)

    # The replay runs in a fresh server (a restart), over the same Maildir read again from
    # its start (a plain intake reads only what arrived since the last one: nothing).
    replayed, counts_after = await replay_after_completion(station, completed)
    for claim in replayed:
        assert claim["message"] is None
    assert counts_after["tasks"] == 1 and counts_after["executions"] == 2
    assert sent_by_message_id(station).keys() == outbox_before.keys()


# -- scenario 4 ------------------------------------------------------------------------------


async def test_scenario_04_missing_context_is_a_context_gap_discovery_continues_and_no_provisional_kpi_becomes_official(
    tmp_path: Path,
) -> None:
    station = OperatorStation(root=tmp_path / "gap-station", clock=FrozenClock())
    station.register(station_context(station.workspace_id, kpis=False))
    source = station.root / "contexts" / f"{station.workspace_id}.yaml"
    source_before = source.read_bytes()
    registered = station.data_dir / "workspaces" / station.workspace_id / "context.yaml"
    registered_before = registered.read_bytes()
    station.deliver(sender=CLIENT)

    async with station.client() as client:
        assert (await context_resource(client, station.workspace_id))["kpis"]["official"] == {}
        scanned, [claim] = await intake_and_claim(client)
        assert claim["outcome"] == "CLAIMED" and claim["task_created"] is True
        assert claim["disposition"] == "CONTEXT_GAP_DISCOVERY"
        assert "kpis.official" in claim["detail"]
        task_id = claim["task_id"]

        task = await call(client, "get_task", task_id=task_id)
        assert task["state"] == "IN_DISCOVERY"
        [gate] = task["open_gates"]
        assert gate["kind"] == "context_gap" and "kpis.official" in gate["reason"]
        assert gate["owner"] == APPROVER
        provisional = task["provisional_basis"]
        assert provisional["first_response_hours"] == "24"
        assert "never an official KPI" in provisional["basis"]

        # Safe discovery continues: the task stays in discovery, then moves on with its work.
        same = await call(
            client, "transition_task", task_id=task_id, state="IN_DISCOVERY", evidence="asking"
        )
        assert same["state"] == "IN_DISCOVERY"
        working = await call(
            client,
            "transition_task",
            task_id=task_id,
            state="EXECUTING",
            evidence="reversible internal work while the KPI is discovered",
        )
        assert working["state"] == "EXECUTING"
        assert [g["kind"] for g in working["open_gates"]] == ["context_gap"]
        assert working["provisional_basis"] == provisional
        [queued] = (await call(client, "list_queue", workspace_id=station.workspace_id))["tasks"]
        assert queued["task_id"] == task_id

        # The provisional value can only be proposed; the proposal is queued, not applied.
        proposal = await call(
            client,
            "submit_learning",
            workspace_id=station.workspace_id,
            kind="rule",
            summary="official KPI first_response_hours: 24",
            detail="the provisional benchmark used while kpis.official is missing",
            evidence=[task_id],
        )
        assert proposal["state"] == "queued" and proposal["queued"] is True

        [reconciliation] = await reconcile_all(client, scanned)
        assert reconciliation["clean"] and reconciliation["non_terminal"] == 1

        live = await context_resource(client, station.workspace_id)
        assert live["kpis"]["official"] == {}
        assert "24" not in str(live["kpis"])

    # Neither the operator's file nor the registered copy changed.
    assert source.read_bytes() == source_before
    assert registered.read_bytes() == registered_before
    store = station.store()
    try:
        [pending] = store.list_proposals(station.workspace_id)
        assert pending.proposal_id == proposal["proposal_id"]
    finally:
        store.close()


# -- scenario 5 ------------------------------------------------------------------------------


async def test_scenario_05_internal_work_proceeds_while_the_client_send_waits_for_a_valid_approval(
    station: OperatorStation,
) -> None:
    station.deliver(sender=CLIENT)
    async with station.client() as client:
        _, [claim] = await intake_and_claim(client)
        task_id = claim["task_id"]
        await to_draft_ready(client, task_id)
        reply = await render_draft(
            client, task_id, "Dear Dana, the Q4 licence quote is USD 1,250 (INV-2026-118)."
        )

        # The client send waits for approval ...
        gate = await check_gate(client, task_id, reply["draft_id"], [CLIENT])
        assert gate["ready"] is False and gate["communication"] == "client_facing"
        assert [(r["blocker"], r["owner"]) for r in gate["reasons"]] == [
            ("approval_missing", APPROVER)
        ]
        [recipient] = gate["recipients"]
        assert recipient["recipient_class"] == "client" and recipient["resolved"] is True
        refusal = await refused(
            client, "send", task_id=task_id, draft_id=reply["draft_id"], to=[CLIENT]
        )
        assert refusal.data["refused"] == "gate"
        assert [r["blocker"] for r in refusal.data["reasons"]] == ["approval_missing"]

        # ... while the internal update to a verified colleague goes at once.
        note = await render_draft(
            client, task_id, "Eli, the Q4 quote for Dana is drafted and waits for Noa's approval."
        )
        internal_gate = await check_gate(client, task_id, note["draft_id"], [COLLEAGUE])
        assert internal_gate["ready"] is True and internal_gate["communication"] == "internal"
        internal = await send_draft(client, task_id, note["draft_id"], [COLLEAGUE])
        assert internal["status"] == "sent" and internal["to"] == [COLLEAGUE]
        assert internal["delivered"] is True  # the station's mail server delivers it
        assert internal["task_state"] == "DRAFT_READY"
        assert (await call(client, "read_back", send_id=internal["send_id"]))["ok"] is True

        approval = await call(
            client, "request_approval", task_id=task_id, draft_id=reply["draft_id"]
        )
        assert approval["task_state"] == "WAITING_INTERNAL_APPROVAL"
        assert approval["approvers"] == [APPROVER] and approval["recipients"] == [CLIENT]
        assert approval["request_message_id"] in sent_by_message_id(station)

        # Internal work still proceeds while the approval is outstanding.
        status = await render_draft(
            client, task_id, "Eli, the approval request went to Noa; nothing has gone to Dana yet."
        )
        update = await send_draft(client, task_id, status["draft_id"], [COLLEAGUE])
        assert update["status"] == "sent"
        assert update["task_state"] == "WAITING_INTERNAL_APPROVAL"
        waiting = await check_gate(client, task_id, reply["draft_id"], [CLIENT])
        assert waiting["ready"] is False and waiting["approval_basis"] is None
        assert "approval_missing" in [r["blocker"] for r in waiting["reasons"]]
        client_copies = [m for m in sent_by_message_id(station).values() if CLIENT in str(m["To"])]
        assert client_copies == []  # nothing reached the client's address yet

        # The approver replies; intake takes the reply in and the server judges it.
        decision = await approved_by_reply(station, client, approval)
        assert decision["draft_id"] == reply["draft_id"]
        verdict = await call(
            client,
            "record_approval",
            task_id=task_id,
            reply_message_id=decision["evidence_message_id"],
        )
        assert verdict["task_state"] == "APPROVED_TO_SEND" and APPROVER in verdict["finding"]

        ready = await check_gate(client, task_id, reply["draft_id"], [CLIENT])
        assert ready["ready"] is True and ready["reasons"] == []
        assert ready["approval_basis"] is not None and APPROVER in ready["approval_basis"]


# -- scenario 6 ------------------------------------------------------------------------------


async def test_scenario_06_an_approved_client_reply_stays_in_the_original_thread_and_is_read_back_from_the_stored_copy(
    station: OperatorStation,
) -> None:
    client_message = station.deliver(sender=CLIENT)
    async with station.client() as client:
        scanned, [claim] = await intake_and_claim(client)
        await reconcile_all(client, scanned)
        task_id = claim["task_id"]
        await to_draft_ready(client, task_id)
        reply = await render_draft(
            client, task_id, "Dear Dana, the Q4 licence quote is attached to INV-2026-118."
        )
        assert reply["subject"] == {"text": "Re: Quote request", "flags": []}
        approval = await call(
            client, "request_approval", task_id=task_id, draft_id=reply["draft_id"]
        )
        await approve_by_reply(station, client, [approval])

        sent = await call(client, "send", task_id=task_id, draft_id=reply["draft_id"], to=[CLIENT])
        assert sent["status"] == "sent" and sent["to"] == [CLIENT] and sent["cc"] == []
        assert sent["channel"] == "test-submission" and sent["delivered"] is True
        assert sent["task_state"] == "APPROVED_TO_SEND"  # sent once the copy is read back
        assert sent["provider_thread_id"] == await provider_thread_of(station, client_message)
        await read_back_the_client_reply(client, task_id, sent)

    # The stored copy itself answers the client's message, in its thread.
    copies = sent_by_message_id(station)
    to_client = [m for m in copies.values() if CLIENT in str(m["To"])]
    assert len(to_client) == 1
    copy = copies[sent["internet_message_id"]]
    assert copy is to_client[0]
    assert copy["In-Reply-To"] == client_message
    assert client_message in str(copy["References"]).split()
    assert copy["Subject"] == "Re: Quote request"
    assert copy["From"] == MAILBOX


# -- scenario 7 ------------------------------------------------------------------------------


def ltr_isolated(html: str) -> set[str]:
    """The texts of the elements that isolate left-to-right text (dir="ltr")."""
    tree = LexborHTMLParser(html)
    return {node.text(deep=True) for node in tree.css('[dir="ltr"]')}


def wrapper_of(html: str) -> dict[str, str | None]:
    """The attributes of the outermost element inside <body> that sets a direction."""
    tree = LexborHTMLParser(html)
    assert tree.body is not None
    wrapper = tree.body.css_first("[dir]")
    assert wrapper is not None, "no element of the stored copy sets a direction"
    return dict(wrapper.attributes)


async def drafted_in_hebrew_and_english(
    client: Client,
    hebrew_task: str,
    english_task: str,
    request_approval: Callable[..., Awaitable[dict[str, Any]]],
) -> tuple[dict[str, dict[str, Any]], list[dict[str, Any]]]:
    """Each task worked to DRAFT_READY and drafted (the Hebrew one from HEBREW_BODY in
    Hebrew, the English one from ENGLISH_BODY in English), its draft then put to the approver
    by ``request_approval(task_id=..., draft_id=...)``; the drafts by task, and the approval
    requests."""
    drafts: dict[str, dict[str, Any]] = {}
    requests: list[dict[str, Any]] = []
    for task_id, body, language in (
        (hebrew_task, HEBREW_BODY, "he"),
        (english_task, ENGLISH_BODY, "en"),
    ):
        await to_draft_ready(client, task_id)
        drafts[task_id] = await call(
            client, "render", task_id=task_id, body_markdown=body, language=language
        )
        requests.append(
            await request_approval(task_id=task_id, draft_id=drafts[task_id]["draft_id"])
        )
    return drafts, requests


def assert_hebrew_reply(message: EmailMessage) -> None:
    """The reply drafted from HEBREW_BODY to the Hebrew request, as sent: right-to-left and
    Hebrew, every LTR fragment isolated (in the HTML part by dir="ltr", in the text part by
    LRI ... PDI)."""
    assert message["Subject"] == f"Re: {HEBREW_SUBJECT}"
    html = part(message, "html")
    wrapper = wrapper_of(html)
    assert (wrapper.get("dir"), wrapper.get("lang")) == ("rtl", "he")
    assert "text-align:right" in (wrapper.get("style") or "").replace(" ", "")
    assert set(HEBREW_FRAGMENTS) <= ltr_isolated(html)
    assert "שלום דנה" in html and "ההצעה המעודכנת" in html
    text = part(message, "plain")
    for fragment in HEBREW_FRAGMENTS:  # the text part isolates them with LRI ... PDI
        assert f"\u2066{fragment}\u2069" in text, fragment


def assert_english_reply(message: EmailMessage) -> None:
    """The reply drafted from ENGLISH_BODY, as sent: left-to-right and English, its text
    intact."""
    html = part(message, "html")
    wrapper = wrapper_of(html)
    assert (wrapper.get("dir"), wrapper.get("lang")) == ("ltr", "en")
    assert "text-align:left" in (wrapper.get("style") or "").replace(" ", "")
    assert "INV-2026-119" in html and "USD 1,250" in html
    assert "https://contoso.test/quotes/119" in html


async def test_scenario_07_hebrew_rtl_and_english_ltr_survive_stored_copy_read_back_with_isolated_urls_prices_and_ids(
    station: OperatorStation,
) -> None:
    station.deliver(sender=CLIENT, subject=HEBREW_SUBJECT, body="שלום, אפשר הצעת מחיר?")
    station.clock.advance(minutes=1)
    station.deliver(sender=CLIENT, subject="Quote request", body="Hi, may I have a quote?")
    async with station.client() as client:
        scanned, claims = await intake_and_claim(client)
        await reconcile_all(client, scanned)
        assert [c["task_created"] for c in claims] == [True, True]
        hebrew_task, english_task = (c["task_id"] for c in claims)

        drafts, requests = await drafted_in_hebrew_and_english(
            client, hebrew_task, english_task, partial(call, client, "request_approval")
        )
        hebrew, english = drafts[hebrew_task], drafts[english_task]
        assert (hebrew["direction"], hebrew["language"]) == ("rtl", "he")
        assert (english["direction"], english["language"]) == ("ltr", "en")
        assert hebrew["subject"] == {"text": f"Re: {HEBREW_SUBJECT}", "flags": []}
        assert set(HEBREW_FRAGMENTS) <= ltr_isolated(hebrew["html"])

        await approve_by_reply(station, client, requests)

        sends: dict[str, dict[str, Any]] = {}
        read_backs: dict[str, dict[str, Any]] = {}
        for task_id, draft in drafts.items():
            sends[task_id] = await send_draft(client, task_id, draft["draft_id"], [CLIENT])
            assert sends[task_id]["status"] == "sent"
            assert sends[task_id]["delivered"] is True
            read_backs[task_id] = await call(client, "read_back", send_id=sends[task_id]["send_id"])

    for task_id, read_back in read_backs.items():
        checks = by_name(read_back)
        assert read_back["ok"] is True, read_back
        assert set(checks) == READ_BACK_CHECKS, sorted(checks)
        for name in (
            "wrapper.direction",
            "wrapper.lang",
            "wrapper.alignment",
            "blocks",
            "fragments",
            "body_text",
            "thread",
            "message_id",
        ):
            assert checks[name]["ok"] is True, (task_id, checks[name])

    copies = sent_by_message_id(station)

    # Hebrew: the stored copy is right-to-left, Hebrew, and every LTR fragment is isolated.
    assert_hebrew_reply(copies[sends[hebrew_task]["internet_message_id"]])
    # English: the stored copy is left-to-right, English, its text intact.
    assert_english_reply(copies[sends[english_task]["internet_message_id"]])


# -- read-back reporting ---------------------------------------------------------------------


async def test_read_back_checks_that_pass_carry_no_failure_message(
    station: OperatorStation,
) -> None:
    """A passing check must not describe a failure: a host reads ``detail`` as the reason."""
    station.deliver(sender=CLIENT)
    async with station.client() as client:
        _, [claim] = await intake_and_claim(client)
        task_id = claim["task_id"]
        await to_draft_ready(client, task_id)
        note = await call(
            client, "render", task_id=task_id, body_markdown="Eli, see INV-2026-118.", language="en"
        )
        sent = await send_draft(client, task_id, note["draft_id"], [COLLEAGUE])
        read_back = await call(client, "read_back", send_id=sent["send_id"])
    assert read_back["ok"] is True
    checks = by_name(read_back)
    misleading = {
        name: checks[name]["detail"]
        for name in ("wrapper.direction", "fragments", "body_text")
        if checks[name]["ok"] and checks[name]["detail"]
    }
    assert misleading == {}


# -- send idempotency ------------------------------------------------------------------------


async def test_repeating_a_sent_client_send_is_refused_naming_the_first_send_and_sends_nothing(
    station: OperatorStation,
) -> None:
    """A host that lost send's answer calls it again: nothing goes twice, and the refusal
    names the first send (its send_id, to read back)."""
    station.deliver(sender=CLIENT)
    async with station.client() as client:
        scanned, [claim] = await intake_and_claim(client)
        await reconcile_all(client, scanned)
        task_id = claim["task_id"]
        await to_draft_ready(client, task_id)
        reply = await call(
            client, "render", task_id=task_id, body_markdown="Dear Dana, here it is.", language="en"
        )
        approval = await call(
            client, "request_approval", task_id=task_id, draft_id=reply["draft_id"]
        )
        await approve_by_reply(station, client, [approval])
        sent = await call(client, "send", task_id=task_id, draft_id=reply["draft_id"], to=[CLIENT])
        again = await refused(
            client, "send", task_id=task_id, draft_id=reply["draft_id"], to=[CLIENT]
        )
        read_back = await call(client, "read_back", send_id=again.data["send_id"])
    to_client = [m for m in sent_by_message_id(station).values() if CLIENT in str(m["To"])]
    assert len(to_client) == 1  # never sent twice
    assert again.code == REFUSED
    assert again.data["refused"] == "already_sent"
    assert again.data["send_id"] == sent["send_id"]
    assert again.data["internet_message_id"] == sent["internet_message_id"]
    assert read_back["ok"]
