"""A Maildir provider whose calls a test can hold open or fail.

Races are made deterministic without sleeping: the provider's first ``send`` (or
``fetch_body``) is held open on an ``anyio.Event`` until the test releases it, so a second
call provably overlaps the first. Within one session the second call may wait inside the
server for the first; ``anyio.wait_all_tasks_blocked`` lets it go as far as it can before the
first is released (nothing on its path runs in a worker thread).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import anyio
from mcp import Client

from agent.domain.context import MailboxBinding
from agent.domain.errors import ProviderError
from agent.domain.mail import Handover, MessageBody, SendResult
from agent.ports import MailProvider
from agent.providers.maildir import MaildirProvider
from mcp_server.composition import Settings
from mcp_server.server import build_server
from tests.mcp.conftest import OperatorStation

WAIT = 30
"""Seconds any one test may take before it is a hang, not a slow machine."""


class Held:
    """Holds the first call it is asked about open until ``release``; later calls pass."""

    def __init__(self) -> None:
        self.entered = anyio.Event()
        self._released = anyio.Event()
        self.calls = 0

    async def turn(self) -> None:
        self.calls += 1
        if self.calls == 1:
            self.entered.set()
            await self._released.wait()

    def release(self) -> None:
        self._released.set()


@dataclass
class Hooks:
    """What the test armed; shared by every provider a server builds."""

    send: Held | None = None
    body: Held | None = None
    body_failures: int = 0


class HookedMaildir(MaildirProvider):
    def __init__(self, path: Path, mailbox_id: str, hooks: Hooks) -> None:
        super().__init__(path, mailbox_id)
        self._hooks = hooks

    async def fetch_body(self, body_ref: str) -> MessageBody:
        if self._hooks.body_failures:
            self._hooks.body_failures -= 1
            raise ProviderError("the provider timed out")
        if self._hooks.body is not None:
            await self._hooks.body.turn()
        return await super().fetch_body(body_ref)

    async def send(self, handover: Handover) -> SendResult:
        if self._hooks.send is not None:
            await self._hooks.send.turn()
        return await super().send(handover)


def hooked_client(station: OperatorStation, hooks: Hooks) -> Client:
    def providers(workspace_id: str, binding: MailboxBinding) -> MailProvider:
        del workspace_id
        assert binding.path is not None
        return HookedMaildir(Path(binding.path), binding.mailbox_id, hooks)

    server = build_server(
        Settings(data_dir=station.data_dir), clock=station.clock, providers=providers
    )
    return Client(server)
