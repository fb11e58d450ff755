"""The workspace schedule: ``<mm> 8,10,12,14,16,18,20 * * 0-5`` in the workspace timezone.

Seven runs per active day, Sunday to Friday, every two hours from 08:00 through 20:00. Only the
minute is the workspace's own: derived from its immutable id over minutes 1-59 (never zero,
never random), moved to the next free minute only when another registered workspace holds
it and a free one exists, chosen once at registration and recorded with its derivation.

Next runs and the day numbering are read with croniter, the scheduler's own reading of the
expression (0 and 7 are Sunday, 6 is Saturday), never by hand.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator, Mapping
from datetime import datetime, timedelta
from zoneinfo import ZoneInfo

from croniter import croniter
from pydantic import BaseModel, ConfigDict

HOURS = (8, 10, 12, 14, 16, 18, 20)
DAYS = "0-5"
MINUTES = range(1, 60)
"""The minutes a workspace may run at: never zero."""
SATURDAY = 6
DERIVATION = "sha256(workspace_id), first 8 bytes big-endian, mod 59, plus 1"


class Collision(BaseModel):
    """A minute the derivation passed over: another registered workspace held it."""

    model_config = ConfigDict(frozen=True)

    minute: int
    held_by: str


class MinuteChoice(BaseModel):
    """The workspace's minute and how it was chosen."""

    model_config = ConfigDict(frozen=True)

    minute: int
    derived: int
    collisions: tuple[Collision, ...] = ()
    shared_with: str | None = None
    """Every minute was held: the derived minute is shared with this workspace."""

    @property
    def expression(self) -> str:
        return expression(self.minute)

    def described(self) -> str:
        """One sentence an operator can check by hand."""
        text = f"derived {self.derived} ({DERIVATION})"
        if self.collisions:
            held = ", ".join(f"{c.minute} held by {c.held_by}" for c in self.collisions)
            text += f"; {held}; the next free minute is {self.minute}"
        if self.shared_with is not None:
            text += f"; every minute 1-59 was held: it shares {self.minute} with {self.shared_with}"
        return text


def derive_minute(workspace_id: str) -> int:
    """The workspace's own minute, 1-59: the same for the same id on every install."""
    digest = hashlib.sha256(workspace_id.encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") % len(MINUTES) + MINUTES.start


def _walk(start: int) -> Iterator[int]:
    """Minutes from ``start`` upwards, wrapping from 59 to 1, each once."""
    for step in range(len(MINUTES)):
        yield (start - MINUTES.start + step) % len(MINUTES) + MINUTES.start


def choose_minute(workspace_id: str, held: Mapping[int, str]) -> MinuteChoice:
    """The derived minute, or the next free one when other workspaces hold it; when all 59
    are held, the derived minute shared (deterministically) with its holder."""
    derived = derive_minute(workspace_id)
    collisions: list[Collision] = []
    for minute in _walk(derived):
        holder = held.get(minute)
        if holder is None or holder == workspace_id:
            return MinuteChoice(minute=minute, derived=derived, collisions=tuple(collisions))
        collisions.append(Collision(minute=minute, held_by=holder))
    return MinuteChoice(minute=derived, derived=derived, shared_with=held[derived])


def rerun(workspace_id: str, recorded: MinuteChoice) -> MinuteChoice:
    """The derivation run again against the recorded collisions (what verify compares)."""
    held = {c.minute: c.held_by for c in recorded.collisions}
    if recorded.shared_with is not None:
        held = {minute: recorded.shared_with for minute in MINUTES}
    return choose_minute(workspace_id, held)


def expression(minute: int) -> str:
    if minute not in MINUTES:
        raise ValueError(f"minute {minute} is outside 1-59")
    return f"{minute} {','.join(str(h) for h in HOURS)} * * {DAYS}"


def valid(expr: str) -> bool:
    return bool(croniter.is_valid(expr))


def fields(expr: str) -> list[list[int | str]]:
    """The five fields as the scheduler reads them (``*`` kept as ``'*'``; 7 read as 0)."""
    expanded, _ = croniter.expand(expr)
    return [[*f] for f in expanded][:5]


def saturday_reason(expr: str) -> str | None:
    """Why the expression can run on a Saturday under cron's day numbering, or None."""
    _, _, days_of_month, _, days_of_week = fields(expr)
    if days_of_week == ["*"]:
        return "its day-of-week field is '*' (every day, Saturday included)"
    if SATURDAY in days_of_week:
        return f"its day-of-week field includes {SATURDAY} (Saturday, in cron's numbering)"
    if days_of_month != ["*"]:
        # cron runs on a day matching EITHER field when both are restricted
        return "its day-of-month field is restricted too, and cron runs on either match"
    return None


def next_runs(expr: str, timezone: str, start: datetime, count: int) -> list[datetime]:
    """The next ``count`` runs after ``start``, in local time of ``timezone``."""
    it = croniter(expr, start.astimezone(ZoneInfo(timezone)))
    return [it.get_next(datetime) for _ in range(count)]


def runs_between(expr: str, timezone: str, start: datetime, end: datetime) -> list[datetime]:
    """Every run after ``start`` and up to ``end``, in local time of ``timezone``."""
    it = croniter(expr, start.astimezone(ZoneInfo(timezone)))
    runs: list[datetime] = []
    while True:
        moment: datetime = it.get_next(datetime)
        if moment > end:
            return runs
        runs.append(moment)


def previous_run(expr: str, timezone: str, moment: datetime) -> datetime:
    """The last run at or before ``moment``."""
    it = croniter(expr, (moment + timedelta(seconds=1)).astimezone(ZoneInfo(timezone)))
    found: datetime = it.get_prev(datetime)
    return found
