"""Deterministic triage of a claimed item: what the run records, and what the task needs next.

Decisions come from verified evidence and the live Workspace Context: headers the adapter
normalized, the registry, the context and the task record. Message wording decides nothing
here, with one bounded exception: an approver's reply in the task's own approval thread is
read for an explicit approval or change request (agent.domain.approval), and that reading
only counts because the sender holds a recorded approval role.

docs/gates.md has the routing table; each row is a test in tests/services/test_routing.py.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from datetime import datetime

from agent.domain import gates
from agent.domain.approval import ApprovalDecision, Decision
from agent.domain.automation import SendKind
from agent.domain.context import WorkspaceContext
from agent.domain.dispositions import (
    DISPOSITION_FOR_STATE,
    TASK_STATE_FOR,
    Disposition,
    GateKind,
    settle,
)
from agent.domain.envelope import Envelope
from agent.domain.gates import clarification_request, unaccepted_attachments
from agent.domain.noise import Noise, NoiseKind, noise
from agent.domain.recipients import (
    Classified,
    RecipientClass,
    classify_recipient,
    own_addresses,
)
from agent.domain.records import TaskUpdate
from agent.domain.states import TaskState, after_inbound
from agent.domain.task import Gate, NextAction, Task
from agent.domain.untrusted import flag

#: Used while kpis.official is missing. Stored on the task, never in the context's KPIs.
PROVISIONAL_FIRST_RESPONSE_HOURS = "24"


@dataclass(frozen=True)
class Triage:
    disposition: Disposition
    update: TaskUpdate
    detail: str


def work_owner(context: WorkspaceContext) -> str:
    """Who owns the next action on new work: the client manager, else the escalation contact."""
    return context.work_owner() or "unassigned (no escalation_contact in the context)"


def preflight(context: WorkspaceContext, mailbox_id: str) -> str | None:
    """Licence and grant preflight (the pure check lives with the gates)."""
    return gates.preflight(context, mailbox_id)


def display_facts(envelope: Envelope) -> tuple[str, tuple[str, ...], tuple[str, ...]]:
    """The sender's display name and the attachment names as they may be shown, and the
    flags of everything untrusted that could mislead a reader."""
    flags: list[str] = []
    name = flag(envelope.sender.name)
    flags.extend(f"sender display name: {f}" for f in name.flags)
    subject = flag(envelope.subject)
    flags.extend(f"subject: {f}" for f in subject.flags if "line breaks" not in f)
    names: list[str] = []
    for raw in envelope.attachment_names:
        shown = flag(raw)
        names.append(shown.shown)
        flags.extend(f"attachment {shown.shown}: {f}" for f in shown.flags)
    return name.shown, tuple(names), tuple(dict.fromkeys(flags))


def _new_work(
    context: WorkspaceContext, envelope: Envelope, owner: str
) -> tuple[TaskState, Disposition, NextAction, list[Gate], str]:
    """Routing of a new thread once noise, preflight and conflicts are ruled out."""
    refused = unaccepted_attachments(context, envelope.attachment_names)
    if refused:
        ask = clarification_request(context, envelope.attachment_names, refused)
        return (
            TaskState.TASK_RESOLVED,
            Disposition.QUEUED,
            NextAction(description=ask, owner=owner),
            [],
            f"clarification needed: {ask}",
        )
    return (
        TaskState.TASK_RESOLVED,
        Disposition.QUEUED,
        NextAction(description="classify the request and do the work", owner=owner),
        [],
        "",
    )


@dataclass
class _Route:
    """Where triage sends an item, before the gates that hold it are added."""

    state: TaskState
    disposition: Disposition
    next_action: NextAction | None
    gates: list[Gate] = field(default_factory=list[Gate])
    detail: str = ""
    joins_only: bool = False
    """The message joins its thread and resumes nothing (a colleague's note to a task that
    waits on the client)."""
    provisional: dict[str, str] | None = None


def triage(
    context: WorkspaceContext,
    envelope: Envelope,
    task: Task,
    task_created: bool,
    preflight_failure: str | None,
    now: datetime,
    approval: ApprovalDecision | None = None,
) -> Triage:
    """What the run records for a claimed item: noise first, then the route, then the gates
    that hold it, settled against the task's open gates."""
    owner = work_owner(context)
    escalation_owner = context.escalation_contact or owner
    sender = classify_recipient(context, envelope.sender.address)
    shown = _shown(envelope, sender)
    found = noise(
        envelope,
        own_addresses=frozenset(own_addresses(context)),
        known_sender=sender.recipient_class is not RecipientClass.UNKNOWN,
    )
    excluded = _noise_verdict(found, envelope, task_created, owner, now, shown)
    if excluded is not None:
        return excluded
    internal = sender.internal and not sender.flags
    if found is not None:
        route = _unclear_noise(found, owner, now)
    elif approval is not None:
        verdict = _approval_reply(context, task, approval, owner, shown)
        return _held_by_preflight(verdict, preflight_failure, escalation_owner, now)
    else:
        closed = None
        if preflight_failure is None:
            closed = _closed_without_work(
                context, envelope, task, task_created, sender, owner, shown
            )
        if closed is not None:
            return closed
        route = _work_route(context, envelope, task, task_created, internal, owner)
    _hold_for_sender_conflict(route, sender, escalation_owner, now)
    _hold_for_preflight_or_owner(
        route, context, task_created, preflight_failure, escalation_owner, now
    )
    if task_created and preflight_failure is None:
        _hold_for_context_gaps(route, context, escalation_owner, now)
    # A new request from a verified internal contact opens the requester loop; the same
    # requester writing again in the thread reopens it.
    requester = (
        sender.address if internal and (task_created or task.requester == sender.address) else None
    )
    return _settled(route, task, task_created, requester, shown)


