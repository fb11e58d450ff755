"""Seed 000 section 12 acceptance scenarios 1, 3, 6, 7, 13 and 14 through the MCP server, with
the workspace's mailbox on a real IMAP server.

The station is set up the way an operator sets up an IMAP mailbox: a Workspace Context that
binds ``support@fabrikam.test`` with ``provider: imap`` and a ``server:`` block (the session's
private Dovecot for IMAP, a submission server relaying into it for SMTP), and the mailbox's
password stored with ``outloop vault set ... --stdin`` in a plain vault. The server's own
composition root (``Providers``) reads that password and builds the IMAP/SMTP adapter: no
provider is passed in.

Mail reaches the workspace through Dovecot's LMTP, as a mail server delivers it. The client
(``dana.levi@contoso.test``), the approver and the colleague are Dovecot users too, so what
the workspace sends lands in their inboxes and is checked there. Everything else - intake,
claims, drafts, approvals, sends, read-back and reconciliation - goes through the MCP tools;
the store and the mailboxes are only inspected.

Checked after every test (scenario 13 and the envelope rule): the workspace's inbox holds
exactly the bytes and flags that were delivered (reading marks nothing, no keyword, label or
folder is written), its Sent folder holds exactly the copies of what the test sent, and
every SMTP envelope the submission server recorded in this module went to exactly the
recipients the host named for that message - no Cc or Bcc it did not name, no message it
did not send, none twice. And the stopped server left no IMAP connection open.
"""

from __future__ import annotations

import asyncio
import email
import email.policy
import gc
import itertools
import os
import secrets
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from email.message import EmailMessage
from email.policy import SMTP
from email.utils import format_datetime, getaddresses, make_msgid
from functools import partial
from pathlib import Path
from typing import Any

import anyio.lowlevel
import pytest
from click.testing import CliRunner
from mcp import Client

from agent.domain.context import Endpoint, MailServer, Security
from agent.domain.dispositions import COVERED
from agent.domain.secrets import Secret
from agent.providers.imap_smtp import ImapSmtpProvider
from agent.testing import FrozenClock
from fixtures.dovecot import Dovecot, quote_mailbox, snapshot_key
from fixtures.submission import Envelope, SubmissionServer
from mcp_server.cli import main as outloop
from mcp_server.composition import Settings
from mcp_server.server import build_server
from tests.conftest import context_yaml, session_dovecot
from tests.mcp.conftest import (
    APPROVER,
    CLIENT,
    COLLEAGUE,
    COLLEAGUE_LINE,
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
    replay_after_completion,
    to_draft_ready,
)
from tests.mcp.test_scenarios import (
    HEBREW_BODY,
    HEBREW_SUBJECT,
    assert_english_reply,
    assert_hebrew_reply,
    drafted_in_hebrew_and_english,
    part,
)

pytestmark = pytest.mark.anyio

WORKSPACE = "ws-test-0001"
PEOPLE = (CLIENT, APPROVER, COLLEAGUE)
"""The people the workspace writes to: Dovecot users, so what it sends lands somewhere."""
FOLDERS = {"INBOX", "Sent", "Drafts", "Trash"}
"""The folders every Dovecot user has; Outloop creates none."""
HEBREW_REQUEST = "שלום, אפשר לקבל הצעת מחיר לרישיונות של הרבעון הרביעי?"
CLIENT_NAME = "דנה לוי"
"""The client's name as she writes it (in Hebrew)."""
_stations = itertools.count(1)


# -- the mail servers, shared by the module ---------------------------------------------------


