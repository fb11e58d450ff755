"""Automated messages (seed 000 sections 7 and 11): business days in the workspace's own
calendar and timezone, one internal reminder to the client manager per waiting period, and
the bounded client receipt acknowledgement."""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

import pytest
import yaml

from agent.domain.automation import (
    AckPlan,
    AckRefusal,
    ReminderPlan,
    ReminderSkip,
    ack_for,
    add_business_days,
    message_language,
    reminder_for,
)
from agent.domain.context import WorkspaceContext, parse_context
from agent.domain.envelope import Envelope
from agent.domain.states import TaskState
from agent.domain.task import NextAction, Task
from agent.testing import make_envelope
from tests.conftest import context_yaml

JERUSALEM = ZoneInfo("Asia/Jerusalem")
NEW_YORK = ZoneInfo("America/New_York")
WORKSPACE = "ws-test-0001"
MAILBOX = "support@fabrikam.test"
CLIENT = "dana.levi@contoso.test"
INTERNAL = "noa.bar@fabrikam.test"  # internal, approver and client_manager in context_yaml()


def make_context(**changes: Any) -> WorkspaceContext:
    """The conftest context (Asia/Jerusalem, weekend fri+sat, two business days to a
    reminder) with top-level keys replaced."""
    data: dict[str, Any] = yaml.safe_load(context_yaml())
    data.update(changes)
    return parse_context(yaml.safe_dump(data, allow_unicode=True), "test context")


def jerusalem(*, holidays: tuple[date, ...] = ()) -> WorkspaceContext:
    return make_context(
        timezone="Asia/Jerusalem", calendar={"weekend": ["fri", "sat"], "holidays": list(holidays)}
    )


def new_york(*, holidays: tuple[date, ...] = ()) -> WorkspaceContext:
    return make_context(
        timezone="America/New_York",
        calendar={"weekend": ["sat", "sun"], "holidays": list(holidays)},
    )


# -- add_business_days: weekends ------------------------------------------------------------------


def test_business_days_skip_the_friday_saturday_weekend_in_jerusalem() -> None:
    context = jerusalem()
    thursday = datetime(2026, 12, 3, 14, 0, tzinfo=JERUSALEM)
    assert add_business_days(context, thursday, 1) == datetime(2026, 12, 6, 14, 0, tzinfo=JERUSALEM)
    assert add_business_days(context, thursday, 2) == datetime(2026, 12, 7, 14, 0, tzinfo=JERUSALEM)


def test_sunday_is_a_business_day_in_jerusalem() -> None:
    context = jerusalem()
    saturday_night_utc_sunday_local = datetime(2026, 12, 5, 23, 0, tzinfo=UTC)  # Sun 01:00 IST
    due = add_business_days(context, saturday_night_utc_sunday_local, 1)
    assert due == datetime(2026, 12, 7, 1, 0, tzinfo=JERUSALEM)  # Monday, same wall time


def test_business_days_skip_the_saturday_sunday_weekend_in_new_york() -> None:
    context = new_york()
    friday = datetime(2026, 12, 4, 14, 0, tzinfo=NEW_YORK)
    assert add_business_days(context, friday, 1) == datetime(2026, 12, 7, 14, 0, tzinfo=NEW_YORK)
    assert add_business_days(context, friday, 3) == datetime(2026, 12, 9, 14, 0, tzinfo=NEW_YORK)


def test_friday_is_a_business_day_in_new_york_but_not_in_jerusalem() -> None:
    thursday_utc = datetime(2026, 12, 3, 16, 0, tzinfo=UTC)  # Thu 11:00 NY, Thu 18:00 IST
    assert add_business_days(new_york(), thursday_utc, 1).date() == date(2026, 12, 4)
    assert add_business_days(jerusalem(), thursday_utc, 1).date() == date(2026, 12, 6)


def test_the_result_is_in_the_workspaces_timezone_whatever_the_zone_of_the_start() -> None:
    context = new_york()
    start_utc = datetime(2026, 12, 2, 15, 0, tzinfo=UTC)  # Wed 10:00 EST
    due = add_business_days(context, start_utc, 1)
    assert due.tzinfo == NEW_YORK
    assert (due.date(), due.hour, due.minute) == (date(2026, 12, 3), 10, 0)


# -- add_business_days: holidays -------------------------------------------------------------------


