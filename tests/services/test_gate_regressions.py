"""Gate regressions: each test is a way the rules were once wrong, written as the behaviour
they must keep."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

import anyio
import anyio.lowlevel
import pytest

from agent.domain.approval import ApprovalRequest, Decision, judge_reply, read_wording
from agent.domain.context import parse_context
from agent.domain.dispositions import Disposition
from agent.domain.envelope import Address, Envelope
from agent.domain.errors import GateRefused
from agent.domain.mail import OutgoingMessage
from agent.domain.records import SendIntent
from agent.domain.states import TaskState
from agent.providers import rfc822
from agent.services import approvals, closure, outbound, workspaces
from agent.testing import InMemoryProvider
from tests.conftest import context_yaml, run_intake
from tests.services.gates_world import APPROVER, CLIENT, COLLEAGUE, MAILBOX, World, with_colleague

pytestmark = pytest.mark.anyio

SECOND_APPROVER = "maya.sade@fabrikam.test"
TWO_APPROVERS = with_colleague(context_yaml()).replace(
    "contacts:\n",
    "contacts:\n  - {address: maya.sade@fabrikam.test, name: Maya Sade, side: internal, "
    "roles: [approver]}\n",
    1,
)


async def _requested(world: World) -> tuple[str, str]:
    world.deliver(sender=CLIENT, thread=1, text="Quote please")
    await world.intake()
    task = world.to_draft_ready(world.only_task().task_id)
    request = await approvals.request_approval(
        world.store, world.box, task.task_id, "d1", world.render(task), (CLIENT,), world.clock
    )
    return task.task_id, request.internet_message_id


async def test_one_approvers_change_request_is_not_overridden_by_anothers_approval(
    make_world: Callable[..., World],
) -> None:
    world = make_world(TWO_APPROVERS)
    task_id, request = await _requested(world)
    world.clock.advance(minutes=1)
    world.deliver(sender=APPROVER, thread="a", text="Please change the price.", in_reply_to=request)
    await world.intake()
    world.clock.advance(minutes=1)
    world.deliver(sender=SECOND_APPROVER, thread="a", text="Approved.", in_reply_to=request)
    await world.intake()
    task = world.task(task_id)
    assert task.state is TaskState.CHANGES_REQUESTED
    assert not world.gate(task, world.render(task), (CLIENT,)).ready


async def test_decisions_count_in_the_order_they_were_written_not_processed(
    make_world: Callable[..., World],
) -> None:
    world = make_world(TWO_APPROVERS)
    task_id, request = await _requested(world)
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


async def test_a_reservation_after_an_approval_suspends_it(
    make_world: Callable[..., World],
) -> None:
    world = make_world(TWO_APPROVERS)
    task_id, request = await _requested(world)
    world.clock.advance(minutes=1)
    world.deliver(sender=APPROVER, thread="a", text="Approved.", in_reply_to=request)
    await world.intake()
    assert world.task(task_id).state is TaskState.APPROVED_TO_SEND
    world.clock.advance(minutes=1)
    world.deliver(sender=APPROVER, thread="a", text="Hold on, wait - let me check with legal.",
                  in_reply_to=request)  # fmt: skip
    await world.intake()
    task = world.task(task_id)
    assert task.state is TaskState.WAITING_INTERNAL_APPROVAL
    assert not world.gate(task, world.render(task), (CLIENT,)).ready


async def test_an_approvers_answer_to_a_colleague_in_the_thread_is_not_an_answer_to_the_request(
    make_world: Callable[..., World],
) -> None:
    world = make_world(TWO_APPROVERS)
    task_id, request = await _requested(world)
    world.clock.advance(minutes=1)
    note = world.deliver(sender=COLLEAGUE, thread="a", text="Drop the discount line first?",
                         in_reply_to=request)  # fmt: skip
    await world.intake()
    world.clock.advance(minutes=1)
    world.deliver(
        sender=APPROVER,
        thread="a",
        text="Approved.",
        in_reply_to=note.internet_message_id,
        references=(request, note.internet_message_id or ""),
    )
    await world.intake()
    assert world.task(task_id).state is TaskState.WAITING_INTERNAL_APPROVAL


async def test_asking_again_for_the_same_draft_after_changes_sends_a_new_request(
    make_world: Callable[..., World],
) -> None:
    world = make_world(TWO_APPROVERS)
    task_id, request = await _requested(world)
    world.clock.advance(minutes=1)
    world.deliver(sender=APPROVER, thread="a", text="Please fix the date.", in_reply_to=request)
    await world.intake()
    world.store.transition_task(task_id, TaskState.DRAFT_READY, "kept as is", world.clock.now())
    task = world.task(task_id)
    again = await approvals.request_approval(
        world.store, world.box, task_id, "d1", world.render(task), (CLIENT,), world.clock
    )
    assert again.internet_message_id != request
    task = world.task(task_id)
    assert task.state is TaskState.WAITING_INTERNAL_APPROVAL
    assert len([m for m in world.box.sent if m.subject.startswith("Approval needed")]) == 2


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


async def test_a_line_separator_in_a_subject_neither_crashes_intake_nor_reaches_a_header(
    tmp_path: Path,
) -> None:
    raw = (
        b"From: Dana Levi <dana.levi@contoso.test>\r\nTo: support@fabrikam.test\r\n"
        b"Subject: =?utf-8?q?Quote=E2=80=A8Bcc:_x=40evil.test?=\r\n"
        b"Message-ID: <ls@contoso.test>\r\n\r\nHello\r\n"
    )
    envelope = rfc822.normalize(
        raw,
        provider="maildir",
        mailbox_id=MAILBOX,
        provider_message_id="p1",
        thread_id_for=lambda *_: "t",
        fallback_received_at=datetime.now(UTC),
    )
    assert "\u2028" not in envelope.subject and "Bcc:" in envelope.subject
    message = OutgoingMessage(
        provider_thread_id="t",
        sender=Address(address=MAILBOX),
        to=(Address(address=CLIENT),),
        subject="Re: a\u2029b\rc",
        text="x",
        internet_message_id="<o@x>",
    )
    assert message.subject == "Re: a b c"


class Exploding(InMemoryProvider):
    async def fetch_body(self, body_ref: str) -> object:  # type: ignore[override]
        if body_ref == "pm-1":
            raise ValueError("a bug in an adapter")
        return await super().fetch_body(body_ref)


async def test_an_unexpected_error_in_one_item_does_not_stop_the_others(
    make_world: Callable[..., World],
) -> None:
    acks = "receipt_ack: true\ncommunication: {ack_templates: {en: We got it.}}\n"
    world = make_world(context_yaml(extra=acks).replace("receipt_ack: false\n", ""))
    world.box = Exploding(MAILBOX)
    world.deliver(sender=CLIENT, thread=1, text="first")
    world.deliver(sender=CLIENT, thread=2, text="second")
    result = await world.intake()
    assert len(result.item_errors) == 1 and "ValueError" in result.item_errors[0]
    assert [i.disposition for i in result.items] == [Disposition.ACK_SENT]
    assert any("intake item" in h.key for h in world.store.list_health())


async def test_one_acknowledgement_for_a_message_received_by_two_of_the_workspaces_mailboxes(
    make_world: Callable[..., World],
) -> None:
    text = (
        context_yaml(extra="receipt_ack: true\ncommunication: {ack_templates: {en: We got it.}}\n")
        .replace("receipt_ack: false\n", "")
        .replace(
            "mailboxes:\n",
            "mailboxes:\n  - {mailbox_id: sales@fabrikam.test, provider: memory}\n",
        )
        .replace(
            "mailboxes: [support@fabrikam.test]",
            "mailboxes: [support@fabrikam.test, sales@fabrikam.test]",
        )
    )
    world = make_world(text)
    sales = InMemoryProvider("sales@fabrikam.test")
    envelope = world.deliver(sender=CLIENT, thread=1, text="Hello")
    sales.deliver(envelope.model_copy(update={"mailbox_id": "sales@fabrikam.test"}), "Hello")
    result = await run_intake(world.store, world.data_dir, world.workspace_id, world.clock,
                              world.box, sales)  # fmt: skip
    assert [i.disposition for i in result.items] == [Disposition.ACK_SENT] * 2
    assert len(world.box.sent) + len(sales.sent) == 1


@pytest.mark.parametrize(
    ("old", "new"),
    [
        ("client_send_policy: draft_for_internal_approval", "client_send_policy: sends_disabled"),
        ("licence: active", "licence: suspended"),
    ],
)
async def test_no_acknowledgement_while_client_sends_are_held_or_the_licence_fails(
    make_world: Callable[..., World], old: str, new: str
) -> None:
    text = context_yaml(extra="receipt_ack: true\ncommunication: {ack_templates: {en: Got it.}}\n")
    world = make_world(text.replace("receipt_ack: false\n", "").replace(old, new))
    world.deliver(sender=CLIENT, thread=1, text="Hello")
    await world.intake()
    assert world.box.sent == []


async def test_a_failed_preflight_stops_reminders_approval_requests_and_status_replies(
    make_world: Callable[..., World], tmp_path: Path
) -> None:
    world = make_world(with_colleague(context_yaml()))
    world.deliver(sender=COLLEAGUE, thread=1, text="Numbers please")
    await world.intake()
    task = world.only_task()
    world.to_draft_ready(task.task_id)
    source = tmp_path / "suspended.yaml"
    source.write_text(with_colleague(context_yaml(licence="suspended")), encoding="utf-8")
    workspaces.update_workspace(world.store, world.data_dir, source, world.clock.now())
    with pytest.raises(GateRefused, match="preflight"):
        await approvals.request_approval(
            world.store, world.box, task.task_id, "d1", world.render(task), (CLIENT,), world.clock
        )
    with pytest.raises(GateRefused, match="preflight"):
        await closure.reply_to_requester(
            world.store, world.box, task.task_id, complete="a", remaining="b", clock=world.clock
        )
    assert world.box.sent == []


async def test_recovering_a_stale_intent_sends_once_however_many_workers_try(
    make_world: Callable[..., World],
) -> None:
    world = make_world(context_yaml())
    intent = SendIntent(
        key="reminder|stale",
        workspace_id=world.workspace_id,
        kind="reminder",
        task_id=None,
        internet_message_id="<stale@fabrikam.test>",
        recipients=(APPROVER,),
        automated=False,
        holder="another-host:1:1",
    )
    world.store.begin_send(intent, world.clock.now() - timedelta(minutes=11))
    message = OutgoingMessage(
        provider_thread_id="",
        sender=Address(address=MAILBOX),
        to=(Address(address=APPROVER),),
        subject="Reminder",
        text="x",
        internet_message_id="<stale@fabrikam.test>",
    )
    outcomes: list[outbound.SendStatus] = []

    async def worker(n: int) -> None:
        mine = intent.model_copy(update={"holder": f"this-host:{n}:1"})
        outcomes.append((await outbound.send_once(world.store, world.box, mine, message,
                                                  world.clock)).status)  # fmt: skip

    async with anyio.create_task_group() as group:
        for n in range(4):
            group.start_soon(worker, n)
    assert len(world.box.sent) == 1
    assert sorted(outcomes).count(outbound.SendStatus.SENT) == 1


async def test_a_colleagues_reply_to_a_reminder_does_not_resume_a_task_waiting_on_the_client(
    make_world: Callable[..., World],
) -> None:
    world = make_world(with_colleague(context_yaml()))
    world.deliver(sender=CLIENT, thread=1)
    await world.intake()
    task = world.only_task()
    world.store.transition_task(task.task_id, TaskState.WAITING_CLIENT, "asked", world.clock.now())
    world.clock.advance(hours=1)
    world.deliver(sender=APPROVER, thread=1, text="I'll call them tomorrow")
    result = await world.intake()
    assert [i.disposition for i in result.items if i.task_id][-1] is Disposition.WAITING_CLIENT
    after = world.task(task.task_id)
    assert after.state is TaskState.WAITING_CLIENT and after.requester is None


async def test_the_requester_loop_reopens_when_the_requester_asks_again(
    make_world: Callable[..., World],
) -> None:
    world = make_world(with_colleague(context_yaml()))
    world.deliver(sender=COLLEAGUE, thread=1, text="Q3 numbers please")
    await world.intake()
    task = world.only_task()
    await closure.reply_to_requester(world.store, world.box, task.task_id, complete="Q3",
                                     remaining="", clock=world.clock)  # fmt: skip
    assert world.task(task.task_id).requester_loop_closed
    world.clock.advance(hours=1)
    world.deliver(sender=COLLEAGUE, thread=1, text="Now Q4 too please")
    await world.intake()
    assert not world.task(task.task_id).requester_loop_closed
    with pytest.raises(GateRefused):
        closure.release(world.store, task.task_id, TaskState.COMPLETED, "done", world.clock)


@pytest.mark.parametrize(
    "sender",
    [
        "noa.bar@fabrikam.test <attacker@evil.test>",
        "Noa <noa.bar@fabrikam.test> <attacker@evil.test>",
        "<noa.bar@fabrikam.test>@evil.test",
    ],
)
def test_an_ambiguous_from_header_gives_no_sender_at_all(sender: str) -> None:
    raw = f"From: {sender}\r\nTo: {MAILBOX}\r\nSubject: x\r\nMessage-ID: <a@b>\r\n\r\nx\r\n"
    envelope: Envelope = rfc822.normalize(
        raw.encode(),
        provider="maildir",
        mailbox_id=MAILBOX,
        provider_message_id="p",
        thread_id_for=lambda *_: "t",
        fallback_received_at=datetime.now(UTC),
    )
    assert envelope.sender.address == "unknown-sender@invalid"
    assert any("exactly one mailbox" in n for n in envelope.normalization_notes)


# -- withdrawals, reading HTML and headers, concurrency ---------------------------------


async def _approved(world: World) -> tuple[str, str, str]:
    task_id, request = await _requested(world)
    world.clock.advance(minutes=1)
    approval = world.deliver(sender=APPROVER, thread="a", text="Approved.", in_reply_to=request)
    await world.intake()
    assert world.task(task_id).state is TaskState.APPROVED_TO_SEND
    assert approval.internet_message_id is not None
    return task_id, request, approval.internet_message_id


def _ready(world: World, task_id: str) -> bool:
    task = world.task(task_id)
    return world.gate(task, world.render(task), (CLIENT,)).ready


async def test_a_withdrawal_replying_to_the_approvers_own_approval_suspends_it(
    make_world: Callable[..., World],
) -> None:
    world = make_world(TWO_APPROVERS)
    task_id, request, approval = await _approved(world)
    world.clock.advance(minutes=1)
    world.deliver(sender=APPROVER, thread="a", text="Wait - don't send! The price is wrong.",
                  in_reply_to=approval, references=(request, approval))  # fmt: skip
    await world.intake()
    assert world.task(task_id).state is TaskState.CHANGES_REQUESTED
    assert not _ready(world, task_id)


async def test_a_bottom_posted_withdrawal_is_read_below_the_quote(
    make_world: Callable[..., World],
) -> None:
    world = make_world(TWO_APPROVERS)
    task_id, request, _ = await _approved(world)
    world.clock.advance(minutes=1)
    text = (
        "On Mon, 30 Nov 2026 at 10:00, Noa Bar <noa.bar@fabrikam.test> wrote:\n"
        "> Approved.\n\nDon't send, the price is wrong."
    )
    world.deliver(sender=APPROVER, thread="a", text=text, in_reply_to=request)
    await world.intake()
    assert not _ready(world, task_id)


async def test_parts_that_disagree_are_read_most_strictly(
    make_world: Callable[..., World],
) -> None:
    world = make_world(TWO_APPROVERS)
    task_id, request, _ = await _approved(world)
    world.clock.advance(minutes=1)
    world.deliver(
        sender=APPROVER,
        thread="a",
        text="Approved, so do\nnot send it yet.",
        html="<p class=MsoNormal>Approved, so do\nnot send it yet.</p>",
        in_reply_to=request,
    )
    await world.intake()
    assert not _ready(world, task_id)


async def test_an_approval_in_struck_or_hidden_html_does_not_approve(
    make_world: Callable[..., World],
) -> None:
    world = make_world(TWO_APPROVERS)
    task_id, request = await _requested(world)
    world.clock.advance(minutes=1)
    world.deliver(sender=APPROVER, thread="a", text="", html="<p><del>Approved</del></p>",
                  in_reply_to=request)  # fmt: skip
    await world.intake()
    assert world.task(task_id).state is TaskState.WAITING_INTERNAL_APPROVAL


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
def test_more_words_around_an_approval_are_read(text: str) -> None:
    assert read_wording(text, ("Noa Bar", "Noa")).decision is not Decision.APPROVED


async def test_an_approver_removed_from_the_context_no_longer_approves_at_send_time(
    make_world: Callable[..., World], tmp_path: Path
) -> None:
    world = make_world(TWO_APPROVERS)
    task_id, _, _ = await _approved(world)
    assert _ready(world, task_id)
    source = tmp_path / "demoted.yaml"
    source.write_text(
        TWO_APPROVERS.replace("roles: [approver, client_manager]", "roles: [client_manager]"),
        encoding="utf-8",
    )
    workspaces.update_workspace(world.store, world.data_dir, source, world.clock.now())
    assert not _ready(world, task_id)


async def test_one_approvers_reservation_is_not_cleared_by_anothers_approval(
    make_world: Callable[..., World],
) -> None:
    world = make_world(TWO_APPROVERS)
    task_id, request = await _requested(world)
    world.clock.advance(minutes=1)
    world.deliver(sender=SECOND_APPROVER, thread="a", text="Hmm, let me think about it.",
                  in_reply_to=request)  # fmt: skip
    await world.intake()
    world.clock.advance(minutes=1)
    world.deliver(sender=APPROVER, thread="a", text="Approved.", in_reply_to=request)
    await world.intake()
    assert world.task(task_id).state is TaskState.WAITING_INTERNAL_APPROVAL
    assert not _ready(world, task_id)


class SlowReadBack(InMemoryProvider):
    async def read_back(self, internet_message_id: str) -> object:  # type: ignore[override]
        await anyio.lowlevel.checkpoint()  # yields, as a network read would
        return await super().read_back(internet_message_id)


async def test_two_coroutines_of_one_worker_never_send_one_intent_twice(
    make_world: Callable[..., World],
) -> None:
    world = make_world(context_yaml())
    world.box = SlowReadBack(MAILBOX)
    intent = SendIntent(
        key="reminder|mine",
        workspace_id=world.workspace_id,
        kind="reminder",
        task_id=None,
        internet_message_id="<mine@fabrikam.test>",
        recipients=(APPROVER,),
        automated=False,
    )
    message = OutgoingMessage(
        provider_thread_id="",
        sender=Address(address=MAILBOX),
        to=(Address(address=APPROVER),),
        subject="Reminder",
        text="x",
        internet_message_id="<mine@fabrikam.test>",
    )
    mine = intent.model_copy(update={"holder": outbound.current_holder()})
    world.store.begin_send(mine, world.clock.now() - timedelta(minutes=1))  # an earlier attempt

    async def worker() -> None:
        await outbound.send_once(world.store, world.box, intent, message, world.clock)

    async with anyio.create_task_group() as group:
        for _ in range(3):
            group.start_soon(worker)
    assert len(world.box.sent) == 1


@pytest.mark.parametrize(
    "sender", ["noa@=?utf-8?q?ours=2Ecom?=", "=?utf-8?q?noa?=@ours.com", "noa@ours.com <>", "<@>"]
)
def test_an_encoded_or_empty_address_gives_no_sender(sender: str) -> None:
    raw = f"From: {sender}\r\nTo: {MAILBOX}\r\nSubject: x\r\nMessage-ID: <a@b>\r\n\r\nx\r\n"
    envelope = rfc822.normalize(
        raw.encode(),
        provider="maildir",
        mailbox_id=MAILBOX,
        provider_message_id="p",
        thread_id_for=lambda *_: "t",
        fallback_received_at=datetime.now(UTC),
    )
    assert envelope.sender.address == "unknown-sender@invalid"


@pytest.mark.parametrize("mid", ["<", "<@", "<a@", "<[>", "<a@["])
def test_a_bounce_whose_original_has_a_broken_message_id_still_normalizes(mid: str) -> None:
    raw = (
        "From: MAILER-DAEMON@mx.test\r\nTo: support@fabrikam.test\r\nSubject: failure\r\n"
        "Message-ID: <dsn@mx.test>\r\nMIME-Version: 1.0\r\n"
        'Content-Type: multipart/report; report-type=delivery-status; boundary="b"\r\n\r\n'
        "--b\r\nContent-Type: text/plain\r\n\r\nfailed\r\n"
        "--b\r\nContent-Type: message/delivery-status\r\n\r\n"
        "Reporting-MTA: dns; mx.test\r\n\r\nFinal-Recipient: rfc822; x@y.test\r\n"
        "Action: failed\r\nStatus: 5.1.1\r\n\r\n"
        f"--b\r\nContent-Type: message/rfc822\r\n\r\nMessage-ID: {mid}\r\nSubject: hi\r\n\r\nbody\r\n"
        "--b--\r\n"
    )
    envelope = rfc822.normalize(
        raw.encode(),
        provider="maildir",
        mailbox_id=MAILBOX,
        provider_message_id="p",
        thread_id_for=lambda *_: "t",
        fallback_received_at=datetime.now(UTC),
    )
    assert envelope.report_failed and envelope.report_type == "delivery-status"


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
