"""Seed 000 section 12 acceptance scenarios with the browser, through the MCP server: a
mailbox of the session's mock providers whose last permitted channel is its mail system's
web app (Outlook on the web, Gmail; the mock web apps in headless Chromium), signed in by
managed login with the worker's password and authenticator secret from the vault.

- 9: Outlook without Graph: the context does not permit Graph; the provider MCP server is
  evaluated (no token for it: a gap, recorded), then Outlook on the web does the whole
  lifecycle - intake, approval by the approver's reply, the Hebrew reply inside the client's
  conversation, and the read-back of the stored copy (direction, language, isolates).
- 10: the browser starts logged out: managed login signs in with password and code, the
  account is re-verified, and the run resumes with no human task; a session that expires
  before the send is signed in again and the reply goes out once.
- 8: no connector on the API side: the browser is the path the order reaches.
- 11: Graph refuses to send: the refusal is never routed around through the browser, and
  reads go on where the context authorizes them.
- A send Graph lost the answer to is settled from Graph's copy, found through Outlook on
  the web, before the browser may send it.
- Gmail on the web (a Google mailbox, browser only): 6, an approved Hebrew reply in the
  client's Gmail thread, read back; 7, Hebrew and English kept through Gmail's stored and
  delivered copies; 10, as above; 13, reading marks, labels and moves nothing.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from selectolax.lexbor import LexborHTMLParser

from agent.services import workspaces
from browser_adapters import webmail
from managed_login.totp import Codes
from mcp_server.composition import Settings
from tests.browser import chromium_executable
from tests.browser_adapters.outlook_mock import SECRET, WebClock
from tests.conftest import session_mock
from tests.mcp.conftest import (
    APPROVER,
    CLIENT,
    READ_BACK_CHECKS,
    by_name,
    call,
    intake_and_claim,
    read_back_the_client_reply,
    reconcile_all,
    refused,
    to_draft_ready,
)
from tests.mcp.test_access_scenarios import MCP_ENDPOINT, RoutedStation, routed_station
from tests.mcp.test_api_scenarios import (
    approve_by_reply,
    assert_kept_html,
    parsed,
    request_approval,
)
from tests.mcp.test_imap_scenarios import CLIENT_NAME
from tests.mcp.test_scenarios import (
    HEBREW_BODY,
    HEBREW_SUBJECT,
    drafted_in_hebrew_and_english,
    part,
)

pytestmark = pytest.mark.anyio

WORKSPACE = "ws-test-0001"
WEB_APPS = {"microsoft": "/web/outlook/mail/", "google": "/web/gmail/mail/u/0/"}
"""Each mail system's web app on the mock."""


@dataclass(kw_only=True)
class BrowserStation(RoutedStation):
    """``RoutedStation`` whose mailbox also permits its mail system's web app."""

    @property
    def settings(self) -> Settings:
        return Settings(
            data_dir=self.data_dir,
            vault_backend="plain",
            browser_executable=chromium_executable(),
        )

    def context(self) -> str:
        url = f"{self.admin.base_url}{WEB_APPS[self.kind]}"
        return (
            super()
            .context()
            .replace(
                f"channels: {self.channels}",
                f"channels: {self.channels}, browser: {{url: '{url}'}}",
                1,
            )
        )

    def worker_secrets(self) -> None:
        """The worker's password and authenticator setup key, as the operator stores them."""
        self.vault_set("password", "pw-" + self.mailbox)
        self.vault_set("totp", SECRET)

    def sessions(self) -> list[Path]:
        folder = self.data_dir / "browser"
        return sorted(folder.glob("*.json")) if folder.exists() else []


@pytest.fixture
def codes_clock(monkeypatch: pytest.MonkeyPatch) -> Iterator[WebClock]:
    """The TOTP clock of the mock and of the worker's codes, driven by the test."""
    admin = session_mock()
    clock = WebClock(admin)
    monkeypatch.setattr(webmail, "Codes", partial(Codes, clock=clock, sleep=clock.sleep))
    yield clock
    admin.clear_faults()


def _station(
    tmp_path: Path,
    channels: str,
    *,
    scopes: list[str] | None = None,
    provider: str = "microsoft",
    **fields: Any,
) -> tuple[BrowserStation, dict[str, Any]]:
    station, account = routed_station(
        tmp_path,
        scopes=scopes,
        kind=BrowserStation,
        provider=provider,
        channels=channels,
        **fields,
    )
    assert isinstance(station, BrowserStation)
    station.worker_secrets()
    return station, account