def _shown(envelope: Envelope, sender: Classified) -> TaskUpdate:
    """The display facts the run records, with the flags of everything untrusted in them."""
    name, attachment_names, flags = display_facts(envelope)
    flags = (*flags, *(f"sender address: {f}" for f in sender.flags))
    return TaskUpdate(sender_name=name, attachment_names=attachment_names, content_flags=flags)


def _noise_verdict(
    found: Noise | None,
    envelope: Envelope,
    task_created: bool,
    owner: str,
    now: datetime,
    shown: TaskUpdate,
) -> Triage | None:
    """A bounce in a live thread is escalated; clear noise is excluded; anything else is not
    settled by noise alone."""
    if found is not None and found.kind is NoiseKind.DELIVERY_REPORT and not task_created:
        # A bounce linked to its thread through the original Message-ID: the thread's
        # message did not arrive, and a person must know.
        gate = Gate(
            kind=GateKind.ESCALATION,
            owner=owner,
            since=now,
            reason=f"{found.reason}: a message of this task was not delivered",
        )
        return Triage(
            Disposition.ESCALATED,
            shown.model_copy(
                update={
                    "add_gates": (gate,),
                    "next_action": NextAction(
                        description="check the failed delivery and reach the recipient another way",
                        owner=owner,
                    ),
                }
            ),
            gate.reason,
        )
    if found is None or not found.clear:
        return None
    if task_created:
        return Triage(
            Disposition.NOISE_EXCLUDED,
            shown.model_copy(
                update={
                    "state": TaskState.COMPLETED,
                    "sole_message": envelope.provider_message_id,
                    "next_action": NextAction(description="none: automated message", owner=owner),
                }
            ),
            found.reason,
        )
    # Noise in a live thread (an out-of-office reply) joins it and resumes nothing.
    return Triage(Disposition.NOISE_EXCLUDED, shown, found.reason)


def _unclear_noise(found: Noise, owner: str, now: datetime) -> _Route:
    """The noise signal is there but not clear (list mail from a known contact): a human looks."""
    return _Route(
        state=TaskState.TASK_RESOLVED,
        disposition=Disposition.AWAITING_ASSIGNMENT,
        next_action=NextAction(description=f"decide: {found.reason}", owner=owner),
        gates=[Gate(kind=GateKind.ASSIGNMENT, owner=owner, since=now, reason=found.reason)],
        detail=found.reason,
    )