def test_a_holiday_is_not_a_business_day_in_jerusalem() -> None:
    wednesday = datetime(2026, 12, 23, 11, 0, tzinfo=JERUSALEM)
    plain = add_business_days(jerusalem(), wednesday, 1)
    assert plain == datetime(2026, 12, 24, 11, 0, tzinfo=JERUSALEM)  # Thursday
    with_holiday = add_business_days(jerusalem(holidays=(date(2026, 12, 24),)), wednesday, 1)
    assert with_holiday == datetime(2026, 12, 27, 11, 0, tzinfo=JERUSALEM)  # holiday, fri, sat


def test_a_holiday_is_not_a_business_day_in_new_york() -> None:
    thursday = datetime(2026, 12, 24, 11, 0, tzinfo=NEW_YORK)
    plain = add_business_days(new_york(), thursday, 1)
    assert plain == datetime(2026, 12, 25, 11, 0, tzinfo=NEW_YORK)  # Friday
    with_holiday = add_business_days(new_york(holidays=(date(2026, 12, 25),)), thursday, 1)
    assert with_holiday == datetime(2026, 12, 28, 11, 0, tzinfo=NEW_YORK)  # holiday, sat, sun


# -- add_business_days: daylight saving time ---------------------------------------------------------


def test_israel_dst_ends_on_the_last_sunday_of_october_2026() -> None:
    # The premise of the Jerusalem DST test, checked against the tz database.
    assert datetime(2026, 10, 24, 12, 0, tzinfo=JERUSALEM).utcoffset() == timedelta(hours=3)
    assert datetime(2026, 10, 25, 12, 0, tzinfo=JERUSALEM).utcoffset() == timedelta(hours=2)
    last_sunday = date(2026, 10, 25)
    assert last_sunday.weekday() == 6 and (last_sunday + timedelta(days=7)).month == 11


def test_across_the_israel_dst_change_the_due_moment_keeps_its_local_wall_time() -> None:
    wednesday = datetime(2026, 10, 21, 10, 0, tzinfo=JERUSALEM)  # IDT, +03:00
    due = add_business_days(jerusalem(), wednesday, 2)  # Thursday, then Sunday 25 October
    assert (due.date(), due.hour, due.minute) == (date(2026, 10, 25), 10, 0)
    assert wednesday.utcoffset() == timedelta(hours=3)
    assert due.utcoffset() == timedelta(hours=2)
    assert due.astimezone(UTC) == datetime(2026, 10, 25, 8, 0, tzinfo=UTC)
    # Four calendar days and one extra hour of absolute time (compared in UTC: Python
    # subtracts two datetimes of the same zone by wall time).
    assert due.astimezone(UTC) - wednesday.astimezone(UTC) == timedelta(days=4, hours=1)


def test_us_dst_ends_on_1_november_2026() -> None:
    assert datetime(2026, 10, 31, 12, 0, tzinfo=NEW_YORK).utcoffset() == timedelta(hours=-4)
    assert datetime(2026, 11, 1, 12, 0, tzinfo=NEW_YORK).utcoffset() == timedelta(hours=-5)


def test_across_the_us_dst_change_the_due_moment_keeps_its_local_wall_time() -> None:
    friday = datetime(2026, 10, 30, 9, 30, tzinfo=NEW_YORK)  # EDT, -04:00
    due = add_business_days(new_york(), friday, 1)
    assert (due.date(), due.hour, due.minute) == (date(2026, 11, 2), 9, 30)
    assert friday.utcoffset() == timedelta(hours=-4)
    assert due.utcoffset() == timedelta(hours=-5)
    assert due.astimezone(UTC) == datetime(2026, 11, 2, 14, 30, tzinfo=UTC)
    assert due.astimezone(UTC) - friday.astimezone(UTC) == timedelta(days=3, hours=1)


# -- add_business_days: a start outside business days ---------------------------------------------


def test_a_start_on_a_weekend_day_counts_from_the_next_business_days_start_in_jerusalem() -> None:
    context = jerusalem()
    friday = datetime(2026, 12, 4, 15, 0, tzinfo=JERUSALEM)
    sunday_start = datetime(2026, 12, 6, 0, 0, tzinfo=JERUSALEM)
    # Counting two business days from Sunday 00:00: Sunday, then Monday, due Tuesday 00:00.
    assert add_business_days(context, sunday_start, 2) == datetime(
        2026, 12, 8, 0, 0, tzinfo=JERUSALEM
    )
    assert add_business_days(context, friday, 2) == add_business_days(context, sunday_start, 2)


def test_a_start_on_a_weekend_day_counts_from_the_next_business_days_start_in_new_york() -> None:
    context = new_york()
    saturday = datetime(2026, 12, 5, 11, 0, tzinfo=NEW_YORK)
    monday_start = datetime(2026, 12, 7, 0, 0, tzinfo=NEW_YORK)
    assert add_business_days(context, monday_start, 1) == datetime(
        2026, 12, 8, 0, 0, tzinfo=NEW_YORK
    )
    assert add_business_days(context, saturday, 1) == add_business_days(context, monday_start, 1)