@dataclass
class MailServers:
    """The session's Dovecot, this module's submission server, and what the host named as
    the recipients of each message it had sent (by Message-ID)."""

    dovecot: Dovecot
    submission: SubmissionServer
    planned: dict[str, tuple[str, ...]] = field(default_factory=dict[str, tuple[str, ...]])

    def plan(self, message_id: str, recipients: Sequence[str]) -> None:
        assert message_id not in self.planned, f"{message_id} was planned twice"
        self.planned[message_id] = tuple(sorted(r.lower() for r in recipients))

    def assert_as_planned(
        self, envelopes: Sequence[Envelope], message_ids: Sequence[str] | None = None
    ) -> None:
        """Each envelope went to exactly the recipients named for its message (RCPT TO, and
        the To and Cc headers; no Bcc header), from the workspace's mailbox; each planned
        message (of ``message_ids``, default all) went out exactly once."""
        seen: dict[str, int] = {}
        for envelope in envelopes:
            message_id = envelope.message_id
            assert message_id in self.planned, f"an unplanned message went out: {envelope}"
            seen[message_id] = seen.get(message_id, 0) + 1
            planned = self.planned[message_id]
            assert tuple(sorted(r.lower() for r in envelope.rcpt_tos)) == planned, envelope
            assert len(set(envelope.rcpt_tos)) == len(envelope.rcpt_tos), envelope
            assert envelope.mail_from.lower() == MAILBOX, envelope
            assert envelope.answered, envelope
            # Everyone named is a Dovecot user: each one's inbox stored it.
            assert sorted(envelope.delivered_to) == sorted(envelope.rcpt_tos), envelope
            headers = email.message_from_bytes(envelope.data, policy=email.policy.default)
            shown = [*headers.get_all("To", []), *headers.get_all("Cc", [])]
            named = tuple(sorted(a.lower() for _, a in getaddresses([str(h) for h in shown])))
            assert named == planned, (message_id, named)
            assert headers["Bcc"] is None, message_id
        wanted = self.planned if message_ids is None else message_ids
        assert seen == dict.fromkeys(wanted, 1)


@pytest.fixture(scope="module")
def mail_servers() -> Iterator[MailServers]:
    """A submission server relaying to the session's Dovecot, for this module; at its end,
    every envelope it recorded is checked against what the tests planned."""
    dovecot = session_dovecot()
    people_password = secrets.token_hex(8)
    for person in PEOPLE:
        dovecot.add_user(person, people_password)
    submission = SubmissionServer.for_dovecot(dovecot, keeps_sent_copy=False).start()
    servers = MailServers(dovecot, submission)
    try:
        yield servers
    finally:
        submission.stop()
    assert submission.errors == []
    servers.assert_as_planned(submission.envelopes)


# -- a station whose mailbox is on Dovecot -------------------------------------------------


class MailServerTime(FrozenClock):
    """The time on a real mail server: the system's. Dovecot stamps each delivery with it
    (the Received header the canonical envelope takes ``received_at`` from), so the MCP
    server must run on it too: an approver's reply stamped before the approval request's
    time would predate it. ``advance`` (a later moment, in the shared helpers) moves nothing:
    on a real server the next moment is simply later."""

    def now(self) -> datetime:
        return datetime.now(UTC)

    def advance(self, **delta: float) -> datetime:
        del delta
        return self.now()


