"""The send gate and the workflow guards: pure functions over verified evidence.

They read the live Workspace Context, the task record and the facts of one draft, and
return a verdict with every reason. They grant no authority, send nothing, and create no
claim or store of their own; the services that call them do the I/O. Message content never
decides a verdict here: the draft's text is read only to keep another workspace's data out
of it.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Sequence
from enum import StrEnum
from pathlib import PurePosixPath
from urllib.parse import unquote

from pydantic import BaseModel, ConfigDict

from agent.domain.approval import (
    Decision,
    approver_roles,
    current_approval,
    decisions_on,
    standing_covers,
)
from agent.domain.context import ClientSendPolicy, Side, WorkspaceContext
from agent.domain.mail import AttachmentRef
from agent.domain.recipients import (
    Communication,
    OwnerEvidence,
    RecipientPlan,
    build_recipients,
)
from agent.domain.states import TERMINAL_STATES, TaskState
from agent.domain.task import CommunicationState, Task
from agent.domain.untrusted import reader_form, skeleton

#: States in which a standing approval lets a client send go (the draft is ready).
STANDING_STATES: frozenset[TaskState] = frozenset(
    {TaskState.DRAFT_READY, TaskState.APPROVED_TO_SEND}
)


class Blocker(StrEnum):
    NO_RECIPIENTS = "no_recipients"
    RECIPIENT_UNKNOWN = "recipient_unknown"
    RECIPIENT_CONFLICT = "recipient_conflict"
    FOREIGN_RECIPIENT = "foreign_recipient"
    FOREIGN_CONTENT = "foreign_content"
    APPROVAL_MISSING = "approval_missing"
    CHANGES_REQUESTED = "changes_requested"
    SENDS_DISABLED = "sends_disabled"
    TASK_CLOSED = "task_closed"
    WRONG_WORKSPACE = "wrong_workspace"
    PREFLIGHT = "preflight"
    REPLY_NOT_READ_BACK = "reply_not_read_back"


class BlockingReason(BaseModel):
    model_config = ConfigDict(frozen=True)

    blocker: Blocker
    detail: str
    recipient: str | None = None
    owner: str
    """Who can clear it."""


class DraftFacts(BaseModel):
    """The draft a gate is asked about: which draft, its exact content digest, its text."""

    model_config = ConfigDict(frozen=True)

    draft_id: str
    digest: str
    subject: str
    text: str


def draft_digest(
    subject: str, html: str, text: str, attachments: Sequence[AttachmentRef] = ()
) -> str:
    """The digest an approval binds to: any change to the draft, or to a file it attaches,
    makes a new one."""
    digest = hashlib.sha256()
    files = [f"{a.name}\n{a.content_type}\n{a.size}\n{a.sha256}" for a in attachments]
    for part in (subject, html, text, *files):
        data = part.encode("utf-8", "surrogatepass")
        digest.update(len(data).to_bytes(8, "big"))
        digest.update(data)
    return digest.hexdigest()


class ForeignMarkers(BaseModel):
    """What identifies other workspaces' clients: their contacts' addresses and domains
    (minus anything this workspace shares with them)."""

    model_config = ConfigDict(frozen=True)

    addresses: frozenset[str] = frozenset()
    domains: frozenset[str] = frozenset()


def foreign_markers(active: WorkspaceContext, others: Iterable[WorkspaceContext]) -> ForeignMarkers:
    mine = {c.address for c in active.contacts} | {b.mailbox_id for b in active.mailboxes}
    my_domains = {a.rsplit("@", 1)[-1] for a in mine}
    addresses: set[str] = set()
    domains: set[str] = set()
    for other in others:
        if other.workspace_id == active.workspace_id:
            continue
        for contact in other.contacts:
            if contact.side is Side.CLIENT and contact.address not in mine:
                addresses.add(contact.address)
                domain = contact.address.rsplit("@", 1)[-1]
                if domain not in my_domains:
                    domains.add(domain)
    return ForeignMarkers(addresses=frozenset(addresses), domains=frozenset(domains))


_DOTS = str.maketrans(dict.fromkeys("\u3002\uff0e\uff61", "."))
"""The full stops IDNA reads as a domain's dot (UTS #46)."""


