"""An operator's station for the MCP tests: a data directory with one workspace whose context
file binds a local Maildir, exactly as ``outloop workspace add`` leaves it."""

from __future__ import annotations

import email
import email.policy
import mailbox
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from email.message import EmailMessage
from email.policy import SMTP
from email.utils import format_datetime, make_msgid
from pathlib import Path
from typing import Any, NamedTuple

import pytest
from mcp import Client
from mcp.shared.exceptions import MCPError
from mcp.types import CallToolResult

from agent.domain.context import MailboxBinding
from agent.domain.mail import Capabilities, Handover, Marker, SendResult, StoredCopy
from agent.domain.task import Task
from agent.ports import MailProvider
from agent.providers.maildir import SENT_FOLDER, MaildirProvider
from agent.services import workspaces
from agent.storage.sqlite import SqliteStore
from agent.testing import FrozenClock
from mcp_server.composition import Settings
from mcp_server.runtime import REFUSED
from mcp_server.server import build_server
from tests.conftest import context_yaml
from tests.leak_canary import forbid

# The shared helper modules' asserts report what they compared, as a test's own do.
pytest.register_assert_rewrite("tests.mcp.attacks", "tests.mcp.hooked")

MAILBOX = "support@fabrikam.test"
CLIENT = "dana.levi@contoso.test"
APPROVER = "noa.bar@fabrikam.test"
COLLEAGUE = "eli.tal@fabrikam.test"
STRANGER = "mallory@evil.test"

REFUSAL_KINDS = {"gate", "policy", "task_state", "already_sent", "handover"}
"""Every kind of refusal the server gives (``data["refused"]``)."""

READ_BACK_CHECKS = {
    "delivered",
    "recipients.to",
    "recipients.cc",
    "recipients.bcc",
    "recipients.reply_to",
    "recipients.other",
    "sender",
    "subject",
    "thread",
    "message_id",
    "wrapper.direction",
    "wrapper.lang",
    "wrapper.alignment",
    "blocks",
    "fragments",
    "body_text",
}
"""Every check read_back runs on a stored copy with an HTML part."""

COLLEAGUE_LINE = (
    "  - {address: eli.tal@fabrikam.test, name: Eli Tal, side: internal, roles: [analyst],"
    " verified_by: directory}\n"
)

DELIVERY = SMTP.clone(max_line_length=998)
"""How test mail is written: a long Message-ID in In-Reply-To stays a msg-id (Python's 78
column folding would write it as encoded words, which no mail client does)."""


def station_context(workspace_id: str = "ws-test-0001", extra: str = "", **kw: Any) -> str:
    text = context_yaml(workspace_id, provider="maildir", path="Maildir", extra=extra, **kw)
    return text.replace("contacts:\n", "contacts:\n" + COLLEAGUE_LINE, 1)


class SubmittingMaildir(MaildirProvider):
    """A Maildir mailbox behind a mail server that delivers what it sends (as a mailbox reached
    over IMAP and SMTP does). Only the delivery is assumed: reading, threading, what is handed
    over and the stored copies are the Maildir adapter's own. The lifecycle tests need a
    delivered client reply; a plain Maildir's outbox copy never is one (tested on its own)."""

    async def send(self, handover: Handover) -> SendResult:
        result = await super().send(handover)
        return result.model_copy(update={"delivered": True, "channel": "test-submission"})

    @property
    def capabilities(self) -> Capabilities:
        return super().capabilities.model_copy(update={"delivers": True})

    async def find_sent(self, marker: Marker) -> StoredCopy | None:
        copy = await super().find_sent(marker)
        return copy.model_copy(update={"delivered": True}) if copy is not None else None


async def inbox_thread_id(provider: MailProvider, internet_message_id: str) -> str:
    """The provider's own thread id for a message in its inbox (read from the start)."""
    cursor: str | None = None
    while True:
        page = await provider.changes(cursor)
        for scanned in page.items:
            envelope = scanned.envelope
            if envelope is not None and envelope.internet_message_id == internet_message_id:
                return envelope.provider_thread_id
        if not page.more:
            raise AssertionError(
                f"{internet_message_id} is not in {type(provider).__name__}'s inbox"
            )
        cursor = page.cursor


def submitting(workspace_id: str, binding: MailboxBinding) -> MailProvider:
    del workspace_id
    assert binding.path is not None
    return SubmittingMaildir(Path(binding.path), binding.mailbox_id)


