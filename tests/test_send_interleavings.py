"""Exactly once under three interleavings of two live workers (and a slow handover), each
forced step by step: the worker that is handing a send over, and another worker - another
process - that calls ``send_once`` for the same key at the worst moment. Each must leave
one copy in the mailbox.

They reproduce three ways ``agent/services/outbound.py`` and the send ledger send a message
twice today (found while writing tests/test_send_exactly_once.py; see each test), so each is
an expected failure, strictly: the day the core is fixed it passes, and the marker goes.

The channels are the fake's API channel (copies searchable at once, as a Maildir's are, or
within a declared latency); a holder named ``worker-a`` or ``worker-b`` is a live worker
(``holder_alive`` cannot see it die).
"""

from __future__ import annotations

import multiprocessing
import time
from collections.abc import Iterator
from dataclasses import replace
from datetime import timedelta
from multiprocessing.process import BaseProcess
from multiprocessing.synchronize import Event
from pathlib import Path
from typing import Any

import anyio
import pytest

from agent.domain.errors import OutcomeUnknown
from agent.domain.mail import Handover, Marker, OutgoingMessage, SendResult, StoredCopy
from agent.domain.records import SendIntent, SendState
from agent.services import outbound, workspaces
from agent.storage.sqlite import SqliteStore
from agent.testing import API, FileClock, FileMailbox, InMemoryProvider
from agent.testing.contexts import context_yaml

pytestmark = pytest.mark.anyio

WS = "ws-interleavings"
MAILBOX = "support@fabrikam.test"
BOUND = 60.0  # seconds any wait on the other process may take
A, B = "worker-a", "worker-b"


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def _planned(holder: str) -> tuple[SendIntent, OutgoingMessage]:
    intent, message = outbound.outgoing(
        key="note|1",
        kind="internal_note",
        workspace_id=WS,
        task_id=None,
        mailbox_id=MAILBOX,
        to=("dana.levi@contoso.test",),
        subject="Note",
        text="One note, sent once.",
    )
    return intent.model_copy(update={"holder": holder}), message


def _station(root: Path) -> SqliteStore:
    data_dir = workspaces.DataDir(root / "station")
    data_dir.root.mkdir(parents=True, exist_ok=True)
    store = SqliteStore(data_dir.database)
    if store.get_workspace(WS) is None:
        source = root / "context.yaml"
        source.write_text(context_yaml(WS, mailbox=MAILBOX), encoding="utf-8")
        workspaces.add_workspace(store, data_dir, source, FileClock(root / "clock").now())
    return store


class _LosesTheFirstBeforeAcceptance(InMemoryProvider):
    """A channel whose first handover is lost before the mailbox took it, the loss unseen
    (``OutcomeUnknown``, no copy): the copy is then proven absent, and a retry is due."""

    async def send(self, handover: Handover) -> SendResult:
        if not self.state.sent_records() and not getattr(self, "lost_one", False):
            self.lost_one = True
            raise OutcomeUnknown("the connection dropped before the provider answered")
        return await super().send(handover)


class _WaitsForB(InMemoryProvider):
    """Worker A's channel: it tells B that A's attempt is recorded, and hands the message
    over only once B has finished its own call."""

    attempted: Event
    b_done: Event

    async def send(self, handover: Handover) -> SendResult:
        self.attempted.set()
        assert await anyio.to_thread.run_sync(self.b_done.wait, BOUND), "B never finished"
        return await super().send(handover)


class _PausesBeforeTakingOver(SqliteStore):
    """Worker B's store: B decides from the record it read, then waits for A to record its
    attempt before its compare-and-set takes the send over."""

    b_read: Event
    attempted: Event

    def take_over_send(self, *args: Any, **kwargs: Any) -> bool:
        self.b_read.set()
        assert self.attempted.wait(BOUND), "A never attempted"
        return super().take_over_send(*args, **kwargs)


