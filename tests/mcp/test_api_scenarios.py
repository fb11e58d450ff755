"""Seed 000 section 12 acceptance scenarios 1, 6 and 7 through the MCP server, with the
workspace's mailbox on the Gmail API and on Microsoft Graph (the session's mock providers,
docs/fixtures.md).

The station is set up the way an operator sets up an API mailbox: a Workspace Context that
binds a mailbox of its own (``support-<uuid>@fabrikam.test``: the mock is shared by the
session) with ``provider: google`` or ``microsoft`` and an ``api:`` block naming the mock's
endpoints, then ``outloop connect --stdin`` with the account's OAuth client id, secret and
refresh token, in a plain vault; the command signs in through the adapter to check them. The
server's own composition root (``Providers``) builds the adapter from the context and the
vault: no provider is passed in.

Mail reaches the workspace as the provider delivers it (the mock's admin API). The client,
the approver and the colleague are accounts of the mock too (their addresses are the shared
helpers', so they are made once and kept for the session; as Gmail accounts, whichever mail
system sends to them), so what the workspace sends lands in their inboxes and is checked
there, each message found by its Message-ID.

Checked after every test (scenario 13 and the envelope rule): the workspace's inbox holds
exactly what was delivered with the ids, thread ids, labels or categories and read flags the
provider gave it (reading changed nothing); no draft is left; its sent mail holds exactly the
messages the host had sent; and each of them went to exactly the recipients the host named -
in its To and Cc, and in the inboxes of the people, once each, and no one else's.
"""

from __future__ import annotations

import base64
import email
import email.policy
import email.utils
import os
import uuid
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from email.message import EmailMessage
from email.utils import getaddresses
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from mcp import Client

from fixtures.admin import MockAdmin
from mcp_server.cli import main as outloop
from mcp_server.composition import Settings
from mcp_server.server import build_server
from tests.conftest import context_yaml, session_mock
from tests.mcp.conftest import (
    APPROVER,
    CLIENT,
    COLLEAGUE,
    COLLEAGUE_LINE,
    DELIVERY,
    READ_BACK_CHECKS,
    OperatorStation,
    assert_one_task_of,
    by_name,
    call,
    intake_and_claim,
    read_back_the_client_reply,
    reconcile_all,
    to_draft_ready,
)
from tests.mcp.test_imap_scenarios import CLIENT_NAME, HEBREW_REQUEST, MailServerTime
from tests.mcp.test_scenarios import (
    HEBREW_BODY,
    HEBREW_FRAGMENTS,
    HEBREW_SUBJECT,
    assert_english_reply,
    assert_hebrew_reply,
    drafted_in_hebrew_and_english,
    ltr_isolated,
    part,
    wrapper_of,
)

pytestmark = pytest.mark.anyio

WORKSPACE = "ws-test-0001"
PEOPLE = (CLIENT, APPROVER, COLLEAGUE)
"""The people the workspace writes to: accounts of the mock, so what it sends lands somewhere."""
ENDPOINTS = {
    "google": ("/gmail/v1", "/oauth2/google/token"),
    "microsoft": ("/graph/v1.0", "/oauth2/microsoft/common/oauth2/v2.0/token"),
}
VAULT_NAMES = ("oauth_client_id", "oauth_client_secret", "oauth_refresh_token")


def parsed(stored: dict[str, Any]) -> EmailMessage:
    """A message the mock stores (``MockAdmin.stored``), parsed from its raw bytes."""
    message = email.message_from_bytes(
        base64.b64decode(stored["raw_base64"]), policy=email.policy.default
    )
    assert isinstance(message, EmailMessage)
    return message


def with_id(stored: Sequence[dict[str, Any]], message_id: str) -> dict[str, Any]:
    """The one stored message carrying ``message_id``."""
    found = [m for m in stored if str(parsed(m)["Message-ID"]) == message_id]
    assert len(found) == 1, (message_id, [str(parsed(m)["Message-ID"]) for m in stored])
    return found[0]