@dataclass
class OperatorStation:
    """A data directory set up by an operator, and the mail that reaches its Maildir."""

    root: Path
    clock: FrozenClock
    workspace_id: str = "ws-test-0001"

    @property
    def maildir(self) -> Path:
        return self.root / "contexts" / "Maildir"

    def register(self, text: str | None = None) -> None:
        contexts = self.root / "contexts"
        contexts.mkdir(parents=True, exist_ok=True)
        source = contexts / f"{self.workspace_id}.yaml"
        source.write_text(text or station_context(self.workspace_id), encoding="utf-8")
        mailbox.Maildir(str(self.maildir), create=True)
        store = SqliteStore(workspaces.DataDir(self.root / "data").database)
        try:
            (self.root / "data").mkdir(exist_ok=True)
            workspaces.add_workspace(
                store, workspaces.DataDir(self.root / "data"), source, self.clock.now()
            )
        finally:
            store.close()

    @property
    def data_dir(self) -> Path:
        return self.root / "data"

    def deliver(
        self,
        *,
        sender: str,
        subject: str = "Quote request",
        body: str = "Could you send me a quote for the Q4 licences?",
        in_reply_to: str | None = None,
        html: str | None = None,
        headers: dict[str, str] | None = None,
        sender_name: str = "",
    ) -> str:
        """Deliver one message from ``sender`` to the mailbox (``deliver_raw``); returns its
        Message-ID."""
        forbid(subject, body, sender_name)  # mail text: never in a log record or metric label
        msg = EmailMessage(policy=DELIVERY)
        msg["From"] = f"{sender_name} <{sender}>" if sender_name else sender
        msg["To"] = MAILBOX
        msg["Subject"] = subject
        msg["Date"] = format_datetime(self.clock.now())
        mid = make_msgid(domain=sender.rsplit("@", 1)[-1])
        msg["Message-ID"] = mid
        if in_reply_to:
            msg["In-Reply-To"] = in_reply_to
            msg["References"] = in_reply_to
        for name, value in (headers or {}).items():
            msg[name] = value
        msg.set_content(body)
        if html is not None:
            msg.add_alternative(html, subtype="html")
        self.deliver_raw(msg.as_bytes(), mail_from=sender)
        return mid

    def deliver_raw(self, raw: bytes, *, mail_from: str = "") -> None:
        """Drop one message into the Maildir inbox exactly as these bytes (crafted mail).
        ``mail_from``, the envelope sender, is for a mail server's delivery: a Maildir keeps
        none."""
        del mail_from
        mailbox.Maildir(str(self.maildir), create=True).add(raw)

    delivering: bool = True
    """Sends are delivered by a mail server (False: the plain Maildir adapter's outbox)."""

    def server(self) -> Any:
        providers = submitting if self.delivering else None
        return build_server(Settings(data_dir=self.data_dir), clock=self.clock, providers=providers)

    @asynccontextmanager
    async def client(self) -> AsyncIterator[Client]:
        async with Client(self.server()) as client:
            yield client

    def store(self) -> SqliteStore:
        return SqliteStore(workspaces.DataDir(self.data_dir).database)


@pytest.fixture
def station(tmp_path: Path) -> OperatorStation:
    s = OperatorStation(root=tmp_path / "station", clock=FrozenClock())
    s.register()
    return s


async def call(client: Client, tool: str, **arguments: Any) -> dict[str, Any]:
    """Call a tool that must succeed; its structured content."""
    result = await client.call_tool(tool, arguments)
    assert isinstance(result, CallToolResult)
    assert not result.is_error, f"{tool} failed: {result.content}"
    assert result.structured_content is not None
    return result.structured_content


async def tool_error(client: Client, tool: str, **arguments: Any) -> str:
    """Call a tool that must fail with a tool error; its text."""
    result = await client.call_tool(tool, arguments)
    assert isinstance(result, CallToolResult)
    assert result.is_error, f"{tool} unexpectedly succeeded: {result.structured_content}"
    text = result.content[0]
    assert text.type == "text"
    return text.text


async def refused(client: Client, tool: str, **arguments: Any) -> MCPError:
    """Call a tool that the server must refuse (JSON-RPC error -32010) saying why, with the
    refusal's kind in its data; the error."""
    with pytest.raises(MCPError) as raised:
        await client.call_tool(tool, arguments)
    error = raised.value
    assert error.code == REFUSED, error.message
    assert error.message, "a refusal says why"
    assert isinstance(error.data, dict)
    assert error.data["refused"] in REFUSAL_KINDS, error.data
    return error


