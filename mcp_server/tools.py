"""The lifecycle as MCP tools. Each tool is thin: it validates its typed arguments, calls one
service, and shapes the answer. Gates, approvals and recipients' classes are decided in the
core from the server's own records; nothing a caller asserts is taken as fact."""

from __future__ import annotations

from typing import Annotated, Any, Literal, cast

from mcp.server.mcpserver import Context, Resolve, Sample
from mcp.server.mcpserver.exceptions import ToolError
from mcp.server.mcpserver.tools import Tool
from mcp.types import CreateMessageResult, SamplingMessage, TextContent, ToolAnnotations
from pydantic import ConfigDict, Field

from agent.domain.context import MailboxBinding
from agent.domain.errors import ContextError, ProviderError, RegistryError
from agent.domain.gates import GateResult
from agent.domain.mail import CANONICAL_ORDER, AttachmentData, Channel, MessageBody
from agent.domain.pack import Drift
from agent.domain.records import DraftRecord
from agent.domain.states import TaskState
from agent.domain.task import Task
from agent.domain.untrusted import shown
from agent.ports import Registry
from agent.rendering.render import RenderedMessage
from agent.rendering.text import readable_text
from agent.services import approvals, closure, drafts, intake, learning, replies
from agent.services import attachments as attachments_service
from agent.services.access import AccessRoute, ChannelState, ChannelStatus
from agent.services.gate_check import check_send, load_task
from agent.services.holder import holder_alive
from agent.services.workspaces import load_context, registered_context
from mcp_server.mail import DESCRIPTION as MAIL_DESCRIPTION
from mcp_server.mail import internal_mail_tool
from mcp_server.models import (
    AccessView,
    ApprovalDecisionView,
    ApprovalRequestView,
    ApprovalView,
    AttachmentView,
    BlockingReasonView,
    ChannelAccess,
    CheckView,
    ClaimView,
    DraftView,
    GateCheckView,
    GateView,
    IntakeItem,
    IntakeResult,
    MailboxAccess,
    PackageView,
    ProposalView,
    QueueView,
    ReadBackView,
    RecipientView,
    ReconciliationView,
    SendView,
    TaskView,
    UntrustedMessage,
    UntrustedTaskFields,
    UntrustedText,
    untrusted_text,
)
from mcp_server.runtime import Runtime, mapped_errors

MAX_BODY_CHARS = 20_000
"""The longest message text a claim returns (the rest is marked truncated)."""

Id = Annotated[str, Field(min_length=1, max_length=200, pattern=r"^[^\x00-\x1f\x7f]+$")]
Address = Annotated[str, Field(min_length=3, max_length=320, pattern=r"^[^\s<>,;]+@[^\s<>,;]+$")]
Recipients = Annotated[list[Address], Field(max_length=50)]
NO_NUL = r"^[^\x00]*$"
"""Free text may hold anything a person writes, except NUL (no store keeps it)."""
Evidence = Annotated[str, Field(min_length=1, max_length=2000, pattern=NO_NUL)]

#: The states a host may move a task to. The approval and send states are the server's:
#: request_approval, an approver's reply (judged at intake), a standing approval
#: (record_approval) and send move a task there.
HostState = Literal[
    "TASK_RESOLVED",
    "IN_DISCOVERY",
    "EXECUTING",
    "VERIFYING",
    "DRAFT_READY",
    "WAITING_CLIENT",
    "PARTIALLY_COMPLETED",
    "BLOCKED_RETRY_PENDING",
    "COMPLETED",
]

Outcome = Literal["completed", "partially_completed", "waiting_client", "blocked_retry_pending"]
_OUTCOME_STATE: dict[str, TaskState] = {
    "completed": TaskState.COMPLETED,
    "partially_completed": TaskState.PARTIALLY_COMPLETED,
    "waiting_client": TaskState.WAITING_CLIENT,
    "blocked_retry_pending": TaskState.BLOCKED_RETRY_PENDING,
}


def runtime_of(ctx: Context) -> Runtime:
    return cast(Runtime, ctx.request_context.lifespan_context)


# -- views --------------------------------------------------------------------------------


def _stored_text(shown: str, prefix: str, task: Task) -> UntrustedText:
    """A display field the task keeps in its shown form, with the flags intake recorded."""
    flags = [f.removeprefix(prefix) for f in task.content_flags if f.startswith(prefix)]
    return UntrustedText(text=shown, flags=flags)


def package_view(package: Drift) -> PackageView:
    return PackageView(
        version=package.package_version,
        drift=package.status,
        differences=list(package.differences),
    )


