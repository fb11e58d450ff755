"""gate_check: may this draft go to these recipients now? Read-only.

The service gathers the evidence (the task record, the live Workspace Context, the other
registered workspaces' client identifiers for mixed-client isolation) and asks the pure
gate in agent.domain.gates. Nothing the caller says about classes or approval is evidence.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from agent.domain.context import WorkspaceContext
from agent.domain.errors import ContextError, UnknownTask
from agent.domain.gates import (
    DraftFacts,
    ForeignMarkers,
    GateResult,
    evaluate_send,
    foreign_markers,
)
from agent.domain.task import Task
from agent.events import Event, codes, emit
from agent.ports import Registry, Tasks
from agent.services.workspaces import load_context, registered_context


class GateReads(Registry, Tasks, Protocol):
    """What the gate reads: the task, its live context and the other workspaces."""


def other_workspaces(store: Registry, active: WorkspaceContext) -> ForeignMarkers:
    others: list[WorkspaceContext] = []
    for row in store.list_workspaces():
        if row.workspace_id == active.workspace_id:
            continue
        try:
            others.append(registered_context(row))
        except ContextError:
            continue  # an unreadable registration has no contacts to leak
    return foreign_markers(active, others)


def load_task(store: Tasks, task_id: str) -> Task:
    task = store.get_task(task_id)
    if task is None:
        raise UnknownTask(task_id)
    return task


def check_send(
    store: GateReads,
    task_id: str,
    draft: DraftFacts,
    *,
    to: Sequence[str],
    cc: Sequence[str] = (),
    internal_only: bool = False,
    record: bool = True,
) -> GateResult:
    """The send gate's verdict on ``draft`` to these recipients, on the live context; a
    decision record unless ``record`` is False (a page that only shows it)."""
    task = load_task(store, task_id)
    context = load_context(store, task.workspace_id)  # the live context, never the caller's
    result = evaluate_send(
        context,
        task,
        draft,
        to=to,
        cc=cc,
        foreign=other_workspaces(store, context),
        internal_only=internal_only,
    )
    if not record:
        return result
    emit(
        Event.GATE,
        workspace_id=task.workspace_id,
        task_id=task_id,
        verdict="ready" if result.ready else "pending",
        outcome=result.communication.value,
        blockers=codes({r.blocker.value for r in result.reasons}),
    )
    return result
