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
from agent.ports import MailProvider
from agent.providers.maildir import SENT_FOLDER, MaildirProvider
from agent.services import workspaces
from agent.storage.sqlite import SqliteStore
from agent.testing import FrozenClock
from mcp_server.composition import Settings
from mcp_server.runtime import REFUSED
from mcp_server.server import build_server
from tests.conftest import context_yaml

# The shared helper modules' asserts report what they compared, as a test's own do.
pytest.register_assert_rewrite("tests.mcp.attacks", "tests.mcp.hooked")

MAILBOX = "support@fabrikam.test"
CLIENT = "dana.levi@contoso.test"
APPROVER = "noa.bar@fabrikam.test"
COLLEAGUE = "eli.tal@fabrikam.test"
STRANGER = "mallory@evil.test"

REFUSAL_KINDS = {"gate", "policy", "task_state", "already_sent", "handover"}
"""Every kind of refusal the server gives (``data["refused"]``)."""

COLLEAGUE_LINE = (
    "  - {address: eli.tal@fabrikam.test, name: Eli Tal, side: internal, roles: [analyst],"
    " verified_by: directory}\n"
)


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
        """Drop one message into the Maildir inbox; returns its Message-ID."""
        msg = EmailMessage(policy=SMTP)
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
        mailbox.Maildir(str(self.maildir), create=True).add(msg.as_bytes())
        return mid

    def deliver_raw(self, raw: bytes) -> None:
        """Drop one message into the Maildir inbox exactly as these bytes (crafted mail)."""
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
