"""Who sees what in the operator console, and what a person decides there, enforced here,
in the core.

A console identity is an address the live context of a registered workspace lists as an
internal contact holding one of its approval roles or the ``operator`` role; a person sees
only the workspaces whose context gives them such a role.

The console is a front end: it shows a task and posts what a signed-in person chose. Every
decision is judged and recorded by the rules the same decision by email meets, whatever the
page sent (a form posted by hand is judged the same way), and each is a task event naming
who, when and from where.
"""

from __future__ import annotations

import secrets

from agent.domain.approval import Decision, judge_console
from agent.domain.context import Side, WorkspaceContext
from agent.domain.errors import ContextError, GateRefused
from agent.domain.records import TaskAmendment
from agent.domain.states import TaskState
from agent.domain.task import NextAction, Task
from agent.ports import Clock, Registry
from agent.services.contexts import registered_context
from agent.services.gate_check import GateReads, load_task
from agent.services.workspaces import load_context

DECIDABLE = (TaskState.WAITING_INTERNAL_APPROVAL, TaskState.APPROVED_TO_SEND)
OPERATOR_ROLE = "operator"


def visible_workspaces(contexts: list[WorkspaceContext], address: str) -> list[str]:
    """The workspaces whose live context lists ``address`` as an internal contact with one
    of its approval roles or the operator role."""
    wanted = address.strip().lower()
    seen: list[str] = []
    for context in contexts:
        roles = {*context.approval.roles, OPERATOR_ROLE}
        for contact in context.contacts:
            if (
                contact.address == wanted
                and contact.side is Side.INTERNAL
                and roles & set(contact.roles)
            ):
                seen.append(context.workspace_id)
                break
    return sorted(seen)


def live_contexts(store: Registry) -> list[WorkspaceContext]:
    """Every registered workspace's live context (one that no longer reads is left out)."""
    found: list[WorkspaceContext] = []
    for row in store.list_workspaces():
        try:
            found.append(registered_context(row))
        except ContextError:
            continue
    return found


def decide(
    store: GateReads,
    task_id: str,
    clock: Clock,
    *,
    approver: str,
    decision: Decision,
    draft_digest: str,
    recipients: tuple[str, ...],
    note: str = "",
    where: str,
) -> Task:
    """Record a person's approval or change request on the task's latest approval request;
    GateRefused (nothing changes) when the rules an emailed decision meets refuse it."""
    task = load_task(store, task_id)
    if task.state not in DECIDABLE or not task.approval_requests:
        raise GateRefused(
            f"task {task_id} is {task.state.value}: there is no approval request waiting on "
            "a decision"
        )
    context = load_context(store, task.workspace_id)
    now = clock.now()
    judged = judge_console(
        context, task.approval_requests[-1], approver=approver, decision=decision,
        draft_digest=draft_digest, recipients=recipients, note=note,
        evidence_id=secrets.token_hex(8), now=now,
    )  # fmt: skip
    if isinstance(judged, str):
        raise GateRefused(judged)
    owner = context.work_owner() or "the workspace operator"
    next_action = NextAction(
        description=(
            f"send the approved draft {judged.draft_id} in the original thread"
            if decision is Decision.APPROVED
            else f"revise draft {judged.draft_id} as the approver asked: {judged.reason}"
        ),
        owner=owner,
    )
    amendment = TaskAmendment(
        event=f"{judged.describe()} (in the console from {where})",
        expect_states=DECIDABLE,
        approval_decision=judged,
        next_action=next_action,
    )
    return store.amend_task(task_id, amendment, now)
