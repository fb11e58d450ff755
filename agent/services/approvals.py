"""request_approval: draft_for_internal_approval, the default client-send policy.

The rendered draft goes to the workspace's recorded approvers as an internal message linked
to the task; the task waits in WAITING_INTERNAL_APPROVAL. An approver's reply in that
thread is an inbound item like any other: intake links it to the task by its In-Reply-To,
and the server judges it (approver role, same task and draft, explicit wording).
"""

from __future__ import annotations

import html
from datetime import datetime

from agent.domain.approval import (
    ApprovalDecision,
    ApprovalRequest,
    Decision,
    approvers,
    judge_reply,
    request_answered,
    standing_covers,
    strictest,
    subject_words,
)
from agent.domain.automation import SendKind
from agent.domain.context import WorkspaceContext
from agent.domain.dispositions import GateKind
from agent.domain.envelope import Envelope
from agent.domain.errors import GateRefused, InvalidRequest, RegistryError
from agent.domain.gates import preflight
from agent.domain.recipients import build_recipients
from agent.domain.records import TaskAmendment
from agent.domain.states import TaskState
from agent.domain.task import CommunicationState, Gate, NextAction, Task
from agent.domain.untrusted import flag
from agent.ports import Clock, Drafts, MailProvider, Tasks
from agent.rendering.render import RenderedMessage
from agent.rendering.text import html_risk, visible_text
from agent.services.drafts import digest_of, keep_draft, load_draft
from agent.services.gate_check import GateReads, load_task
from agent.services.outbound import (
    SendOutcome,
    outgoing,
    raise_unless_settled,
    send_once,
    sent_ref,
)
from agent.services.replies import ReplyStore
from agent.services.workspaces import load_context


def request_subject(task: Task) -> str:
    return f"Approval needed: {flag(task.title).shown}"


def _shown_flags(task: Task) -> tuple[str, ...]:
    """The flags an approval request shows beside the task's title (kept on the request)."""
    return (*flag(task.title).flags, *task.content_flags)


def _request_text(task: Task, draft: RenderedMessage, to: str, shown_flags: tuple[str, ...]) -> str:
    title = flag(task.title)
    flags = "".join(f"\n⚠ {f}" for f in shown_flags)
    return (
        f"Approval needed for task {task.task_id}: {title.shown}{flags}\n"
        f"The draft below is ready to go to {to}. Reply 'Approved' to approve exactly this "
        "draft, or say what to change. Nothing is sent to the client before that.\n\n"
        f"Subject: {flag(draft.subject).shown}\n{_files(draft)}\n{draft.text}"
    )


def _files(draft: RenderedMessage) -> str:
    """The files the draft attaches, as the approver is shown them (name and size)."""
    return "".join(
        f"Attachment: {flag(a.name).shown} ({a.size} bytes, sha256 {a.sha256[:12]})\n"
        for a in draft.attachments
    )


def _request_html(task: Task, draft: RenderedMessage, to: str) -> str:
    note = (
        '<div dir="ltr" lang="en" style="text-align:left;border-bottom:1px solid #ccc;'
        'padding-bottom:8px;margin-bottom:8px">'
        f"<p>Approval needed for task {html.escape(task.task_id)}: "
        f"{html.escape(flag(task.title).shown)}</p>"
        f"<p>The draft below is ready to go to {html.escape(to)}. Reply 'Approved' to approve "
        "exactly this draft, or say what to change.</p>"
        f"<p>Subject: {html.escape(flag(draft.subject).shown)}</p>"
        + "".join(f"<p>{html.escape(line)}</p>" for line in _files(draft).splitlines())
        + "</div>"
    )
    lowered = draft.html.lower()
    at = lowered.find("<body")
    if at >= 0:
        end = draft.html.find(">", at) + 1
        return draft.html[:end] + note + draft.html[end:]
    return note + draft.html