def _closed_without_work(
    context: WorkspaceContext,
    envelope: Envelope,
    task: Task,
    task_created: bool,
    sender: Classified,
    owner: str,
    shown: TaskUpdate,
) -> Triage | None:
    """A message the thread already answered, or an internal FYI, needs no work."""
    if not task_created and _answered_after(task, envelope):
        return Triage(
            Disposition.ALREADY_ANSWERED,
            shown,
            "the thread already had a reply sent after this message",
        )
    if task_created and _internal_fyi(context, envelope, sender.internal):
        return Triage(
            Disposition.CLOSED_NO_REPLY_NEEDED,
            shown.model_copy(
                update={
                    "state": TaskState.COMPLETED,
                    "sole_message": envelope.provider_message_id,
                    "next_action": NextAction(
                        description="none: internal FYI (mailbox only in Cc)", owner=owner
                    ),
                }
            ),
            "internal FYI: the workspace mailbox is only in Cc of an internal sender's message",
        )
    return None


def _work_route(
    context: WorkspaceContext,
    envelope: Envelope,
    task: Task,
    task_created: bool,
    internal: bool,
    owner: str,
) -> _Route:
    """New work is routed as new work; a message in a live thread moves its task on."""
    if task_created:
        state, disposition, next_action, gates, detail = _new_work(context, envelope, owner)
        return _Route(state, disposition, next_action, gates, detail)
    if internal and task.state is TaskState.WAITING_CLIENT:
        # A colleague's note (a reply to a reminder, say) joins the thread; only the client
        # resumes a task that waits on the client.
        return _Route(task.state, Disposition.WAITING_CLIENT, None, joins_only=True)
    # Seen from this claim's snapshot; the report resumes from the state current then.
    state = after_inbound(task.state)
    return _Route(
        state,
        DISPOSITION_FOR_STATE[state],
        NextAction(
            description="read the new message in the thread and continue the work", owner=owner
        ),
    )


def _hold_for_sender_conflict(route: _Route, sender: Classified, owner: str, now: datetime) -> None:
    """A sender whose evidence conflicts is escalated."""
    if sender.conflict is None:
        return
    route.gates.append(
        Gate(
            kind=GateKind.ESCALATION,
            owner=owner,
            since=now,
            reason=f"sender {sender.address}: {sender.conflict}",
        )
    )
    route.disposition = Disposition.ESCALATED


def _hold_for_preflight_or_owner(
    route: _Route,
    context: WorkspaceContext,
    task_created: bool,
    preflight_failure: str | None,
    escalation_owner: str,
    now: datetime,
) -> None:
    """A failed preflight escalates the item; else new work with no owner waits for assignment."""
    if preflight_failure is not None:
        gate, route.next_action = _preflight_hold(preflight_failure, escalation_owner, now)
        route.gates.append(gate)
        route.disposition = Disposition.ESCALATED
    elif task_created and context.work_owner() is None:
        route.gates.append(
            Gate(
                kind=GateKind.ASSIGNMENT,
                owner=context.unresolved_queue or "unresolved queue",
                since=now,
                reason="the context names no client_manager and no escalation_contact",
            )
        )
        if route.disposition is Disposition.QUEUED:
            route.disposition = Disposition.AWAITING_ASSIGNMENT


def _hold_for_context_gaps(
    route: _Route, context: WorkspaceContext, owner: str, now: datetime
) -> None:
    """New work on a context that misses what intake needs goes into discovery, measured
    against a provisional benchmark while the official KPIs are missing."""
    missing = context.missing_for_intake()
    if not missing:
        return
    route.gates.append(
        Gate(
            kind=GateKind.CONTEXT_GAP,
            owner=owner,
            since=now,
            reason="missing context: " + ", ".join(missing),
        )
    )
    route.state = TaskState.IN_DISCOVERY
    if route.disposition is Disposition.QUEUED:
        route.disposition = Disposition.CONTEXT_GAP_DISCOVERY
        route.next_action = NextAction(
            description="discover the missing context; continue safe, reversible work",
            owner=owner,
        )
    if "kpis.official" in missing:
        route.provisional = {
            "first_response_hours": PROVISIONAL_FIRST_RESPONSE_HOURS,
            "basis": "provisional benchmark while kpis.official is missing; never an official KPI",
        }