def _worker_b(root: str, pause: bool, b_read: Event, attempted: Event, done: Event) -> None:
    """Worker B, another process: one ``send_once`` of the same key through the API."""

    async def main() -> None:
        path = Path(root)
        clock = FileClock(path / "clock")
        if pause:
            store: SqliteStore = _PausesBeforeTakingOver(path / "station" / "outloop.db")
            store.b_read, store.attempted = b_read, attempted  # type: ignore[attr-defined]
        else:
            store = SqliteStore(path / "station" / "outloop.db")
        state = FileMailbox(path / "mailbox.db", clock=clock)
        box = InMemoryProvider.through(state, API)
        intent, message = _planned(B)
        try:
            await outbound.send_once(store, box, intent, message, clock)
        finally:
            done.set()
            store.close()
            state.close()

    anyio.run(main)


def _until(event: Event, other: BaseProcess) -> None:
    """Wait (bounded) until ``event`` is set; fail at once if the other process died."""
    deadline = time.monotonic() + BOUND
    while not event.wait(0.05):
        assert other.is_alive(), f"the other worker died first (exit code {other.exitcode})"
        assert time.monotonic() < deadline, "the other worker never got there"


class _World:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.store = _station(root)
        self.clock = FileClock(root / "clock")
        self.state = FileMailbox(root / "mailbox.db", MAILBOX, clock=self.clock)
        context = multiprocessing.get_context("spawn")
        self.context = context
        self.b_read, self.attempted, self.b_done = context.Event(), context.Event(), context.Event()

    def start_b(self, *, pause: bool) -> BaseProcess:
        b = self.context.Process(
            target=_worker_b,
            args=(str(self.root), pause, self.b_read, self.attempted, self.b_done),
        )
        b.start()
        return b

    def a_channel(self) -> _WaitsForB:
        box = _WaitsForB.through(self.state, API)
        assert isinstance(box, _WaitsForB)
        box.attempted, box.b_done = self.attempted, self.b_done
        return box

    async def a_loses_its_first_attempt(self) -> None:
        """Worker A's first attempt is lost before acceptance: UNCERTAIN, and no copy."""
        lossy = _LosesTheFirstBeforeAcceptance.through(self.state, API)
        intent, message = _planned(A)
        first = await outbound.send_once(self.store, lossy, intent, message, self.clock)
        assert first.status is outbound.SendStatus.UNCERTAIN

    def copies(self) -> int:
        return len(self.state.sent_records())

    def close(self) -> None:
        self.store.close()
        self.state.close()


@pytest.fixture
def world(tmp_path: Path) -> Iterator[_World]:
    made = _World(tmp_path)
    yield made
    made.close()


async def test_a_live_worker_s_retry_is_not_taken_over_by_a_worker_that_read_it_uncertain(
    world: _World,
) -> None:
    """B reads the send UNCERTAIN under A (so not busy: B may take it over); A, still alive,
    proves the copy absent and records its retry (ATTEMPTING); B's takeover then succeeds all
    the same, B finds no copy (A has not handed it over yet) and, the latency being 0, sends;
    then A hands its own over. The takeover compares the state (and attempt count) B
    decided on, not only the holder."""
    await world.a_loses_its_first_attempt()
    b = world.start_b(pause=True)
    await anyio.to_thread.run_sync(_until, world.b_read, b)
    intent, message = _planned(A)
    await outbound.send_once(world.store, world.a_channel(), intent, message, world.clock)
    b.join(BOUND)
    assert b.exitcode == 0
    assert world.copies() == 1


async def test_a_live_worker_s_retry_long_after_the_send_was_ledgered_is_not_taken_over(
    world: _World,
) -> None:
    """A's first attempt is lost before acceptance; eleven minutes later A proves the copy
    absent and retries (ATTEMPTING, attempted now, ledgered eleven minutes ago). B calls while
    A hands over: A is alive and busy, but not 'young' (now - created_at >= IN_FLIGHT), so B
    takes the send over, finds no copy and sends; then A's handover goes too. So the latency is measured
    the time in flight from the latest attempt (max(created_at, attempted_at)), or restart
    created_at in attempt_send as take_over_send does."""
    await world.a_loses_its_first_attempt()
    world.clock.advance(minutes=11)
    world.b_read.set()  # B does not pause
    box = world.a_channel()
    intent, message = _planned(A)
    b: list[BaseProcess] = []

    async def start_b_when_a_attempts() -> None:
        await anyio.to_thread.run_sync(world.attempted.wait, BOUND)
        b.append(world.start_b(pause=False))

    async with anyio.create_task_group() as group:
        group.start_soon(start_b_when_a_attempts)
        await outbound.send_once(world.store, box, intent, message, world.clock)
    b[0].join(BOUND)
    assert b[0].exitcode == 0
    assert world.copies() == 1