def ensure_people(admin: MockAdmin) -> None:
    """The client, the approver and the colleague as accounts of the mock: made by the first
    test that needs them and kept (the mock is the session's, never reset)."""
    for person in PEOPLE:
        try:
            admin.account(person, "google")
        except RuntimeError as exc:
            if "already exists" not in str(exc):
                raise


# -- a station whose mailbox is reached through the provider's API ---------------------------


@dataclass(kw_only=True)
class ApiStation(OperatorStation):
    """``OperatorStation`` with its mailbox an account of the mock Gmail API or Graph: mail
    is delivered by the provider, and the server is built from its settings alone (the vault
    holds the OAuth client and refresh token ``outloop connect`` stored)."""

    admin: MockAdmin
    kind: str
    """The mail system: google or microsoft."""
    mailbox: str
    """The workspace mailbox's address (its own per test: no test sees another's)."""
    inbox: dict[str, tuple[Any, ...]] = field(default_factory=dict[str, tuple[Any, ...]])
    """The inbox as the last delivery left it (``inbox_state``)."""
    planned: dict[str, tuple[str, ...]] = field(default_factory=dict[str, tuple[str, ...]])
    """The recipients the host named for each message it had sent, by Message-ID."""

    @property
    def settings(self) -> Settings:
        return Settings(data_dir=self.data_dir, vault_backend="plain")

    def context(self) -> str:
        """The Workspace Context an operator writes for this mailbox."""
        base, token = (self.admin.base_url + path for path in ENDPOINTS[self.kind])
        api = f"api: {{base_url: '{base}', token_url: '{token}'}}"
        text = context_yaml(
            self.workspace_id, mailbox=self.mailbox, provider=self.kind, mailbox_fields=api
        )
        return text.replace("contacts:\n", "contacts:\n" + COLLEAGUE_LINE, 1)

    def connect(self, account: dict[str, Any]) -> None:
        """``outloop connect --workspace WS --mailbox M --stdin``, as the operator runs it,
        with its default check: the values sign in through the adapter, then are stored."""
        env: dict[str, str | None] = {k: None for k in os.environ if k.startswith("OUTLOOP_")}
        env["OUTLOOP_VAULT_BACKEND"] = "plain"
        args = ["connect", "--workspace", self.workspace_id, "--mailbox", self.mailbox, "--stdin"]
        values = "".join(f"{account[k]}\n" for k in ("client_id", "client_secret", "refresh_token"))
        done = CliRunner().invoke(
            outloop, [*args, "--data-dir", str(self.data_dir)], input=values, env=env
        )
        assert done.exit_code == 0, (done.stdout, done.stderr, done.exception)
        connected, stored = done.stdout.splitlines()
        assert stored == f"stored {', '.join(VAULT_NAMES)} for {self.mailbox}"
        assert connected.startswith("connected: "), connected
        for value in values.split():  # nothing typed is echoed
            assert value not in done.output

    def deliver_raw(self, raw: bytes, *, mail_from: str = "") -> None:
        """The provider delivers these bytes to the workspace's mailbox (``deliver`` writes
        them to the shared helpers' address: the To header names this mailbox instead)."""
        del mail_from
        message = email.message_from_bytes(raw, policy=DELIVERY)
        message.replace_header("To", self.mailbox)
        self.admin.deliver(self.mailbox, message.as_bytes())
        self.inbox = self.inbox_state()

    def deliver_hebrew_request(self, sender_name: str = "") -> str:
        """The client's request for a quote, in Hebrew, delivered; its Message-ID."""
        return self.deliver(
            sender=CLIENT, sender_name=sender_name, subject=HEBREW_SUBJECT, body=HEBREW_REQUEST
        )

    def server(self) -> Any:
        return build_server(self.settings, clock=self.clock)

    # -- inspecting the mailboxes ----------------------------------------------------------

    def stored(self, folder: str, address: str | None = None) -> list[dict[str, Any]]:
        """A folder (inbox, sent, drafts) of an account (the workspace's unless named)."""
        return self.admin.stored(address or self.mailbox, folder)

    def inbox_state(self) -> dict[str, tuple[Any, ...]]:
        """Each inbox message's thread, labels, categories, read flag and bytes, by id."""
        return {
            m["id"]: (m["thread_id"], m["labels"], m["categories"], m["is_read"], m["raw_base64"])
            for m in self.stored("inbox")
        }

    def thread_of(self, message_id: str) -> str:
        """The provider's thread (Gmail) or conversation (Graph) id of an inbox message."""
        return str(with_id(self.stored("inbox"), message_id)["thread_id"])

    def task_thread(self, task_id: str) -> str:
        """The thread the store recorded for a task (the one its first message opened)."""
        store = self.store()
        try:
            [task] = [t for t in store.list_tasks(self.workspace_id) if t.task_id == task_id]
            return task.provider_thread_id
        finally:
            store.close()

    def plan(self, message_id: str, recipients: Sequence[str]) -> None:
        """The host had ``message_id`` sent to exactly ``recipients``."""
        assert message_id not in self.planned, f"{message_id} was sent twice"
        self.planned[message_id] = tuple(sorted(r.lower() for r in recipients))

    def assert_sent_as_planned(self) -> None:
        """The mailbox's sent mail is exactly the planned messages; each one names exactly its
        planned recipients (To and Cc, no Bcc) and reached each of them once, and no other
        of the people."""
        sent = {str(parsed(m)["Message-ID"]): parsed(m) for m in self.stored("sent")}
        assert sorted(sent) == sorted(self.planned)
        delivered = {
            person: Counter(str(parsed(m)["Message-ID"]) for m in self.stored("inbox", person))
            for person in PEOPLE
        }
        for message_id, planned in self.planned.items():
            for copy in (sent[message_id], *self.copies_of(message_id)):
                named = [*copy.get_all("To", []), *copy.get_all("Cc", [])]
                addresses = sorted(a.lower() for _, a in getaddresses([str(n) for n in named]))
                assert tuple(addresses) == planned, (message_id, addresses)
                assert copy["Bcc"] is None, message_id
            for person in PEOPLE:
                wanted = 1 if person in planned else 0
                assert delivered[person][message_id] == wanted, (person, message_id)

    def copies_of(self, message_id: str) -> list[EmailMessage]:
        """The delivered copies of a sent message, in the inboxes of the people it names."""
        return [
            parsed(with_id(self.stored("inbox", person), message_id))
            for person in self.planned[message_id]
            if person in PEOPLE
        ]