def task_view(task: Task, package: Drift) -> TaskView:
    return TaskView(
        task_id=task.task_id,
        workspace_id=task.workspace_id,
        state=task.state.value,
        state_since=task.state_since,
        communication_state=task.communication_state.value,
        readiness_tier=task.readiness_tier.value,
        received_at=task.received_at,
        client_send_policy=task.client_send_policy,
        open_gates=[
            GateView(kind=g.kind.value, owner=g.owner, reason=shown(g.reason), since=g.since)
            for g in task.open_gates
        ],
        next_action=shown(task.next_action.description),
        next_action_owner=task.next_action.owner,
        remaining_work=task.remaining_work,
        provisional_basis=dict(task.provisional_basis),
        message_class=task.message_class,
        requester=task.requester,
        requester_loop_closed=task.requester_loop_closed,
        approval_requests=[
            ApprovalRequestView(
                draft_id=r.draft_id,
                approvers=list(r.approvers),
                recipients=list(r.recipients),
                request_message_id=r.internet_message_id,
                sent_at=r.sent_at,
            )
            for r in task.approval_requests
        ],
        approval_decisions=[
            ApprovalDecisionView(
                decision=d.decision.value,
                approver=d.approver,
                draft_id=d.draft_id,
                evidence_message_id=d.evidence_message_id,
                reason=shown(d.reason),
                decided_at=d.decided_at,
            )
            for d in task.approval_decisions
        ],
        sent_message_id=task.sent_message_id,
        readback_evidence=task.readback_evidence,
        message_count=len(task.messages),
        package=package_view(package),
        untrusted=UntrustedTaskFields(
            title=untrusted_text(task.title),
            original_subject=untrusted_text(task.original_subject),
            sender=task.sender_identity,
            sender_name=_stored_text(task.sender_name, "sender display name: ", task),
            attachment_names=[
                _stored_text(name, f"attachment {name}: ", task) for name in task.attachment_names
            ],
            content_flags=list(task.content_flags),
        ),
    )


def _gate_view(task_id: str, draft_id: str, gate: GateResult) -> GateCheckView:
    recipients = [
        RecipientView(
            address=r.address,
            field=field,
            recipient_class=r.recipient_class.value,
            resolved=r.resolved,
            evidence=list(r.evidence),
        )
        for field, group in (("to", gate.plan.to), ("cc", gate.plan.cc))
        for r in group
        if field in ("to", "cc")
    ]
    return GateCheckView(
        task_id=task_id,
        draft_id=draft_id,
        ready=gate.ready,
        communication=gate.communication.value,
        approval_basis=gate.approval_basis,
        recipients=recipients,
        removed=[f"{r.address}: {r.reason}" for r in gate.plan.removed],
        reasons=[
            BlockingReasonView(
                blocker=r.blocker.value, detail=r.detail, recipient=r.recipient, owner=r.owner
            )
            for r in gate.reasons
        ],
    )


def _body(body: MessageBody) -> tuple[str, bool]:
    text = readable_text(body.text, body.html)
    return text[:MAX_BODY_CHARS], len(text) > MAX_BODY_CHARS


def _message_view(plan: intake.Planned, body: MessageBody | None = None) -> UntrustedMessage | None:
    envelope = plan.envelope
    if envelope is None:
        return None
    text, truncated = _body(body) if body is not None else ("", False)
    return UntrustedMessage(
        sender=envelope.sender.address,
        sender_name=untrusted_text(envelope.sender.name),
        subject=untrusted_text(envelope.subject),
        received_at=envelope.received_at,
        body_text=text,
        body_truncated=truncated,
        attachment_names=[untrusted_text(n) for n in envelope.attachment_names],
        attachment_refs=list(envelope.attachment_refs),
    )


# -- the tools ----------------------------------------------------------------------------