def by_name(read_back: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """read_back's checks by name (each reported once)."""
    checks = {c["name"]: c for c in read_back["checks"]}
    assert len(checks) == len(read_back["checks"]), "a check is reported twice"
    return checks


# -- the lifecycle, as a host drives it ------------------------------------------------------


class Intake(NamedTuple):
    """One intake of a mailbox, and the claim of each of its items in the order given."""

    scanned: dict[str, Any]
    claims: list[dict[str, Any]]


async def intake_and_claim(
    client: Client, mailbox_id: str = MAILBOX, *, from_start: bool = False
) -> Intake:
    """One intake of the mailbox (the station's own unless named; ``from_start``: a replay
    of the whole mailbox), then a claim of each item in the order given."""
    scanned = await call(client, "intake", mailbox_id=mailbox_id, from_start=from_start)
    claims = [
        await call(client, "claim", run_id=item["run_id"], item_ref=item["item_ref"])
        for item in scanned["items"]
    ]
    return Intake(scanned, claims)


async def reconcile_all(client: Client, scanned: dict[str, Any]) -> list[dict[str, Any]]:
    """Reconcile every run an intake opened; each run's figures."""
    return [await call(client, "reconcile", run_id=run_id) for run_id in scanned["run_ids"]]


async def to_draft_ready(client: Client, task_id: str) -> dict[str, Any]:
    """Work a task through EXECUTING and VERIFYING to DRAFT_READY, each move confirmed; the
    task as DRAFT_READY."""
    task: dict[str, Any] = {}
    for state in ("EXECUTING", "VERIFYING", "DRAFT_READY"):
        task = await call(
            client, "transition_task", task_id=task_id, state=state, evidence=f"work {state}"
        )
        assert task["state"] == state
    return task


async def approve_by_reply(
    station: OperatorStation, client: Client, requests: list[dict[str, Any]]
) -> dict[str, str]:
    """The approver answers each approval request (request_approval's answer) by replying
    'Approved.' to it; intake takes the replies in and the server judges them. Returns each
    task's reply Message-ID."""
    station.clock.advance(minutes=5)
    replies = {
        request["task_id"]: station.deliver(
            sender=APPROVER,
            subject="Re: Approval needed",
            body="Approved.",
            in_reply_to=request["request_message_id"],
        )
        for request in requests
    }
    scanned, claims = await intake_and_claim(client)
    judged = {c["task_id"]: c for c in claims if c["outcome"] == "CLAIMED"}
    assert set(judged) == set(replies), claims
    for claim in judged.values():
        assert claim["task_created"] is False  # the reply joins the task it approves
        assert f"approved by {APPROVER}" in claim["detail"]
    assert {c["outcome"] for c in claims if c["task_id"] is None} <= {"EXECUTION_ALREADY_DONE"}
    for reconciliation in await reconcile_all(client, scanned):
        assert reconciliation["clean"], reconciliation
    return replies


async def waiting_for_approval(
    client: Client, body_markdown: str = "The quote is $1,200."
) -> dict[str, Any]:
    """The task the next intake creates, worked to a draft that waits for approval (the run
    reconciled); request_approval's answer (with the task's and the draft's ids)."""
    scanned, claims = await intake_and_claim(client)
    task_id = next(c["task_id"] for c in claims if c["task_created"])
    await to_draft_ready(client, task_id)
    draft = await call(client, "render", task_id=task_id, body_markdown=body_markdown)
    request = await call(client, "request_approval", task_id=task_id, draft_id=draft["draft_id"])
    for reconciliation in await reconcile_all(client, scanned):
        assert reconciliation["clean"], reconciliation
    return request


async def approved_draft(client: Client, station: OperatorStation) -> dict[str, Any]:
    """``waiting_for_approval``, then approved by the approver's reply."""
    request = await waiting_for_approval(client)
    await approve_by_reply(station, client, [request])
    return request


async def draft_ready(
    station: OperatorStation, client: Client, body: str
) -> tuple[str, str, dict[str, Any]]:
    """A client's request taken in, claimed and worked to DRAFT_READY with a draft; the
    task, the draft and the intake."""
    station.deliver(sender=CLIENT, sender_name="Dana Levi", body="Please send the Q4 quote.")
    intake = await intake_and_claim(client)
    [claimed] = intake.claims
    task_id = claimed["task_id"]
    await to_draft_ready(client, task_id)
    draft = await call(client, "render", task_id=task_id, body_markdown=body, language="en")
    return task_id, draft["draft_id"], intake.scanned


# -- steps of the acceptance scenarios, whichever mailbox the station binds -------------------


class NewRequest(NamedTuple):
    """The one item an intake found for a new request, its claim, and the queued task."""

    item: dict[str, Any]
    claim: dict[str, Any]
    task: dict[str, Any]


async def claim_the_new_request(client: Client, station: OperatorStation) -> NewRequest:
    """Scenario 1: an intake of the mailbox finds one item, from the client, for the station's
    workspace, with nothing to escalate; its claim queues it and creates a task, and claiming
    it again gives the same answer; the queue holds that task alone (resolved, one message);
    the run is reconciled clean, the item not yet terminal."""
    scanned = await call(client, "intake", mailbox_id=MAILBOX)
    assert len(scanned["run_ids"]) == 1 and scanned["access_errors"] == []
    [item] = scanned["items"]
    assert item["workspace_id"] == station.workspace_id
    assert item["escalation_reason"] == ""
    assert item["untrusted"]["sender"] == CLIENT

    claim = await call(client, "claim", run_id=item["run_id"], item_ref=item["item_ref"])
    assert claim["outcome"] == "CLAIMED" and claim["task_created"] is True
    assert claim["disposition"] == "QUEUED"
    # Claiming the same item again gives the first answer; nothing new is created.
    again = await call(client, "claim", run_id=item["run_id"], item_ref=item["item_ref"])
    assert again == claim

    [task] = (await call(client, "list_queue", workspace_id=station.workspace_id))["tasks"]
    assert task["task_id"] == claim["task_id"]
    assert task["state"] == "TASK_RESOLVED" and task["message_count"] == 1

    [reconciliation] = await reconcile_all(client, scanned)
    assert reconciliation["clean"] and reconciliation["scanned"] == 1
    assert reconciliation["non_terminal"] == 1 and reconciliation["claim_race"] == 0
    return NewRequest(item, claim, task)


def assert_one_task_of(store: SqliteStore, workspace_id: str, message_id: str) -> None:
    """The store holds one execution, done, and one task of the workspace, whose one message
    is ``message_id``."""
    counts = store.counts()
    assert counts["executions"] == 1 and counts["executions_done"] == 1
    assert counts["tasks"] == 1 and counts["task_messages"] == 1
    [stored] = store.list_tasks(workspace_id)
    assert [m.internet_message_id for m in stored.messages] == [message_id]


class Completed(NamedTuple):
    """A task reported completed, and the store's counts and tasks once it was."""

    task_id: str
    counts: dict[str, int]
    tasks: list[Task]


async def complete_the_request_and_its_follow_up(station: OperatorStation) -> Completed:
    """Scenario 3, before the replay: the mailbox's two messages (a request, then its
    follow-up) are claimed into one task, worked and reported completed, the run reconciled
    clean; then the store is read."""
    async with station.client() as client:
        scanned, claims = await intake_and_claim(client)
        assert [c["outcome"] for c in claims] == ["CLAIMED", "CLAIMED"]
        assert [c["task_created"] for c in claims] == [True, False]  # the follow-up joins
        task_id = claims[0]["task_id"]
        assert claims[1]["task_id"] == task_id
        await call(client, "transition_task", task_id=task_id, state="EXECUTING", evidence="work")
        await call(client, "transition_task", task_id=task_id, state="VERIFYING", evidence="check")
        done = await call(
            client, "report", task_id=task_id, outcome="completed", evidence="answered by phone"
        )
        assert done["state"] == "COMPLETED"
        [reconciliation] = await reconcile_all(client, scanned)
        assert reconciliation["clean"] and reconciliation["scanned"] == 2

    store = station.store()
    try:
        return Completed(task_id, store.counts(), store.list_tasks(station.workspace_id))
    finally:
        store.close()


class Replayed(NamedTuple):
    """The replay's claims, and the store's counts after it."""

    claims: list[dict[str, Any]]
    counts: dict[str, int]


async def replay_after_completion(station: OperatorStation, completed: Completed) -> Replayed:
    """Scenario 3's replay, in a fresh server (a restart) over the same mailbox: a plain
    intake finds nothing (the cursor in the store says nothing arrived); a replay from the
    mailbox's start claims both items as already done, creating nothing, and is reconciled
    clean; the task stays completed and the queue empty. Only the two runs and the replay's
    ledger rows are new in the store."""
    async with station.client() as client:
        nothing_new, none = await intake_and_claim(client)
        assert nothing_new["items"] == [] and none == []
        [empty] = await reconcile_all(client, nothing_new)
        assert empty["clean"] and empty["scanned"] == 0
        replay, replayed = await intake_and_claim(client, from_start=True)
        assert len(replayed) == 2
        for claim in replayed:
            assert claim["outcome"] == claim["disposition"] == "EXECUTION_ALREADY_DONE"
            assert claim["task_id"] is None and claim["task_created"] is False
        [reconciliation] = await reconcile_all(client, replay)
        assert reconciliation["clean"] and reconciliation["reconciliation_failed"] == 0
        assert reconciliation["scanned"] == reconciliation["claim_race"] == 2
        assert reconciliation["terminal"] == reconciliation["non_terminal"] == 0
        task = await call(client, "get_task", task_id=completed.task_id)
        assert task["state"] == "COMPLETED" and task["message_count"] == 2
        assert (await call(client, "list_queue", workspace_id=station.workspace_id))["tasks"] == []

    store = station.store()
    try:
        counts = store.counts()
        assert counts["runs"] == completed.counts["runs"] + 2  # the empty intake and the replay
        assert counts["run_items"] == completed.counts["run_items"] + 2
        for name in ("executions", "executions_done", "tasks", "task_messages", "sends"):
            assert counts[name] == completed.counts[name], name
        assert store.list_tasks(station.workspace_id) == completed.tasks
    finally:
        store.close()
    return Replayed(replayed, counts)


async def approved_by_reply(
    station: OperatorStation, client: Client, request: dict[str, Any]
) -> dict[str, Any]:
    """``approve_by_reply`` of one approval request: the task is APPROVED_TO_SEND on the
    approver's decision, whose evidence is the reply; the decision."""
    replies = await approve_by_reply(station, client, [request])
    task_id = request["task_id"]
    task = await call(client, "get_task", task_id=task_id)
    assert task["state"] == "APPROVED_TO_SEND"
    [decision] = task["approval_decisions"]
    assert decision["decision"] == "approved" and decision["approver"] == APPROVER
    assert decision["evidence_message_id"] == replies[task_id]
    return decision


async def read_back_the_client_reply(client: Client, task_id: str, sent: dict[str, Any]) -> None:
    """read_back of a sent client reply: every check passes on the stored copy the send named,
    and the task records the reply as sent, the read-back as its evidence."""
    read_back = await call(client, "read_back", send_id=sent["send_id"])
    checks = by_name(read_back)
    assert read_back["ok"] is True, [c for c in read_back["checks"] if not c["ok"]]
    assert set(checks) == READ_BACK_CHECKS
    assert all(c["ok"] for c in checks.values()), checks
    assert read_back["stored_provider_message_id"] == sent["provider_message_id"]

    task = await call(client, "get_task", task_id=task_id)
    assert task["state"] == "CLIENT_REPLY_SENT"
    assert task["sent_message_id"] == sent["internet_message_id"]
    assert task["readback_evidence"] == (
        f"read back {sent['internet_message_id']}: all checks passed"
    )


# -- the Maildir outbox ------------------------------------------------------------------------


def sent_raw(maildir: Path) -> list[bytes]:
    """The exact bytes of every copy the Maildir provider's send wrote, in key order."""
    box = mailbox.Maildir(str(maildir), create=False)
    if SENT_FOLDER not in box.list_folders():
        return []
    sent = box.get_folder(SENT_FOLDER)
    return [sent.get_bytes(key) for key in sorted(sent.iterkeys())]


def sent_messages(maildir: Path) -> list[EmailMessage]:
    """Every copy the Maildir provider's send wrote into the Maildir's Sent folder (approval
    requests and replies), parsed, in the folder's key order."""
    box = mailbox.Maildir(str(maildir), create=False)
    if SENT_FOLDER not in box.list_folders():
        return []
    sent = box.get_folder(SENT_FOLDER)
    messages: list[EmailMessage] = []
    for key in sorted(sent.iterkeys()):
        message = email.message_from_bytes(sent.get_bytes(key), policy=email.policy.default)
        assert isinstance(message, EmailMessage)
        messages.append(message)
    return messages
