"""One mailbox's browser session is driven by one operation at a time: across worker
processes (a lock file) and across the tasks of one process (the MCP server runs each
request as a task), while an operation may go on into another of its own."""

from __future__ import annotations

import stat
from pathlib import Path

import anyio
import pytest

from agent.domain.errors import TransientFailure
from browser_adapters.session import Browsers, BrowserSettings, MailboxBrowser

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def _session(state: Path, timeout: float = 5) -> MailboxBrowser:
    browsers = Browsers(BrowserSettings(state_dir=state, timeout_seconds=timeout))
    return MailboxBrowser(browsers, "ws-1", "ops@fabrikam.test")


async def test_two_tasks_of_one_process_never_drive_one_mailbox_at_once(tmp_path: Path) -> None:
    session = _session(tmp_path / "state")
    inside: list[str] = []
    overlaps: list[tuple[str, ...]] = []
    both_waiting = anyio.Event()
    started: list[str] = []

    async def operation(name: str) -> None:
        started.append(name)
        if len(started) == 2:
            both_waiting.set()
        async with session.driving():
            inside.append(name)
            if len(inside) > 1:
                overlaps.append(tuple(inside))
            await both_waiting.wait()  # the other task has asked by now
            async with session.driving():  # an operation inside its own: not a deadlock
                pass
            inside.remove(name)

    async with anyio.create_task_group() as tasks:
        tasks.start_soon(operation, "send-a")
        tasks.start_soon(operation, "send-b")
    assert overlaps == [] and inside == []


async def test_a_worker_that_cannot_get_the_mailbox_in_time_is_told_to_try_later(
    tmp_path: Path,
) -> None:
    state = tmp_path / "state"
    holder, other = _session(state), _session(state, timeout=0.2)  # two workers' objects
    async with holder.driving():
        with pytest.raises(TransientFailure, match="another worker"):
            async with other.driving():
                pass
    async with other.driving():  # released: the other worker goes on
        pass
    assert stat.S_IMODE(state.stat().st_mode) == 0o700


async def test_the_kept_session_is_written_for_its_owner_alone(tmp_path: Path) -> None:
    session = _session(tmp_path / "state")
    session.keep({"cookies": [], "origins": []})
    assert stat.S_IMODE(session.state_file.stat().st_mode) == 0o600
    session.forget()
    assert not session.state_file.exists()