async def request_approval(
    store: ReplyStore,
    provider: MailProvider,
    task_id: str,
    draft_id: str,
    draft: RenderedMessage,
    client_recipients: tuple[str, ...],
    clock: Clock,
) -> ApprovalRequest:
    """Send the draft to the recorded approvers and move the task to
    WAITING_INTERNAL_APPROVAL. The task must be DRAFT_READY."""
    task = load_task(store, task_id)
    context: WorkspaceContext = load_context(store, task.workspace_id)
    _require_requestable(context, task, task_id)
    clients = _named_clients(client_recipients)
    to, cc = _approver_addresses(context)
    digest = digest_of(draft)
    keep_draft(store, task, draft_id, draft, clock)  # a reply's quotes are read against it
    key = _request_key(task, task_id, draft_id, digest, clients)
    shown_to = ", ".join(clients)
    intent, message = outgoing(
        key=key,
        kind=SendKind.APPROVAL_REQUEST,
        workspace_id=task.workspace_id,
        task_id=task_id,
        mailbox_id=task.mailbox_id,
        to=to,
        cc=cc,
        subject=request_subject(task),
        text=_request_text(task, draft, shown_to, _shown_flags(task)),
        html=_request_html(task, draft, shown_to),
    )
    outcome = await send_once(store, provider, intent, message, clock)
    raise_unless_settled(outcome, "the approval request")
    now = clock.now()
    request = ApprovalRequest(
        draft_id=draft_id,
        draft_digest=digest,
        # The id the request went out with: the approver's reply answers that one (a channel
        # that cannot set ours, a web app, sends it under the provider's).
        internet_message_id=outcome.message_id,
        provider_thread_id=outcome.result.provider_thread_id if outcome.result else "",
        approvers=to,
        sent_at=outcome.record.sent_at or now,
        recipients=clients,
        shown_flags=_shown_flags(task),
    )
    _record_request(store, task, task_id, request, key, outcome, now)
    return request


def _require_requestable(context: WorkspaceContext, task: Task, task_id: str) -> None:
    """Approval is requested for a task in DRAFT_READY whose licence/grant preflight passes."""
    if task.state is not TaskState.DRAFT_READY:
        raise GateRefused(
            f"task {task_id} is {task.state}; approval is requested for a task in DRAFT_READY "
            "(transition it there once the draft is ready)"
        )
    if (failed := preflight(context, task.mailbox_id)) is not None:
        raise GateRefused(f"licence/grant preflight failed: {failed}; nothing is sent")


def _named_clients(client_recipients: tuple[str, ...]) -> tuple[str, ...]:
    """The client recipients the approval covers, normalized; at least one is named."""
    clients = tuple(dict.fromkeys(a.strip().lower() for a in client_recipients if a.strip()))
    if not clients:
        raise GateRefused(
            "name the client recipients the draft is for: an approval covers a send to "
            "exactly those recipients"
        )
    return clients


def _approver_addresses(context: WorkspaceContext) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The request's To and Cc: verified internal contacts holding an approval role."""
    plan = build_recipients(context, to=approvers(context), internal_only=True)
    if not plan.to:
        raise GateRefused(
            "no verified internal contact holds an approval role ("
            + ", ".join(context.approval.roles)
            + "); record one in the workspace context"
        )
    return plan.addresses()


def _request_key(
    task: Task, task_id: str, draft_id: str, digest: str, clients: tuple[str, ...]
) -> str:
    """The request's send key. Each request is its own message (asking again for the same
    draft after changes were requested is a new request); a retry of the same call finds the
    same key."""
    return f"approval|{task_id}|{len(task.approval_requests) + 1}|{draft_id}|{digest}|" + ",".join(
        sorted(clients)
    )


