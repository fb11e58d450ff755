"""Fixtures shared by the service tests."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from agent.services import workspaces
from agent.storage.sqlite import SqliteStore
from agent.testing import FrozenClock
from tests.conftest import context_yaml
from tests.services.gates_world import World, with_colleague


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