@dataclass(kw_only=True)
class DovecotStation(OperatorStation):
    """``OperatorStation`` with its mailbox on Dovecot: mail is delivered through LMTP, and
    the server is built from its settings alone (the vault holds the IMAP password)."""

    servers: MailServers
    user: str
    """The workspace mailbox's Dovecot login (its own per test: no test sees another's)."""
    password: str
    inbox: dict[str, str] = field(default_factory=dict[str, str])
    """The inbox as the last delivery left it (``Dovecot.snapshot`` entries)."""
    sent_ids: list[str] = field(default_factory=list[str])
    """The Message-IDs of what the host had this station send."""

    @property
    def dovecot(self) -> Dovecot:
        return self.servers.dovecot

    @property
    def settings(self) -> Settings:
        return Settings(data_dir=self.data_dir, vault_backend="plain")

    def mail_server(self) -> MailServer:
        host = self.dovecot.host
        return MailServer(
            imap=Endpoint(host=host, port=self.dovecot.imap_port, security=Security.NONE),
            smtp=Endpoint(host=host, port=self.servers.submission.port, security=Security.NONE),
            username=self.user,
        )

    def context(self) -> str:
        """The Workspace Context an operator writes for this mailbox."""
        server = (
            f"server: {{imap: {{host: {self.dovecot.host}, port: {self.dovecot.imap_port}, "
            f"security: none}}, smtp: {{host: {self.dovecot.host}, "
            f"port: {self.servers.submission.port}, security: none}}, username: '{self.user}', "
            "password: password, submission_keeps_sent_copy: false}"
        )
        text = context_yaml(self.workspace_id, provider="imap", mailbox_fields=server)
        return text.replace("contacts:\n", "contacts:\n" + COLLEAGUE_LINE, 1)

    def store_password(self) -> None:
        """``outloop vault set WORKSPACE MAILBOX password --stdin``, as the operator runs it."""
        env: dict[str, str | None] = {k: None for k in os.environ if k.startswith("OUTLOOP_")}
        env["OUTLOOP_VAULT_BACKEND"] = "plain"
        args = ["vault", "set", self.workspace_id, MAILBOX, "password", "--stdin"]
        done = CliRunner().invoke(
            outloop, [*args, "--data-dir", str(self.data_dir)], input=self.password + "\n", env=env
        )
        assert done.exit_code == 0, done.stderr
        assert done.stdout == f"stored {self.workspace_id}/{MAILBOX}/password\n"

    def deliver_raw(self, raw: bytes, *, mail_from: str = "") -> None:
        """Deliver these bytes to the workspace's mailbox through LMTP, from ``mail_from``
        (``OperatorStation.deliver`` delivers what it writes here, from its sender)."""
        self.dovecot.deliver(self.user, raw, mail_from=mail_from)
        self.inbox = self.folder_state("INBOX")

    def deliver_hebrew_request(self, sender_name: str = "") -> str:
        """The client's request for a quote, in Hebrew, delivered; its Message-ID."""
        return self.deliver(
            sender=CLIENT, sender_name=sender_name, subject=HEBREW_SUBJECT, body=HEBREW_REQUEST
        )

    def append_raw(self, raw: bytes) -> None:
        """Put these exact bytes in the workspace's inbox with IMAP APPEND (LMTP would add
        its own headers first)."""
        self.dovecot.append_raw(self.user, None, "INBOX", raw)
        self.inbox = self.folder_state("INBOX")

    def server(self) -> Any:
        return build_server(self.settings, clock=self.clock)

    # -- inspecting the mailboxes ----------------------------------------------------------

    def folder_state(self, folder: str) -> dict[str, str]:
        """The workspace mailbox's snapshot entries of one folder."""
        snapshot = self.dovecot.snapshot(self.user)
        prefix = snapshot_key(folder, 0).removesuffix("0")
        return {k: v for k, v in snapshot.items() if k == folder or k.startswith(prefix)}

    def folders(self) -> set[str]:
        return {k for k in self.dovecot.snapshot(self.user) if "\t" not in k}

    def messages(self, address: str | None = None, folder: str = "INBOX") -> list[EmailMessage]:
        """Every message in a folder of a Dovecot user (the workspace's unless named), read
        without changing anything (EXAMINE, BODY.PEEK)."""
        return folder_messages(self.dovecot, address or self.user, folder)

    def plan(self, message_id: str, recipients: Sequence[str]) -> None:
        """The host had ``message_id`` sent to exactly ``recipients``."""
        self.servers.plan(message_id, recipients)
        self.sent_ids.append(message_id)

    def envelopes(self) -> list[Envelope]:
        """What this station's mailbox submitted."""
        return [e for e in self.servers.submission.envelopes if e.auth_user == self.user]

    async def thread_of(self, internet_message_id: str) -> str:
        """The IMAP adapter's thread id for an inbox message (read on a channel of its own)."""
        provider = ImapSmtpProvider(self.mail_server(), MAILBOX, Secret(self.password))
        try:
            return await inbox_thread_id(provider, internet_message_id)
        finally:
            await provider.aclose()


def folder_messages(dovecot: Dovecot, address: str, folder: str) -> list[EmailMessage]:
    with dovecot.imap_session(address) as imap:
        typ, data = imap.select(quote_mailbox(folder), readonly=True)
        assert typ == "OK", data
        if not int(data[0] or b"0"):
            return []
        typ, fetched = imap.uid("FETCH", "1:*", "(BODY.PEEK[])")
        assert typ == "OK", fetched
    messages: list[EmailMessage] = []
    for item in fetched:
        if isinstance(item, tuple):
            raw: object = item[1]  # pyright: ignore[reportUnknownVariableType]
            assert isinstance(raw, bytes)
            message = email.message_from_bytes(raw, policy=email.policy.default)
            assert isinstance(message, EmailMessage)
            messages.append(message)
    return messages