def test_a_start_on_a_holiday_counts_from_the_next_business_days_start() -> None:
    context = new_york(holidays=(date(2026, 12, 25),))
    christmas = datetime(2026, 12, 25, 10, 0, tzinfo=NEW_YORK)
    monday_start = datetime(2026, 12, 28, 0, 0, tzinfo=NEW_YORK)
    assert add_business_days(context, christmas, 1) == add_business_days(context, monday_start, 1)


def test_a_later_start_is_never_due_earlier() -> None:
    context = jerusalem()
    thursday_evening = datetime(2026, 12, 3, 23, 0, tzinfo=JERUSALEM)
    friday_morning = datetime(2026, 12, 4, 9, 0, tzinfo=JERUSALEM)
    assert add_business_days(context, friday_morning, 2) >= add_business_days(
        context, thursday_evening, 2
    )


# -- reminder_for -------------------------------------------------------------------------------

WAITING_SINCE = datetime(2026, 12, 2, 10, 0, tzinfo=JERUSALEM)  # a Wednesday
REMINDER_DUE = datetime(2026, 12, 6, 10, 0, tzinfo=JERUSALEM)  # Thursday + Sunday: 2 days


def make_task(
    *,
    state: TaskState = TaskState.WAITING_CLIENT,
    state_since: datetime | None = WAITING_SINCE,
    workspace_id: str = WORKSPACE,
    updated_at: datetime = WAITING_SINCE,
) -> Task:
    received = datetime(2026, 12, 1, 9, 0, tzinfo=JERUSALEM)
    return Task(
        task_id="task-0001",
        workspace_id=workspace_id,
        work_key=f"{workspace_id}|memory|{MAILBOX}|thread-1",
        provider="memory",
        mailbox_id=MAILBOX,
        provider_thread_id="thread-1",
        title="Quote request",
        original_subject="Re: Quote request",
        received_at=received,
        first_seen_at=received,
        updated_at=updated_at,
        state=state,
        sender_identity=CLIENT,
        sender_side="client",
        client_send_policy="draft_for_internal_approval",
        next_action=NextAction(description="wait for the client", owner=INTERNAL),
        state_since=state_since,
    )


def test_no_reminder_before_the_business_days_have_passed() -> None:
    context = make_context()
    assert reminder_for(context, make_task(), REMINDER_DUE - timedelta(minutes=1)) is None
    assert reminder_for(context, make_task(), WAITING_SINCE) is None


def test_the_reminder_is_due_at_the_due_moment_and_goes_to_the_client_manager() -> None:
    result = reminder_for(make_context(), make_task(), REMINDER_DUE)
    assert isinstance(result, ReminderPlan)
    assert result.to == INTERNAL
    assert result.to != CLIENT
    assert result.due_at == REMINDER_DUE
    assert result.task_id == "task-0001"


def test_the_reminder_is_still_planned_after_the_due_moment() -> None:
    result = reminder_for(make_context(), make_task(), REMINDER_DUE + timedelta(days=5))
    assert isinstance(result, ReminderPlan)
    assert result.to == INTERNAL
    assert result.due_at == REMINDER_DUE


def test_the_reminder_counts_the_contexts_business_days() -> None:
    context = make_context(reminder_business_days=3)
    monday = datetime(2026, 12, 7, 10, 0, tzinfo=JERUSALEM)
    assert reminder_for(context, make_task(), monday - timedelta(seconds=1)) is None
    assert isinstance(reminder_for(context, make_task(), monday), ReminderPlan)


def test_the_reminder_never_goes_to_the_client_even_if_the_client_holds_the_manager_role() -> None:
    data: dict[str, Any] = yaml.safe_load(context_yaml())
    data["contacts"] = [
        {"address": CLIENT, "side": "client", "roles": ["client_manager"]},
        {"address": INTERNAL, "side": "internal", "roles": ["approver"]},
    ]
    context = parse_context(yaml.safe_dump(data), "test context")
    result = reminder_for(context, make_task(), REMINDER_DUE)
    assert isinstance(result, ReminderSkip)
    assert "client_manager" in result.reason


def test_no_client_manager_skips_the_reminder_with_a_reason() -> None:
    data: dict[str, Any] = yaml.safe_load(context_yaml())
    data["contacts"] = [
        {"address": CLIENT, "side": "client", "verified_by": "crm-record"},
        {"address": INTERNAL, "side": "internal", "roles": ["approver"]},
    ]
    context = parse_context(yaml.safe_dump(data), "test context")
    result = reminder_for(context, make_task(), REMINDER_DUE)
    assert isinstance(result, ReminderSkip)
    assert result.task_id == "task-0001"
    assert "client_manager" in result.reason


