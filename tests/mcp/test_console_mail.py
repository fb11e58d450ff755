"""The console reads a body through the task's mailbox binding: one adapter per binding,
kept while the console runs, a new one when the binding changes, and a bounded wait."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import anyio
import pytest

from agent.domain.context import MailboxBinding
from agent.domain.mail import MessageBody
from agent.ports import MailProvider
from agent.services import workspaces
from agent.storage.sqlite import SqliteStore
from agent.testing import FrozenClock, InMemoryProvider
from mcp_server.console import mail
from mcp_server.console.mail import MailboxBodies
from tests.conftest import context_yaml
from tests.services.gates_world import CLIENT, MAILBOX, World

pytestmark = pytest.mark.anyio


@pytest.fixture
def world(
    station_store: SqliteStore,
    data_dir: workspaces.DataDir,
    clock: FrozenClock,
    register: Callable[[str], str],
) -> World:
    return World(station_store, data_dir, register(context_yaml()), clock)


class Opened:
    """The mailbox's adapters as the console opens them, each recorded with its binding."""

    def __init__(self, world: World) -> None:
        self.world = world
        self.bindings: list[MailboxBinding] = []
        self.closed = 0

    def __call__(self, workspace_id: str, binding: MailboxBinding) -> MailProvider:
        self.bindings.append(binding)
        return self.world.box

    async def close(self) -> None:
        self.closed += 1


async def test_bodies_are_read_through_one_adapter_per_binding_and_a_changed_binding_opens_anew(
    world: World, tmp_path: Path
) -> None:
    world.deliver(sender=CLIENT, thread=1, text="Please send the quote.")
    await world.intake()
    task = world.only_task()
    opened = Opened(world)
    bodies = MailboxBodies(world.store, opened, opened.close)
    [message] = task.messages
    assert (await bodies(task, message)).text == "Please send the quote."
    await bodies(task, message)
    assert len(opened.bindings) == 1
    row = world.store.get_workspace(world.workspace_id)
    assert row is not None and row.context_text is not None
    changed = tmp_path / "changed.yaml"
    changed.write_text(
        row.context_text.replace("reads_after_refusal: false", "reads_after_refusal: true")
    )
    workspaces.update_workspace(world.store, world.data_dir, changed, world.clock.now())
    await bodies(task, message)
    assert [b.reads_after_refusal for b in opened.bindings] == [False, True]
    await bodies.aclose()
    assert opened.closed == 1


class Hanging(InMemoryProvider):
    """A mailbox that never answers."""

    async def fetch_body(self, body_ref: str) -> MessageBody:
        await anyio.Event().wait()
        raise AssertionError("unreachable")


async def test_a_mailbox_that_does_not_answer_is_given_up_on_within_the_bound(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    world.deliver(sender=CLIENT, thread=1, text="Hello")
    await world.intake()
    task = world.only_task()
    monkeypatch.setattr(mail, "READ_SECONDS", 0.05)
    bodies = MailboxBodies(world.store, lambda _w, _b: Hanging(MAILBOX))
    with pytest.raises(TimeoutError):
        await bodies(task, task.messages[0])
