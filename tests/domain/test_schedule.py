"""The workspace schedule: a minute derived from the immutable workspace id (1-59, stable,
moved only past minutes other workspaces hold), and runs read by croniter, the scheduler's own
reading of the expression: seven per active day in local time across DST changes, none on
Saturday (cron's numbering: 0 and 7 Sunday, 6 Saturday)."""

from __future__ import annotations

from datetime import date, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agent.domain import schedule
from agent.domain.schedule import MINUTES, choose_minute, derive_minute, rerun

IDS = st.from_regex(r"ws-[a-z0-9]{4,20}", fullmatch=True)


@given(IDS)
def test_the_derived_minute_is_never_zero_and_the_same_on_every_install(workspace_id: str) -> None:
    minute = derive_minute(workspace_id)
    assert minute in MINUTES
    assert derive_minute(str(workspace_id)) == minute
    assert choose_minute(workspace_id, {}).minute == minute


def _register_all(ids: list[str]) -> dict[str, schedule.MinuteChoice]:
    held: dict[int, str] = {}
    chosen: dict[str, schedule.MinuteChoice] = {}
    for workspace_id in ids:
        choice = choose_minute(workspace_id, held)
        chosen[workspace_id] = choice
        held.setdefault(choice.minute, workspace_id)
    return chosen


def test_59_workspaces_get_59_distinct_minutes_and_the_60th_shares_deterministically() -> None:
    ids = [f"ws-fleet-{n:03d}" for n in range(60)]
    chosen = _register_all(ids)
    first = [chosen[w].minute for w in ids[:59]]
    assert sorted(first) == list(MINUTES)
    last = chosen[ids[59]]
    assert last.minute == last.derived == derive_minute(ids[59])
    holder = next(w for w in ids[:59] if chosen[w].minute == last.minute)
    assert last.shared_with == holder
    assert _register_all(ids)[ids[59]] == last  # the same again, not random
    for workspace_id in ids:  # every recorded derivation re-runs to its minute
        assert rerun(workspace_id, chosen[workspace_id]).minute == chosen[workspace_id].minute


def test_a_held_minute_moves_to_the_next_free_one_and_records_the_collision() -> None:
    workspace_id = "ws-contoso-1"
    derived = derive_minute(workspace_id)
    following = derived % 59 + 1
    choice = choose_minute(workspace_id, {derived: "ws-a", following: "ws-b"})
    assert choice.minute == following % 59 + 1 and choice.derived == derived
    assert [(c.minute, c.held_by) for c in choice.collisions] == [
        (derived, "ws-a"),
        (following, "ws-b"),
    ]
    assert rerun(workspace_id, choice) == choice
    assert "held by ws-a" in choice.described()


def test_the_expression_changes_only_the_minute() -> None:
    assert schedule.expression(7) == "7 8,10,12,14,16,18,20 * * 0-5"
    with pytest.raises(ValueError, match="outside 1-59"):
        schedule.expression(0)


@pytest.mark.parametrize(
    ("timezone", "dst_change"),
    [
        ("Asia/Jerusalem", date(2026, 3, 27)),  # IST -> IDT, a Friday
        ("Asia/Jerusalem", date(2026, 10, 25)),  # IDT -> IST, a Sunday
        ("America/New_York", date(2026, 3, 8)),  # EST -> EDT, a Sunday
        ("America/New_York", date(2026, 11, 1)),  # EDT -> EST, a Sunday
        ("UTC", date(2026, 3, 29)),  # Europe's change; UTC has none
    ],
)
def test_a_week_across_a_dst_change_has_seven_runs_per_active_day_and_none_on_saturday(
    timezone: str, dst_change: date
) -> None:
    tz = ZoneInfo(timezone)
    start = datetime.combine(dst_change - timedelta(days=3), datetime.min.time(), tz)
    expr = schedule.expression(23)
    runs = schedule.runs_between(expr, timezone, start, start + timedelta(days=7))
    per_day: dict[date, list[datetime]] = {}
    for run in runs:
        assert run.tzinfo is not None
        local = run.astimezone(tz)
        per_day.setdefault(local.date(), []).append(local)
    for offset in range(7):
        day = start.date() + timedelta(days=offset)
        got = per_day.get(day, [])
        if day.weekday() == 5:
            assert got == [], f"{day} is a Saturday"
        else:
            assert [(r.hour, r.minute) for r in got] == [(h, 23) for h in schedule.HOURS], day
    offsets = {r.utcoffset() for r in runs}
    assert len(offsets) == (1 if timezone == "UTC" else 2)  # the change is inside the week


@pytest.mark.parametrize(
    ("expr", "saturday"),
    [
        ("23 8,10,12,14,16,18,20 * * 0-5", False),
        ("23 8,10,12,14,16,18,20 * * 7,1-5", False),  # 7 is Sunday too
        ("23 8,10,12,14,16,18,20 * * sun-fri", False),
        ("23 8,10,12,14,16,18,20 * * 1-6", True),
        ("23 8,10,12,14,16,18,20 * * *", True),
        ("23 8,10,12,14,16,18,20 1 * 0-5", True),  # day-of-month OR day-of-week
    ],
)
def test_saturday_is_read_under_cron_day_numbering(expr: str, saturday: bool) -> None:
    assert (schedule.saturday_reason(expr) is not None) is saturday
