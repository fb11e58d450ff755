"""What an operator's monitoring reads of the station: per workspace, its open tasks by
state, the sends waiting to be settled, its last clean run against its schedule, the sign-in
challenges a person must resolve and its dispatchers; and the problems among them, each
named with what clears it. ``outloop health`` prints it, ``/metrics`` exports it as gauges."""

from __future__ import annotations

from collections import Counter
from datetime import datetime
from typing import Protocol

from pydantic import BaseModel, ConfigDict

from agent.domain import schedule
from agent.domain.records import SendState
from agent.domain.run import RunRow
from agent.domain.task import QueueEntry
from agent.ports import Dispatch, Health, Registry, RunLedger, SendLedger, TaskBoard
from agent.services import challenges
from agent.services.workspaces import load_context

UNSETTLED = (SendState.UNCERTAIN, SendState.WITH_PERSON)
"""Sends that may or may not have gone out: nothing more goes out until they are settled."""
MISSED_SLOTS = 2
"""A workspace with no clean run for this many scheduled slots is a problem."""


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
    schedule_interval_seconds: float | None
    """The spacing of the workspace's next two scheduled runs (None: no schedule)."""
    unresolved_challenges: int
    dispatchers: list[DispatcherSeen]
    problems: list[str]


def interval(expression: str, timezone: str, now: datetime) -> float:
    """The seconds between the schedule's next two runs."""
    first, second = schedule.next_runs(expression, timezone, now, 2)
    return (second - first).total_seconds()


def of_workspace(store: StatusStore, workspace_id: str, now: datetime) -> WorkspaceStatus:
    """One workspace's status now, with its problems."""
    row = store.get_workspace(workspace_id)
    every = None
    if row is not None and row.schedule_expression:
        timezone = load_context(store, workspace_id).schedule_timezone
        every = interval(row.schedule_expression, timezone, now)
    runs = store.recent_runs(workspace_id, 50)
    reconciled = [r for r in runs if r.summary is not None]
    clean = [r for r in reconciled if r.summary is not None and r.summary.clean]
    sends = Counter(s.state.name for s in store.list_sends(workspace_id) if s.state in UNSETTLED)
    waiting = [c for c in challenges.listed(store, workspace_id) if c.open]
    status = WorkspaceStatus(
        workspace_id=workspace_id,
        open_tasks=_by_state(store.list_queue_entries(workspace_id)),
        unsettled_sends=dict(sends),
        last_run_at=_reconciled_at(reconciled),
        last_clean_run_at=_reconciled_at(clean),
        schedule_interval_seconds=every,
        unresolved_challenges=len(waiting),
        dispatchers=[
            DispatcherSeen(holder=d.holder, role=d.role, seen_at=d.seen_at)
            for d in store.list_dispatchers(workspace_id)
        ],
        problems=[],
    )
    return status.model_copy(update={"problems": problems(status, waiting, now)})


def _reconciled_at(runs: list[RunRow]) -> datetime | None:
    summary = runs[0].summary if runs else None
    return summary.reconciled_at if summary is not None else None


def _by_state(entries: list[QueueEntry]) -> dict[str, int]:
    return dict(Counter(e.state.value for e in entries))


def problems(
    status: WorkspaceStatus, waiting: list[challenges.Challenge], now: datetime
) -> list[str]:
    """What is wrong with the workspace, each with what clears it."""
    found: list[str] = []
    ws = status.workspace_id
    every = status.schedule_interval_seconds
    if every is not None:
        since = status.last_clean_run_at
        if since is None or (now - since).total_seconds() > MISSED_SLOTS * every:
            when = "never" if since is None else f"last at {since:%Y-%m-%d %H:%M} UTC"
            found.append(
                f"workspace {ws}: no clean run in {MISSED_SLOTS} scheduled slots ({when}; "
                f"runs every {every:.0f} s): check 'outloop dispatch --workspace {ws}' runs, "
                "and the latest run's reconciliation ('outloop run' prints it)"
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
    """Every registered workspace's status."""
    return [of_workspace(store, row.workspace_id, now) for row in store.list_workspaces()]
