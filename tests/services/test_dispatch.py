"""The dispatcher's loop on a clock the test drives (every sleep moves the clock, nothing is
waited for): a cycle at each scheduled time across a week with a DST change, none on
Saturday, each occurrence once; a missed occurrence caught up once; a standby that takes the
lease only when it lapses; a shared mailbox scanned under its own lease."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from zoneinfo import ZoneInfo

import anyio
import anyio.lowlevel
import pytest

from agent import events
from agent.domain import schedule
from agent.services.dispatch import CycleOutcome, Dispatcher, Plan, lease_name, scan_lease_name
from agent.services.schedule import Installation
from agent.storage.sqlite import SqliteStore
from agent.testing import FrozenClock

WS = "ws-dispatch-0001"
TZ = "America/New_York"
HERE = Installation(executable="/venv/bin/python", install="/opt/outloop", version="1.0")
REMOTE = "elsewhere/1/4242/1/abcd1234"
"""A holder on another machine: its liveness cannot be seen, only its lease."""
LOCAL = "here/1/1/1/self0002"


class Stop(Exception):
    """Ends a driven loop."""


@pytest.fixture
def store(tmp_path: Path) -> Iterator[SqliteStore]:
    opened = SqliteStore(tmp_path / "store.db")
    yield opened
    opened.close()


def driven(
    store: SqliteStore,
    clock: FrozenClock,
    until: datetime,
    shared: tuple[str, ...] = (),
    holder: str = "here/1/1/1/self0001",
) -> tuple[Dispatcher, list[datetime]]:
    """A dispatcher whose sleeps advance ``clock`` and that stops at ``until``; the cycles it
    ran, by the clock's time when each ran."""
    ran: list[datetime] = []
    expr = schedule.expression(schedule.derive_minute(WS))

    async def cycle() -> CycleOutcome:
        ran.append(clock.now())
        return CycleOutcome(f"run-{len(ran)}", "clean")

    async def sleep(seconds: float) -> None:
        if clock.now() >= until:
            raise Stop
        clock.advance(seconds=max(seconds, 0.001))

    dispatcher = Dispatcher(
        store=store, workspace_id=WS, here=HERE, clock=clock,
        plan=lambda: Plan(expr, TZ, shared), cycle=cycle, sleep=sleep,
        say=lambda _: None, poll=900.0, lease_ttl=timedelta(minutes=30), holder=holder,
    )  # fmt: skip
    return dispatcher, ran


def drive(dispatcher: Dispatcher) -> None:
    async def main() -> None:
        with contextlib.suppress(Stop):
            await dispatcher.run()

    anyio.run(main)


def test_a_week_across_a_dst_change_runs_each_scheduled_cycle_once_and_none_on_saturday(
    store: SqliteStore,
) -> None:
    start = datetime(2026, 10, 29, 0, 0, tzinfo=UTC)  # Thu; New York leaves DST on Sun Nov 1
    clock = FrozenClock(start)
    dispatcher, ran = driven(store, clock, start + timedelta(days=7))
    drive(dispatcher)
    expr = schedule.expression(schedule.derive_minute(WS))
    expected = schedule.runs_between(expr, TZ, start, start + timedelta(days=7))
    assert len(ran) == len(expected) == 42
    for moment, due in zip(ran, expected, strict=True):
        assert due <= moment < due + timedelta(seconds=1)  # at the minute, not a poll later
        assert moment.astimezone(ZoneInfo(TZ)).weekday() != 5
    cycles = store.list_cycles(WS, 100)
    assert sorted(c.scheduled_for for c in cycles) == [d.astimezone(UTC) for d in expected]
    assert all(c.outcome == "clean" and c.finished_at is not None for c in cycles)
    lease = store.get_lease(lease_name(WS))
    assert lease is None  # given up when it stopped


