"""What an operator's monitoring reads of the station: per workspace, its open tasks by
state, the sends waiting to be settled, its last clean run against its schedule, the sign-in
challenges a person must resolve and its dispatchers; and the problems among them, each
named with what clears it. ``outloop health`` prints it, ``/metrics`` exports it as gauges."""

from __future__ import annotations

from collections import Counter
from datetime import datetime, timedelta
from typing import Protocol

from pydantic import BaseModel, ConfigDict

from agent.domain import schedule
from agent.domain.errors import OutloopError, StoreError
from agent.domain.records import SendState
from agent.domain.run import RunRow
from agent.domain.task import QueueEntry
from agent.ports import Dispatch, Health, Registry, RunLedger, SendLedger, TaskBoard
from agent.services import challenges
from agent.services.workspaces import load_context

UNSETTLED = (SendState.UNCERTAIN, SendState.WITH_PERSON)
"""Sends that may or may not have gone out: nothing more goes out until they are settled."""
MISSED_SLOTS = 2
"""A workspace with this many scheduled runs missed since its last clean run is a problem."""
GRACE = timedelta(minutes=15)
"""How long a scheduled run has to end clean before its slot counts as missed."""
LOOKBACK = timedelta(days=30)
"""How far back slots are counted (a count of missed runs, not a history)."""


class StatusStore(Registry, RunLedger, SendLedger, Health, Dispatch, TaskBoard, Protocol):
    """What the status reads."""


class DispatcherSeen(BaseModel):
    model_config = ConfigDict(frozen=True)

    holder: str
    role: str
    seen_at: datetime


class WorkspaceStatus(BaseModel):
    model_config = ConfigDict(frozen=True)

    workspace_id: str
    open_tasks: dict[str, int]
    """Non-terminal tasks by state."""
    unsettled_sends: dict[str, int]
    """UNCERTAIN and WITH_PERSON sends (a person settles a WITH_PERSON one)."""
    last_run_at: datetime | None
    last_clean_run_at: datetime | None
    missed_runs: int | None
    """Scheduled runs since the last clean run (or since registration) that ended no clean
    run within ``GRACE``; None without a recorded schedule. Counted up to ``LOOKBACK``."""
    unresolved_challenges: int
    dispatchers: list[DispatcherSeen]
    problems: list[str]


def missed(expression: str, timezone: str, since: datetime, now: datetime) -> int:
    """Scheduled runs after ``since`` whose slot is more than ``GRACE`` ago."""
    start = max(since, now - LOOKBACK)
    return len(schedule.runs_between(expression, timezone, start, now - GRACE))


def of_workspace(store: StatusStore, workspace_id: str, now: datetime) -> WorkspaceStatus:
    """One workspace's status now, with its problems."""
    row = store.get_workspace(workspace_id)
    runs = store.recent_runs(workspace_id, 50)
    reconciled = [r for r in runs if r.summary is not None]
    clean = [r for r in reconciled if r.summary is not None and r.summary.clean]
    missed_runs = None
    if row is not None and row.schedule_expression:
        timezone = load_context(store, workspace_id).schedule_timezone
        since = _reconciled_at(clean) or row.registered_at
        missed_runs = missed(row.schedule_expression, timezone, since, now)
    sends = Counter(s.state.name for s in store.list_sends(workspace_id) if s.state in UNSETTLED)
    waiting = [c for c in challenges.listed(store, workspace_id) if c.open]
    status = WorkspaceStatus(
        workspace_id=workspace_id,
        open_tasks=_by_state(store.list_queue_entries(workspace_id)),
        unsettled_sends=dict(sends),
        last_run_at=_reconciled_at(reconciled),
        last_clean_run_at=_reconciled_at(clean),
        missed_runs=missed_runs,
        unresolved_challenges=len(waiting),
        dispatchers=[
            DispatcherSeen(holder=d.holder, role=d.role, seen_at=d.seen_at)
            for d in store.list_dispatchers(workspace_id)
        ],
        problems=[],
    )
    return status.model_copy(update={"problems": problems(status, waiting)})


def _reconciled_at(runs: list[RunRow]) -> datetime | None:
    summary = runs[0].summary if runs else None
    return summary.reconciled_at if summary is not None else None


def _by_state(entries: list[QueueEntry]) -> dict[str, int]:
    return dict(Counter(e.state.value for e in entries))


def problems(status: WorkspaceStatus, waiting: list[challenges.Challenge]) -> list[str]:
    """What is wrong with the workspace, each with what clears it."""
    found: list[str] = []
    ws = status.workspace_id
    if status.missed_runs is not None and status.missed_runs >= MISSED_SLOTS:
        since = status.last_clean_run_at
        when = "never" if since is None else f"last at {since:%Y-%m-%d %H:%M} UTC"
        found.append(
            f"workspace {ws}: no clean run in {status.missed_runs} scheduled slots ({when}): "
            f"check that 'outloop dispatch --workspace {ws}' runs, and the latest run's "
            "reconciliation (the console's Runs page, or 'outloop run' prints it)"
        )
    for state, count in sorted(status.unsettled_sends.items()):
        found.append(
            f"workspace {ws}: {count} send(s) {state}, nothing more goes to their recipients "
            f"until settled: see 'outloop sends list --workspace {ws} --unsettled' and settle with "
            "'outloop sends settle KEY --sent|--not-sent --evidence ...'"
        )
    for challenge in waiting:
        if challenge.open:
            found.append(
                f"workspace {ws}: AUTH_CHALLENGE_UNRESOLVED on {challenge.mailbox_id} "
                f"({challenge.channel}, {challenge.challenge}) since "
                f"{challenge.met_at:%Y-%m-%d %H:%M} UTC: {challenge.action}; then acknowledge "
                f"it in the console or run 'outloop login --workspace {ws} --mailbox "
                f"{challenge.mailbox_id}'"
            )
    return found


def of_station(store: StatusStore, now: datetime) -> list[WorkspaceStatus]:
    """Every registered workspace's status; one whose context cannot be read says so (a
    store that does not answer raises ``StoreError``)."""
    found: list[WorkspaceStatus] = []
    for row in store.list_workspaces():
        try:
            found.append(of_workspace(store, row.workspace_id, now))
        except StoreError:
            raise
        except OutloopError as exc:
            found.append(_unreadable(row.workspace_id, exc))
    return found


def _unreadable(workspace_id: str, exc: OutloopError) -> WorkspaceStatus:
    return WorkspaceStatus(
        workspace_id=workspace_id, open_tasks={}, unsettled_sends={}, last_run_at=None,
        last_clean_run_at=None, missed_runs=None, unresolved_challenges=0, dispatchers=[],
        problems=[f"workspace {workspace_id}: its status cannot be read: {exc}"],
    )  # fmt: skip
