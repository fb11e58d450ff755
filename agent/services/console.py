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
from typing import Protocol

from agent.domain.approval import Decision, judge_console
from agent.domain.context import Side, WorkspaceContext
from agent.domain.dispositions import GateKind
from agent.domain.errors import ContextError, GateRefused, InvalidRequest, UnknownSend
from agent.domain.gates import preflight
from agent.domain.records import SendRecord, TaskAmendment
from agent.domain.states import TaskState
from agent.domain.task import NextAction, Task
from agent.ports import Clock, Registry, SendLedger
from agent.services.contexts import registered_context
from agent.services.gate_check import GateReads, load_task
from agent.services.outbound import settle_by_person
from agent.services.workspaces import load_context

DECIDABLE = (TaskState.WAITING_INTERNAL_APPROVAL, TaskState.APPROVED_TO_SEND)
OPERATOR_ROLE = "operator"


def visible_workspaces(contexts: list[WorkspaceContext], address: str) -> list[str]:
    """The workspaces whose live context lists ``address`` as an internal contact with one
    of its approval roles or the operator role."""
    return sorted(
        c.workspace_id for c in contexts if holds(c, address, {*c.approval.roles, OPERATOR_ROLE})
    )


def holds(context: WorkspaceContext, address: str, roles: set[str]) -> bool:
    """Whether the live context lists ``address`` as an internal contact holding one of
    ``roles``."""
    wanted = address.strip().lower()
    return any(
        contact.address == wanted and contact.side is Side.INTERNAL and roles & set(contact.roles)
        for contact in context.contacts
    )


def require_operator(context: WorkspaceContext, address: str, what: str) -> None:
    """GateRefused unless ``address`` holds the operator role in the live context."""
    if not holds(context, address, {OPERATOR_ROLE}):
        raise GateRefused(
            f"{address} does not hold the {OPERATOR_ROLE!r} role in workspace "
            f"{context.workspace_id}'s context: only an operator may {what}"
        )


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


HOLDS = (GateKind.PREFLIGHT,)
"""Gates that hold a task's send until their cause is cleared in the live context."""


def release_hold(store: GateReads, task_id: str, clock: Clock, *, by: str, where: str) -> Task:
    """An operator releases a send the licence/grant preflight held, once the live context
    passes it again: the hold is removed and the task goes on. Refused, changing nothing,
    when the task holds no send, the preflight still fails, or ``by`` is not an operator."""
    task = load_task(store, task_id)
    held = [g for g in task.open_gates if g.kind in HOLDS]
    if not held:
        raise InvalidRequest(f"task {task_id} has no held send (no {HOLDS[0].value} hold)")
    context = load_context(store, task.workspace_id)
    require_operator(context, by, "release a held send")
    failed = preflight(context, task.mailbox_id)
    if failed is not None:
        raise GateRefused(
            f"the hold on task {task_id} is not cleared: the licence/grant preflight still "
            f"fails ({failed}); fix the context's grants and release it again"
        )
    owner = context.work_owner() or "the workspace operator"
    amendment = TaskAmendment(
        event=f"send hold released by {by} (in the console from {where}): the licence/grant "
        f"preflight passes now (held since {held[0].since:%Y-%m-%d %H:%M} UTC)",
        expect_states=(task.state,),
        remove_gate_kinds=HOLDS,
        next_action=NextAction(
            description="go on with the task: its send is no longer held", owner=owner
        ),
    )
    return store.amend_task(task_id, amendment, clock.now())


class SettleStore(Registry, SendLedger, Protocol):
    """What settling a send needs: the live context and the send ledger."""


def settle_send(
    store: SettleStore, key: str, clock: Clock, *, sent: bool, evidence: str, by: str, where: str
) -> SendRecord:
    """An operator's word on a send no channel could settle: the rule of ``outloop sends
    settle`` (evidence required, only an unsettled send), given by an operator of the
    send's workspace and recorded with who and from where."""
    record = store.get_send(key)
    if record is None:
        raise UnknownSend(key)
    require_operator(load_context(store, record.workspace_id), by, "settle a send")
    return settle_by_person(store, key, sent, evidence, f"{by} (console, from {where})", clock)
