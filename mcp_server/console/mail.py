"""The console reads an inbound message's body where it lives: in the workspace's mailbox,
through the channel its context permits (the store keeps only where the body is)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import anyio

from agent.domain.context import MailboxBinding
from agent.domain.errors import ProviderError
from agent.domain.mail import MessageBody
from agent.domain.task import MessageRef, Task
from agent.ports import MailProvider, Registry
from agent.services.workspaces import load_context

READ_SECONDS = 30.0
"""How long a page waits for a mailbox to give a body before it says it could not."""


class MailboxBodies:
    """One adapter per mailbox binding, opened on first need and kept while the console
    runs (a changed binding opens a new one)."""

    def __init__(
        self,
        store: Registry,
        providers: Callable[[str, MailboxBinding], MailProvider],
        close_providers: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        self._store = store
        self._providers = providers
        self._close_providers = close_providers
        self._open: dict[tuple[str, str], MailProvider] = {}
        self._lock = anyio.Lock()

    async def __call__(self, task: Task, message: MessageRef) -> MessageBody:
        if message.body_ref is None:
            raise ProviderError("the message's body is not kept where it can be read")
        adapter = await self._adapter(task)
        with anyio.fail_after(READ_SECONDS):
            return await adapter.fetch_body(message.body_ref)

    async def _adapter(self, task: Task) -> MailProvider:
        context = load_context(self._store, task.workspace_id)
        binding = context.mailbox(task.provider, task.mailbox_id)
        if binding is None:
            raise ProviderError(
                f"mailbox {task.mailbox_id} is no longer bound to workspace {task.workspace_id}"
            )
        key = (task.workspace_id, binding.model_dump_json())
        async with self._lock:
            if key not in self._open:
                self._open[key] = self._providers(task.workspace_id, binding)
            return self._open[key]

    async def aclose(self) -> None:
        opened, self._open = list(self._open.values()), {}
        for adapter in opened:
            await adapter.aclose()
        if self._close_providers is not None:
            await self._close_providers()