class _SlowHandover(InMemoryProvider):
    """A channel whose handover takes 30 s of the clock before the provider accepts the
    message (bounded retries of a transient failure, a slow link): the copy is kept and shows
    within the declared latency after that acceptance; this answer is lost."""

    async def send(self, handover: Handover) -> SendResult:
        clock = self.state.clock
        assert isinstance(clock, FileClock)
        clock.advance(seconds=30)
        return await super().send(handover)


async def test_a_copy_accepted_late_in_a_slow_handover_is_not_proven_absent_too_early(
    world: _World,
) -> None:
    """The channel declares copies searchable within 60 s of acceptance and shows them 60 s
    late. A's attempt is recorded at T, the provider accepts at T+30 s and the answer is
    lost. At T+61 s the core searches, finds nothing, counts the copy proven absent (61 s
    after the attempt) and sends again - 29 s before the first copy was due. So the latency is measured
    the latency from when the outcome was found lost (the UNCERTAIN transition, which no
    acceptance of that attempt can follow: its worker had returned, or was dead), not from
    attempted_at."""
    view = replace(API, sent_copy_latency=timedelta(seconds=60))
    world.state.delay_sent_copies(timedelta(seconds=60))
    world.state.lose_acks(1)
    box = _SlowHandover.through(world.state, view)
    intent, message = _planned(A)
    lost = await outbound.send_once(world.store, box, intent, message, world.clock)
    assert lost.status is outbound.SendStatus.UNCERTAIN
    world.clock.advance(seconds=31)
    again = await outbound.send_once(world.store, box, intent, message, world.clock)
    assert world.copies() == 1, "sent again before the first copy was due"
    assert again.status is outbound.SendStatus.UNCERTAIN
    world.clock.advance(seconds=30)
    settled = await outbound.send_once(world.store, box, intent, message, world.clock)
    assert settled.status is outbound.SendStatus.RECOVERED
    record = world.store.get_send(intent.key)
    assert record is not None and record.state is SendState.CONFIRMED
    assert world.copies() == 1


class _SlowSearch(InMemoryProvider):
    """A channel whose search reads the mailbox as it was when the search began, and
    answers only after the clock moved on (a long scan of the sent mail while other
    workers play the clock)."""

    async def find_sent(self, marker: Marker) -> StoredCopy | None:
        found = await super().find_sent(marker)
        clock = self.state.clock
        assert isinstance(clock, FileClock)
        clock.advance(seconds=45)
        return found


async def test_a_search_that_began_before_the_copy_was_due_proves_nothing_however_long_it_ran(
    world: _World,
) -> None:
    """Copies are searchable within 60 s. A's answer is lost and the copy shows 60 s late.
    At T+30 s a search begins, sees no copy, and ends at T+75 s: counted from when it
    ended, the copy would be proven absent and sent again - although what the search saw
    was the mailbox at T+30 s. Only a search that began after the latency proves absence."""
    view = replace(API, sent_copy_latency=timedelta(seconds=60))
    world.state.delay_sent_copies(timedelta(seconds=60))
    world.state.lose_acks(1)
    box = _SlowSearch.through(world.state, view)
    intent, message = _planned(A)
    lost = await outbound.send_once(world.store, box, intent, message, world.clock)
    assert lost.status is outbound.SendStatus.UNCERTAIN
    world.clock.advance(seconds=30)
    again = await outbound.send_once(world.store, box, intent, message, world.clock)
    assert again.status is outbound.SendStatus.UNCERTAIN, "proven absent by a search too early"
    assert world.copies() == 1
    settled = await outbound.send_once(world.store, box, intent, message, world.clock)
    assert settled.status is outbound.SendStatus.RECOVERED
    assert world.copies() == 1