async def intake_tool(
    mailbox_id: Annotated[
        Address, Field(description="the mailbox to scan, as its context binds it")
    ],
    ctx: Context,
    from_start: Annotated[
        bool,
        Field(
            description="read the whole mailbox again instead of only what arrived since the "
            "last intake (a replay: finished items come back as EXECUTION_ALREADY_DONE)"
        ),
    ] = False,
) -> IntakeResult:
    """Scan one mailbox: read what arrived since the last intake (and any item a stopped
    worker's run left unclaimed), normalize it, resolve its workspace from the registry,
    derive its occurrence key and record it in a new run's ledger. Call this first. It
    claims nothing and creates no task: call claim for each returned item, oldest first,
    then reconcile the run. Refuses a mailbox no registered workspace binds."""
    rt = runtime_of(ctx)
    store = rt.station.store
    wanted = mailbox_id.strip().lower()
    with mapped_errors():
        bound = _workspaces_binding(store, wanted, mailbox_id)
        items: list[IntakeItem] = []
        runs: list[str] = []
        access_errors: list[str] = []
        stale = 0
        for workspace_id in bound:
            run = await intake.scan(
                store=store,
                data_dir=rt.station.data_dir,
                workspace_id=workspace_id,
                provider_for=rt.provider_for,
                clock=rt.clock,
                mailbox_ids=frozenset({wanted}),
                from_start=from_start,
            )
            rt.keep_run(run)
            runs.append(run.run_id)
            access_errors.extend(run.result.access_errors)
            stale += len(run.result.reconciled_stale)
            items.extend(_intake_items(run))
    return IntakeResult(
        mailbox_id=wanted,
        run_id=runs[0],
        run_ids=runs,
        items=items,
        access_errors=access_errors,
        reconciled_stale_runs=stale,
    )


def _workspaces_binding(store: Registry, wanted: str, mailbox_id: str) -> list[str]:
    """The registered workspaces whose context binds the mailbox; at least one."""
    bound: list[str] = []
    for row in store.list_workspaces():
        try:
            context = registered_context(row)
        except ContextError:
            continue  # an unreadable registration binds nothing; its own runs say why
        if any(b.mailbox_id == wanted for b in context.mailboxes):
            bound.append(row.workspace_id)
    if not bound:
        raise RegistryError(
            f"no registered workspace binds mailbox {mailbox_id}; an operator registers it "
            "with 'outloop workspace add --context FILE'"
        )
    return bound


def _intake_items(run: intake.Scan) -> list[IntakeItem]:
    """The run's scanned items as intake returns them, their message untrusted."""
    return [
        IntakeItem(
            run_id=run.run_id,
            item_ref=plan.ref,
            workspace_id=plan.owner,
            escalation_reason=shown(plan.reason),
            untrusted=_message_view(plan),
        )
        for plan in run.planned
    ]


async def claim_tool(
    run_id: Annotated[Id, Field(description="the run_id intake returned")],
    item_ref: Annotated[Id, Field(description="an item_ref of that run")],
    ctx: Context,
) -> ClaimView:
    """Claim one scanned item. Only the winner (outcome CLAIMED) creates or updates the one
    task for the message's thread; the server triages it and records its disposition. The
    result carries the message for the holder to work on, as untrusted data. Another
    worker's claim gives EXECUTION_ALREADY_CLAIMED, a finished occurrence
    EXECUTION_ALREADY_DONE: then do nothing for it. Claiming the same item again returns the
    first answer."""
    rt = runtime_of(ctx)
    async with rt.serialized("run", run_id):
        known = rt.claimed.get((run_id, item_ref))
        if known is not None:
            return await _claimed_again(rt, run_id, item_ref, known)
        failed = rt.failed_claims.get((run_id, item_ref))
        if failed is not None:
            raise ToolError(failed)
        run, index = await _scanned_item(rt, run_id, item_ref)
        with mapped_errors():
            outcome = await intake.claim_item(run, index, rt.clock)
            intake.flush(run, rt.clock)
        if outcome is None:
            failed = (
                f"handling item {item_ref} failed ({run.result.item_errors[-1]}); it stays "
                "unreconciled in this run and a later run takes it over"
            )
            rt.failed_claims[(run_id, item_ref)] = failed
            raise ToolError(failed)
        view = ClaimView(
            run_id=run_id,
            item_ref=item_ref,
            outcome=outcome.claim.value if outcome.claim is not None else None,
            disposition=outcome.disposition.value,
            task_id=outcome.task_id,
            task_created=outcome.task_created,
            detail=shown(outcome.detail),
        )
        # The claim is decided and recorded: a repeat returns this answer whatever follows.
        rt.claimed[(run_id, item_ref)] = view
        if outcome.task_id is None or run.planned[index].envelope is None:
            return view
        return await _with_message(rt, run, index, view)


async def _claimed_again(rt: Runtime, run_id: str, item_ref: str, known: ClaimView) -> ClaimView:
    """A repeated claim returns the first answer, with its message read again if it could not
    be read the first time (while the run is still open here)."""
    if known.message_error is None:
        return known
    run = rt.runs.get(run_id)
    index = run.index_of(item_ref) if run is not None else None
    if run is None or index is None:
        return known
    return await _with_message(rt, run, index, known)


