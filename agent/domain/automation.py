"""Automated messages: business-day reminders and bounded receipt acknowledgements.

Both are planned here from the task record and the live context (pure); the services send
them through the sends ledger, which makes each one happen at most once and enforces the
per-recipient cap.
"""

from __future__ import annotations

import re
from datetime import date, datetime, time, timedelta
from enum import StrEnum

from pydantic import BaseModel, ConfigDict

from agent.domain.context import ClientSendPolicy, WorkspaceContext
from agent.domain.envelope import Envelope, identity_digest
from agent.domain.gates import preflight
from agent.domain.recipients import build_recipients
from agent.domain.states import TaskState
from agent.domain.task import Task


class SendKind(StrEnum):
    """What a ledgered send is. The automated kinds count toward the per-recipient cap."""

    ACK = "ack"
    REMINDER = "reminder"
    APPROVAL_REQUEST = "approval_request"
    INTERNAL_REPLY = "internal_reply"
    CLIENT_REPLY = "client_reply"


AUTOMATED_KINDS: frozenset[SendKind] = frozenset({SendKind.ACK, SendKind.REMINDER})


# -- business days ----------------------------------------------------------------------------


def add_business_days(context: WorkspaceContext, start: datetime, days: int) -> datetime:
    """The moment ``days`` business days after ``start``, at the same local wall time, in
    the workspace's timezone, weekend and holidays. A start on a non-business day counts
    from the next business day's start."""
    tz = context.tz
    local = start.astimezone(tz)
    day: date = local.date()
    wall: time = local.time().replace(tzinfo=None)
    if not context.calendar.is_business_day(day):
        # The clock starts at the beginning of the next business day.
        day += timedelta(days=1)
        while not context.calendar.is_business_day(day):
            day += timedelta(days=1)
        wall = time(0, 0)
    counted = 0
    while counted < days:
        day += timedelta(days=1)
        if context.calendar.is_business_day(day):
            counted += 1
    # Wall time on that date in the zone (zoneinfo resolves a DST gap or fold).
    return datetime.combine(day, wall, tzinfo=tz)


class ReminderPlan(BaseModel):
    model_config = ConfigDict(frozen=True)

    key: str
    task_id: str
    to: str
    due_at: datetime
    subject: str
    text: str


class ReminderSkip(BaseModel):
    model_config = ConfigDict(frozen=True)

    task_id: str
    reason: str


def reminder_for(
    context: WorkspaceContext, task: Task, now: datetime
) -> ReminderPlan | ReminderSkip | None:
    """The one internal reminder a task waiting on the client is due, if it is due now.

    It goes to the recorded client manager only, never to the client; its key names the
    waiting period, so one period gets one reminder however often this is asked.
    """
    if task.state is not TaskState.WAITING_CLIENT or task.workspace_id != context.workspace_id:
        return None
    since = task.state_since or task.first_seen_at  # stable: one key per waiting period
    due = add_business_days(context, since, context.reminder_business_days)
    if now < due:
        return None
    if (failed := preflight(context, task.mailbox_id)) is not None:
        return ReminderSkip(
            task_id=task.task_id, reason=f"licence/grant preflight failed: {failed}"
        )
    manager = context.client_manager()
    if manager is None:
        return ReminderSkip(
            task_id=task.task_id,
            reason="no internal contact holds the client_manager role: no reminder can be sent",
        )
    plan = build_recipients(context, to=(manager,), internal_only=True)
    if not plan.to:
        return ReminderSkip(
            task_id=task.task_id,
            reason=f"the client manager {manager} is not verified internal: "
            + "; ".join(r.reason for r in plan.removed),
        )
    return ReminderPlan(
        key=f"reminder|{task.task_id}|{since.timestamp():.6f}",
        task_id=task.task_id,
        to=manager,
        due_at=due,
        subject=f"Reminder: waiting on the client - {task.title}",
        text=(
            f"Task {task.task_id} ({task.title}) has been waiting for the client since "
            f"{since.astimezone(context.tz):%Y-%m-%d %H:%M %Z}, "
            f"{context.reminder_business_days} business days. "
            "No reminder was sent to the client; following up with them is yours to decide."
        ),
    )


# -- receipt acknowledgements ------------------------------------------------------------------

_HEBREW = re.compile(r"[\u0590-\u05ff]")
_ARABIC = re.compile(r"[\u0600-\u06ff]")
_LATIN = re.compile(r"[A-Za-z]")


def message_language(text: str, default: str) -> str:
    """The language a sender wrote in, by script (Hebrew, Arabic, else English for Latin
    text); ``default`` when the text has no letters to tell."""
    counts = {
        "he": len(_HEBREW.findall(text)),
        "ar": len(_ARABIC.findall(text)),
        "en": len(_LATIN.findall(text)),
    }
    language, count = max(counts.items(), key=lambda kv: kv[1])
    if count == 0:
        return default
    if language == "en" and default not in {"he", "ar"}:
        return default  # a Latin-script default (de, fr, ...) is the better guess
    return language


class AckPlan(BaseModel):
    model_config = ConfigDict(frozen=True)

    key: str
    to: str
    language: str
    text: str


class AckRefusal(BaseModel):
    model_config = ConfigDict(frozen=True)

    reason: str


def ack_for(
    context: WorkspaceContext,
    envelope: Envelope,
    *,
    sender_text: str,
    finishes_this_run: bool,
    routine: bool,
) -> AckPlan | AckRefusal:
    """A bounded client receipt acknowledgement (seed 000 section 7), or why there is none:
    the context enables it, the work cannot finish this run, the topic is routine, it goes
    to the verified client sender only, in the sender's language, with the context's own
    text, once for this exact inbound message (the key)."""
    if not context.receipt_ack:
        return AckRefusal(reason="receipt_ack is off in the workspace context")
    if context.client_send_policy is ClientSendPolicy.SENDS_DISABLED:
        return AckRefusal(reason="client_send_policy is sends_disabled: client sends are held")
    if (failed := preflight(context, envelope.mailbox_id)) is not None:
        return AckRefusal(reason=f"licence/grant preflight failed: {failed}")
    if finishes_this_run:
        return AckRefusal(reason="the work finishes this run: no acknowledgement needed")
    if not routine:
        return AckRefusal(reason="not a routine topic")
    plan = build_recipients(context, to=(envelope.sender.address,), internal_only=False)
    [sender] = plan.to or (None,)
    if sender is None or not sender.resolved or sender.recipient_class.value != "client":
        return AckRefusal(reason="the sender is not a verified client contact")
    language = message_language(f"{envelope.subject}\n{sender_text}", context.language)
    text = context.communication.ack_text(language, context.language)
    if text is None:
        return AckRefusal(reason=f"the context has no acknowledgement text in {language!r}")
    # One acknowledgement per inbound message, however many of the workspace's mailboxes
    # received it and whichever channel read it.
    if envelope.internet_message_id is not None:
        ident = f"{envelope.internet_message_id}|{identity_digest(envelope)[:32]}"
    else:
        ident = f"provider:{envelope.provider_message_id}|{envelope.content_digest[:32]}"
    key = f"ack|{context.workspace_id}|{ident}"
    return AckPlan(key=key, to=sender.address, language=language, text=text)
