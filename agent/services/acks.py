"""Bounded client receipt acknowledgements (seed 000 section 7).

Sent only when the context enables them, the work cannot finish this run, the topic is
routine, to the verified client sender alone, in the original thread and the sender's
language, with exactly the context's template text, once for the inbound message (its
ledger key), and within the per-recipient cap on automated mail.
"""

from __future__ import annotations

from dataclasses import replace

from agent.domain.automation import AckPlan, SendKind, ack_for
from agent.domain.context import WorkspaceContext
from agent.domain.dispositions import Disposition
from agent.domain.envelope import Envelope
from agent.domain.errors import HandoverRefused, ProviderError
from agent.domain.headers import msg_id, references_for
from agent.domain.mail import OutgoingMessage
from agent.domain.records import SendIntent
from agent.domain.task import CommunicationState, Task
from agent.ports import Clock, MailProvider
from agent.rendering.render import render_message, reply_subject
from agent.services.approvals import reply_text
from agent.services.classify import Triage
from agent.services.outbound import OutboundStore, SendStatus, outgoing, send_automated


def _routine(envelope: Envelope, verdict: Triage) -> bool:
    """Routine by evidence: no attachments, nothing flagged, no gate opened by triage."""
    return (
        not envelope.attachment_refs
        and not verdict.update.content_flags
        and not verdict.update.add_gates
    )


def ack_message(
    context: WorkspaceContext, envelope: Envelope, task_id: str, plan: AckPlan
) -> tuple[SendIntent, OutgoingMessage]:
    rendered = render_message(
        plan.text,
        subject=reply_subject(envelope.subject),
        context=context,
        language=plan.language,
        greeting="",
        signature="",
    )
    parent = msg_id(envelope.internet_message_id)
    return outgoing(
        key=plan.key,
        kind=SendKind.ACK,
        workspace_id=context.workspace_id,
        task_id=task_id,
        mailbox_id=envelope.mailbox_id,
        to=(plan.to,),
        subject=rendered.subject,
        text=rendered.text,
        html=rendered.html,
        thread_id=envelope.provider_thread_id,
        in_reply_to=parent,
        references=references_for(parent, envelope.references, envelope.in_reply_to),
        automated=True,
    )


async def acknowledge(
    store: OutboundStore,
    context: WorkspaceContext,
    envelope: Envelope,
    task: Task,
    verdict: Triage,
    provider: MailProvider,
    clock: Clock,
) -> Triage:
    """Send the acknowledgement a new routine request may get; the verdict becomes
    ACK_SENT when it went out (now or by an earlier attempt of the same claim)."""
    if not context.receipt_ack:
        return verdict
    try:
        texts = await reply_text(provider, envelope.body_ref)
    except ProviderError as exc:
        return replace(verdict, detail=_join(verdict.detail, f"no acknowledgement: {exc}"))
    plan = ack_for(
        context,
        envelope,
        sender_text=texts[0],
        finishes_this_run=False,  # intake never finishes the work itself
        routine=_routine(envelope, verdict),
    )
    if not isinstance(plan, AckPlan):
        return replace(verdict, detail=_join(verdict.detail, f"no acknowledgement: {plan.reason}"))
    intent, message = ack_message(context, envelope, task.task_id, plan)
    try:
        outcome = await send_automated(store, provider, intent, message, clock, context)
    except (ProviderError, HandoverRefused) as exc:
        return replace(verdict, detail=_join(verdict.detail, f"acknowledgement failed: {exc}"))
    if outcome.status is SendStatus.REFUSED:
        return replace(
            verdict, detail=_join(verdict.detail, f"no acknowledgement: {outcome.record.detail}")
        )
    if not outcome.went_out:
        return verdict
    return Triage(
        Disposition.ACK_SENT,
        verdict.update.model_copy(update={"communication_state": CommunicationState.ACK_SENT}),
        _join(verdict.detail, f"receipt acknowledged in {plan.language} ({outcome.status.value})"),
    )


def _join(first: str, second: str) -> str:
    return f"{first}; {second}" if first else second
