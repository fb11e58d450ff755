"""Automated mail: business-day reminders and receipt acknowledgements, each sent once,
within the per-recipient cap, across runs, restarts and a provider that loses its answer."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import anyio
import anyio.lowlevel
import pytest

from agent.domain.dispositions import Disposition
from agent.domain.envelope import Address
from agent.domain.errors import ProviderError
from agent.domain.mail import Handover, Marker, OutgoingMessage, SendResult, StoredCopy
from agent.domain.records import SendIntent, SendState
from agent.domain.states import TaskState
from agent.services import outbound, workspaces
from agent.storage.sqlite import SqliteStore
from agent.testing import InMemoryProvider
from tests.conftest import context_yaml, run_intake
from tests.services.gates_world import APPROVER, CLIENT, MAILBOX, World

pytestmark = pytest.mark.anyio

ACKS = """\
receipt_ack: true
automation: {max_per_recipient_per_day: 3}
communication:
  ack_template: "קיבלנו את פנייתך ונחזור אליך."
  ack_templates: {en: "We received your message and will get back to you."}
"""


def _ctx(extra: str = "") -> str:
    return context_yaml(extra=extra).replace("receipt_ack: false\n", "")


def _reminders(box: InMemoryProvider) -> list[OutgoingMessage]:
    return [m for m in box.sent if m.subject.startswith("Reminder:")]


def _reminder_intent(world: World, name: str, **changes: Any) -> SendIntent:
    """A manual reminder intent to the approver, keyed and identified by ``name``."""
    return SendIntent(
        key=f"reminder|{name}",
        workspace_id=world.workspace_id,
        kind="reminder",
        task_id=None,
        internet_message_id=f"<{name}@fabrikam.test>",
        recipients=(APPROVER,),
        automated=False,
        **changes,
    )


def _reminder_to_approver(name: str) -> OutgoingMessage:
    """The message of ``_reminder_intent(world, name)``."""
    return OutgoingMessage(
        provider_thread_id="",
        sender=Address(address=MAILBOX),
        to=(Address(address=APPROVER),),
        subject="Reminder",
        text="x",
        internet_message_id=f"<{name}@fabrikam.test>",
    )


async def _waiting_since(world: World, moment: datetime) -> str:
    world.deliver(sender=CLIENT, thread=1, text="Please send the contract")
    await world.intake()
    task = world.only_task()
    world.store.transition_task(task.task_id, TaskState.WAITING_CLIENT, "asked the client", moment)
    return task.task_id


async def test_one_internal_reminder_after_the_business_days_never_twice_across_a_restart(
    make_world: Callable[..., World], data_dir: workspaces.DataDir
) -> None:
    world = make_world(_ctx())  # Asia/Jerusalem, weekend fri+sat, 2 business days
    wed = datetime(2026, 12, 23, 8, 0, tzinfo=UTC)  # Wednesday 10:00 in Jerusalem
    world.clock.moment = wed
    task_id = await _waiting_since(world, wed)
    # Thursday counts 1; Friday and Saturday are the weekend; Sunday 10:00 counts 2.
    for moment in (
        datetime(2026, 12, 24, 9, 0, tzinfo=UTC),
        datetime(2026, 12, 26, 20, 0, tzinfo=UTC),
        datetime(2026, 12, 27, 7, 59, tzinfo=UTC),
    ):
        world.clock.moment = moment
        await world.intake()
        assert _reminders(world.box) == []
    world.clock.moment = datetime(2026, 12, 27, 8, 0, tzinfo=UTC)
    result = await world.intake()
    [reminder] = _reminders(world.box)
    assert [a.address for a in reminder.to] == [APPROVER] and reminder.cc == ()
    assert CLIENT not in reminder.text and task_id in reminder.text
    assert any("sent" in line for line in result.reminders)
    world.clock.advance(hours=3)
    await world.intake()
    # A restart: a new store connection and a new provider object on the same data.
    store = SqliteStore(data_dir.database)
    restarted = World(
        store, data_dir, world.workspace_id, world.clock, box=InMemoryProvider(MAILBOX)
    )
    restarted.clock.advance(days=3)
    result = await restarted.intake()
    assert restarted.box.sent == [] and _reminders(world.box) == [reminder]
    assert any("already_sent" in line for line in result.reminders)
    [send] = [s for s in store.list_sends(world.workspace_id) if s.kind == "reminder"]
    assert send.state is SendState.CONFIRMED and send.recipients == (APPROVER,)
    store.close()


async def test_a_task_waiting_again_later_gets_one_reminder_for_the_new_waiting_period(
    make_world: Callable[..., World],
) -> None:
    world = make_world(_ctx())
    start = datetime(2026, 12, 21, 8, 0, tzinfo=UTC)  # Monday
    world.clock.moment = start
    task_id = await _waiting_since(world, start)
    world.clock.moment = start + timedelta(days=3)
    await world.intake()
    assert len(_reminders(world.box)) == 1
    world.store.transition_task(
        task_id, TaskState.TASK_RESOLVED, "client answered", world.clock.now()
    )
    world.store.transition_task(task_id, TaskState.WAITING_CLIENT, "asked again", world.clock.now())
    world.clock.advance(days=1)
    await world.intake()
    assert len(_reminders(world.box)) == 1
    world.clock.advance(days=3)
    await world.intake()
    await world.intake()
    assert len(_reminders(world.box)) == 2


class LosesTheAnswer(InMemoryProvider):
    """Accepts the message, then the connection drops before its answer arrives."""

    def __init__(self, mailbox_id: str) -> None:
        super().__init__(mailbox_id)
        self.drop_next = True

    async def send(self, handover: Handover) -> SendResult:
        result = await super().send(handover)
        if self.drop_next:
            self.drop_next = False
            raise ProviderError("connection reset after the message was accepted")
        return result


async def test_a_lost_answer_is_resolved_from_the_sent_copy_and_the_reminder_is_not_resent(
    make_world: Callable[..., World],
) -> None:
    world = make_world(_ctx())
    world.box = LosesTheAnswer(MAILBOX)
    start = datetime(2026, 12, 21, 8, 0, tzinfo=UTC)
    world.clock.moment = start
    await _waiting_since(world, start)
    world.clock.moment = start + timedelta(days=3)
    result = await world.intake()
    assert any("send failed" in line for line in result.reminders)
    assert len(world.box.sent) == 1
    world.clock.advance(minutes=1)
    result = await world.intake()
    assert len(world.box.sent) == 1  # read back, not sent again
    assert any("recovered" in line for line in result.reminders)


async def test_an_acknowledgement_goes_once_in_the_thread_and_language_with_only_the_template(
    make_world: Callable[..., World],
) -> None:
    world = make_world(_ctx(ACKS))
    he = world.deliver(sender=CLIENT, thread=1, text="שלום, אפשר הצעת מחיר?", subject="הצעת מחיר")
    en = world.deliver(sender=CLIENT, thread=2, text="Hello, can I get a quote?", subject="Quote")
    result = await world.intake()
    assert [i.disposition for i in result.items] == [Disposition.ACK_SENT] * 2
    by_parent = {m.in_reply_to: m for m in world.box.sent}
    he_ack, en_ack = by_parent[he.internet_message_id], by_parent[en.internet_message_id]
    assert he_ack.provider_thread_id == "thread-1" and en_ack.provider_thread_id == "thread-2"
    assert [a.address for a in he_ack.to] == [CLIENT] and he_ack.cc == ()
    assert he_ack.subject == "Re: הצעת מחיר"
    assert "קיבלנו את פנייתך ונחזור אליך." in he_ack.text and 'dir="rtl"' in (he_ack.html or "")
    assert "We received your message and will get back to you." in en_ack.text
    # Nothing beyond the template: no greeting, no signature, no other sentence.
    assert en_ack.text.strip().strip("\u200e\u200f") == (
        "We received your message and will get back to you."
    )
    replay = await world.intake(from_start=True)
    assert {i.disposition for i in replay.items} == {Disposition.EXECUTION_ALREADY_DONE}
    assert len(world.box.sent) == 2


async def test_acknowledgements_respect_the_per_recipient_cap(
    make_world: Callable[..., World],
) -> None:
    world = make_world(_ctx(ACKS))
    for n in range(5):
        world.deliver(sender=CLIENT, thread=n, text="Hello", subject=f"Topic {n}")
    result = await world.intake()
    dispositions = [i.disposition for i in result.items]
    assert dispositions.count(Disposition.ACK_SENT) == 3
    assert dispositions.count(Disposition.QUEUED) == 2
    held = [i for i in result.items if i.disposition is Disposition.QUEUED]
    assert all("max_per_recipient_per_day" in i.detail for i in held)
    assert len(world.box.sent) == 3
    # A day later the cap has room again.
    world.clock.advance(hours=24, seconds=1)
    world.deliver(sender=CLIENT, thread=9, text="Hello again", subject="Topic 9")
    result = await world.intake()
    assert [i.disposition for i in result.items if i.task_created] == [Disposition.ACK_SENT]


@pytest.mark.parametrize(
    ("text_changes", "sender", "changes"),
    [
        ("", "someone@unknown.test", {}),
        ("", CLIENT, {"attachment_refs": ("pm/0",), "attachment_names": ("a.pdf",)}),
        ("receipt_ack: false\n", CLIENT, {}),
    ],
    ids=["unknown-sender", "not-routine-attachment", "option-off"],
)
async def test_no_acknowledgement_outside_its_bounds(
    make_world: Callable[..., World], text_changes: str, sender: str, changes: dict[str, Any]
) -> None:
    extra = ACKS.replace("receipt_ack: true\n", text_changes or "receipt_ack: true\n")
    world = make_world(_ctx(extra))
    world.deliver(sender=sender, thread=1, text="Hello", **changes)
    result = await world.intake()
    assert [i.disposition for i in result.items] == [Disposition.QUEUED]
    assert world.box.sent == []


# -- acknowledgements across mailboxes and held sends --------------------------------------


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


# -- one send per intent, however many try -------------------------------------------------


async def test_recovering_a_stale_intent_sends_once_however_many_workers_try(
    make_world: Callable[..., World],
) -> None:
    world = make_world(context_yaml())
    intent = _reminder_intent(world, "stale", holder="another-host:1:1")
    world.store.begin_send(intent, world.clock.now() - timedelta(minutes=11))
    message = _reminder_to_approver("stale")
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


class SlowReadBack(InMemoryProvider):
    async def find_sent(self, marker: Marker) -> StoredCopy | None:
        await anyio.lowlevel.checkpoint()  # yields, as a network read would
        return await super().find_sent(marker)


async def test_two_coroutines_of_one_worker_never_send_one_intent_twice(
    make_world: Callable[..., World],
) -> None:
    world = make_world(context_yaml())
    world.box = SlowReadBack(MAILBOX)
    intent = _reminder_intent(world, "mine")
    message = _reminder_to_approver("mine")
    mine = intent.model_copy(update={"holder": outbound.current_holder()})
    world.store.begin_send(mine, world.clock.now() - timedelta(minutes=1))  # an earlier attempt

    async def worker() -> None:
        await outbound.send_once(world.store, world.box, intent, message, world.clock)

    async with anyio.create_task_group() as group:
        for _ in range(3):
            group.start_soon(worker)
    assert len(world.box.sent) == 1