def _forms(text: str) -> tuple[str, str]:
    """The text as a reader sees it (``reader_form``, percent-escapes decoded, IDNA dots
    plain), and that again with lookalike letters folded together (``skeleton``)."""
    seen = reader_form(unquote(text)).translate(_DOTS)
    return seen, skeleton(seen)


_ADDRESS = r"(?<![\w.+-]){}(?![\w-])"
_DOMAIN = r"(?<![\w.-])(?:[\w-]+\.)*{}(?![\w-])"
"""A foreign client's domain, or any subdomain of it."""


def _named(marker: str, pattern: str, forms: tuple[str, str]) -> bool:
    wanted = _forms(marker)
    return any(
        re.search(pattern.format(re.escape(m)), f) for m, f in zip(wanted, forms, strict=True)
    )


def foreign_content(text: str, markers: ForeignMarkers) -> tuple[str, ...]:
    """Other workspaces' client identifiers found in a draft (mixed-client isolation), read
    as a reader sees the text: an address split by an invisible character, written in
    fullwidth letters or with a Cyrillic lookalike letter is still that address, and a
    subdomain of a foreign client's domain is that client's."""
    forms = _forms(text)
    found = {a for a in markers.addresses if _named(a, _ADDRESS, forms)}
    found |= {d for d in markers.domains if _named(d, _DOMAIN, forms)}
    return tuple(sorted(found))


class GateResult(BaseModel):
    """Ready, or pending with every blocking reason."""

    model_config = ConfigDict(frozen=True)

    ready: bool
    communication: Communication
    plan: RecipientPlan
    reasons: tuple[BlockingReason, ...] = ()
    approval_basis: str | None = None

    def summary(self) -> str:
        if self.ready:
            return f"ready ({self.communication.value})"
        return "pending: " + "; ".join(r.detail for r in self.reasons)


def task_owner_evidence(task: Task) -> tuple[OwnerEvidence, ...]:
    """Owner evidence the task itself records (used only where the context permits it)."""
    return (
        OwnerEvidence(
            address=task.next_action.owner,
            evidence=f"named owner of task {task.task_id}'s next action",
        ),
    )


def evaluate_send(
    context: WorkspaceContext,
    task: Task,
    draft: DraftFacts,
    *,
    to: Sequence[str],
    cc: Sequence[str] = (),
    foreign: ForeignMarkers | None = None,
    internal_only: bool = False,
) -> GateResult:
    """May this draft go to these recipients now? Every blocking reason is listed.

    An internal send (every recipient verified internal) is never held by the client-send
    policy or by approval: a requester's loop is closed whatever the rollout stage.
    """
    owner = context.work_owner() or "the workspace operator"
    foreign = foreign or ForeignMarkers()
    plan = build_recipients(
        context, to=to, cc=cc, internal_only=internal_only, owner_evidence=task_owner_evidence(task)
    )
    reasons = [
        *_task_blockers(context, task, owner),
        *_recipient_blockers(plan, foreign, owner),
        *_content_blockers(draft, foreign, owner),
    ]
    basis: str | None = None
    if plan.communication is Communication.CLIENT_FACING:
        reasons.extend(_client_send_blockers(context, task, owner))
        basis, unapproved = _client_approval(context, task, draft, plan, owner)
        if unapproved is not None:
            reasons.append(unapproved)
    return GateResult(
        ready=not reasons,
        communication=plan.communication,
        plan=plan,
        reasons=tuple(reasons),
        approval_basis=basis,
    )


def check_recipients(
    context: WorkspaceContext,
    *,
    to: Sequence[str],
    cc: Sequence[str] = (),
    internal_only: bool = False,
    owner_evidence: Sequence[OwnerEvidence] = (),
    others: Iterable[WorkspaceContext] = (),
) -> tuple[RecipientPlan, tuple[BlockingReason, ...]]:
    """The send gate's recipient part alone, over verified evidence: To and Cc built from
    exactly these addresses, each classified, and every reason one blocks the send."""
    owner = context.work_owner() or "the workspace operator"
    plan = build_recipients(
        context, to=to, cc=cc, internal_only=internal_only, owner_evidence=owner_evidence
    )
    foreign = foreign_markers(context, others)
    return plan, tuple(_recipient_blockers(plan, foreign, owner))