async def _scanned_item(rt: Runtime, run_id: str, item_ref: str) -> tuple[intake.Scan, int]:
    """The open run and the item's place in it. A run another server (or this one before a
    restart) scanned is read from the store: any worker may claim any item of an open run."""
    run = rt.runs.get(run_id)
    if run is None:
        with mapped_errors():
            run = await intake.resume(
                store=rt.station.store,
                data_dir=rt.station.data_dir,
                run_id=run_id,
                provider_for=rt.provider_for,
                clock=rt.clock,
            )
        rt.keep_run(run)
    index = run.index_of(item_ref)
    if index is None:
        raise ToolError(
            f"run {run_id} scanned no item {item_ref!r}; use an item_ref intake returned"
        )
    return run, index


async def _with_message(rt: Runtime, run: intake.Scan, index: int, view: ClaimView) -> ClaimView:
    """The claim with its message read from the provider (or why it cannot be read now: a
    repeat of the claim tries again)."""
    plan = run.planned[index]
    assert plan.envelope is not None
    try:
        body = await run.providers[plan.mailbox.mailbox_id].fetch_body(plan.envelope.body_ref)
    except ProviderError as exc:
        view = view.model_copy(
            update={
                "message": None,
                "message_error": f"the message body could not be read now ({exc}); the claim "
                "stands - call claim again for the same item to retry reading it",
            }
        )
    else:
        view = view.model_copy(update={"message": _message_view(plan, body), "message_error": None})
    rt.claimed[(view.run_id, view.item_ref)] = view
    return view


async def get_task_tool(
    task_id: Annotated[Id, Field(description="the task's id")], ctx: Context
) -> TaskView:
    """The task record: state, open gates with their owners, approval requests and the
    server's verdicts on approvers' replies, what was sent and read back. Subjects, names and
    attachment names are in `untrusted`."""
    with mapped_errors():
        rt = runtime_of(ctx)
        return task_view(load_task(rt.station.store, task_id), rt.package())


async def list_queue_tool(
    workspace_id: Annotated[Id, Field(description="a registered workspace id")], ctx: Context
) -> QueueView:
    """The workspace's non-terminal tasks, oldest received first: the order to work them."""
    station = runtime_of(ctx).station
    with mapped_errors():
        load_context(station.store, workspace_id)
        queue = station.board.list_queue(workspace_id)
        package = runtime_of(ctx).package()
        return QueueView(workspace_id=workspace_id, tasks=[task_view(t, package) for t in queue])


async def transition_task_tool(
    task_id: Id,
    state: Annotated[HostState, Field(description="the state the work has reached")],
    evidence: Annotated[Evidence, Field(description="what shows the task is there")],
    ctx: Context,
) -> TaskView:
    """Move a task along its work: TASK_RESOLVED, IN_DISCOVERY, EXECUTING, VERIFYING,
    DRAFT_READY, WAITING_CLIENT, PARTIALLY_COMPLETED, BLOCKED_RETRY_PENDING or COMPLETED.
    The transition table of the 14 states applies. Approval and send states are the
    server's: request_approval, an approver's reply and send move the task there. Closing
    is refused while a verified internal requester has had no result or status reply, or
    while a gate is open. Moving to the state the task is already in changes nothing."""
    rt = runtime_of(ctx)
    target = TaskState(state)
    async with rt.serialized("task", task_id):
        with mapped_errors():
            task = load_task(rt.station.store, task_id)
            if task.state is target:
                return task_view(task, rt.package())
            released = closure.release(rt.station.board, task_id, target, evidence, rt.clock)
    return task_view(released, rt.package())


async def request_approval_tool(
    task_id: Id,
    draft_id: Annotated[Id, Field(description="a draft_id render returned for this task")],
    ctx: Context,
    to: Annotated[
        Recipients | None,
        Field(description="the client recipients the draft is for (default: the task's sender)"),
    ] = None,
    cc: Annotated[Recipients, Field(description="client Cc recipients")] = [],  # noqa: B006
) -> ApprovalView:
    """Send the rendered draft to the workspace's recorded approvers as an internal email
    linked to the task, and move the task (which must be DRAFT_READY) to
    WAITING_INTERNAL_APPROVAL. The approval will cover exactly this draft to exactly these
    recipients. An approver answers by replying to that email; intake takes the reply in."""
    rt = runtime_of(ctx)
    store = rt.station.store
    async with rt.serialized("task", task_id):
        with mapped_errors():
            task = load_task(store, task_id)
            _, rendered = drafts.load_draft(store, task_id, draft_id)
            clients = (*(to if to is not None else [task.sender_identity]), *cc)
            request = await approvals.request_approval(
                store, rt.provider_for_task(task), task_id, draft_id, rendered, clients, rt.clock
            )
            task = load_task(store, task_id)
    return ApprovalView(
        task_id=task_id,
        draft_id=draft_id,
        request_message_id=request.internet_message_id,
        approvers=list(request.approvers),
        recipients=list(request.recipients),
        finding="approval requested",
        task_state=task.state.value,
    )