def test_an_occurrence_missed_while_no_dispatcher_ran_is_caught_up_once(
    store: SqliteStore,
) -> None:
    start = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)  # a Tuesday
    clock = FrozenClock(start)
    first, ran = driven(store, clock, start + timedelta(hours=4))
    drive(first)
    assert len(ran) == 2  # 08:mm and 10:mm New York time are 13:mm and 15:mm UTC
    clock.moment = datetime(2026, 12, 1, 21, 0, tzinfo=UTC)  # 16:00 local: 12:mm, 14:mm missed
    second, ran_again = driven(store, clock, clock.now())  # stops at its first sleep
    drive(second)
    assert len(ran_again) == 1  # the latest missed occurrence, once
    [latest, *_] = store.list_cycles(WS)
    assert latest.scheduled_for.astimezone(ZoneInfo(TZ)).hour == 14


def test_a_standby_takes_the_lease_only_when_the_remote_holder_lets_it_lapse(
    store: SqliteStore,
) -> None:
    clock = FrozenClock(datetime(2026, 12, 1, 12, 0, tzinfo=UTC))
    taken = store.take_lease(lease_name(WS), REMOTE, clock.now(), timedelta(seconds=60))
    assert taken is not None
    standby, _ = driven(store, clock, clock.now() + timedelta(seconds=50), holder=LOCAL)
    standby.poll = 10.0
    standby.requested = True  # a cycle wanted: only the lease holder may run it
    said: list[str] = []
    standby.say = said.append
    drive(standby)
    assert said[0].startswith("standby: the lease is held by elsewhere pid 4242")
    assert store.list_cycles(WS) == []
    lease = store.get_lease(lease_name(WS))
    assert lease is not None and lease.holder == REMOTE  # not taken before it lapsed
    drive_until_lapse = clock.now() + timedelta(seconds=30)
    said.clear()
    driven_again, _ = driven(store, clock, drive_until_lapse, holder=LOCAL)
    driven_again.poll, driven_again.requested, driven_again.say = 10.0, True, said.append
    drive(driven_again)
    assert any(line.startswith("active:") for line in said), said
    [cycle] = store.list_cycles(WS)
    assert cycle.holder == LOCAL and cycle.started_at > taken.expires_at


def test_a_cycle_longer_than_the_lease_keeps_its_lease(store: SqliteStore) -> None:
    clock = FrozenClock(datetime(2026, 12, 1, 12, 0, tzinfo=UTC))
    dispatcher, _ = driven(store, clock, clock.now() + timedelta(hours=3), holder=LOCAL)
    refused: list[bool] = []

    async def long_cycle() -> CycleOutcome:
        for _ in range(6):  # two hours, four times the lease
            await anyio.lowlevel.checkpoint()
            clock.advance(minutes=20)
            taken = store.take_lease(lease_name(WS), REMOTE, clock.now(), timedelta(minutes=30))
            refused.append(taken is None)
        return CycleOutcome("run-long", "clean")

    dispatcher.cycle = long_cycle
    dispatcher.requested = True
    drive(dispatcher)
    assert refused == [True] * 6
    assert [c.outcome for c in store.list_cycles(WS)] == ["clean"]


def test_a_shared_mailbox_is_scanned_only_while_its_scan_lease_is_free(
    store: SqliteStore,
) -> None:
    clock = FrozenClock(datetime(2026, 12, 1, 13, 0, tzinfo=UTC))
    mailbox = "imap:shared@fabrikam.test"
    other = "elsewhere/1/7/1/other001"
    assert store.take_lease(scan_lease_name(mailbox), other, clock.now(), timedelta(minutes=5))
    dispatcher, ran = driven(store, clock, clock.now() + timedelta(minutes=20), (mailbox,))
    dispatcher.requested = True
    drive(dispatcher)
    assert ran and ran[0] >= datetime(2026, 12, 1, 13, 5, tzinfo=UTC)  # after the lease lapsed
    assert store.get_lease(scan_lease_name(mailbox)) is None  # released after the cycle


