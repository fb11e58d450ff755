"""An operator's station for the MCP tests: a data directory with one workspace whose context
file binds a local Maildir, exactly as ``outloop workspace add`` leaves it."""

from __future__ import annotations

import mailbox
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from email.message import EmailMessage
from email.policy import SMTP
from email.utils import format_datetime, make_msgid
from pathlib import Path
from typing import Any

import pytest
from mcp import Client
from mcp.types import CallToolResult

from agent.services import workspaces
from agent.storage.sqlite import SqliteStore
from agent.testing import FrozenClock
from mcp_server.runtime import Settings
from mcp_server.server import build_server
from tests.conftest import context_yaml

MAILBOX = "support@fabrikam.test"
CLIENT = "dana.levi@contoso.test"
APPROVER = "noa.bar@fabrikam.test"
COLLEAGUE = "eli.tal@fabrikam.test"
STRANGER = "mallory@evil.test"

COLLEAGUE_LINE = (
    "  - {address: eli.tal@fabrikam.test, name: Eli Tal, side: internal, roles: [analyst],"
    " verified_by: directory}\n"
)


def station_context(workspace_id: str = "ws-test-0001", extra: str = "", **kw: Any) -> str:
    text = context_yaml(workspace_id, provider="maildir", path="Maildir", extra=extra, **kw)
    return text.replace("contacts:\n", "contacts:\n" + COLLEAGUE_LINE, 1)


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

    def server(self) -> Any:
        return build_server(Settings(data_dir=self.data_dir), clock=self.clock)

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
