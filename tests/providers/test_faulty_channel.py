"""``agent.testing.faults.FaultyChannel`` keeps the contracts of the channel it wraps: the
MailProvider contract and the core's contract through a Maildir wrapped in it, now with the
two faults a Maildir cannot produce itself (a lost answer, a late copy); and what its
switches do, seen from several processes' openings of its file."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import timedelta
from typing import ClassVar

import pytest

from agent.domain.errors import OutcomeUnknown, Unsupported
from agent.domain.mail import Marker, MarkerKind
from agent.ports import MailProvider
from agent.providers.maildir import MaildirProvider
from agent.testing import FrozenClock
from agent.testing.channel_contract import ChannelLifecycleContract
from agent.testing.faults import ChannelFaults, FaultyChannel
from agent.testing.providers import MAILBOX, Fault, MailProviderContract, reply, sent
from tests.providers.test_provider_contract import OnMaildir

LATENCY = timedelta(seconds=30)


class OnFaultyMaildir(OnMaildir):
    """A Maildir wrapped in a FaultyChannel that declares copies searchable within 30 s."""

    faults: ClassVar[frozenset[Fault]] = frozenset(
        {Fault.EXPIRED_CURSOR, Fault.LOST_ACK, Fault.LATE_SENT_COPY}
    )
    cannot: ClassVar[Mapping[Fault, str]] = {
        Fault.DROPPED_MESSAGE_ID: "the Maildir keeps every header we write",
        Fault.NO_SENT_COPY: "a Maildir send is the writing of its sent copy",
    }
    clock: FrozenClock
    switches: ChannelFaults

    def setup_mailbox(self) -> None:
        super().setup_mailbox()
        self.clock = FrozenClock()
        self.switches = ChannelFaults(self.where / "faults.db", self.clock)

    def teardown_mailbox(self) -> None:
        self.switches.close()

    def build(
        self, *, channel: str | None = None, markers: tuple[MarkerKind, ...] | None = None
    ) -> MailProvider:
        assert channel in (None, self.channels[0])
        inner = MaildirProvider(
            self.path, MAILBOX, page_size=3, markers=markers or (MarkerKind.MESSAGE_ID,
            MarkerKind.HEADER), clock=self.clock,
        )  # fmt: skip
        return FaultyChannel(inner, self.switches, sent_copy_latency=LATENCY)

    def flip(self, fault: Fault) -> None:
        if fault is Fault.LOST_ACK:
            self.switches.lose_acks(1)
        elif fault is Fault.LATE_SENT_COPY:
            self.switches.delay_sent_copies(LATENCY)
        else:
            super().flip(fault)

    def advance(self, delta: timedelta) -> None:
        self.clock.advance(seconds=delta.total_seconds())


class TestFaultyMaildir(OnFaultyMaildir, MailProviderContract): ...


class TestCoreOnFaultyMaildir(OnFaultyMaildir, ChannelLifecycleContract): ...


# -- the switches --------------------------------------------------------------------------


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


class TestSwitches(OnFaultyMaildir):
    @pytest.mark.anyio
    async def test_lost_answers_by_probability_follow_the_seed_in_every_process(self) -> None:
        other = ChannelFaults(self.where / "faults.db", self.clock)  # another process's opening
        self.switches.lose_acks(0, probability=0.5, seed=7)
        provider = self.build()
        parent = await self.parent(provider)
        lost: list[bool] = []
        for n in range(20):
            message = reply(parent, provider.capabilities, f"<r{n}@fabrikam.test>")
            try:
                await sent(provider, message)
            except OutcomeUnknown:
                lost.append(True)
            else:
                lost.append(False)
        assert 0 < sum(lost) < 20
        assert [a.lost for a in other.accepted()] == lost  # decided once, seen by every opening
        replay = ChannelFaults(self.where / "replay.db", self.clock)
        replay.lose_acks(0, probability=0.5, seed=7)
        for n, was in enumerate(lost):  # the same seed, Message-ID and attempt: the same draw
            assert replay.accept(f"<r{n}@fabrikam.test>", None).lost == was
        other.close()
        replay.close()

    @pytest.mark.anyio
    async def test_a_late_copy_shows_within_its_delay_and_a_found_copy_is_the_inner_one_s(
        self,
    ) -> None:
        self.switches.delay_sent_copies(LATENCY, at_least=LATENCY / 2)
        provider = self.build()
        message = reply(await self.parent(provider), provider.capabilities)
        handover, result = await sent(provider, message)
        assert handover.marker is not None
        [accepted] = self.switches.accepted()
        assert LATENCY / 2 <= accepted.visible_at - accepted.accepted_at <= LATENCY
        assert await provider.find_sent(handover.marker) is None
        self.advance(accepted.visible_at - accepted.accepted_at - timedelta(microseconds=1))
        assert await provider.find_sent(handover.marker) is None
        self.advance(timedelta(microseconds=1))
        found = await provider.find_sent(handover.marker)
        assert found is not None and found.provider_message_id == result.provider_message_id
        assert self.switches.accepted()[0].hidden_searches == 2
        other = Marker(kind=MarkerKind.HEADER, value="outloop-nothing")
        assert await provider.find_sent(other) is None  # nothing the inner channel lacks

    @pytest.mark.anyio
    async def test_a_delay_beyond_the_declared_latency_is_refused_before_anything_is_sent(
        self,
    ) -> None:
        provider = self.build()
        message = reply(await self.parent(provider), provider.capabilities)
        self.switches.delay_sent_copies(LATENCY + timedelta(seconds=1))
        with pytest.raises(ValueError, match="declared sent_copy_latency"):
            await sent(provider, message)
        assert self.sent_copies(message.internet_message_id) == 0
        assert provider.capabilities.sent_copy_latency == LATENCY

    @pytest.mark.anyio
    async def test_a_marker_kind_the_inner_channel_does_not_search_is_still_refused(
        self,
    ) -> None:
        self.switches.delay_sent_copies(LATENCY)
        provider = self.build(markers=(MarkerKind.MESSAGE_ID,))
        with pytest.raises(Unsupported):
            await provider.find_sent(Marker(kind=MarkerKind.HEADER, value="outloop-x"))

    def test_switches_refuse_what_no_channel_could_do(self) -> None:
        with pytest.raises(ValueError, match="probability"):
            self.switches.lose_acks(0, probability=1.5)
        with pytest.raises(ValueError, match="at_least"):
            self.switches.delay_sent_copies(LATENCY, at_least=LATENCY * 2)
