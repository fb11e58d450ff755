"""Deterministic triage of a claimed item: what the run records, and what the task needs next.

Decisions come from verified evidence and the live Workspace Context: headers the adapter
normalized, the registry and the context. Message wording never decides anything here.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from agent.domain.context import Side, WorkspaceContext
from agent.domain.dispositions import (
    DISPOSITION_FOR_STATE,
    TASK_STATE_FOR,
    Disposition,
    GateKind,
    settle,
)
from agent.domain.envelope import Envelope
from agent.domain.noise import noise_reason
from agent.domain.records import TaskUpdate
from agent.domain.states import TaskState, after_inbound
from agent.domain.task import Gate, NextAction, Task

#: Used while kpis.official is missing. Stored on the task, never in the context's KPIs.
PROVISIONAL_FIRST_RESPONSE_HOURS = "24"


@dataclass(frozen=True)
class Triage:
    disposition: Disposition
    update: TaskUpdate
    detail: str


def work_owner(context: WorkspaceContext) -> str:
    """Who owns the next action on new work: the client manager, else the escalation contact."""
    for contact in context.contacts:
        if contact.side is Side.INTERNAL and "client_manager" in contact.roles:
            return contact.address
    return context.escalation_contact or "unassigned (no escalation_contact in the context)"


def preflight(context: WorkspaceContext, mailbox_id: str) -> str | None:
    """Licence and grant preflight from the context's ``grants``: None when it passes."""
    if context.grants.licence != "active":
        return f"grants.licence is {context.grants.licence!r}, not 'active'"
    if mailbox_id.lower() not in context.grants.mailboxes:
        return f"grants.mailboxes does not include {mailbox_id}"
    return None


def triage(
    context: WorkspaceContext,
    envelope: Envelope,
    task: Task,
    task_created: bool,
    preflight_failure: str | None,
    now: datetime,
) -> Triage:
    owner = work_owner(context)
    escalation_owner = context.escalation_contact or owner
    noise = noise_reason(envelope)
    if noise is not None:
        if task_created:
            return Triage(
                Disposition.NOISE_EXCLUDED,
                TaskUpdate(
                    state=TaskState.COMPLETED,
                    sole_message=envelope.provider_message_id,
                    next_action=NextAction(description="none: automated message", owner=owner),
                ),
                noise,
            )
        # Noise in a live thread (an auto-reply) is recorded but resumes nothing.
        return Triage(Disposition.NOISE_EXCLUDED, TaskUpdate(), noise)

    gates: list[Gate] = []
    provisional: dict[str, str] | None = None
    if task_created:
        state, disposition = TaskState.TASK_RESOLVED, Disposition.QUEUED
        next_action = NextAction(description="classify the request and do the work", owner=owner)
    else:
        # Seen from this claim's snapshot; the report resumes from the state current then.
        state = after_inbound(task.state)
        disposition = DISPOSITION_FOR_STATE[state]
        next_action = NextAction(
            description="read the new message in the thread and continue the work", owner=owner
        )

    if preflight_failure is not None:
        gates.append(
            Gate(
                kind=GateKind.PREFLIGHT, owner=escalation_owner, since=now, reason=preflight_failure
            )
        )
        disposition = Disposition.ESCALATED
        next_action = NextAction(
            description=f"restore the licence/grant ({preflight_failure})", owner=escalation_owner
        )
    elif task_created and (missing := context.missing_for_intake()):
        gates.append(
            Gate(
                kind=GateKind.CONTEXT_GAP,
                owner=escalation_owner,
                since=now,
                reason="missing context: " + ", ".join(missing),
            )
        )
        state, disposition = TaskState.IN_DISCOVERY, Disposition.CONTEXT_GAP_DISCOVERY
        next_action = NextAction(
            description="discover the missing context; continue safe, reversible work",
            owner=escalation_owner,
        )
        if "kpis.official" in missing:
            provisional = {
                "first_response_hours": PROVISIONAL_FIRST_RESPONSE_HOURS,
                "basis": "provisional benchmark while kpis.official is missing; "
                "never an official KPI",
            }
    open_kinds = frozenset(g.kind for g in (*task.open_gates, *gates))
    settled = settle(disposition, open_kinds)
    # A terminal outcome with an open gate is rewritten to its waiting state (seed 000 s.6).
    target = TASK_STATE_FOR[settled] if settled is not disposition else state
    return Triage(
        settled,
        TaskUpdate(
            state=target if task_created else None,
            resume_on_inbound=not task_created,
            add_gates=tuple(gates),
            next_action=next_action,
            provisional_basis=provisional,
        ),
        "; ".join(g.reason for g in gates),
    )