async def _drafted(
    station: BrowserStation, client: Any
) -> tuple[dict[str, Any], str, dict[str, Any]]:
    """The client's request taken in and claimed, and our reply rendered: the intake's
    result, the task and its draft."""
    scanned, [claim] = await intake_and_claim(client, station.mailbox)
    assert claim["outcome"] == "CLAIMED" and scanned["access_errors"] == []
    task_id = claim["task_id"]
    await to_draft_ready(client, task_id)
    draft = await call(client, "render", task_id=task_id, body_markdown="We are on it.")
    return scanned, task_id, draft


async def _approved_reply(station: BrowserStation, client: Any) -> tuple[str, dict[str, Any]]:
    """``_drafted``, then the approval asked for and the approver's reply approving it
    taken in: the task and its draft."""
    scanned, task_id, draft = await _drafted(station, client)
    request = await request_approval(station, client, task_id, draft["draft_id"])
    for reconciliation in await reconcile_all(client, scanned):
        assert reconciliation["clean"], reconciliation
    await approve_by_reply(station, client, [request])
    return task_id, draft


async def _send_through_browser(
    station: BrowserStation, client: Any, task_id: str, draft_id: str
) -> dict[str, Any]:
    sent = await call(client, "send", task_id=task_id, draft_id=draft_id, to=[CLIENT])
    assert sent["status"] == "sent" and sent["channel"] == "browser", sent
    return sent


async def test_scenario_09_outlook_without_graph_goes_past_the_provider_mcp_server_to_outlook_on_the_web(
    tmp_path: Path, codes_clock: WebClock
) -> None:
    del codes_clock
    station, _ = _station(tmp_path, "[provider_mcp, browser]", mcp=True)  # no MCP token stored
    request_id = station.deliver(sender=CLIENT, sender_name=CLIENT_NAME, subject=HEBREW_SUBJECT)
    async with station.client() as client:
        access = await call(client, "access_status", workspace_id=station.workspace_id)
        [mailbox] = access["mailboxes"]
        states = {c["channel"]: c["state"] for c in mailbox["channels"]}
        assert states == {"api": "not_permitted", "provider_mcp": "gap", "browser": "usable"}
        assert mailbox["path"] == "browser" and mailbox["ok"] is True

        scanned, [claim] = await intake_and_claim(client, station.mailbox)
        assert claim["outcome"] == "CLAIMED" and claim["task_created"] is True
        task_id = claim["task_id"]
        await to_draft_ready(client, task_id)
        draft = await call(
            client, "render", task_id=task_id, body_markdown=HEBREW_BODY, language="he"
        )
        request = await request_approval(station, client, task_id, draft["draft_id"])
        for reconciliation in await reconcile_all(client, scanned):
            assert reconciliation["clean"], reconciliation
        await approve_by_reply(station, client, [request])
        sent = await _send_through_browser(station, client, task_id, draft["draft_id"])
        await read_back_the_client_reply(client, task_id, sent)

    [stored] = [m for m in station.stored("sent") if m["id"] != request["request_message_id"]
                and parsed(m)["To"] == CLIENT]  # fmt: skip
    assert stored["thread_id"] == station.thread_of(request_id)
    delivered = parsed(stored)
    assert delivered["In-Reply-To"] == request_id
    assert delivered["Subject"] == f"Re: {HEBREW_SUBJECT}"
    assert 'dir="rtl"' in stored["html"] and 'lang="he"' in stored["html"]
    copies = [m for m in station.stored("inbox", CLIENT) if parsed(m)["In-Reply-To"] == request_id]
    assert len(copies) == 1  # the client got the reply once
    recorded = "\n".join(station.health())
    assert "channel provider_mcp passed over" in recorded
    assert station.inbox_state() == station.inbox  # nothing read was marked, moved or labelled


@pytest.mark.parametrize("provider", ["microsoft", "google"], ids=["outlook_web", "gmail_web"])
async def test_scenario_10_a_logged_out_browser_signs_in_re_verifies_and_resumes_with_no_human_task(
    tmp_path: Path, codes_clock: WebClock, provider: str
) -> None:
    del codes_clock
    station, _ = _station(tmp_path, "[browser]", provider=provider)
    assert station.sessions() == []  # logged out: no session kept yet
    request_id = station.deliver(sender=CLIENT, subject="Quote request")
    async with station.client() as client:
        task_id, draft = await _approved_reply(station, client)  # signed in to read
        [session] = station.sessions()
        assert session.stat().st_mode & 0o777 == 0o600

        station.admin.faults(expire_web_sessions=True)  # signed out before the send
        sent = await _send_through_browser(station, client, task_id, draft["draft_id"])
        await read_back_the_client_reply(client, task_id, sent)
        queue = await call(client, "list_queue", workspace_id=station.workspace_id)
        [waiting] = queue["tasks"]  # the client's task, waiting for her answer: no other task
        assert waiting["task_id"] == task_id
    store = station.store()
    try:
        assert store.list_escalations() == []  # the sign-ins never became a person's task
    finally:
        store.close()
    replies = [m for m in station.stored("inbox", CLIENT) if parsed(m)["In-Reply-To"] == request_id]
    assert len(replies) == 1  # sent once, after the second sign-in


