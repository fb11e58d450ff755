"""The lifecycle core's contract through an adapter's channels, shipped as a base class over
the same ``MailboxHooks`` the MailProvider contract uses (its extension point)::

    class TestCoreOnMyAdapter(OnMyAdapter, ChannelLifecycleContract): ...

It drives the real core - a SQLite store opened with ``open_store`` in ``self.where``, a
workspace registered from a context that binds the test's mailbox (its ``provider`` is the
adapter's mail system, its ``path`` the hooks' ``context_path``), ``intake.run_cycle`` with a
``provider_for`` that returns ``self.build(channel=...)``, and ``outbound.send_once`` - and
proves what docs/lifecycle.md promises in "Mail system, channel and keys" and "Sending
exactly once, whatever the channel": the same message read again, or through another channel
of its mailbox, is one occurrence and one task; a follow-up joins its thread's task and a
message that only looks like it does not; a run reads each message once; a lost or late
answer to a send is settled from the sent copy, through the channel that sent it or another
that can search its marker, and never sent twice; a channel that keeps no copy hands a lost
send to a person; and a whole cycle changes nothing in the mailbox but the sent copies.

Channels. ``channels[0]`` is the first channel. The second channel is the first other
channel in ``channels`` whose ``capabilities.native_threads`` is the first's: a mailbox's
channels either all show the mail system's thread id or none do (then the store keeps thread
aliases). A mailbox whose permitted channels mix the two is not a supported configuration:
its threads would be keyed by the native id through some channels and by an alias through
the others. An adapter with no such other channel (a Maildir has one channel) runs the
cross-channel tests through its first channel again. A send needs no shared thread id, so a
send is settled through the second channel when it fits the test (it can, or cannot, search
the marker kind the send recorded), else through the first other channel that fits.

The core's clock is a ``FrozenClock`` (``core_clock``) that starts where the test clocks
start; a test that lets a sent copy's latency pass moves it and the mailbox (``advance``)
together. The hooks' ``sent_copies`` counts what went out; a test needing a fault the
adapter cannot produce is skipped with the adapter's reason (``needs``). The suite keeps its
own state in ``core_store``, ``data_dir`` and ``core_clock``: an adapter's hooks use other
names.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from functools import partial

import pytest

from agent.domain.dispositions import Disposition
from agent.domain.errors import HandoverRefused, InvalidRequest
from agent.domain.execution import ClaimOutcome
from agent.domain.mail import (
    Handover,
    MarkerKind,
    OutgoingMessage,
    SendResult,
)
from agent.domain.records import SendIntent, SendRecord, SendState
from agent.domain.task import Task
from agent.ports import EmbeddedStore
from agent.providers import mime
from agent.rendering.render import render_message
from agent.services import intake, outbound
from agent.services.holder import current_holder
from agent.services.workspaces import DataDir, add_workspace
from agent.storage.backend import open_store
from agent.testing.clocks import FrozenClock
from agent.testing.contexts import context_yaml
from agent.testing.faults import Passthrough
from agent.testing.providers import CLIENT, Fault, MailboxHooks, raw_message

WORKSPACE = "ws-channels-0001"
FIRST = "<c1@contoso.test>"
FOLLOW_UP = "<c2@contoso.test>"
LOOKALIKE = "<c9@contoso.test>"
COUNTED = ("executions", "tasks", "task_threads", "task_messages", "escalations", "sends")
"""What a read that creates nothing leaves as it was (the run ledger grows by its items)."""
ELSEWHERE = "worker-2.test/unseen/4242/0/restart1"
"""Another worker, on another machine (a failover seldom happens in the same process)."""
MAX_MESSAGES = 20
"""The most messages a test delivers to read more than one page."""


def lookalike() -> bytes:
    """Message 9: the first message's subject, sender and Date, and no reference to it."""
    raw = raw_message(9)
    assert b"Subject: Invoice 9" in raw
    return raw.replace(b"Subject: Invoice 9", b"Subject: Invoice 1", 1)