def with_id(messages: Sequence[EmailMessage], message_id: str) -> EmailMessage:
    """The one message carrying ``message_id``."""
    found = [m for m in messages if str(m["Message-ID"]) == message_id]
    assert len(found) == 1, (message_id, [str(m["Message-ID"]) for m in messages])
    return found[0]


def open_connections(port: int) -> list[asyncio.Transport]:
    """This process's open connections to ``port`` on the loopback (the IMAP channels the
    server opened and has not closed)."""
    found: list[asyncio.Transport] = []
    for obj in gc.get_objects():
        if isinstance(obj, asyncio.Transport) and not obj.is_closing():
            peer: object = obj.get_extra_info("peername")
            if isinstance(peer, tuple) and peer[1:2] == (port,):
                found.append(obj)
    return found


async def close_leaked_connections(port: int) -> int:
    """Close the IMAP connections a stopped server left open, and say how many there were.
    Left alone, the event loop would hold them until it ends, and the unclosed transports
    found then would fail whichever test was running."""
    leaked = open_connections(port)
    for transport in leaked:
        transport.close()
    await anyio.lowlevel.checkpoint()  # the loop runs the close
    return len(leaked)


@pytest.fixture
async def station(tmp_path: Path, mail_servers: MailServers) -> AsyncIterator[DovecotStation]:
    user = f"support-{next(_stations)}-{secrets.token_hex(3)}@fabrikam.test"
    password = f'pa"ss\\{secrets.token_hex(6)}'
    mail_servers.dovecot.add_user(user, password)
    s = DovecotStation(
        root=tmp_path / "station",
        clock=MailServerTime(),
        workspace_id=WORKSPACE,
        servers=mail_servers,
        user=user,
        password=password,
    )
    s.register(s.context())
    s.store_password()
    s.inbox = s.folder_state("INBOX")
    try:
        yield s
    finally:
        left_open = await close_leaked_connections(s.dovecot.imap_port)
    # The servers the test ran have stopped: every IMAP connection they opened is closed.
    assert left_open == 0, f"{left_open} IMAP connections outlived the server"
    # Scenario 13: the inbox is exactly what was delivered (no flag, keyword or move), no
    # folder was made, and Sent holds exactly the copies of what this test sent.
    assert s.folder_state("INBOX") == s.inbox
    assert s.folders() == FOLDERS
    assert s.messages(folder="Drafts") == s.messages(folder="Trash") == []
    assert sorted(str(m["Message-ID"]) for m in s.messages(folder="Sent")) == sorted(s.sent_ids)
    mail_servers.assert_as_planned(s.envelopes(), s.sent_ids)


# -- the host's steps that send mail (each records whom the host named) ---------------------


async def request_approval(
    station: DovecotStation, client: Client, task_id: str, draft_id: str
) -> dict[str, Any]:
    """request_approval of a draft for the task's sender (the client): the request goes to
    the workspace's recorded approver only, and covers exactly the client."""
    request = await call(client, "request_approval", task_id=task_id, draft_id=draft_id)
    station.plan(request["request_message_id"], [APPROVER])
    assert request["approvers"] == [APPROVER] and request["recipients"] == [CLIENT]
    assert request["task_state"] == "WAITING_INTERNAL_APPROVAL"
    return request


async def send(
    station: DovecotStation, client: Client, task_id: str, draft_id: str, to: list[str]
) -> dict[str, Any]:
    """send a draft to ``to`` (and no one else); it is handed over and delivered."""
    sent = await call(client, "send", task_id=task_id, draft_id=draft_id, to=to)
    station.plan(sent["internet_message_id"], to)
    assert sent["status"] == "sent" and sent["to"] == to and sent["cc"] == []
    assert sent["channel"] == "imap" and sent["delivered"] is True
    return sent


async def hebrew_request_drafted(
    station: DovecotStation, client: Client
) -> tuple[str, dict[str, Any], dict[str, Any]]:
    """The Hebrew request taken in, claimed once, worked to a Hebrew draft and put to the
    approver (the run reconciled); its task, draft and approval request."""
    scanned, [claim] = await intake_and_claim(client)
    assert claim["outcome"] == "CLAIMED" and claim["task_created"] is True
    task_id = claim["task_id"]
    await to_draft_ready(client, task_id)
    draft = await call(client, "render", task_id=task_id, body_markdown=HEBREW_BODY, language="he")
    assert (draft["direction"], draft["language"]) == ("rtl", "he")
    assert draft["subject"] == {"text": f"Re: {HEBREW_SUBJECT}", "flags": []}
    gate = await call(
        client, "gate_check", task_id=task_id, draft_id=draft["draft_id"], to=[CLIENT]
    )
    assert gate["ready"] is False
    assert [r["blocker"] for r in gate["reasons"]] == ["approval_missing"]
    request = await request_approval(station, client, task_id, draft["draft_id"])
    for reconciliation in await reconcile_all(client, scanned):
        assert reconciliation["clean"], reconciliation
    return task_id, draft, request