async def test_scenario_08_with_no_connector_on_the_api_side_the_browser_reads_the_mailbox(
    tmp_path: Path, codes_clock: WebClock
) -> None:
    del codes_clock
    station, _ = _station(tmp_path, "[api, provider_mcp, browser]", mcp=False)
    station.deliver(sender=CLIENT, subject="Quote request")
    async with station.client() as client:
        access = await call(client, "access_status", workspace_id=station.workspace_id)
        [mailbox] = access["mailboxes"]
        states = [c["state"] for c in mailbox["channels"]]
        assert states == ["gap", "gap", "usable"], mailbox["channels"]
        assert mailbox["path"] == "browser"
        scanned, [claim] = await intake_and_claim(client, station.mailbox)
        assert scanned["access_errors"] == [] and claim["outcome"] == "CLAIMED"
        for reconciliation in await reconcile_all(client, scanned):
            assert reconciliation["clean"], reconciliation
    recorded = "\n".join(station.health())
    assert "channel api passed over: no connector" in recorded
    assert "channel browser in use" in recorded


@pytest.mark.parametrize("authorized", [True, False], ids=["reads_authorized", "reads_not"])
async def test_scenario_11_a_refusal_is_not_bypassed_through_the_browser(
    tmp_path: Path, codes_clock: WebClock, authorized: bool
) -> None:
    del codes_clock
    no_send = [
        "https://graph.microsoft.com/User.Read",
        "https://graph.microsoft.com/Mail.ReadWrite",
    ]
    station, account = _station(
        tmp_path, "[api, browser]", scopes=no_send, mcp=False, reads_after_refusal=authorized
    )
    station.connect_without_check(account)
    station.deliver(sender=CLIENT, subject="Quote request")
    async with station.client() as client:
        scanned, task_id, draft = await _drafted(station, client)
        first = await refused(
            client, "request_approval", task_id=task_id, draft_id=draft["draft_id"]
        )
        assert first.data["refused"] == "policy"  # type: ignore[index]
        assert "never routed around" in first.message
        await reconcile_all(client, scanned)
        access = await call(client, "access_status", workspace_id=station.workspace_id)
        [mailbox] = access["mailboxes"]
        assert mailbox["channels"][0]["state"] == "refused"
        assert mailbox["channels"][2]["state"] != "usable"  # the browser is not a way round
        station.deliver(sender=APPROVER, subject="Another question")
        reading = await call(client, "intake", mailbox_id=station.mailbox)
        if authorized:
            assert reading["access_errors"] == []
            assert [i["untrusted"]["subject"]["text"] for i in reading["items"]] == [
                "Another question"
            ]
        else:
            assert reading["items"] == []
        await reconcile_all(client, reading)
    assert station.stored("sent") == []
    assert station.sessions() == []  # the browser was never opened to go around it


async def test_a_send_graph_lost_is_settled_from_its_copy_through_outlook_on_the_web_before_the_browser_may_send(
    tmp_path: Path, codes_clock: WebClock
) -> None:
    del codes_clock
    station, account = _station(tmp_path, "[api, browser]", mcp=False)
    station.connect_without_check(account)
    station.deliver(sender=CLIENT, subject="Quote request")
    async with station.client() as client:
        task_id, draft = await _approved_reply(station, client)

        station.admin.faults(drop_send_ack=1)  # Graph takes the send and the answer is lost
        lost = await refused(
            client, "send", task_id=task_id, draft_id=draft["draft_id"], to=[CLIENT]
        )
        assert "outcome is not known yet" in lost.message

        station.channels = "[browser]"  # the operator no longer permits Graph
        source = station.root / "contexts" / f"{station.workspace_id}.yaml"
        source.write_text(station.context(), encoding="utf-8")
        store = station.store()
        try:
            workspaces.update_workspace(
                store, workspaces.DataDir(station.data_dir), source, station.clock.now()
            )
        finally:
            store.close()
        settled = await call(
            client, "send", task_id=task_id, draft_id=draft["draft_id"], to=[CLIENT]
        )
        assert settled["status"] == "recovered", settled
        again = await refused(
            client, "send", task_id=task_id, draft_id=draft["draft_id"], to=[CLIENT]
        )
        assert "never sent twice" in again.message
    copies = [
        m for m in station.stored("sent")
        if str(parsed(m)["Message-ID"]) == settled["internet_message_id"]
    ]  # fmt: skip
    assert len(copies) == 1  # Graph's copy; the browser sent nothing
    assert MCP_ENDPOINT  # the provider MCP server is not part of this mailbox's order