def test_the_reminder_key_is_stable_within_one_waiting_period() -> None:
    context = make_context()
    first = reminder_for(context, make_task(), REMINDER_DUE)
    later = reminder_for(context, make_task(), REMINDER_DUE + timedelta(days=3, hours=7))
    touched = reminder_for(
        context, make_task(updated_at=REMINDER_DUE + timedelta(hours=1)), REMINDER_DUE
    )
    assert isinstance(first, ReminderPlan)
    assert isinstance(later, ReminderPlan)
    assert isinstance(touched, ReminderPlan)
    assert first.key == later.key == touched.key


def test_a_later_waiting_period_gets_a_different_reminder_key() -> None:
    context = make_context()
    first = reminder_for(context, make_task(), REMINDER_DUE)
    second_since = datetime(2026, 12, 9, 12, 0, tzinfo=JERUSALEM)
    second = reminder_for(
        context, make_task(state_since=second_since), second_since + timedelta(days=10)
    )
    assert isinstance(first, ReminderPlan)
    assert isinstance(second, ReminderPlan)
    assert first.key != second.key


def test_without_state_since_the_waiting_period_counts_from_first_seen() -> None:
    context = make_context()
    task = make_task(state_since=None)  # first seen Tue 1 Dec 09:00: due Thu 3 Dec 09:00
    assert reminder_for(context, task, datetime(2026, 12, 3, 8, 59, tzinfo=JERUSALEM)) is None
    result = reminder_for(context, task, datetime(2026, 12, 3, 9, 0, tzinfo=JERUSALEM))
    assert isinstance(result, ReminderPlan)
    much_later = reminder_for(context, task, REMINDER_DUE + timedelta(days=9))
    assert isinstance(much_later, ReminderPlan)
    assert much_later.key == result.key


@pytest.mark.parametrize("state", [s for s in TaskState if s is not TaskState.WAITING_CLIENT])
def test_no_reminder_for_a_task_that_is_not_waiting_on_the_client(state: TaskState) -> None:
    task = make_task(state=state)
    assert reminder_for(make_context(), task, REMINDER_DUE + timedelta(days=30)) is None


def test_no_reminder_for_a_task_of_another_workspace() -> None:
    task = make_task(workspace_id="ws-other-0002")
    assert reminder_for(make_context(), task, REMINDER_DUE + timedelta(days=30)) is None


# -- ack_for ------------------------------------------------------------------------------------

HE_ACK = "שלום, קיבלנו את פנייתך ונחזור אליך בהקדם. {ref}"
EN_ACK = "Hello, we received your message and will get back to you. {ref}"
HE_SUBJECT = "בקשה להצעת מחיר"
HE_TEXT = "שלום, אפשר לקבל הצעת מחיר על 20 יחידות?"
EN_SUBJECT = "Quote request"
EN_TEXT = "Hello, could we get a quote for 20 units?"


def ack_context(**changes: Any) -> WorkspaceContext:
    settings: dict[str, Any] = {
        "receipt_ack": True,
        "communication": {"ack_templates": {"he": HE_ACK, "en": EN_ACK}},
    }
    settings.update(changes)
    return make_context(**settings)


def inbound(*, sender: str = CLIENT, subject: str = HE_SUBJECT) -> Envelope:
    return make_envelope(
        mailbox_id=MAILBOX, message_no=1, thread_no=1, sender=sender, subject=subject
    )


def ack(
    context: WorkspaceContext,
    envelope: Envelope,
    *,
    text: str = HE_TEXT,
    finishes_this_run: bool = False,
    routine: bool = True,
) -> AckPlan | AckRefusal:
    return ack_for(
        context,
        envelope,
        sender_text=text,
        finishes_this_run=finishes_this_run,
        routine=routine,
    )


def test_a_hebrew_message_gets_the_hebrew_acknowledgement_verbatim() -> None:
    envelope = inbound()
    result = ack(ack_context(), envelope)
    assert isinstance(result, AckPlan)
    assert result.text == HE_ACK
    assert result.language == "he"
    assert result.to == CLIENT


def test_an_english_message_gets_the_english_acknowledgement_verbatim() -> None:
    envelope = inbound(subject=EN_SUBJECT)
    result = ack(ack_context(), envelope, text=EN_TEXT)
    assert isinstance(result, AckPlan)
    assert result.text == EN_ACK
    assert result.language == "en"
    assert result.to == CLIENT