# -- scenario 1 ------------------------------------------------------------------------------


async def test_scenario_01_a_hebrew_request_delivered_over_lmtp_resolves_the_workspace_claims_once_and_creates_one_task(
    station: DovecotStation,
) -> None:
    message_id = station.deliver_hebrew_request(sender_name=CLIENT_NAME)
    async with station.client() as client:
        # The composition root reached the mailbox over IMAP with the vault's password.
        access = await call(client, "access_status", workspace_id=station.workspace_id)
        [mailbox] = access["mailboxes"]
        assert mailbox["provider"] == "imap" and mailbox["ok"] is True, mailbox
        signed_in = f"IMAP {station.dovecot.host}:{station.dovecot.imap_port} signed in"
        assert signed_in in mailbox["detail"], mailbox
        item, claim, task = await claim_the_new_request(client, station)
    assert item["item_ref"].startswith(f"imap:{MAILBOX}/imap:INBOX:")
    assert item["untrusted"]["subject"] == {"text": HEBREW_SUBJECT, "flags": []}
    assert claim["message"]["body_text"].strip() == HEBREW_REQUEST
    assert claim["message"]["sender_name"] == {"text": CLIENT_NAME, "flags": []}
    assert task["untrusted"]["original_subject"]["text"] == HEBREW_SUBJECT

    store = station.store()
    try:
        assert_one_task_of(store, station.workspace_id, message_id)
    finally:
        store.close()


# -- scenario 3 ------------------------------------------------------------------------------


async def test_scenario_03_a_replay_of_the_imap_inbox_after_completion_creates_nothing_and_is_fully_reconciled(
    station: DovecotStation,
) -> None:
    first = station.deliver_hebrew_request()
    station.deliver(
        sender=CLIENT,
        subject=f"Re: {HEBREW_SUBJECT}",
        body="וגם לרבעון הראשון, בבקשה.",
        in_reply_to=first,
    )
    completed = await complete_the_request_and_its_follow_up(station)
    mailbox_before = station.dovecot.snapshot(station.user)

    # A fresh server (a restart) over the same IMAP inbox: the cursor in the store says
    # nothing arrived; the replay reads the inbox from its start.
    await replay_after_completion(station, completed)
    # Scenario 13: the replay knew the items were done from the store alone - the mailbox
    # (every folder, every message's bytes and flags) is exactly as it was.
    assert station.dovecot.snapshot(station.user) == mailbox_before
    assert station.envelopes() == []


# -- scenario 6 ------------------------------------------------------------------------------