async def record_approval_tool(
    task_id: Id,
    ctx: Context,
    reply_message_id: Annotated[
        Id | None,
        Field(description="the Message-ID of an approver's reply in this task's approval thread"),
    ] = None,
    standing_class: Annotated[
        Id | None,
        Field(description="the message class of a standing approval in the workspace context"),
    ] = None,
) -> ApprovalView:
    """Point the server at approval evidence; the server judges it, not the caller. An
    approver's reply counts only as the server judged it when intake took it in (approver
    role from the live context, a direct reply to this task's request, explicit wording);
    this returns that verdict. A standing approval covers a task the server classified in
    exactly its message class (a caller cannot declare the class) and moves it from
    DRAFT_READY to APPROVED_TO_SEND. Anything else is refused."""
    rt = runtime_of(ctx)
    async with rt.serialized("task", task_id):
        with mapped_errors():
            task, finding = approvals.record_approval(
                rt.station.store,
                task_id,
                rt.clock,
                message_id=reply_message_id,
                standing_class=standing_class,
            )
    return ApprovalView(task_id=task_id, finding=shown(finding), task_state=task.state.value)


Language = Annotated[
    str | None,
    Field(pattern=r"^[a-z]{2,3}(-[A-Za-z0-9]{2,8})?$", description="e.g. he or en"),
]
Guidance = Annotated[
    str,
    Field(
        max_length=4000,
        pattern=NO_NUL,
        description="without body_markdown: what the reply must say (facts from your work)",
    ),
]


async def _ask_host_model(
    task_id: str,
    body_markdown: str | None,
    guidance: str,
    language: str | None,
    ctx: Context,
) -> Sample | None:
    """Without a body, ask the host's own model for one through MCP sampling (when the host
    offers it); the email being answered is passed as marked, untrusted data."""
    if body_markdown is not None:
        return None
    capabilities = ctx.client_capabilities
    if capabilities is None or capabilities.sampling is None:
        raise ToolError(
            "this host offers no sampling, so the server cannot draft with its model: write "
            "the reply yourself and pass it as body_markdown"
        )
    rt = runtime_of(ctx)
    with mapped_errors():
        task = load_task(rt.station.store, task_id)
        request = await drafts.draft_request(
            rt.station.store, rt.provider_for_task(task), task_id, guidance, language
        )
    return Sample(
        [SamplingMessage(role="user", content=TextContent(type="text", text=request.user))],
        max_tokens=1500,
        system_prompt=request.system,
        include_context="none",
    )


async def render_tool(
    task_id: Id,
    ctx: Context,
    body_markdown: Annotated[
        str | None,
        Field(
            min_length=1,
            pattern=NO_NUL,
            max_length=drafts.MAX_DRAFT_CHARS,
            description="the reply's body in Markdown; leave it out to have the host's model "
            "draft it through sampling",
        ),
    ] = None,
    language: Language = None,
    guidance: Guidance = "",
    attachments: Annotated[
        list[Annotated[str, Field(min_length=1, max_length=2000, pattern=NO_NUL)]],
        Field(
            max_length=attachments_service.MAX_ATTACHMENTS,
            description="files to attach, by reference only: an attachment_ref a claimed "
            "message of the workspace listed, or file:<absolute path> under a directory the "
            "workspace context's attachments.outgoing_dirs authorizes. Never file contents",
        ),
    ] = [],  # noqa: B006
    sampled: Annotated[CreateMessageResult | None, Resolve(_ask_host_model)] = None,
) -> DraftView:
    """Render a reply for the task: email-safe HTML and plain text with the right direction
    (RTL/LTR) and lang, URLs, prices and ids isolated, the context's greeting and signature,
    and the original thread's subject. Returns a draft_id: gate_check, request_approval and
    send take it. Any change to the text is a new draft that no earlier approval covers.
    Without body_markdown, the server asks your host's model (MCP sampling) for the body,
    following `guidance`; hosts without sampling must write the body."""
    rt = runtime_of(ctx)
    drafted_by: Literal["caller", "host_model"] = "caller"
    if body_markdown is None:
        if sampled is None or not isinstance(sampled.content, TextContent):
            raise ToolError("the host's model returned no text; write body_markdown yourself")
        body_markdown, drafted_by = sampled.content.text, "host_model"
    with mapped_errors():
        files = await _attachments(rt, task_id, attachments)
        record, rendered = drafts.render_draft(
            rt.station.store, task_id, body_markdown, rt.clock, language=language, attachments=files
        )
    return _draft_view(task_id, record, rendered, drafted_by)


