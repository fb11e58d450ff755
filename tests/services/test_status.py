"""The station's status as monitoring reads it: scheduled runs missed since the last clean
run are counted on the workspace's own schedule (nights and Saturdays it does not run are
not missed), with a grace for a run under way; a workspace whose context cannot be read says
so without hiding the others."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta

from agent.services import status
from agent.storage.sqlite import SqliteStore
from agent.testing import FrozenClock
from agent.testing.contexts import context_yaml

EXPR = "17 8,10,12,14,16,18,20 * * 0-5"  # every two hours, 08-20, Sunday to Friday
TZ = "Asia/Jerusalem"  # UTC+2 in December


def at(day: int, hour: int, minute: int = 0) -> datetime:
    """A moment of December 2026 in local time (UTC+2), as UTC."""
    return datetime(2026, 12, day, hour, minute, tzinfo=UTC) - timedelta(hours=2)


def test_nights_and_saturdays_without_runs_miss_no_slot() -> None:
    monday_last = at(7, 20, 30)  # Monday 20:17 ran clean at 20:30
    assert status.missed(EXPR, TZ, monday_last, at(8, 1, 0)) == 0  # Tuesday 01:00
    assert status.missed(EXPR, TZ, monday_last, at(8, 8, 20)) == 0  # 08:17, within the grace
    assert status.missed(EXPR, TZ, monday_last, at(8, 8, 40)) == 1  # 08:17 ended no clean run
    friday_last = at(11, 20, 30)
    assert status.missed(EXPR, TZ, friday_last, at(12, 12, 0)) == 0  # Saturday noon
    assert status.missed(EXPR, TZ, friday_last, at(13, 10, 40)) == 2  # Sunday 08:17 and 10:17


def test_a_workspace_past_two_missed_slots_is_a_problem_saying_what_to_check(
    station_store: SqliteStore, register: Callable[[str], str], clock: FrozenClock
) -> None:
    ws = register(context_yaml("ws-status-01"))
    registered = station_store.get_workspace(ws)
    assert registered is not None and registered.schedule_expression
    found = status.of_workspace(station_store, ws, clock.now() + timedelta(minutes=1))
    assert (found.missed_runs, found.problems) == (0, [])
    later = clock.now() + timedelta(days=3)
    found = status.of_workspace(station_store, ws, later)
    assert found.missed_runs is not None and found.missed_runs >= 2
    [problem] = found.problems
    assert problem.startswith(f"workspace {ws}: no clean run in {found.missed_runs} scheduled")
    assert "(never)" in problem and f"outloop dispatch --workspace {ws}" in problem


def test_a_workspace_whose_context_cannot_be_read_is_named_and_the_others_still_read(
    station_store: SqliteStore, register: Callable[[str], str], clock: FrozenClock
) -> None:
    good = register(context_yaml("ws-status-02"))
    broken = register(context_yaml("ws-status-03"))
    station_store._conn.execute(  # pyright: ignore[reportPrivateUsage]
        "UPDATE workspaces SET context_text = 'not: [a context' WHERE workspace_id = ?", (broken,)
    )
    found = {s.workspace_id: s for s in status.of_station(station_store, clock.now())}
    assert found[good].problems == []
    [problem] = found[broken].problems
    assert problem.startswith(f"workspace {broken}: its status cannot be read: ")