def test_a_dispatcher_whose_lease_is_taken_mid_cycle_stops_it_and_stands_by(
    store: SqliteStore, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger=events.ROOT)
    clock = FrozenClock(datetime(2026, 12, 1, 12, 0, tzinfo=UTC))
    dispatcher, _ = driven(store, clock, clock.now() + timedelta(hours=1), holder=LOCAL)
    said: list[str] = []
    dispatcher.say = said.append
    reached: list[int] = []

    async def cycle_taken_over() -> CycleOutcome:
        # Another machine takes the lease (as if this one had stalled past it).
        store.take_lease(lease_name(WS), REMOTE, clock.now(), timedelta(hours=2), dead=LOCAL)
        for step in range(3):
            await anyio.lowlevel.checkpoint()
            reached.append(step)
        return CycleOutcome("run-x", "clean")

    dispatcher.cycle = cycle_taken_over
    dispatcher.requested = True
    drive(dispatcher)
    assert len(reached) < 3  # stopped at the checkpoint after the renewal failed
    [cycle] = store.list_cycles(WS)
    assert cycle.finished_at is None  # the holder runs it again
    assert any("lost the lease mid-cycle" in line for line in said), said
    assert dispatcher.role is not None and dispatcher.role.value == "stopped"
    leases = [dict(f[1]) for r in caplog.records if (f := events.of(r)) and f[0] == "lease"]
    assert [(r["role"], r["outcome"]) for r in leases] == [
        ("active", "taken"), ("standby", "lost"), ("stopped", "released"),
    ]  # fmt: skip
    assert {r["workspace_id"] for r in leases} == {WS}


def test_a_cycle_that_fails_without_a_message_is_recorded_by_its_kind(
    store: SqliteStore,
) -> None:
    clock = FrozenClock(datetime(2026, 12, 1, 12, 0, tzinfo=UTC))
    dispatcher, _ = driven(store, clock, clock.now(), holder=LOCAL)

    async def failing() -> CycleOutcome:
        raise TimeoutError

    dispatcher.cycle = failing
    dispatcher.requested = True
    drive(dispatcher)
    [cycle] = store.list_cycles(WS)
    assert cycle.outcome == "failed: TimeoutError" and cycle.finished_at is not None


def after_a_requested_cycle(store: SqliteStore) -> tuple[FrozenClock, list[datetime]]:
    """A cycle asked for and run at 12:00:07.25, the clock left there; the cycles it ran."""
    clock = FrozenClock(datetime(2026, 12, 1, 12, 0, 7, 250_000, tzinfo=UTC))
    dispatcher, ran = driven(store, clock, clock.now(), holder=LOCAL)
    dispatcher.requested = True
    drive(dispatcher)
    return clock, ran


def test_a_cycle_asked_for_in_the_second_a_cycle_finished_runs_as_a_cycle_of_its_own(
    store: SqliteStore,
) -> None:
    clock, ran = after_a_requested_cycle(store)
    again, ran_again = driven(store, clock, clock.now(), holder=LOCAL)
    again.requested = True  # mail came meanwhile: the operator asks again, in the same second
    drive(again)
    assert len(ran) == len(ran_again) == 1
    cycles = store.list_cycles(WS)
    assert [c.scheduled_for for c in cycles] == [  # newest first, the second one ms later
        datetime(2026, 12, 1, 12, 0, 7, 1000, tzinfo=UTC),
        datetime(2026, 12, 1, 12, 0, 7, tzinfo=UTC),
    ]
    assert all(c.outcome == "clean" for c in cycles)


def test_a_one_shot_run_in_the_second_a_cycle_finished_runs_a_cycle_of_its_own(
    store: SqliteStore,
) -> None:
    clock, _ = after_a_requested_cycle(store)
    one_shot, ran = driven(store, clock, clock.now(), holder=LOCAL)
    assert anyio.run(one_shot.once)
    assert len(ran) == 1 and len(store.list_cycles(WS)) == 2