def _draft_view(
    task_id: str,
    record: DraftRecord,
    rendered: RenderedMessage,
    drafted_by: Literal["caller", "host_model"],
) -> DraftView:
    return DraftView(
        task_id=task_id,
        draft_id=record.draft_id,
        digest=record.digest,
        subject=untrusted_text(rendered.subject),
        language=rendered.language,
        direction=rendered.direction.value,
        html=rendered.html,
        text=rendered.text,
        warnings=list(rendered.warnings),
        drafted_by=drafted_by,
        attachments=[
            AttachmentView(
                ref=a.ref,
                name=untrusted_text(a.name),
                content_type=a.content_type,
                size=a.size,
                sha256=a.sha256,
            )
            for a in rendered.attachments
        ],
    )


async def _attachments(rt: Runtime, task_id: str, refs: list[str]) -> tuple[AttachmentData, ...]:
    """The files a draft attaches, read by reference through the task's own mailbox."""
    if not refs:
        return ()
    store = rt.station.store
    task = load_task(store, task_id)
    context = load_context(store, task.workspace_id)
    provider = rt.provider_for_task(task)
    return await attachments_service.read_attachments(store, context, provider, refs)


async def gate_check_tool(
    task_id: Id,
    draft_id: Id,
    to: Annotated[Recipients, Field(min_length=1)],
    ctx: Context,
    cc: Recipients = [],  # noqa: B006
) -> GateCheckView:
    """May this draft go to these recipients now? Returns each recipient's class with its
    evidence, the approval basis when ready, or every blocking reason with who can clear it.
    Classes and approval come from the workspace context and the task record only.
    Read-only: it sends nothing."""
    rt = runtime_of(ctx)
    store = rt.station.store
    with mapped_errors():
        load_task(store, task_id)
        record, rendered = drafts.load_draft(store, task_id, draft_id)
        gate = check_send(store, task_id, drafts.facts(record, rendered), to=to, cc=cc)
    return _gate_view(task_id, draft_id, gate)


async def send_tool(
    task_id: Id,
    draft_id: Id,
    to: Annotated[Recipients, Field(min_length=1)],
    ctx: Context,
    cc: Recipients = [],  # noqa: B006
) -> SendView:
    """Send a rendered draft in the task's original thread, exactly once. The server runs
    the gate again itself (recipients' classes, approval of exactly this draft and these
    recipients, policy, preflight) and refuses with every reason when it is not satisfied.
    The same draft to the same recipients is never sent twice. Then call read_back."""
    rt = runtime_of(ctx)
    store = rt.station.store
    async with rt.serialized("task", task_id):
        with mapped_errors():
            task = load_task(store, task_id)
            done = await replies.send_reply(
                store,
                rt.provider_for_task(task),
                task_id,
                draft_id,
                to=to,
                cc=cc,
                clock=rt.clock,
            )
    to_addrs, cc_addrs = done.gate.plan.addresses()
    result = done.outcome.result
    record = done.outcome.record
    return SendView(
        send_id=record.key,
        task_id=task_id,
        status=done.outcome.status.value,
        channel=result.channel if result else record.detail,
        delivered=result.delivered if result else False,
        internet_message_id=done.outcome.message_id,
        provider_message_id=record.provider_message_id,
        provider_thread_id=result.provider_thread_id if result else None,
        to=list(to_addrs),
        cc=list(cc_addrs),
        task_state=done.task.state.value,
    )


async def read_back_tool(
    send_id: Annotated[str, Field(min_length=1, max_length=4000)], ctx: Context
) -> ReadBackView:
    """Fetch the provider's stored copy of a send and check it: recipients, subject, thread,
    message id, direction, lang and isolated fragments. Every check is returned; the result
    is recorded on the task. Report delivery only when every check passed."""
    rt = runtime_of(ctx)
    store = rt.station.store
    with mapped_errors():
        record = store.get_send(send_id)
        if record is None or record.task_id is None:
            raise RegistryError(f"no send {send_id!r}; read_back takes the send_id send returned")
        async with rt.serialized("task", record.task_id):
            found = await replies.read_back(store, rt.provider_for_task, record, rt.clock)
    return ReadBackView(
        send_id=send_id,
        ok=found.report.ok,
        checks=[CheckView(name=c.name, ok=c.ok, detail=c.detail) for c in found.report.checks],
        stored_provider_message_id=found.stored_provider_message_id,
    )