def _settled(
    route: _Route, task: Task, task_created: bool, requester: str | None, shown: TaskUpdate
) -> Triage:
    """The route settled against every open gate, with the reasons that hold it."""
    open_kinds = frozenset(g.kind for g in (*task.open_gates, *route.gates))
    settled = settle(route.disposition, open_kinds)
    # A terminal outcome with an open gate is rewritten to its waiting state (seed 000 s.6).
    target = TASK_STATE_FOR[settled] if settled is not route.disposition else route.state
    reasons = [g.reason for g in route.gates]
    if route.detail and route.detail not in reasons:
        reasons.insert(0, route.detail)
    return Triage(
        settled,
        shown.model_copy(
            update={
                "state": target if task_created else None,
                "resume_on_inbound": not task_created and not route.joins_only,
                "add_gates": tuple(route.gates),
                "next_action": route.next_action,
                "provisional_basis": route.provisional,
                "requester": requester,
            }
        ),
        "; ".join(reasons),
    )


def _preflight_hold(failure: str, owner: str, now: datetime) -> tuple[Gate, NextAction]:
    """The gate and next action a failed licence/grant preflight puts on an item."""
    gate = Gate(kind=GateKind.PREFLIGHT, owner=owner, since=now, reason=failure)
    return gate, NextAction(description=f"restore the licence/grant ({failure})", owner=owner)


def _held_by_preflight(verdict: Triage, failure: str | None, owner: str, now: datetime) -> Triage:
    """A verdict with the failed licence/grant preflight gating it: every item that is not
    automated noise is escalated while the preflight fails, whatever else it is."""
    if failure is None:
        return verdict
    gate, action = _preflight_hold(failure, owner, now)
    update = verdict.update.model_copy(
        update={"add_gates": (*verdict.update.add_gates, gate), "next_action": action}
    )
    detail = f"{verdict.detail}; {failure}"
    return replace(verdict, disposition=Disposition.ESCALATED, update=update, detail=detail)


def _approval_reply(
    context: WorkspaceContext,
    task: Task,
    approval: ApprovalDecision,
    owner: str,
    shown: TaskUpdate,
) -> Triage:
    """An approver's reply in the task's approval thread: it updates the approval state and
    gets its own disposition, never a new task."""
    waiting = task.state is TaskState.WAITING_INTERNAL_APPROVAL
    latest = task.approval_requests[-1].internet_message_id if task.approval_requests else None
    current = waiting and approval.request_message_id == latest
    if approval.decision is Decision.APPROVED and current:
        disposition = Disposition.QUEUED
        action = NextAction(
            description=f"send the approved draft {approval.draft_id} in the original thread",
            owner=owner,
        )
    elif approval.decision is Decision.CHANGES_REQUESTED and current:
        disposition = Disposition.QUEUED
        action = NextAction(
            description=f"revise draft {approval.draft_id} as the approver asked", owner=owner
        )
    else:
        disposition = (
            Disposition.WAITING_INTERNAL_APPROVAL
            if task.state is TaskState.WAITING_INTERNAL_APPROVAL
            else DISPOSITION_FOR_STATE[task.state]
        )
        action = None
    why = approval.describe()
    if not current and approval.decision is not Decision.NONE:
        why += " (not the task's current approval request: recorded, changes nothing)"
    return Triage(
        disposition,
        shown.model_copy(update={"approval_decision": approval, "next_action": action}),
        why,
    )


_REPLIES = frozenset({SendKind.CLIENT_REPLY.value, SendKind.INTERNAL_REPLY.value})
"""The directions of the sent messages that answer a thread (an acknowledgement does not)."""


def _answered_after(task: Task, envelope: Envelope) -> bool:
    """The thread has a reply the workspace sent after this message was received."""
    return any(
        m.direction in _REPLIES and m.received_at > envelope.received_at for m in task.messages
    )


def _internal_fyi(context: WorkspaceContext, envelope: Envelope, internal_sender: bool) -> bool:
    mine = own_addresses(context)
    to = {a.address for a in envelope.to}
    cc = {a.address for a in envelope.cc}
    return internal_sender and not (to & mine) and bool(cc & mine)