def _task_blockers(context: WorkspaceContext, task: Task, owner: str) -> list[BlockingReason]:
    """The task must belong to this workspace, pass the licence/grant preflight, and be open."""
    reasons: list[BlockingReason] = []
    if task.workspace_id != context.workspace_id:
        reasons.append(
            BlockingReason(
                blocker=Blocker.WRONG_WORKSPACE,
                detail=f"task {task.task_id} belongs to workspace {task.workspace_id}, not "
                f"{context.workspace_id}",
                owner=owner,
            )
        )
    if (failed := preflight(context, task.mailbox_id)) is not None:
        reasons.append(
            BlockingReason(
                blocker=Blocker.PREFLIGHT,
                detail=f"licence/grant preflight failed: {failed}; nothing is sent",
                owner=context.escalation_contact or owner,
            )
        )
    if task.state in TERMINAL_STATES:
        reasons.append(
            BlockingReason(
                blocker=Blocker.TASK_CLOSED, detail=f"task {task.task_id} is closed", owner=owner
            )
        )
    return reasons


def _recipient_blockers(
    plan: RecipientPlan, foreign: ForeignMarkers, owner: str
) -> list[BlockingReason]:
    """Someone must be left in To, and every recipient resolved, unconflicted and not another
    workspace's client."""
    reasons: list[BlockingReason] = []
    if not plan.to:
        reasons.append(
            BlockingReason(
                blocker=Blocker.NO_RECIPIENTS,
                detail="no recipient is left in To"
                + (
                    " (" + "; ".join(f"{r.address}: {r.reason}" for r in plan.removed) + ")"
                    if plan.removed
                    else ""
                ),
                owner=owner,
            )
        )
    for recipient in plan.everyone:
        if recipient.conflict is not None:
            reasons.append(
                BlockingReason(
                    blocker=Blocker.RECIPIENT_CONFLICT,
                    detail=f"{recipient.address}: conflicting evidence ({recipient.conflict})",
                    recipient=recipient.address,
                    owner=owner,
                )
            )
        elif not recipient.resolved:
            reasons.append(
                BlockingReason(
                    blocker=Blocker.RECIPIENT_UNKNOWN,
                    detail=f"{recipient.address}: class unresolved ("
                    + "; ".join(recipient.evidence)
                    + "); record the contact's side in the workspace context",
                    recipient=recipient.address,
                    owner=owner,
                )
            )
        if recipient.address in foreign.addresses:
            reasons.append(
                BlockingReason(
                    blocker=Blocker.FOREIGN_RECIPIENT,
                    detail=f"{recipient.address} is another workspace's client contact",
                    recipient=recipient.address,
                    owner=owner,
                )
            )
    return reasons


def _content_blockers(
    draft: DraftFacts, foreign: ForeignMarkers, owner: str
) -> list[BlockingReason]:
    """The draft must not name another workspace's client."""
    leaked = foreign_content(f"{draft.subject}\n{draft.text}", foreign)
    if not leaked:
        return []
    return [
        BlockingReason(
            blocker=Blocker.FOREIGN_CONTENT,
            detail="the draft names another workspace's client: " + ", ".join(leaked),
            owner=owner,
        )
    ]


def _client_send_blockers(
    context: WorkspaceContext, task: Task, owner: str
) -> list[BlockingReason]:
    """A client send waits for the last client reply's read-back, and for the rollout stage
    to allow client sends."""
    reasons: list[BlockingReason] = []
    if task.communication_state is CommunicationState.CLIENT_REPLY_HANDED_OVER:
        reasons.append(
            BlockingReason(
                blocker=Blocker.REPLY_NOT_READ_BACK,
                detail="a client reply of this task went out and is not read back yet; "
                "read_back its send before anything else goes to the client",
                owner=owner,
            )
        )
    if context.client_send_policy is ClientSendPolicy.SENDS_DISABLED:
        reasons.append(
            BlockingReason(
                blocker=Blocker.SENDS_DISABLED,
                detail="client_send_policy is sends_disabled (a rollout stage): client-"
                "facing sends are held; internal work and internal replies continue",
                owner=owner,
            )
        )
    return reasons