async def test_a_reply_whose_copy_showed_late_is_linked_under_the_message_id_exchange_gave_it(
    tmp_path: Path, codes_clock: WebClock
) -> None:
    """Outlook on the web gives a message its own Message-ID, read from the sent copy; a
    copy that does not show at once leaves the send recorded under ours, and the read-back
    links the copy's, so the client's answer to it joins the task."""
    del codes_clock
    station, _ = _station(tmp_path, "[browser]")
    station.deliver(sender=CLIENT, subject="Quote request")
    async with station.client() as client:
        task_id, draft = await _approved_reply(station, client)

        station.admin.faults(delay_sent_copy_seconds=3600)
        sent = await _send_through_browser(station, client, task_id, draft["draft_id"])
        station.admin.faults(release_delayed=True)
        read_back = await call(client, "read_back", send_id=sent["send_id"])
        assert read_back["ok"] is True, read_back
        [copy] = [m for m in station.stored("sent") if parsed(m)["To"] == CLIENT]
        given = str(parsed(copy)["Message-ID"])
        assert given != sent["internet_message_id"]  # the send could not name it at once
        task = await call(client, "get_task", task_id=task_id)
        assert task["sent_message_id"] == given

        station.deliver(sender=CLIENT, subject="Another matter", in_reply_to=given)
        answered, [joined] = await intake_and_claim(client, station.mailbox)
        assert joined["task_id"] == task_id and joined["task_created"] is False
        for reconciliation in await reconcile_all(client, answered):
            assert reconciliation["clean"], reconciliation


async def test_an_approval_request_whose_answer_was_lost_is_settled_from_its_copy_and_approved(
    tmp_path: Path, codes_clock: WebClock
) -> None:
    """Outlook on the web filed the request and its answer was lost: the next
    request_approval settles it from the copy (nothing sent twice) and records the
    Message-ID Exchange gave it, so the approver's reply to it approves."""
    del codes_clock
    station, _ = _station(tmp_path, "[browser]")
    station.deliver(sender=CLIENT, subject="Quote request")
    async with station.client() as client:
        scanned, task_id, draft = await _drafted(station, client)
        station.admin.faults(drop_send_ack=1)
        lost = await refused(
            client, "request_approval", task_id=task_id, draft_id=draft["draft_id"]
        )
        assert "outcome is not known yet" in lost.message
        request = await request_approval(station, client, task_id, draft["draft_id"])
        [copy] = [m for m in station.stored("sent") if parsed(m)["To"] == APPROVER]
        assert request["request_message_id"] == str(parsed(copy)["Message-ID"])
        for reconciliation in await reconcile_all(client, scanned):
            assert reconciliation["clean"], reconciliation
        await approve_by_reply(station, client, [request])


# -- Gmail on the web: scenarios 6, 7 and 13 ---------------------------------------------------


def _written(html: str) -> str:
    """What was written, as Gmail keeps it in its own ``div dir="ltr"`` (its composer's
    direction): our block, whose wrapper says the message's direction and language."""
    ours = LexborHTMLParser(html).css_first('div[dir="ltr"] > [class^="outloop-"]')
    assert ours is not None, html
    return ours.html or ""


def _reply_to_client(station: BrowserStation, request_id: str) -> dict[str, Any]:
    """Our one sent copy answering the client's message ``request_id``."""
    [stored] = [
        m for m in station.stored("sent")
        if parsed(m)["To"] == CLIENT and parsed(m)["In-Reply-To"] == request_id
    ]  # fmt: skip
    return stored