class ChannelLifecycleContract(MailboxHooks):
    """Occurrences, tasks and sends of the real core through one mailbox's channels (see the
    module)."""

    core_store: EmbeddedStore
    data_dir: DataDir
    core_clock: FrozenClock

    @pytest.fixture(autouse=True)
    def _core(self, _mailbox_directory: None) -> Iterator[None]:
        root = self.where / "core"
        root.mkdir()
        self.data_dir = DataDir(root)
        self.core_clock = FrozenClock()
        self.core_store = open_store(None, self.data_dir.database)
        provider = self.build()
        text = context_yaml(
            WORKSPACE,
            mailbox=provider.mailbox_id,
            provider=provider.provider,
            path=self.context_path(),
            mailbox_fields=self.context_fields(),
        )
        source = self.where / "context.yaml"
        source.write_text(text, encoding="utf-8")
        add_workspace(self.core_store, self.data_dir, source, self.core_clock.now())
        yield
        self.core_store.close()

    # -- channels ----------------------------------------------------------------------

    @property
    def first(self) -> str:
        return self.channels[0]

    @property
    def second(self) -> str:
        """The first other channel showing threads as the first does, else the first."""
        native = self.build(channel=self.first).capabilities.native_threads
        for other in self.channels[1:]:
            if self.build(channel=other).capabilities.native_threads == native:
                return other
        return self.first

    def settler(self, kind: MarkerKind, *, searches: bool) -> str | None:
        """A channel other than the first that can (``searches``) or cannot search ``kind``:
        the second channel if it fits, else the first other channel in ``channels`` that
        does; the first channel itself for a one-channel adapter that searches it."""
        others = [self.second, *(c for c in self.channels[1:] if c != self.second)]
        for channel in others:
            if channel != self.first and searches == self.finds(channel, kind):
                return channel
        if len(self.channels) == 1 and searches:
            return self.first
        return None

    def settling(self, *, searches: bool) -> tuple[MarkerKind, str]:
        """A marker kind the first channel sets and a ``settler`` for it (the test is skipped,
        saying why, when the adapter's channels offer none)."""
        for kind in self.markers_of(self.first):
            channel = self.settler(kind, searches=searches)
            if channel is not None:
                return kind, channel
        what = "searches a marker" if searches else "is blind to a marker"
        pytest.skip(f"no other channel of {type(self).__name__} {what} {self.first} sets")

    def markers_of(self, channel: str) -> tuple[MarkerKind, ...]:
        return self.build(channel=channel).capabilities.markers

    def finds(self, channel: str, kind: MarkerKind) -> bool:
        return self.build(channel=channel).capabilities.finds(kind)

    # -- the core ----------------------------------------------------------------------

    async def cycle(self, channel: str, *, from_start: bool = False) -> intake.RunResult:
        """One intake cycle of the workspace, its mailbox read through ``channel``."""
        result = await intake.run_cycle(
            store=self.core_store,
            data_dir=self.data_dir,
            workspace_id=WORKSPACE,
            provider_for=lambda _workspace, _binding: self.build(channel=channel),
            clock=self.core_clock,
            from_start=from_start,
        )
        assert (result.access_errors, result.item_errors) == ([], [])
        assert result.reconciliation is not None and result.reconciliation.clean
        return result

    async def failover(self) -> intake.RunResult:
        """A cycle through the second channel: a plain run (a channel's cursor is its own),
        or a replay when the second channel is the first again."""
        return await self.cycle(self.second, from_start=self.second == self.first)

    def by_message(self, result: intake.RunResult) -> dict[str | None, intake.ItemOutcome]:
        """The run's outcomes by the Message-ID of the item each decided (each read once)."""
        mids = {
            entry.item_ref: entry.scanned.envelope.internet_message_id
            for entry in self.core_store.ledger(result.run_id)
            if entry.scanned is not None and entry.scanned.envelope is not None
        }
        assert len(mids) == len(result.items), "every item the run read has an envelope"
        found = {mids[outcome.item_ref]: outcome for outcome in result.items}
        assert len(found) == len(result.items), "a run reads each message once"
        return found

    def counted(self) -> dict[str, int]:
        counts = self.core_store.counts()
        return {name: counts[name] for name in COUNTED}

    def tasks(self) -> list[Task]:
        return self.core_store.list_tasks(WORKSPACE)

    async def first_task(self) -> Task:
        """Deliver the client's first message, read it through the first channel: its task."""
        self.deliver(raw_message(1))
        outcome = self.by_message(await self.cycle(self.first))[FIRST]
        assert outcome.claim is ClaimOutcome.CLAIMED and outcome.task_created
        assert outcome.task_id is not None
        task = self.core_store.get_task(outcome.task_id)
        assert task is not None
        return task

    def reply(self, task: Task, key: str = "reply|1") -> tuple[SendIntent, OutgoingMessage]:
        """Our reply to the first message, ledgered under ``key``; its text carries the
        send's body token, so a channel that marks copies by one can mark it."""
        mid = outbound.message_id_for(key, task.mailbox_id)
        return outbound.outgoing(
            key=key,
            kind="client_reply",
            workspace_id=WORKSPACE,
            task_id=task.task_id,
            mailbox_id=task.mailbox_id,
            to=(CLIENT,),
            subject="Re: Invoice 1",
            text=f"We are on it.\n\nReference: {mime.send_token(mid)}",
            thread_id=task.provider_thread_id,
            in_reply_to=FIRST,
            references=(FIRST,),
        )

    async def send(
        self,
        channel: str,
        task: Task,
        *,
        markers: tuple[MarkerKind, ...] | None = None,
        key: str = "reply|1",
        holder: str = "",
    ) -> outbound.SendOutcome:
        """``send_once`` of the reply under ``key`` through a new instance of ``channel``, by
        this worker or by ``holder``."""
        provider = self.build(channel=channel, markers=markers)
        intent, message = self.reply(task, key)
        intent = intent.model_copy(update={"holder": holder})
        try:
            return await outbound.send_once(
                self.core_store, provider, intent, message, self.core_clock
            )
        finally:
            await provider.aclose()

    async def sent_as(self, record: SendRecord) -> str | None:
        """The Message-ID of the send's stored copy, read through the first channel."""
        provider = self.build(channel=self.first)
        try:
            copy = await provider.find_sent(outbound.marker_of(record))
        finally:
            await provider.aclose()
        assert copy is not None
        return copy.internet_message_id

    def copies(self, task: Task, key: str = "reply|1") -> int:
        return self.sent_copies(outbound.message_id_for(key, task.mailbox_id))

    def pass_time(self, delta: timedelta) -> None:
        """Let ``delta`` pass for the mailbox and the core alike."""
        self.advance(delta)
        self.core_clock.advance(seconds=delta.total_seconds())

    # -- occurrences and tasks ---------------------------------------------------------

    @pytest.mark.anyio
    async def test_a_message_read_again_or_through_the_second_channel_is_one_occurrence(
        self,
    ) -> None:
        task = await self.first_task()
        before = self.counted()
        replay = partial(self.cycle, self.first, from_start=True)
        for again in (replay, self.failover):
            outcome = self.by_message(await again())[FIRST]
            assert outcome.claim is ClaimOutcome.EXECUTION_ALREADY_DONE
            assert outcome.disposition is Disposition.EXECUTION_ALREADY_DONE
            assert (outcome.task_id, outcome.task_created) == (None, False)
            assert self.counted() == before, "a read of a done occurrence creates nothing"
        assert [t.task_id for t in self.tasks()] == [task.task_id]
        assert len(self.core_store.list_executions()) == 1

    @pytest.mark.anyio
    async def test_a_follow_up_joins_the_first_message_s_task_through_the_same_channel(
        self,
    ) -> None:
        task = await self.first_task()
        self.deliver(raw_message(2, in_reply_to=FIRST))
        outcome = self.by_message(await self.cycle(self.first))[FOLLOW_UP]
        assert outcome.claim is ClaimOutcome.CLAIMED
        assert (outcome.task_id, outcome.task_created) == (task.task_id, False)
        [joined] = self.tasks()
        assert [m.internet_message_id for m in joined.messages] == [FIRST, FOLLOW_UP]

    @pytest.mark.anyio
    async def test_a_follow_up_read_through_the_second_channel_joins_the_first_s_task(
        self,
    ) -> None:
        task = await self.first_task()
        self.deliver(raw_message(2, in_reply_to=FIRST))
        outcome = self.by_message(await self.failover())[FOLLOW_UP]
        assert outcome.claim is ClaimOutcome.CLAIMED
        assert (outcome.task_id, outcome.task_created) == (task.task_id, False)
        [joined] = self.tasks()
        assert sorted(str(m.internet_message_id) for m in joined.messages) == [FIRST, FOLLOW_UP]

    @pytest.mark.anyio
    async def test_a_follow_up_read_before_the_message_it_answers_shares_its_task(
        self,
    ) -> None:
        self.deliver(raw_message(2, in_reply_to=FIRST))
        early = self.by_message(await self.cycle(self.first))[FOLLOW_UP]
        assert early.claim is ClaimOutcome.CLAIMED and early.task_created
        self.deliver(raw_message(1))
        late = self.by_message(await self.failover())[FIRST]
        assert late.claim is ClaimOutcome.CLAIMED
        assert (late.task_id, late.task_created) == (early.task_id, False)
        assert len(self.tasks()) == 1

    @pytest.mark.anyio
    async def test_a_message_with_the_same_subject_and_no_reference_has_a_task_of_its_own(
        self,
    ) -> None:
        task = await self.first_task()
        self.deliver(lookalike())  # the first's subject, sender and Date
        outcome = self.by_message(await self.failover())[LOOKALIKE]
        assert outcome.claim is ClaimOutcome.CLAIMED and outcome.task_created
        assert outcome.task_id is not None and outcome.task_id != task.task_id
        again = self.by_message(await self.cycle(self.first, from_start=True))[LOOKALIKE]
        assert again.claim is ClaimOutcome.EXECUTION_ALREADY_DONE
        tasks = {t.task_id: [m.internet_message_id for m in t.messages] for t in self.tasks()}
        assert tasks == {task.task_id: [FIRST], outcome.task_id: [LOOKALIKE]}

    @pytest.mark.anyio
    async def test_each_run_reads_what_arrived_since_the_last_once_and_nothing_again(
        self,
    ) -> None:
        size = self.build(channel=self.first).capabilities.page_size
        numbers = range(1, min(size + 2, MAX_MESSAGES))  # more than one page where it can
        for n in numbers:
            self.deliver(raw_message(n))
        first = self.by_message(await self.cycle(self.first))
        assert sorted(map(str, first)) == sorted(f"<c{n}@contoso.test>" for n in numbers)
        assert {o.claim for o in first.values()} == {ClaimOutcome.CLAIMED}
        assert self.by_message(await self.cycle(self.first)) == {}
        self.deliver(raw_message(50))
        between = self.by_message(await self.cycle(self.first))
        assert list(between) == ["<c50@contoso.test>"]
        assert between["<c50@contoso.test>"].claim is ClaimOutcome.CLAIMED
        assert self.by_message(await self.cycle(self.first)) == {}
        assert len(self.core_store.list_executions()) == len(numbers) + 1

    # -- sending exactly once ----------------------------------------------------------

    @pytest.mark.anyio
    async def test_a_lost_answer_is_uncertain_and_the_next_send_recovers_it_from_the_copy(
        self,
    ) -> None:
        self.needs(Fault.LOST_ACK)
        task = await self.first_task()
        self.flip(Fault.LOST_ACK)
        lost = await self.send(self.first, task)
        assert lost.status is outbound.SendStatus.UNCERTAIN
        assert lost.record.state is SendState.UNCERTAIN
        recovered = await self.send(self.first, task)
        assert recovered.status is outbound.SendStatus.RECOVERED
        assert recovered.record.state is SendState.CONFIRMED
        # The id answers will name: the one the copy went out with (a web app's own).
        assert recovered.message_id == await self.sent_as(recovered.record)
        assert (await self.send(self.first, task)).status is outbound.SendStatus.ALREADY_SENT
        assert self.copies(task) == 1

    @pytest.mark.anyio
    async def test_a_late_copy_is_awaited_for_the_declared_latency_and_never_sent_twice(
        self,
    ) -> None:
        self.needs(Fault.LOST_ACK)
        self.needs(Fault.LATE_SENT_COPY)
        latency = self.build(channel=self.first).capabilities.sent_copy_latency
        assert latency > timedelta(0), "a channel whose copies may be late declares how late"
        task = await self.first_task()
        self.flip(Fault.LATE_SENT_COPY)
        self.flip(Fault.LOST_ACK)
        assert (await self.send(self.first, task)).status is outbound.SendStatus.UNCERTAIN
        assert (await self.send(self.first, task)).status is outbound.SendStatus.UNCERTAIN
        self.pass_time(latency / 2)
        assert (await self.send(self.first, task)).status is outbound.SendStatus.UNCERTAIN
        assert self.copies(task) == 1, "nothing goes out before the latency has passed"
        self.pass_time(latency - latency / 2)
        recovered = await self.send(self.first, task)
        assert recovered.status is outbound.SendStatus.RECOVERED
        assert self.copies(task) == 1

    @pytest.mark.anyio
    async def test_an_uncertain_send_is_settled_through_another_channel_that_searches_it(
        self,
    ) -> None:
        self.needs(Fault.LOST_ACK)
        kind, settler = self.settling(searches=True)
        task = await self.first_task()
        self.flip(Fault.LOST_ACK)
        lost = await self.send(self.first, task, markers=(kind,))
        assert lost.status is outbound.SendStatus.UNCERTAIN
        assert lost.record.marker is not None and lost.record.marker.kind is kind
        recovered = await self.send(settler, task, holder=ELSEWHERE)
        assert recovered.status is outbound.SendStatus.RECOVERED, (settler, recovered.record)
        assert recovered.record.state is SendState.CONFIRMED
        assert self.copies(task) == 1

    @pytest.mark.anyio
    async def test_a_channel_that_cannot_search_the_marker_leaves_the_send_uncertain(
        self,
    ) -> None:
        self.needs(Fault.LOST_ACK)
        kind, blind = self.settling(searches=False)
        task = await self.first_task()
        self.flip(Fault.LOST_ACK)
        lost = await self.send(self.first, task, markers=(kind,))
        assert lost.status is outbound.SendStatus.UNCERTAIN
        latest = max(
            self.build(channel=c).capabilities.sent_copy_latency for c in (self.first, blind)
        )
        self.core_clock.advance(seconds=(latest + timedelta(hours=1)).total_seconds())
        held = await self.send(blind, task, holder=ELSEWHERE)
        assert held.status is outbound.SendStatus.UNCERTAIN, (blind, held.record)
        assert held.record.state is SendState.UNCERTAIN
        assert self.copies(task) == 1, f"{blind} cannot prove the copy absent: nothing is sent"
        settled = await self.send(self.first, task, markers=(kind,))
        assert settled.status is outbound.SendStatus.RECOVERED
        assert self.copies(task) == 1

    @pytest.mark.anyio
    async def test_a_send_whose_worker_died_after_the_handover_is_settled_from_its_copy(
        self,
    ) -> None:
        """The worker dies after the channel took the message, before it ledgered the answer.
        The next worker finds the copy by its marker - whether the mail system keeps copies
        or the channel filed its own after the answer - and sends nothing; only a channel
        with no copy at all hands it to a person."""
        task = await self.first_task()
        provider = self.build(channel=self.first)
        intent, message = self.reply(task)
        with pytest.raises(_Died):
            await outbound.send_once(
                self.core_store,
                _DiesAfterHandover(provider),
                intent.model_copy(update={"holder": _dead_holder()}),
                message,
                self.core_clock,
            )
        await provider.aclose()
        assert self.copies(task) == 1
        caps = self.build(channel=self.first).capabilities
        if caps.sent_copy_latency > timedelta(0):
            self.pass_time(caps.sent_copy_latency)
        settled = await self.send(self.first, task)
        if caps.keeps_sent_copy or caps.files_sent_copy:
            assert settled.status is outbound.SendStatus.RECOVERED, settled.record
            assert settled.record.state is SendState.CONFIRMED
        else:
            assert settled.status is outbound.SendStatus.WITH_PERSON, settled.record
        assert self.copies(task) == 1

    @pytest.mark.anyio
    async def test_a_lost_send_through_a_channel_without_a_sent_copy_goes_to_a_person(
        self,
    ) -> None:
        """The channel keeps no sent copy, so it sets no marker (``Handover.marker`` None): the
        send still goes, and a lost answer goes to a person, whose "not sent" allows exactly
        one more attempt."""
        task = await self.with_person()
        settle = outbound.settle_by_person
        with pytest.raises(InvalidRequest):
            settle(self.core_store, "reply|1", False, " ", "operator", self.core_clock)
        evidence = "the client's inbox and our provider's log show no such message"
        record = settle(self.core_store, "reply|1", False, evidence, "operator", self.core_clock)
        assert record.state is SendState.PREPARED and record.resend_allowed
        resent = await self.send(self.first, task)
        assert resent.status is outbound.SendStatus.SENT
        assert self.copies(task) == 2, "the lost attempt and exactly one more"
        assert (await self.send(self.first, task)).status is outbound.SendStatus.ALREADY_SENT
        assert self.copies(task) == 2
        with pytest.raises(InvalidRequest):  # settled: a person's word cannot reopen it
            settle(self.core_store, "reply|1", False, evidence, "operator", self.core_clock)

    @pytest.mark.anyio
    async def test_a_person_who_confirms_a_lost_send_closes_it_with_no_send(self) -> None:
        task = await self.with_person()
        evidence = "the client confirmed receipt by phone"
        record = outbound.settle_by_person(
            self.core_store, "reply|1", True, evidence, "operator", self.core_clock
        )
        assert record.state is SendState.CONFIRMED
        again = await self.send(self.first, task)
        assert again.status is outbound.SendStatus.ALREADY_SENT
        assert self.copies(task) == 1

    async def with_person(self) -> Task:
        """A send through a channel that keeps no sent copy, its answer lost: it is with a
        person, having gone out once."""
        self.needs(Fault.NO_SENT_COPY)
        self.needs(Fault.LOST_ACK)
        task = await self.first_task()
        self.flip(Fault.NO_SENT_COPY)
        self.flip(Fault.LOST_ACK)
        first = await self.send(self.first, task)
        assert first.status in {outbound.SendStatus.UNCERTAIN, outbound.SendStatus.WITH_PERSON}
        held = await self.send(self.first, task)
        assert held.status is outbound.SendStatus.WITH_PERSON
        assert held.record.state is SendState.WITH_PERSON
        assert "keeps no sent copy" in held.record.detail, held.record.detail
        assert self.copies(task) == 1, "a send no channel can settle is never repeated blind"
        return task

    @pytest.mark.anyio
    async def test_a_reply_the_core_writes_is_marked_or_refused_before_handover(self) -> None:
        """A reply as the core renders and builds it (``render_message``, ``reply_in_thread``)
        goes through every channel that can mark its sent copy by our Message-ID or header;
        a channel that could only mark it by a body token (which the core does not write
        into client mail) refuses it before anything is handed over or ledgered."""
        task = await self.first_task()
        rendered = render_message("We are on it.", subject="Re: Invoice 1", language="en")
        for n, channel in enumerate(self.channels):
            key = f"core-reply|{n}"
            intent, message = outbound.reply_in_thread(
                task, key, rendered, (CLIENT,), (), "client_reply"
            )
            provider = self.build(channel=channel)
            kinds = set(provider.capabilities.markers)
            if provider.capabilities.keeps_sent_copy and not kinds - {MarkerKind.BODY_TOKEN}:
                with pytest.raises(HandoverRefused):
                    await outbound.send_once(
                        self.core_store, provider, intent, message, self.core_clock
                    )
                assert self.core_store.get_send(key) is None and self.copies(task, key) == 0
                continue
            outcome = await outbound.send_once(
                self.core_store, provider, intent, message, self.core_clock
            )
            assert outcome.status is outbound.SendStatus.SENT, (channel, outcome.record)
            assert outcome.record.marker is not None
            assert self.copies(task, key) == 1

    # -- the mailbox ---------------------------------------------------------------------

    @pytest.mark.anyio
    async def test_a_whole_cycle_through_both_channels_changes_nothing_but_sent_copies(
        self,
    ) -> None:
        self.deliver(raw_message(1))
        self.deliver(raw_message(2, in_reply_to=FIRST))
        self.deliver(lookalike())
        before = dict(self.snapshot())
        await self.cycle(self.first)
        await self.failover()
        await self.cycle(self.first, from_start=True)
        [task] = [t for t in self.tasks() if FIRST in {m.internet_message_id for m in t.messages}]
        sent = await self.send(self.first, task)
        assert sent.status is outbound.SendStatus.SENT
        await self.cycle(self.first)
        after = dict(self.snapshot())
        assert {key: after.get(key) for key in before} == before
        added = sorted(set(after) - set(before))
        assert len(added) == self.copies(task) == 1, added


class _Died(BaseException):
    """A worker's death, right after the channel took the message (nothing catches it)."""


def _dead_holder() -> str:
    """A holder on this machine whose process is gone (its pid's start time differs)."""
    parts = current_holder().split("/")
    parts[3] = "1"
    return "/".join(parts)


class _DiesAfterHandover(Passthrough):
    """A channel whose worker dies the moment the channel has taken the message."""

    async def send(self, handover: Handover) -> SendResult:
        await self.inner.send(handover)
        raise _Died