async def report_tool(
    task_id: Id,
    outcome: Annotated[Outcome, Field(description="where the work ended")],
    evidence: Evidence,
    ctx: Context,
) -> TaskView:
    """Report the end of the work on a task: completed, partially_completed, waiting_client
    or blocked_retry_pending, with the evidence (what was done, what remains). Refused while
    the transition table, an open gate or an unanswered internal requester forbids it."""
    return await transition_task_tool(
        task_id, cast(HostState, _OUTCOME_STATE[outcome].value), evidence, ctx
    )


async def reconcile_tool(run_id: Id, ctx: Context) -> ReconciliationView:
    """Close a run: every scanned item has exactly one outcome (scanned = terminal +
    non-terminal + claim-race); an item left without one is RECONCILIATION_FAILED and is
    taken again by the next run. Then the reminders now due are sent."""
    rt = runtime_of(ctx)
    async with rt.serialized("run", run_id):
        with mapped_errors():
            run = rt.runs.get(run_id)
            if run is not None and run.owns_run:
                result = await intake.finish(run, rt.clock)
                rt.forget_run(run_id)
                rec, reminders = result.reconciliation, result.reminders
            else:
                # A run this server does not hold: report it if it was reconciled, reconcile it
                # if its worker is gone; never close a run a live worker is still claiming.
                store = rt.station.store
                rec, reminders = store.run_summary(run_id), []
                if rec is None:
                    open_run = store.run_holder(run_id)
                    rec = store.reconcile_stale(run_id, rt.clock.now(), holder_alive)
                    if rec is not None and open_run is not None:
                        rec = intake.reconciled(rec, open_run.scope)
                if rec is None:
                    if run_id not in set(store.list_runs()):
                        raise RegistryError(
                            f"no run {run_id}; reconcile takes a run_id intake returned"
                        )
                    raise ToolError(
                        f"run {run_id} is still open in another live worker (or in this server "
                        "before a restart, until its lease runs out); that worker reconciles it, "
                        "or the next intake of its workspace does once it is stale"
                    )
    assert rec is not None
    return ReconciliationView(
        run_id=run_id,
        scanned=rec.scanned,
        terminal=rec.terminal,
        non_terminal=rec.non_terminal,
        claim_race=rec.claim_race,
        reconciliation_failed=rec.reconciliation_failed,
        clean=rec.clean,
        reminders=reminders,
    )


async def submit_learning_tool(
    workspace_id: Id,
    kind: Literal["new_contact", "contact_change", "rule", "other"],
    summary: Annotated[str, Field(min_length=1, max_length=300, pattern=NO_NUL)],
    ctx: Context,
    detail: Annotated[str, Field(max_length=5000, pattern=NO_NUL)] = "",
    evidence: Annotated[list[Id], Field(max_length=20, description="Message-IDs or task ids")] = [],  # noqa: B006
) -> ProposalView:
    """Propose a change to the workspace context (a new contact, a rule). It is queued for
    an operator and never applied by this call: the context, its contacts and its policy
    change only when an operator updates the context file."""
    rt = runtime_of(ctx)
    with mapped_errors():
        proposal = learning.submit(
            rt.station.store,
            workspace_id,
            kind=kind,
            summary=summary,
            detail=detail,
            evidence=evidence,
            clock=rt.clock,
        )
    return ProposalView(
        proposal_id=proposal.proposal_id,
        workspace_id=workspace_id,
        state=proposal.state.value,
        queued=proposal.created,
    )


def _access_path(channel: Channel) -> str:
    """The access path a channel is, in the tool's words: an IMAP server is reached by its
    API (its protocol), a Maildir is embedded."""
    return {Channel.LOCAL: "embedded", Channel.IMAP: "api"}.get(channel, channel.value)


async def access_status_tool(workspace_id: Id, ctx: Context) -> AccessView:
    """Which access path each of the workspace's mailboxes uses now, and for every channel
    in the canonical order (API, provider MCP, browser) its state and why: usable, an
    access gap (the next permitted channel is tried), refused (never routed around), not
    permitted by the context, or not available in this version."""
    rt = runtime_of(ctx)
    with mapped_errors():
        context = load_context(rt.station.store, workspace_id)
    out = [await _mailbox_access(rt, workspace_id, binding) for binding in context.mailboxes]
    return AccessView(workspace_id=workspace_id, mailboxes=out)


