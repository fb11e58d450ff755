"""``outloop.execution.claim``: claim one occurrence and, for its holder only, create or update
the one task of its verified thread - in the same transaction."""

from __future__ import annotations

import importlib.metadata
import time
from collections.abc import Callable, Sequence
from datetime import datetime
from functools import cache

from agent.domain.context import WorkspaceContext
from agent.domain.envelope import Envelope, work_key
from agent.domain.execution import ExecutionRecord, contest
from agent.domain.records import ClaimRequest, ClaimResult, EscalationDraft, TaskDraft
from agent.domain.task import MessageRef, NextAction, new_task_id, normalize_subject
from agent.events import Event, emit
from agent.ports import Claims
from agent.services.holder import holder_alive


@cache
def package_version() -> str:
    """The Outloop distribution that creates a task (recorded on it)."""
    try:
        return "outloop-" + importlib.metadata.version("outloop")
    except importlib.metadata.PackageNotFoundError:
        return "outloop-unknown"


def task_draft(
    context: WorkspaceContext, envelope: Envelope, key: str, owner: str, now: datetime
) -> TaskDraft:
    """What the claim holder writes for this message: a new task, or an update to its thread's."""
    sender_contact = context.contact(envelope.sender.address)
    links = tuple(i for i in (envelope.in_reply_to, envelope.reported_message_id) if i)
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
            body_ref=envelope.body_ref,
            in_reply_to=envelope.in_reply_to,
            references=envelope.references,
            attachment_refs=envelope.attachment_refs,
        ),
        sender_identity=envelope.sender.address,
        sender_side=sender_contact.side.value if sender_contact and sender_contact.side else None,
        client_send_policy=context.client_send_policy.value,
        project_id=context.task_board.project_id,
        intake_location_id=context.task_board.intake_location_id,
        next_action=NextAction(description="triage the new message", owner=owner),
        package_version=package_version(),
    )


class Lookahead:
    """The execution records of the next items of a run, read in one query per window.

    Deciding a lost claim needs the occurrence's execution record; reading the records of
    the next ``size`` items together replaces one round trip per item with one per window.
    A record read a moment early is still sound: DONE is final, a live holder's claim that
    ended since is taken over by a later run, and an occurrence that looked unclaimed is
    decided by the store's insert.
    """

    def __init__(self, store: Claims, keys: Sequence[str], size: int = 64) -> None:
        self._store = store
        self._keys = keys
        self._size = size
        self._next = 0
        self._window: dict[str, ExecutionRecord | None] = {}

    def seen(self, index: int) -> tuple[ExecutionRecord | None]:
        """What was read for the key at ``index`` (the window moves forward as needed)."""
        key = self._keys[index]
        if key not in self._window:
            window = self._keys[index : index + self._size]
            found = self._store.get_executions(window)
            self._window = {k: found.get(k) for k in window}
        return (self._window.pop(key),)


def claim_occurrence(
    store: Claims,
    request: ClaimRequest,
    make_draft: Callable[[], TaskDraft | EscalationDraft],
    now: datetime,
    *,
    seen: tuple[ExecutionRecord | None] | None = None,
    workspace_id: str = "",
) -> ClaimResult:
    """Claim; the outcome is CLAIMED, EXECUTION_ALREADY_CLAIMED or EXECUTION_ALREADY_DONE.

    A claim held by a provably dead holder (or whose lease expired, or whose retry is due) is
    taken over exactly once. A claim that has already lost is decided by one read - DONE is
    final, and a live holder's claim can only be taken over once the holder is dead or its
    lease ran out, which a later claim sees - so it writes nothing, takes no write lock and
    never builds its task draft. Only the store's insert can win a claim. The caller records
    a lost claim's claim-race disposition in the run ledger. ``seen`` is the record a
    Lookahead read just before (``(None,)``: none existed); without it, it is read now.
    The outcome is a decision record of ``workspace_id`` (the scope claiming).
    """
    started = time.perf_counter()
    result = _claimed(store, request, make_draft, now, seen)
    emit(
        Event.CLAIM,
        workspace_id=workspace_id or None,
        run_id=request.run_id,
        item_ref=request.item_ref,
        outcome=result.outcome.value,
        task_id=result.task.task_id if result.task is not None else None,
        duration_seconds=round(time.perf_counter() - started, 6),
    )
    return result


def _claimed(
    store: Claims,
    request: ClaimRequest,
    make_draft: Callable[[], TaskDraft | EscalationDraft],
    now: datetime,
    seen: tuple[ExecutionRecord | None] | None,
) -> ClaimResult:
    known = store.get_execution(request.key) if seen is None else seen[0]
    if known is not None:
        outcome = contest(known, now, holder_alive)
        if outcome is not None:
            return ClaimResult(outcome=outcome, execution=known)
    return store.claim(request, make_draft(), now, holder_alive)
