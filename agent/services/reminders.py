"""Business-day reminders: one internal reminder per waiting period, to the client manager.

A task in WAITING_CLIENT past the context's ``reminder_business_days`` (in the workspace's
timezone, weekend and holidays) gets exactly one reminder to the recorded client manager,
never to the client. The sends ledger keys it by the task and the moment its waiting began,
so neither a second run nor a restart sends it again.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

from agent.domain.automation import ReminderPlan, ReminderSkip, SendKind, reminder_for
from agent.domain.context import WorkspaceContext
from agent.domain.errors import HandoverRefused, ProviderError
from agent.domain.records import TaskAmendment
from agent.ports import Clock, Health, MailProvider, TaskBoard
from agent.services.outbound import OutboundStore, SendStatus, outgoing, send_automated, sent_ref


class ReminderStore(TaskBoard, Health, OutboundStore, Protocol):
    """What reminders need: the board's queue, health events and sending once."""


async def send_due(
    store: ReminderStore,
    context: WorkspaceContext,
    providers: Mapping[str, MailProvider],
    clock: Clock,
) -> list[str]:
    """Send every reminder now due in the workspace; returns a line per reminder."""
    lines: list[str] = []
    now = clock.now()
    for task in store.list_queue(context.workspace_id):
        plan = reminder_for(context, task, now)
        if plan is None:
            continue
        if isinstance(plan, ReminderSkip):
            store.record_health(f"reminder {task.task_id}", plan.reason, now)
            lines.append(f"{task.task_id}: {plan.reason}")
            continue
        provider = providers.get(task.mailbox_id)
        if provider is None:
            lines.append(f"{task.task_id}: mailbox {task.mailbox_id} was not readable this run")
            continue
        lines.append(f"{task.task_id}: {await _send(store, context, provider, plan, clock)}")
    return lines


async def _send(
    store: ReminderStore,
    context: WorkspaceContext,
    provider: MailProvider,
    plan: ReminderPlan,
    clock: Clock,
) -> str:
    task = store.get_task(plan.task_id)
    if task is None:
        return "the task is gone"
    intent, message = outgoing(
        key=plan.key,
        kind=SendKind.REMINDER,
        workspace_id=context.workspace_id,
        task_id=task.task_id,
        mailbox_id=task.mailbox_id,
        to=(plan.to,),
        subject=plan.subject,
        text=plan.text,
        automated=True,
    )
    try:
        outcome = await send_automated(store, provider, intent, message, clock, context)
    except ProviderError as exc:
        store.record_health(f"reminder {task.task_id}", f"send failed: {exc}", clock.now())
        return f"send failed ({exc}); retried next run"
    except HandoverRefused as exc:  # the task records why; a person looks
        return f"refused before handover: {'; '.join(exc.problems)}"
    if outcome.status in {SendStatus.SENT, SendStatus.RECOVERED}:
        store.amend_task(
            task.task_id,
            TaskAmendment(
                event=f"reminder sent: {plan.key}",
                sent_message=sent_ref(outcome, "reminder", task.mailbox_id, clock.now()),
            ),
            clock.now(),
        )
    if outcome.status is SendStatus.REFUSED:
        return f"held: {outcome.record.detail}"
    return f"reminder to {plan.to} {outcome.status.value}"