def test_the_acknowledgement_key_is_the_exact_inbound_message_in_any_of_its_mailboxes() -> None:
    envelope = inbound()
    result = ack(ack_context(), envelope)
    assert isinstance(result, AckPlan)
    assert envelope.internet_message_id is not None
    assert result.key.startswith(f"ack|{WORKSPACE}|{envelope.internet_message_id}|")
    # The same message received by a second mailbox of the workspace: the same key.
    copy = envelope.model_copy(update={"mailbox_id": "sales@fabrikam.test"})
    both = ack_context()
    both = both.model_copy(
        update={
            "grants": both.grants.model_copy(update={"mailboxes": (MAILBOX, "sales@fabrikam.test")})
        }
    )
    copy_result = ack(both, copy)
    assert isinstance(copy_result, AckPlan) and copy_result.key == result.key
    other = make_envelope(mailbox_id=MAILBOX, message_no=2, thread_no=1, sender=CLIENT)
    other_result = ack(ack_context(), other)
    assert isinstance(other_result, AckPlan)
    assert other_result.key != result.key


def test_no_acknowledgement_when_receipt_ack_is_off() -> None:
    result = ack(ack_context(receipt_ack=False), inbound())
    assert isinstance(result, AckRefusal)
    assert "receipt_ack" in result.reason


def test_no_acknowledgement_when_the_work_finishes_this_run() -> None:
    result = ack(ack_context(), inbound(), finishes_this_run=True)
    assert isinstance(result, AckRefusal)
    assert "finishes this run" in result.reason


def test_no_acknowledgement_for_a_topic_that_is_not_routine() -> None:
    result = ack(ack_context(), inbound(), routine=False)
    assert isinstance(result, AckRefusal)
    assert "routine" in result.reason


@pytest.mark.parametrize(
    "sender",
    [
        "stranger@contoso.test",  # unknown, at the client's domain
        "someone@fabrikam.test",  # unknown, at the team's domain
        INTERNAL,  # a verified internal contact is no client
        "dana.levi@c0ntoso.test",  # a lookalike of the client's domain
    ],
)
def test_no_acknowledgement_unless_the_sender_is_a_verified_client_contact(sender: str) -> None:
    result = ack(ack_context(), inbound(sender=sender))
    assert isinstance(result, AckRefusal)
    assert "not a verified client contact" in result.reason


def test_no_acknowledgement_to_a_client_contact_with_conflicting_evidence() -> None:
    result = ack(ack_context(default_cc=[CLIENT]), inbound())
    assert isinstance(result, AckRefusal)
    assert "not a verified client contact" in result.reason


def test_no_acknowledgement_to_the_workspaces_own_mailbox() -> None:
    result = ack(ack_context(), inbound(sender=MAILBOX))
    assert isinstance(result, AckRefusal)


def test_no_acknowledgement_without_a_template_in_the_senders_language() -> None:
    context = ack_context(communication={"ack_templates": {"he": HE_ACK}})
    result = ack(context, inbound(subject=EN_SUBJECT), text=EN_TEXT)
    assert isinstance(result, AckRefusal)
    assert "'en'" in result.reason


def test_no_acknowledgement_when_the_context_has_no_acknowledgement_text_at_all() -> None:
    context = ack_context(communication={})
    result = ack(context, inbound())
    assert isinstance(result, AckRefusal)


def test_the_single_ack_template_serves_the_workspaces_own_language_only() -> None:
    context = ack_context(communication={"ack_template": HE_ACK})  # language: he
    hebrew = ack(context, inbound())
    assert isinstance(hebrew, AckPlan)
    assert hebrew.text == HE_ACK
    english = ack(context, inbound(subject=EN_SUBJECT), text=EN_TEXT)
    assert isinstance(english, AckRefusal)


# -- message_language ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "default", "expected"),
    [
        ("שלום, אפשר לקבל הצעת מחיר?", "en", "he"),
        ("مرحبا، هل يمكنني الحصول على عرض سعر؟", "en", "ar"),
        ("Hello, could we get a quote?", "he", "en"),
        ("Hello, could we get a quote?", "ar", "en"),
        ("שלום, ההזמנה ORD-42 מוכנה", "en", "he"),  # mostly Hebrew with a Latin id
        ("Guten Tag, ich brauche ein Angebot", "de", "de"),  # Latin text, Latin default
        ("12345 / 2026-12-01 !!", "he", "he"),  # no letters: the default
        ("", "en", "en"),
    ],
)
def test_message_language_is_told_by_script(text: str, default: str, expected: str) -> None:
    assert message_language(text, default) == expected