async def test_scenario_06_an_approved_hebrew_reply_is_delivered_in_the_original_thread_and_read_back_from_imap_sent(
    station: DovecotStation,
) -> None:
    client_message = station.deliver_hebrew_request(sender_name=CLIENT_NAME)
    async with station.client() as client:
        task_id, draft, request = await hebrew_request_drafted(station, client)
        # The approval request reached the approver (and no one else), in its own thread.
        asked = with_id(station.messages(APPROVER), request["request_message_id"])
        assert asked["To"] == APPROVER and asked["From"] == MAILBOX
        assert asked["Cc"] is None

        # The approver's reply comes back into the workspace's inbox; intake judges it.
        await approved_by_reply(station, client, request)
        ready = await call(
            client, "gate_check", task_id=task_id, draft_id=draft["draft_id"], to=[CLIENT]
        )
        assert ready["ready"] is True and ready["reasons"] == []

        sent = await send(station, client, task_id, draft["draft_id"], [CLIENT])
        assert sent["task_state"] == "APPROVED_TO_SEND"  # sent once the copy is read back
        assert sent["provider_thread_id"] == await station.thread_of(client_message)
        assert sent["provider_message_id"].startswith("imap:Sent:")
        await read_back_the_client_reply(client, task_id, sent)
        reported = await call(
            client, "report", task_id=task_id, outcome="waiting_client", evidence="quote sent"
        )
        assert reported["state"] == "WAITING_CLIENT"

        # A replay of the whole inbox after the send: nothing is claimed or sent again.
        replay, replayed = await intake_and_claim(client, from_start=True)
        assert [c["outcome"] for c in replayed] == ["EXECUTION_ALREADY_DONE"] * 2
        [reconciliation] = await reconcile_all(client, replay)
        assert reconciliation["clean"] and reconciliation["claim_race"] == 2

    # The client received the reply once, inside the thread of her own message.
    delivered = with_id(station.messages(CLIENT), sent["internet_message_id"])
    assert delivered["In-Reply-To"] == client_message
    assert str(delivered["References"]).split() == [client_message]
    assert delivered["Subject"] == f"Re: {HEBREW_SUBJECT}"
    assert delivered["From"] == MAILBOX and delivered["To"] == CLIENT
    assert delivered["Cc"] is None and delivered["Bcc"] is None
    # The workspace's Sent folder holds the copy that was read back: the same message.
    stored = with_id(station.messages(folder="Sent"), sent["internet_message_id"])
    for header in ("In-Reply-To", "References", "Subject", "From", "To", "Date"):
        assert stored[header] == delivered[header], header
    assert part(stored, "html") == part(delivered, "html")
    # Of what this workspace sent, the client got the reply only, the approver the request.
    ours = set(station.sent_ids)
    assert [
        str(m["Message-ID"]) for m in station.messages(CLIENT) if str(m["Message-ID"]) in ours
    ] == [sent["internet_message_id"]]
    assert [
        str(m["Message-ID"]) for m in station.messages(APPROVER) if str(m["Message-ID"]) in ours
    ] == [request["request_message_id"]]


# -- scenario 7 ------------------------------------------------------------------------------


async def test_scenario_07_hebrew_rtl_and_english_ltr_survive_imap_read_back_and_delivery_with_isolated_fragments(
    station: DovecotStation,
) -> None:
    hebrew_request = station.deliver_hebrew_request()
    english_request = station.deliver(sender=CLIENT, body="Hi, may I have a quote?")
    async with station.client() as client:
        scanned, claims = await intake_and_claim(client)
        assert [c["task_created"] for c in claims] == [True, True]
        by_message = {c["message"]["subject"]["text"]: c["task_id"] for c in claims}
        hebrew_task, english_task = by_message[HEBREW_SUBJECT], by_message["Quote request"]
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

    inbox = station.messages(CLIENT)
    sent_folder = station.messages(folder="Sent")
    for where in (inbox, sent_folder):  # what the client got, and the stored copy
        hebrew = with_id(where, sends[hebrew_task]["internet_message_id"])
        assert_hebrew_reply(hebrew)
        assert hebrew["In-Reply-To"] == hebrew_request
        english = with_id(where, sends[english_task]["internet_message_id"])
        assert english["Subject"] == "Re: Quote request"
        assert english["In-Reply-To"] == english_request
        assert_english_reply(english)


# -- scenario 14 -----------------------------------------------------------------------------


