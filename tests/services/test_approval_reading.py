"""How approvers' replies are read: every word written around an approval, every part of
an HTML reply, and which message a reply answers. With several approvers, decisions count in
the order they were written, and one approver's hold or change is not cleared by another's
approval."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from agent.domain.approval import ApprovalRequest, Decision, judge_reply, read_wording
from agent.domain.context import parse_context
from agent.domain.states import TaskState
from tests.conftest import context_yaml
from tests.services.gates_world import (
    APPROVER,
    CLIENT,
    COLLEAGUE,
    SECOND_APPROVER,
    World,
    approval_requested,
    approved_by_reply,
    ready_for_client,
)

pytestmark = pytest.mark.anyio


# -- several approvers ---------------------------------------------------------------------


async def test_one_approvers_change_request_is_not_overridden_by_anothers_approval(
    approvers_world: World,
) -> None:
    world = approvers_world
    task_id, request = await approval_requested(world)
    await world.approver_replies(thread="a", text="Please change the price.", in_reply_to=request)
    world.clock.advance(minutes=1)
    world.deliver(sender=SECOND_APPROVER, thread="a", text="Approved.", in_reply_to=request)
    await world.intake()
    task = world.task(task_id)
    assert task.state is TaskState.CHANGES_REQUESTED
    assert not world.gate(task, world.render(task), (CLIENT,)).ready


async def test_one_approvers_reservation_is_not_cleared_by_anothers_approval(
    approvers_world: World,
) -> None:
    world = approvers_world
    task_id, request = await approval_requested(world)
    world.clock.advance(minutes=1)
    world.deliver(sender=SECOND_APPROVER, thread="a", text="Hmm, let me think about it.",
                  in_reply_to=request)  # fmt: skip
    await world.intake()
    await world.approver_replies(thread="a", text="Approved.", in_reply_to=request)
    assert world.task(task_id).state is TaskState.WAITING_INTERNAL_APPROVAL
    assert not ready_for_client(world, task_id)


async def test_decisions_count_in_the_order_they_were_written_not_processed(
    approvers_world: World,
) -> None:
    world = approvers_world
    task_id, request = await approval_requested(world)
    early = world.clock.now() + timedelta(minutes=2)
    world.clock.advance(minutes=10)
    # The later "don't send" arrives first; the earlier "Approved." is processed after it.
    world.deliver(sender=APPROVER, thread="a", text="Don't send, the price is wrong.",
                  in_reply_to=request)  # fmt: skip
    await world.intake()
    world.deliver(sender=APPROVER, thread="a", text="Approved.", in_reply_to=request,
                  received_at=early)  # fmt: skip
    await world.intake()
    task = world.task(task_id)
    assert task.state is TaskState.CHANGES_REQUESTED
    assert not world.gate(task, world.render(task), (CLIENT,)).ready


# -- holds and withdrawals after an approval -----------------------------------------------


async def test_a_reservation_after_an_approval_suspends_it(approvers_world: World) -> None:
    world = approvers_world
    task_id, request = await approval_requested(world)
    await world.approver_replies(thread="a", text="Approved.", in_reply_to=request)
    assert world.task(task_id).state is TaskState.APPROVED_TO_SEND
    await world.approver_replies(
        thread="a", text="Hold on, wait - let me check with legal.", in_reply_to=request
    )
    task = world.task(task_id)
    assert task.state is TaskState.WAITING_INTERNAL_APPROVAL
    assert not world.gate(task, world.render(task), (CLIENT,)).ready


async def test_a_withdrawal_replying_to_the_approvers_own_approval_suspends_it(
    approvers_world: World,
) -> None:
    world = approvers_world
    task_id, request, approval = await approved_by_reply(world)
    await world.approver_replies(
        thread="a",
        text="Wait - don't send! The price is wrong.",
        in_reply_to=approval,
        references=(request, approval),
    )
    assert world.task(task_id).state is TaskState.CHANGES_REQUESTED
    assert not ready_for_client(world, task_id)


async def test_a_bottom_posted_withdrawal_is_read_below_the_quote(approvers_world: World) -> None:
    world = approvers_world
    task_id, request, _ = await approved_by_reply(world)
    world.clock.advance(minutes=1)
    text = (
        "On Mon, 30 Nov 2026 at 10:00, Noa Bar <noa.bar@fabrikam.test> wrote:\n"
        "> Approved.\n\nDon't send, the price is wrong."
    )
    world.deliver(sender=APPROVER, thread="a", text=text, in_reply_to=request)
    await world.intake()
    assert not ready_for_client(world, task_id)


# -- which message a reply answers ---------------------------------------------------------


async def test_an_approvers_answer_to_a_colleague_in_the_thread_is_not_an_answer_to_the_request(
    approvers_world: World,
) -> None:
    world = approvers_world
    task_id, request = await approval_requested(world)
    world.clock.advance(minutes=1)
    note = world.deliver(sender=COLLEAGUE, thread="a", text="Drop the discount line first?",
                         in_reply_to=request)  # fmt: skip
    await world.intake()
    await world.approver_replies(
        thread="a",
        text="Approved.",
        in_reply_to=note.internet_message_id,
        references=(request, note.internet_message_id or ""),
    )
    assert world.task(task_id).state is TaskState.WAITING_INTERNAL_APPROVAL


# -- HTML parts ----------------------------------------------------------------------------


async def test_parts_that_disagree_are_read_most_strictly(approvers_world: World) -> None:
    world = approvers_world
    task_id, request, _ = await approved_by_reply(world)
    await world.approver_replies(
        thread="a",
        text="Approved, so do\nnot send it yet.",
        html="<p class=MsoNormal>Approved, so do\nnot send it yet.</p>",
        in_reply_to=request,
    )
    assert not ready_for_client(world, task_id)


async def test_an_approval_in_struck_or_hidden_html_does_not_approve(
    approvers_world: World,
) -> None:
    world = approvers_world
    task_id, request = await approval_requested(world)
    await world.approver_replies(
        thread="a", text="", html="<p><del>Approved</del></p>", in_reply_to=request
    )
    assert world.task(task_id).state is TaskState.WAITING_INTERNAL_APPROVAL


# -- the words around an approval ----------------------------------------------------------


@pytest.mark.parametrize(
    "text",
    [
        "Approved.\nThanks!\nP.S. don't send before Monday - legal still has to sign.\n\nNoa",
        "Approved\nCheers\nWait for Legal to sign off first",
        "מאושר\nתודה\nרק אל תשלחו לפני יום ראשון",
        "Approved\nwith edits",
        "Approved\nRetracted",
        "Approved\nCancel",
        "Approved\npending legal",
        "מאושר\nמבוטל",
        "מאושר\nבתאריך 1.5 ולא לפני",
        "Approved\nDate: the 5th, not before",
        "Approved\nTo: Dana only, not the whole list",
        "Approved\n--\nJust kidding, do not send",
        "Approved\n_________\nfix the VAT line first",
        "Hey don't send\nApproved",
        "Hi not yet\nApproved",
        "Approved, thanks for the draft to the wrong client",
    ],
)
def test_words_around_an_approval_are_read_not_cut_away(text: str) -> None:
    assert read_wording(text, ("Noa Bar", "Noa")).decision is not Decision.APPROVED


@pytest.mark.parametrize(
    "text",
    [
        "Approved.\nOn second thought, don't send until you see what Dana wrote:\nthe price is wrong",
        "מאושר\nהערה לגבי המכתב:\nלא לשלוח לפני יום ראשון",
        "מאשר\nבתאריך שכתוב בטיוטה יש טעות, הנה התיקון:",
        "Approved\n--\nActually scratch that, wrong draft. Ignore.",
        "Approved\n--\nD\u043en't send",
        "Approved\nSent from my phone, wrong draft - ignore",
        "Approved\nGet Outlook for iOS - scratch that, wrong thread",
        "מאשר\nנשלח מהר מדי, תתעלמו. טעות",
        "Hey stop!\nApproved",
        "Approved\n>50% discount must be removed first",
        "Approved ;)",
        "Approved :(",
        "Approved (!)",
    ],
)
def test_retractions_and_marks_beside_an_approval_are_read_even_below_a_sign_off(text: str) -> None:
    assert read_wording(text, ("Noa Bar", "Noa")).decision is not Decision.APPROVED


def test_an_approver_with_a_blank_recorded_name_is_still_judged() -> None:
    context = parse_context(context_yaml().replace("name: Noa Bar", "name: ' '"))
    request = ApprovalRequest(
        draft_id="d1",
        draft_digest="a" * 64,
        internet_message_id="<r@x>",
        provider_thread_id="t",
        approvers=(APPROVER,),
        sent_at=datetime(2026, 1, 1, tzinfo=UTC),
    )
    decision = judge_reply(
        context,
        request,
        sender=APPROVER,
        message_id="<m@x>",
        received_at=datetime(2026, 1, 2, tzinfo=UTC),
        body="Don't send.",
        now=datetime(2026, 1, 2, tzinfo=UTC),
    )
    assert decision.decision is Decision.CHANGES_REQUESTED