async def test_scenario_06_an_approved_reply_through_gmail_on_the_web_stays_in_the_clients_thread_and_is_read_back(
    tmp_path: Path, codes_clock: WebClock
) -> None:
    del codes_clock
    station, _ = _station(tmp_path, "[browser]", provider="google")
    request_id = station.deliver_hebrew_request(sender_name=CLIENT_NAME)
    async with station.client() as client:
        scanned, [claim] = await intake_and_claim(client, station.mailbox)
        assert claim["outcome"] == "CLAIMED" and claim["task_created"] is True
        task_id = claim["task_id"]
        await to_draft_ready(client, task_id)
        draft = await call(
            client, "render", task_id=task_id, body_markdown=HEBREW_BODY, language="he"
        )
        request = await request_approval(station, client, task_id, draft["draft_id"])
        for reconciliation in await reconcile_all(client, scanned):
            assert reconciliation["clean"], reconciliation
        await approve_by_reply(station, client, [request])
        sent = await _send_through_browser(station, client, task_id, draft["draft_id"])
        await read_back_the_client_reply(client, task_id, sent)

        replay, replayed = await intake_and_claim(client, station.mailbox, from_start=True)
        assert [c["outcome"] for c in replayed] == ["EXECUTION_ALREADY_DONE"] * 2
        [reconciliation] = await reconcile_all(client, replay)
        assert reconciliation["clean"] and reconciliation["claim_race"] == 2

    stored = _reply_to_client(station, request_id)
    assert stored["thread_id"] == station.thread_of(request_id)  # Gmail's own thread
    assert stored["id"] == sent["provider_message_id"]
    delivered = parsed(stored)
    assert str(delivered["Message-ID"]) == sent["internet_message_id"]  # the one Gmail gave
    assert str(delivered["References"]).split() == [request_id]
    assert delivered["Subject"] == f"Re: {HEBREW_SUBJECT}"
    received = [
        m for m in station.stored("inbox", CLIENT) if parsed(m)["In-Reply-To"] == request_id
    ]
    assert len(received) == 1  # the client got the reply once
    assert station.inbox_state() == station.inbox  # nothing read was marked or labelled


async def test_scenario_07_hebrew_rtl_and_english_ltr_survive_read_back_through_gmail_on_the_web_with_isolated_fragments(
    tmp_path: Path, codes_clock: WebClock
) -> None:
    del codes_clock
    station, _ = _station(tmp_path, "[browser]", provider="google")
    hebrew_request = station.deliver_hebrew_request()
    english_request = station.deliver(sender=CLIENT, body="Hi, may I have a quote?")
    async with station.client() as client:
        scanned, claims = await intake_and_claim(client, station.mailbox)
        by_subject = {c["message"]["subject"]["text"]: c["task_id"] for c in claims}
        hebrew_task, english_task = by_subject[HEBREW_SUBJECT], by_subject["Quote request"]
        drafts, requests = await drafted_in_hebrew_and_english(
            client, hebrew_task, english_task, partial(request_approval, station, client)
        )
        for reconciliation in await reconcile_all(client, scanned):
            assert reconciliation["clean"], reconciliation
        await approve_by_reply(station, client, requests)
        for task_id, draft in drafts.items():
            sent = await _send_through_browser(station, client, task_id, draft["draft_id"])
            read_back = await call(client, "read_back", send_id=sent["send_id"])
            checks = by_name(read_back)
            assert read_back["ok"] is True and set(checks) == READ_BACK_CHECKS, read_back
            assert all(c["ok"] for c in checks.values()), checks

    for request, language in ((hebrew_request, "he"), (english_request, "en")):
        stored = _reply_to_client(station, request)
        assert stored["thread_id"] == station.thread_of(request)
        assert_kept_html(_written(stored["html"]), language)  # as Gmail keeps it
        [received] = [
            m for m in station.stored("inbox", CLIENT) if parsed(m)["In-Reply-To"] == request
        ]
        assert_kept_html(_written(part(parsed(received), "html")), language)  # as delivered


async def test_scenario_13_gmail_on_the_web_reads_the_mailbox_without_marking_labelling_or_moving_anything(
    tmp_path: Path, codes_clock: WebClock
) -> None:
    """What the run knows of an item is the store's, never the mailbox's read flags or
    labels: reading through Gmail's page leaves every message unread and where it was, and a
    second read takes nothing in again."""
    del codes_clock
    station, _ = _station(tmp_path, "[browser]", provider="google")
    station.deliver(sender=CLIENT, subject="Quote request")
    station.deliver(sender=APPROVER, subject="Another question")
    assert all(not state[3] for state in station.inbox.values())  # both unread
    async with station.client() as client:
        scanned, claims = await intake_and_claim(client, station.mailbox)
        assert [c["outcome"] for c in claims] == ["CLAIMED", "CLAIMED"]
        for reconciliation in await reconcile_all(client, scanned):
            assert reconciliation["clean"], reconciliation
        again = await call(client, "intake", mailbox_id=station.mailbox)
        assert again["items"] == []  # the channel's cursor, not an unread flag
        await reconcile_all(client, again)
    assert station.inbox_state() == station.inbox