def _record_request(
    store: Tasks,
    task: Task,
    task_id: str,
    request: ApprovalRequest,
    key: str,
    outcome: SendOutcome,
    now: datetime,
) -> None:
    """The task waits in WAITING_INTERNAL_APPROVAL behind an approval gate, recording the
    request and its sent message."""
    owners = ", ".join(request.approvers)
    store.amend_task(
        task_id,
        TaskAmendment(
            event=f"approval requested: {key}",
            expect_states=(TaskState.DRAFT_READY,),
            state=TaskState.WAITING_INTERNAL_APPROVAL,
            add_gates=(
                Gate(
                    kind=GateKind.INTERNAL_APPROVAL,
                    owner=owners,
                    since=now,
                    reason=f"draft {request.draft_id} awaits approval by a recorded approver",
                ),
            ),
            approval_request=request,
            communication_state=CommunicationState.DRAFT_AWAITING_APPROVAL,
            next_action=NextAction(
                description=f"approve or request changes to draft {request.draft_id}",
                owner=owners,
            ),
            sent_message=sent_ref(outcome, "approval_request", task.mailbox_id, now),
        ),
        now,
    )


async def reply_parts(provider: MailProvider, body_ref: str) -> tuple[tuple[str, ...], str | None]:
    """The reply's words as the sender wrote them - the plain-text part and the visible text
    of the HTML part - and why the HTML cannot be read safely (None when it can)."""
    body = await provider.fetch_body(body_ref)
    texts = [body.text] if body.text.strip() else []
    risk: str | None = None
    if body.html:
        risk = html_risk(body.html)
        texts.append(visible_text(body.html))
    return tuple(texts) or ("",), risk


async def reply_text(provider: MailProvider, body_ref: str) -> tuple[str, ...]:
    """The reply's words: the plain-text part and the visible text of the HTML part."""
    texts, _ = await reply_parts(provider, body_ref)
    return texts


def _request_as_sent(store: Drafts, task: Task, request: ApprovalRequest) -> str:
    """The approval request's words as it was sent (its text and the visible text of its
    HTML), built again from the draft it carried: quoted history in a reply is compared with
    them. Empty when the draft is gone, so nothing quoted can be taken for the request."""
    try:
        _, draft = load_draft(store, task.task_id, request.draft_id)
    except (RegistryError, GateRefused):
        return ""
    to = ", ".join(request.recipients)
    text = _request_text(task, draft, to, request.shown_flags)
    return text + "\n" + visible_text(_request_html(task, draft, to))


def _in_approval_thread(task: Task, envelope: Envelope) -> bool:
    """The message answers something in one of the task's approval threads: a request, or a
    reply to one."""
    thread = {r.internet_message_id for r in task.approval_requests} | {
        d.evidence_message_id for d in task.approval_decisions
    }
    linked = {*envelope.references, *((envelope.in_reply_to,) if envelope.in_reply_to else ())}
    return bool(thread & linked)


async def judge_inbound(
    store: Drafts,
    context: WorkspaceContext,
    task: Task,
    envelope: Envelope,
    provider: MailProvider,
    clock: Clock,
) -> ApprovalDecision | None:
    """The decision an inbound message carries about the task's approval; None when it is
    not part of an approval thread.

    Only a reply whose In-Reply-To is the request itself can approve. Any other message of
    an approval thread can still withdraw or suspend the approval (a change request or a
    reservation counts; an approval there does not), so a retraction never fails open.
    """
    request = request_answered(task.approval_requests, envelope.in_reply_to)
    exact = request is not None
    if request is None:
        if not task.approval_requests or not _in_approval_thread(task, envelope):
            return None
        request = task.approval_requests[-1]
    texts, risk = await reply_parts(provider, envelope.body_ref)
    sent = _request_as_sent(store, task, request)
    asked = request_subject(task)
    verdicts = [
        judge_reply(
            context,
            request,
            sender=envelope.sender.address,
            message_id=envelope.internet_message_id or envelope.provider_message_id,
            received_at=envelope.received_at,
            body=text,
            now=clock.now(),
            sent=sent,
            subject_words=subject_words(envelope.subject, asked),
        )
        for text in texts
    ]
    decision = strictest([v.decision for v in verdicts])
    reasons = "; ".join(dict.fromkeys(v.reason for v in verdicts))
    if risk is not None and decision is Decision.APPROVED:
        decision, reasons = Decision.HELD, f"the HTML part cannot be read safely: {risk}"
    if not exact and decision is Decision.APPROVED:
        decision = Decision.NONE
        reasons = "an approval counts only as a direct reply to the approval request"
    return verdicts[0].model_copy(update={"decision": decision, "reason": reasons})


