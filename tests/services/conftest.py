"""Fixtures shared by the service tests."""

from __future__ import annotations

import mailbox
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

import pytest

from agent.ports import MailProvider
from agent.services import intake, workspaces
from agent.storage.sqlite import SqliteStore
from agent.testing import FrozenClock, InMemoryProvider
from tests.conftest import context_yaml, run_intake
from tests.services.gates_world import MAILBOX, TWO_APPROVERS, World, with_colleague


@pytest.fixture
def make_world(
    station_store: SqliteStore,
    data_dir: workspaces.DataDir,
    clock: FrozenClock,
    register: Callable[[str], str],
) -> Callable[..., World]:
    """A World for a workspace registered from context text (default: the test context with
    an internal colleague who holds no approval role)."""

    def _make(text: str | None = None) -> World:
        ws = register(text or with_colleague(context_yaml()))
        return World(station_store, data_dir, ws, clock)

    return _make


@pytest.fixture
def world(make_world: Callable[..., World]) -> World:
    """The default World: the test context with an internal colleague."""
    return make_world()


class Station(NamedTuple):
    """The station fixtures the intake tests use together: store, data directory, clock and
    the workspace registrar."""

    store: SqliteStore
    data_dir: workspaces.DataDir
    clock: FrozenClock
    register: Callable[[str], str]

    def inbox(self, text: str, mailbox: str = MAILBOX) -> tuple[str, InMemoryProvider]:
        """A workspace registered from context ``text`` and an in-memory ``mailbox``."""
        return self.register(text), InMemoryProvider(mailbox)

    async def cycle(
        self,
        workspace_id: str,
        *mailboxes: MailProvider,
        holder: str | None = None,
        from_start: bool = False,
    ) -> intake.RunResult:
        """One intake cycle of ``workspace_id`` over ``mailboxes`` (``from_start``: a replay
        of each whole mailbox)."""
        return await run_intake(
            self.store,
            self.data_dir,
            workspace_id,
            self.clock,
            *mailboxes,
            holder=holder,
            from_start=from_start,
        )


@pytest.fixture
def station(
    station_store: SqliteStore,
    data_dir: workspaces.DataDir,
    clock: FrozenClock,
    register: Callable[[str], str],
) -> Station:
    return Station(station_store, data_dir, clock, register)


def new_maildir(root: Path) -> tuple[Path, mailbox.Maildir]:
    """An empty Maildir created at ``root/Maildir``: its path and a writer for it."""
    path = root / "Maildir"
    return path, mailbox.Maildir(str(path), create=True)


@pytest.fixture
def approvers_world(make_world: Callable[..., World]) -> World:
    """A World whose context has the colleague and a second approver."""
    return make_world(TWO_APPROVERS)
