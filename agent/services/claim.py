"""``outloop.execution.claim``: claim one occurrence and, for its holder only, create or update
the one task of its verified thread - in the same transaction."""

from __future__ import annotations

from datetime import datetime

from agent.domain.context import WorkspaceContext
from agent.domain.envelope import Envelope, work_key
from agent.domain.records import ClaimRequest, ClaimResult, EscalationDraft, TaskDraft
from agent.domain.task import MessageRef, NextAction, new_task_id, normalize_subject
from agent.ports import Store
from agent.services.holder import holder_alive

PACKAGE_VERSION = "outloop-0.1.0"


def task_draft(
    context: WorkspaceContext, envelope: Envelope, key: str, owner: str, now: datetime
) -> TaskDraft:
    """What the claim holder writes for this message: a new task, or an update to its thread's."""
    sender_contact = context.contact(envelope.sender.address)
    links = (envelope.in_reply_to,) if envelope.in_reply_to else ()
    return TaskDraft(
        task_id=new_task_id(now),
        occurrence_key=key,
        workspace_id=context.workspace_id,
        work_key=work_key(context.workspace_id, envelope),
        provider=envelope.provider,
        mailbox_id=envelope.mailbox_id,
        provider_thread_id=envelope.provider_thread_id,
        link_message_ids=tuple(dict.fromkeys((*links, *envelope.references))),
        title=normalize_subject(envelope.subject),
        original_subject=envelope.subject,
        received_at=envelope.received_at,
        message=MessageRef(
            provider_message_id=envelope.provider_message_id,
            internet_message_id=envelope.internet_message_id,
            received_at=envelope.received_at,
            sender=envelope.sender.address,
        ),
        sender_identity=envelope.sender.address,
        sender_side=sender_contact.side.value if sender_contact and sender_contact.side else None,
        client_send_policy=context.client_send_policy.value,
        project_id=context.task_board.project_id,
        intake_location_id=context.task_board.intake_location_id,
        next_action=NextAction(description="triage the new message", owner=owner),
        package_version=PACKAGE_VERSION,
    )


def claim_occurrence(
    store: Store, request: ClaimRequest, draft: TaskDraft | EscalationDraft, now: datetime
) -> ClaimResult:
    """Claim; the outcome is CLAIMED, EXECUTION_ALREADY_CLAIMED or EXECUTION_ALREADY_DONE.

    A claim held by a provably dead holder (or whose lease expired, or whose retry is due) is
    taken over exactly once. A lost claim writes nothing at all; the caller records its
    claim-race disposition in the run ledger.
    """
    return store.claim(request, draft, now, holder_alive)