def _bare_id(message_id: str) -> str:
    return message_id.strip().strip("<>").strip().lower()


def record_approval(
    store: GateReads,
    task_id: str,
    clock: Clock,
    *,
    message_id: str | None = None,
    standing_class: str | None = None,
) -> tuple[Task, str]:
    """Record what approval evidence establishes, judged by the server; returns the task
    and what was found.

    ``message_id`` names an approver's reply in the task's approval thread. Intake judges
    every such reply when it takes it in (approver role from the live context, the same task
    and draft, explicit wording), so the decision is looked up on the task: a message that
    is not there - not yet taken in, or another task's - approves nothing.
    ``standing_class`` names a standing approval of the live context; it covers a task whose
    message class the server recorded as exactly that class (never a class the caller
    declares), and moves it from DRAFT_READY to APPROVED_TO_SEND.
    """
    if (message_id is None) == (standing_class is None):
        raise InvalidRequest(
            "give exactly one piece of evidence: the Message-ID of an approver's reply, or the "
            "message class of a standing approval"
        )
    task = load_task(store, task_id)
    if message_id is not None:
        return task, _recorded_decision(task, task_id, message_id)
    assert standing_class is not None
    context = load_context(store, task.workspace_id)
    basis = _standing_basis(context, task, task_id, standing_class)
    task = store.amend_task(
        task_id,
        TaskAmendment(
            event=f"approved to send: {basis}",
            expect_states=(TaskState.DRAFT_READY,),
            state=TaskState.APPROVED_TO_SEND,
        ),
        clock.now(),
    )
    return task, basis


def _recorded_decision(task: Task, task_id: str, message_id: str) -> str:
    """What intake decided about this approver's reply, as recorded on the task."""
    wanted = _bare_id(message_id)
    found = [d for d in task.approval_decisions if _bare_id(d.evidence_message_id) == wanted]
    if not found:
        raise GateRefused(
            f"no approver's reply {message_id} is recorded on task {task_id}. A reply counts "
            "only once intake has taken it in (call intake, then claim its item) and only "
            "in this task's own approval thread; the server judges it, not the caller"
        )
    return found[-1].describe()


def _standing_basis(
    context: WorkspaceContext, task: Task, task_id: str, standing_class: str
) -> str:
    """The standing approval that covers the task: recorded in the context for the message
    class the server gave the task, on a DRAFT_READY task no approver asked changes on."""
    basis = standing_covers(context, standing_class)
    if basis is None:
        raise GateRefused(
            f"the workspace context records no standing approval for message class "
            f"{standing_class!r}; request internal approval instead"
        )
    if task.message_class != standing_class:
        raise GateRefused(
            f"task {task_id} is not of message class {standing_class!r} in the server's "
            f"records (it is {task.message_class or 'unclassified'}); a caller cannot declare "
            "a class that a standing approval covers: request internal approval instead"
        )
    if task.state is not TaskState.DRAFT_READY:
        raise GateRefused(
            f"task {task_id} is {task.state}; a standing approval applies to a task in "
            "DRAFT_READY (render the draft and transition the task there first)"
        )
    if any(d.decision is Decision.CHANGES_REQUESTED for d in task.approval_decisions):
        raise GateRefused(
            "an approver asked for changes on this task; a standing approval does not "
            "override that: request internal approval for the revised draft"
        )
    return basis