async def _mailbox_access(rt: Runtime, workspace_id: str, binding: MailboxBinding) -> MailboxAccess:
    try:
        statuses = await _channel_statuses(rt, workspace_id, binding)
    except Exception as exc:  # every failure is a finding here, not a crash
        statuses = [
            ChannelStatus(c, ChannelState.GAP, f"{type(exc).__name__}: {exc}")
            for c in binding.permitted_channels
        ]
    permitted = set(binding.permitted_channels)
    shown = {s.channel: s for s in statuses}
    channels = [
        shown.get(c) or ChannelStatus(c, ChannelState.NOT_PERMITTED, "the context does not list it")
        for c in CANONICAL_ORDER
        if c in permitted or c in PATHS_SHOWN
    ]
    usable = next((s for s in channels if s.state is ChannelState.USABLE), None)
    blocking = [
        s for s in channels if s.channel in permitted and s.state is not ChannelState.USABLE
    ]
    return MailboxAccess(
        mailbox_id=binding.mailbox_id,
        provider=binding.provider,
        path=_access_path(usable.channel) if usable is not None else "none",
        ok=usable is not None,
        detail=usable.reason
        if usable is not None
        else "; ".join(f"{s.channel}: {s.reason}" for s in blocking) or "no permitted channel",
        channels=[
            ChannelAccess(
                channel=s.channel.value,
                path=_access_path(s.channel),
                state=s.state.value,
                reason=s.reason,
            )
            for s in channels
        ],
    )


PATHS_SHOWN = (Channel.API, Channel.PROVIDER_MCP, Channel.BROWSER)
"""The access paths every mailbox's status lists, permitted or not (seed 000 s.9)."""


async def _channel_statuses(
    rt: Runtime, workspace_id: str, binding: MailboxBinding
) -> list[ChannelStatus]:
    provider = rt.mailbox(workspace_id, binding)
    if isinstance(provider, AccessRoute):
        return await provider.evaluate()
    health = await provider.health()
    state = ChannelState.USABLE if health.ok else ChannelState.GAP
    return [ChannelStatus(provider.capabilities.channel, state, health.detail)]


# -- registration -------------------------------------------------------------------------


def _hints(hints: tuple[bool, bool, bool, bool]) -> ToolAnnotations:
    read_only, destructive, idempotent, open_world = hints
    return ToolAnnotations(
        read_only_hint=read_only,
        destructive_hint=destructive,
        idempotent_hint=idempotent,
        open_world_hint=open_world,
    )


#: Every tool with its hints, set explicitly (the SDK's defaults say destructive and open
#: world): (read_only, destructive, idempotent, open_world).
_TOOLS: tuple[tuple[str, Any, tuple[bool, bool, bool, bool]], ...] = (
    ("intake", intake_tool, (False, False, False, True)),
    ("claim", claim_tool, (False, False, True, True)),
    ("get_task", get_task_tool, (True, False, True, False)),
    ("list_queue", list_queue_tool, (True, False, True, False)),
    ("transition_task", transition_task_tool, (False, False, True, False)),
    ("request_approval", request_approval_tool, (False, False, False, True)),
    ("record_approval", record_approval_tool, (False, False, True, False)),
    ("render", render_tool, (False, False, False, False)),  # a sampled body varies
    ("gate_check", gate_check_tool, (True, False, True, False)),
    ("send", send_tool, (False, True, True, True)),
    ("read_back", read_back_tool, (False, False, True, True)),
    ("report", report_tool, (False, False, True, False)),
    ("reconcile", reconcile_tool, (False, False, True, False)),
    ("submit_learning", submit_learning_tool, (False, False, True, False)),
    ("access_status", access_status_tool, (True, False, True, True)),
    ("internal_mail", internal_mail_tool, (False, True, False, False)),
)


def _strict(tool: Tool) -> Tool:
    """Refuse arguments the schema does not name (the SDK ignores them by default)."""
    base = tool.fn_metadata.arg_model
    strict = type(
        base.__name__,
        (base,),
        {
            "model_config": ConfigDict(extra="forbid", arbitrary_types_allowed=True),
            "__module__": base.__module__,
        },
    )
    tool.fn_metadata.arg_model = strict
    tool.parameters = strict.model_json_schema()
    return tool


def build_tools() -> list[Tool]:
    return [
        _strict(
            Tool.from_function(
                fn,
                name=name,
                annotations=_hints(hints),
                description=MAIL_DESCRIPTION if name == "internal_mail" else None,
            )
        )
        for name, fn, hints in _TOOLS
    ]