@pytest.fixture(params=sorted(ENDPOINTS))
def station(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[ApiStation]:
    admin = session_mock()
    ensure_people(admin)
    kind = str(request.param)
    mailbox = f"support-{uuid.uuid4().hex[:10]}@fabrikam.test"
    account = admin.account(mailbox, kind)
    s = ApiStation(
        root=tmp_path / "station",
        clock=MailServerTime(),
        workspace_id=WORKSPACE,
        admin=admin,
        kind=kind,
        mailbox=mailbox,
    )
    s.register(s.context())
    s.connect(account)
    s.inbox = s.inbox_state()
    yield s
    # Scenario 13: reading marked, labelled, categorized or moved nothing; no draft is left.
    assert s.inbox_state() == s.inbox
    assert s.stored("drafts") == []
    s.assert_sent_as_planned()


# -- the host's steps that send mail (each records whom the host named) ---------------------


async def request_approval(
    station: ApiStation, client: Client, task_id: str, draft_id: str
) -> dict[str, Any]:
    """request_approval of a draft for the task's sender (the client): the request goes to
    the workspace's recorded approver only, and covers exactly the client."""
    request = await call(client, "request_approval", task_id=task_id, draft_id=draft_id)
    station.plan(request["request_message_id"], [APPROVER])
    assert request["approvers"] == [APPROVER] and request["recipients"] == [CLIENT]
    assert request["task_state"] == "WAITING_INTERNAL_APPROVAL"
    return request


async def approve_by_reply(
    station: ApiStation, client: Client, requests: Sequence[dict[str, Any]]
) -> None:
    """The approver answers each approval request from her inbox, replying 'Approved.' in
    its thread; intake takes the replies in and the server judges them: each task is
    APPROVED_TO_SEND on her decision, whose evidence is her reply."""
    replies: dict[str, str] = {}
    for request in requests:
        asked = parsed(with_id(station.stored("inbox", APPROVER), request["request_message_id"]))
        assert asked["To"] == APPROVER and asked["Cc"] is None
        assert email.utils.parseaddr(str(asked["From"]))[1].lower() == station.mailbox
        replies[request["task_id"]] = station.deliver(
            sender=APPROVER,
            subject=f"Re: {asked['Subject']}",
            body="Approved.",
            in_reply_to=request["request_message_id"],
        )
    scanned, claims = await intake_and_claim(client, station.mailbox)
    assert [c["outcome"] for c in claims] == ["CLAIMED"] * len(requests), claims
    assert sorted(c["task_id"] for c in claims) == sorted(replies)
    for claim in claims:
        assert claim["task_created"] is False  # the reply joins the task it approves
        assert f"approved by {APPROVER}" in claim["detail"]
    for reconciliation in await reconcile_all(client, scanned):
        assert reconciliation["clean"], reconciliation
    for task_id, reply in replies.items():
        task = await call(client, "get_task", task_id=task_id)
        assert task["state"] == "APPROVED_TO_SEND"
        [decision] = task["approval_decisions"]
        assert (decision["decision"], decision["approver"]) == ("approved", APPROVER)
        assert decision["evidence_message_id"] == reply


async def send(
    station: ApiStation, client: Client, task_id: str, draft_id: str, to: list[str]
) -> dict[str, Any]:
    """send a draft to ``to`` (and no one else) through the provider's API; it is handed
    over and delivered, its stored copy filed in the thread of the message it answers."""
    sent = await call(client, "send", task_id=task_id, draft_id=draft_id, to=to)
    station.plan(sent["internet_message_id"], to)
    assert sent["status"] == "sent" and sent["to"] == to and sent["cc"] == []
    assert sent["channel"] == "api" and sent["delivered"] is True
    assert sent["task_state"] == "APPROVED_TO_SEND"  # until the copy is read back
    return sent


def assert_filed_in_the_thread_and_transformed(
    station: ApiStation, sent: dict[str, Any], draft: dict[str, Any], request: str
) -> str:
    """The reply's stored copy is filed, under the id the send reported, in the provider's
    own thread (Gmail) or conversation (Graph) of the client's message ``request``. The copy
    read back is the provider's, not what was handed over: Gmail's, with the body wrapped in
    its ``gmail_default`` div; Exchange's, re-serialized in its document wrapper. Its HTML as
    the provider keeps it."""
    stored = with_id(station.stored("sent"), sent["internet_message_id"])
    assert stored["thread_id"] == station.thread_of(request)
    assert stored["id"] == sent["provider_message_id"]
    kept = stored["html"]
    [delivered] = station.copies_of(sent["internet_message_id"])
    handed_over = part(delivered, "html")  # what the provider took, as it delivered it
    assert kept != handed_over and kept != draft["html"]
    if station.kind == "google":
        assert '<div class="gmail_default">' in kept and '<div class="gmail_default">' not in (
            handed_over
        )
    else:
        assert kept.startswith("<html><head>") and not handed_over.startswith("<html><head>")
    return kept


# -- scenario 1 ------------------------------------------------------------------------------


async def test_scenario_01_a_hebrew_request_in_the_api_mailbox_resolves_the_workspace_claims_once_and_creates_one_task(
    station: ApiStation,
) -> None:
    message_id = station.deliver_hebrew_request(sender_name=CLIENT_NAME)
    async with station.client() as client:
        # The composition root reached the mailbox through the API with the vault's secrets.
        access = await call(client, "access_status", workspace_id=station.workspace_id)
        [mailbox] = access["mailboxes"]
        assert mailbox["mailbox_id"] == station.mailbox and mailbox["provider"] == station.kind
        assert mailbox["path"] == "api" and mailbox["ok"] is True, mailbox

        scanned = await call(client, "intake", mailbox_id=station.mailbox)
        assert len(scanned["run_ids"]) == 1 and scanned["access_errors"] == []
        [item] = scanned["items"]
        assert item["workspace_id"] == station.workspace_id and item["escalation_reason"] == ""
        assert item["untrusted"]["sender"] == CLIENT
        assert item["untrusted"]["subject"] == {"text": HEBREW_SUBJECT, "flags": []}
        claim = await call(client, "claim", run_id=item["run_id"], item_ref=item["item_ref"])
        assert claim["outcome"] == "CLAIMED" and claim["task_created"] is True
        assert claim["disposition"] == "QUEUED"
        assert claim["message"]["body_text"].strip() == HEBREW_REQUEST
        assert claim["message"]["sender_name"] == {"text": CLIENT_NAME, "flags": []}
        # Claiming the same item again gives the first answer; nothing new is created.
        again = await call(client, "claim", run_id=item["run_id"], item_ref=item["item_ref"])
        assert again == claim

        [task] = (await call(client, "list_queue", workspace_id=station.workspace_id))["tasks"]
        assert task["task_id"] == claim["task_id"] and task["message_count"] == 1
        assert task["state"] == "TASK_RESOLVED"
        assert task["untrusted"]["original_subject"]["text"] == HEBREW_SUBJECT
        [reconciliation] = await reconcile_all(client, scanned)
        assert reconciliation["clean"] and reconciliation["scanned"] == 1
        assert reconciliation["non_terminal"] == 1 and reconciliation["claim_race"] == 0

        # The next intake starts from the provider's cursor: nothing new, nothing claimed.
        nothing, none = await intake_and_claim(client, station.mailbox)
        assert nothing["items"] == [] and none == []
        await reconcile_all(client, nothing)

    store = station.store()
    try:
        assert_one_task_of(store, station.workspace_id, message_id)
        [stored] = store.list_tasks(station.workspace_id)
        # The task names the message by the provider's own id for it.
        request = with_id(station.stored("inbox"), message_id)
        assert [m.provider_message_id for m in stored.messages] == [request["id"]]
    finally:
        store.close()


# -- scenario 6 ------------------------------------------------------------------------------


async def test_scenario_06_an_approved_hebrew_reply_is_sent_in_the_client_thread_and_read_back_from_the_providers_stored_copy(
    station: ApiStation,
) -> None:
    client_message = station.deliver_hebrew_request(sender_name=CLIENT_NAME)
    async with station.client() as client:
        scanned, [claim] = await intake_and_claim(client, station.mailbox)
        assert claim["outcome"] == "CLAIMED" and claim["task_created"] is True
        task_id = claim["task_id"]
        await to_draft_ready(client, task_id)
        draft = await call(
            client, "render", task_id=task_id, body_markdown=HEBREW_BODY, language="he"
        )
        assert draft["subject"] == {"text": f"Re: {HEBREW_SUBJECT}", "flags": []}
        gate = await call(
            client, "gate_check", task_id=task_id, draft_id=draft["draft_id"], to=[CLIENT]
        )
        assert [r["blocker"] for r in gate["reasons"]] == ["approval_missing"]
        request = await request_approval(station, client, task_id, draft["draft_id"])
        for reconciliation in await reconcile_all(client, scanned):
            assert reconciliation["clean"], reconciliation

        await approve_by_reply(station, client, [request])
        ready = await call(
            client, "gate_check", task_id=task_id, draft_id=draft["draft_id"], to=[CLIENT]
        )
        assert ready["ready"] is True and ready["reasons"] == []

        sent = await send(station, client, task_id, draft["draft_id"], [CLIENT])
        assert sent["provider_thread_id"] == station.task_thread(task_id)
        await read_back_the_client_reply(client, task_id, sent)
        reported = await call(
            client, "report", task_id=task_id, outcome="waiting_client", evidence="quote sent"
        )
        assert reported["state"] == "WAITING_CLIENT"

        # A replay of the whole inbox after the send: nothing is claimed or sent again.
        replay, replayed = await intake_and_claim(client, station.mailbox, from_start=True)
        assert [c["outcome"] for c in replayed] == ["EXECUTION_ALREADY_DONE"] * 2
        [reconciliation] = await reconcile_all(client, replay)
        assert reconciliation["clean"] and reconciliation["claim_race"] == 2

    # Inside the original thread (Gmail) or conversation (Graph) of the client's message.
    assert_filed_in_the_thread_and_transformed(station, sent, draft, client_message)
    # The client received the reply once, answering her own message.
    [delivered] = station.copies_of(sent["internet_message_id"])
    assert delivered["In-Reply-To"] == client_message
    assert str(delivered["References"]).split() == [client_message]
    assert delivered["Subject"] == f"Re: {HEBREW_SUBJECT}"
    assert delivered["From"] == station.mailbox and delivered["To"] == CLIENT


# -- scenario 7 ------------------------------------------------------------------------------


def assert_kept_html(html: str, language: str) -> None:
    """The HTML the provider keeps of a reply still says its direction, language and
    alignment on the wrapper, and (in Hebrew) isolates every LTR fragment."""
    wrapper = wrapper_of(html)
    direction, align = ("rtl", "right") if language == "he" else ("ltr", "left")
    assert (wrapper.get("dir"), wrapper.get("lang")) == (direction, language)
    assert f"text-align:{align}" in (wrapper.get("style") or "").replace(" ", "")
    if language == "he":
        assert set(HEBREW_FRAGMENTS) <= ltr_isolated(html)
    else:
        assert "https://contoso.test/quotes/119" in html and "INV-2026-119" in html


async def test_scenario_07_hebrew_rtl_and_english_ltr_survive_read_back_of_the_providers_stored_copy_with_isolated_fragments(
    station: ApiStation,
) -> None:
    hebrew_request = station.deliver_hebrew_request()
    english_request = station.deliver(sender=CLIENT, body="Hi, may I have a quote?")
    async with station.client() as client:
        scanned, claims = await intake_and_claim(client, station.mailbox)
        assert [c["task_created"] for c in claims] == [True, True]
        by_subject = {c["message"]["subject"]["text"]: c["task_id"] for c in claims}
        hebrew_task, english_task = by_subject[HEBREW_SUBJECT], by_subject["Quote request"]
        drafts, requests = await drafted_in_hebrew_and_english(
            client, hebrew_task, english_task, partial(request_approval, station, client)
        )
        for reconciliation in await reconcile_all(client, scanned):
            assert reconciliation["clean"], reconciliation
        await approve_by_reply(station, client, requests)

        sends: dict[str, dict[str, Any]] = {}
        for task_id, draft in drafts.items():
            sends[task_id] = await send(station, client, task_id, draft["draft_id"], [CLIENT])
            read_back = await call(client, "read_back", send_id=sends[task_id]["send_id"])
            checks = by_name(read_back)
            assert read_back["ok"] is True and set(checks) == READ_BACK_CHECKS, read_back
            assert all(c["ok"] for c in checks.values()), checks

    for task_id, request, language in (
        (hebrew_task, hebrew_request, "he"),
        (english_task, english_request, "en"),
    ):
        sent = sends[task_id]
        assert sent["provider_thread_id"] == station.task_thread(task_id)
        kept = assert_filed_in_the_thread_and_transformed(station, sent, drafts[task_id], request)
        assert_kept_html(kept, language)  # the copy read back, as the provider keeps it
        [delivered] = station.copies_of(sent["internet_message_id"])  # what the client got
        assert delivered["In-Reply-To"] == request
        subject = HEBREW_SUBJECT if language == "he" else "Quote request"
        assert delivered["Subject"] == f"Re: {subject}"
        assert_kept_html(part(delivered, "html"), language)
        if station.kind == "google":  # Gmail delivers the MIME Outloop built, text part too
            (assert_hebrew_reply if language == "he" else assert_english_reply)(delivered)
        # (Exchange builds the message from the HTML body: its text part is Exchange's own.)