async def test_scenario_14_every_item_scanned_from_the_imap_inbox_is_reconciled_to_exactly_one_outcome(
    station: DovecotStation,
) -> None:
    first = station.deliver_hebrew_request()
    station.deliver(sender=CLIENT, subject=f"Re: {HEBREW_SUBJECT}", body="תודה!", in_reply_to=first)
    station.deliver(
        sender="mailer@contoso.test",
        subject="Out of office",
        body="I am away this week.",
        headers={"Auto-Submitted": "auto-replied"},
    )
    twice = EmailMessage(policy=SMTP)
    twice["From"], twice["To"], twice["Subject"] = CLIENT, MAILBOX, "Invoice question"
    twice["Date"] = format_datetime(station.clock.now())
    twice["Message-ID"] = make_msgid(domain="contoso.test")
    twice.set_content("Which invoice is this?")
    station.deliver_raw(twice.as_bytes(), mail_from=CLIENT)
    station.deliver_raw(twice.as_bytes(), mail_from=CLIENT)  # the same message delivered twice
    station.append_raw(b"this first line is no header\r\n\r\nand there is no header block\r\n")
    async with station.client() as client:
        scanned, claims = await intake_and_claim(client)
        [reconciliation] = await reconcile_all(client, scanned)

    # Oldest first (UID order within Dovecot's one-second Received stamps); unreadable last.
    items = scanned["items"]
    assert [i["item_ref"].rsplit(":", 1)[1] for i in items] == ["1", "2", "3", "4", "5", "6"]
    assert all(i["workspace_id"] == station.workspace_id for i in items)
    assert [i["escalation_reason"] for i in items[:5]] == [""] * 5
    assert "no header block could be read" in items[5]["escalation_reason"]
    assert items[5]["untrusted"] is None
    outcomes = [(c["outcome"], c["disposition"], c["task_created"]) for c in claims]
    assert outcomes == [
        ("CLAIMED", "QUEUED", True),  # the request
        ("CLAIMED", "QUEUED", False),  # its follow-up joins the request's task
        ("CLAIMED", "NOISE_EXCLUDED", True),  # an auto-reply: recorded, terminal
        ("CLAIMED", "QUEUED", True),  # a new request
        ("EXECUTION_ALREADY_DONE", "EXECUTION_ALREADY_DONE", False),  # its second delivery
        ("CLAIMED", "ESCALATED", False),  # unreadable: escalated, no task
    ]
    assert claims[1]["task_id"] == claims[0]["task_id"]
    assert claims[4]["task_id"] is None and claims[5]["task_id"] is None
    assert reconciliation["clean"] and reconciliation["reconciliation_failed"] == 0
    figures = tuple(reconciliation[k] for k in ("terminal", "non_terminal", "claim_race"))
    assert reconciliation["scanned"] == sum(figures) == 6 and figures == (1, 4, 1)

    store = station.store()
    try:
        ledger = store.ledger(scanned["run_id"])
        assert sorted(e.item_ref for e in ledger) == sorted(i["item_ref"] for i in items)
        recorded = {e.item_ref: e.disposition for e in ledger}
        assert {ref: d.value if d else None for ref, d in recorded.items()} == {
            c["item_ref"]: c["disposition"] for c in claims
        }
        assert all(d in COVERED for d in recorded.values())  # each one known outcome
        [escalation] = store.list_escalations(station.workspace_id)
        assert escalation.queue == "unresolved" and escalation.assignee == APPROVER
        assert store.counts()["tasks"] == 3
    finally:
        store.close()


# -- the server's IMAP connections -------------------------------------------------------------


async def test_the_server_reuses_one_imap_connection_per_mailbox_and_closes_it_when_it_stops(
    station: DovecotStation,
) -> None:
    """Between intake runs (each run's own channel is closed when it is reconciled), the
    server holds at most one IMAP connection to the mailbox, however many calls use it: a
    long-running server must not pile up logged-in sessions until the mail server refuses
    the mailbox (Dovecot allows 10 per user and address by default). When the server stops,
    none is left open."""
    port = station.dovecot.imap_port
    held: dict[str, int] = {}

    async def tool(client: Client, name: str, **arguments: Any) -> dict[str, Any]:
        result = await call(client, name, **arguments)
        held[name] = max(held.get(name, 0), len(open_connections(port)))
        return result

    station.deliver_hebrew_request()
    async with station.client() as client:
        for _ in range(3):
            await tool(client, "access_status", workspace_id=station.workspace_id)
        scanned, [claim] = await intake_and_claim(client)
        await reconcile_all(client, scanned)
        held["intake, claim and reconcile"] = len(open_connections(port))
        task_id = claim["task_id"]
        await to_draft_ready(client, task_id)
        draft = await tool(client, "render", task_id=task_id, body_markdown=HEBREW_BODY)
        request = await request_approval(station, client, task_id, draft["draft_id"])
        held["request_approval"] = len(open_connections(port))
        await approve_by_reply(station, client, [request])
        sent = await send(station, client, task_id, draft["draft_id"], [CLIENT])
        held["send"] = len(open_connections(port))
        for _ in range(3):
            await tool(client, "read_back", send_id=sent["send_id"])
        await tool(client, "access_status", workspace_id=station.workspace_id)
    assert held == dict.fromkeys(held, 1)  # the first access_status opened it; all reuse it
    # The station's teardown checks that the stopped server left no connection open.