def _client_approval(
    context: WorkspaceContext, task: Task, draft: DraftFacts, plan: RecipientPlan, owner: str
) -> tuple[str | None, BlockingReason | None]:
    """The approval a client send goes on (an approval of this exact draft to these
    recipients, or a standing approval), else the reason it is held."""
    approved = current_approval(task.approval_requests, task.approval_decisions, draft.digest)
    if approved is not None and not approver_roles(context, approved.approver):
        approved = None  # authority is read from the live context, at send time too
    standing = standing_covers(context, task.message_class)
    if standing is not None and _changes_requested_for(task, draft.digest):
        standing = None  # an approver's change request outranks a standing approval
    outside = [
        r.address
        for r in plan.everyone
        if not r.internal
        and task.approval_requests
        and r.address not in task.approval_requests[-1].recipients
    ]
    if approved is not None and task.state is TaskState.APPROVED_TO_SEND and not outside:
        return approved.describe(), None
    if standing is not None and task.state in STANDING_STATES:
        return standing, None
    if task.state is TaskState.CHANGES_REQUESTED:
        detail = "an approver asked for changes; revise the draft and request approval again"
        return None, BlockingReason(blocker=Blocker.CHANGES_REQUESTED, detail=detail, owner=owner)
    if approved is not None and outside:
        detail = (
            "the approval covers a send to "
            + ", ".join(task.approval_requests[-1].recipients)
            + ", not to "
            + ", ".join(outside)
            + "; request approval for these recipients"
        )
        return None, BlockingReason(blocker=Blocker.APPROVAL_MISSING, detail=detail, owner=owner)
    detail = (
        f"no approval in force for draft {draft.draft_id} (digest "
        f"{draft.digest[:12]}) from a recorded approver (task is {task.state}), "
        "and no standing approval covers this message class; request internal "
        "approval"
    )
    return None, BlockingReason(blocker=Blocker.APPROVAL_MISSING, detail=detail, owner=owner)


def preflight(context: WorkspaceContext, mailbox_id: str) -> str | None:
    """Licence and grant preflight from the context's ``grants``: None when it passes."""
    if context.grants.licence != "active":
        return f"grants.licence is {context.grants.licence!r}, not 'active'"
    if mailbox_id.lower() not in context.grants.mailboxes:
        return f"grants.mailboxes does not include {mailbox_id}"
    return None


def _changes_requested_for(task: Task, digest: str) -> bool:
    return any(
        d.decision is Decision.CHANGES_REQUESTED
        for request in task.approval_requests
        if request.draft_digest == digest
        for d in decisions_on(request, task.approval_decisions)
    )


# -- request closure --------------------------------------------------------------------------


def release_guard(task: Task, closing: bool) -> str | None:
    """Why the occurrence may not be released yet (None: it may)."""
    return requester_guard(task.requester, task.requester_loop_closed, closing)


def requester_guard(requester: str | None, loop_closed: bool, closing: bool) -> str | None:
    """A verified internal requester's loop is closed before release, for partial results
    too: an internal result or status reply must have been sent first."""
    if requester is not None and not loop_closed and closing:
        return (
            f"the internal requester {requester} has not had a result or status reply; "
            "send it (what is complete, what remains) before releasing the occurrence"
        )
    return None


# -- attachments ------------------------------------------------------------------------------


def unaccepted_attachments(context: WorkspaceContext, names: Iterable[str]) -> tuple[str, ...]:
    """Attachments whose format the context does not accept (empty when it lists none)."""
    accepted = set(context.attachments.accepted)
    if not accepted:
        return ()
    refused: list[str] = []
    for name in names:
        suffix = PurePosixPath(name.replace("\\", "/")).suffix.lower().lstrip(".")
        if suffix not in accepted:
            refused.append(name)
    return tuple(refused)


def clarification_request(
    context: WorkspaceContext, names: Sequence[str], refused: Sequence[str]
) -> str:
    """What to ask the sender. The attachments are named by their position in the message,
    never by their names: a name is untrusted text and must not become an instruction."""
    positions = [str(i) for i, name in enumerate(names, start=1) if name in set(refused)]
    which = "attachment " if len(positions) == 1 else "attachments "
    return (
        "ask the sender for "
        + which
        + ", ".join(positions)
        + f" (of {len(names)}) again in an accepted format ("
        + ", ".join(context.attachments.accepted)
        + ")"
    )
