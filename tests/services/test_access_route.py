"""The access resolver (``agent.services.access``): a mailbox's permitted channels in the
canonical order, an access gap moving on with its reason recorded, an explicit refusal never
routed around, reads after a refusal only where the context authorizes them, and a send
never moved to another channel.

Each channel is a view of one in-memory mailbox (``agent.testing.memory``), so every channel
shows the same mail; a channel is made to fail by wrapping it."""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any, cast

import pytest

from agent import events
from agent.domain.envelope import Address
from agent.domain.errors import (
    AccessRefused,
    NotHandedOver,
    ProviderError,
    TransientFailure,
    Unsupported,
)
from agent.domain.mail import Channel, MarkerKind, OutgoingMessage, ProviderHealth
from agent.ports import MailProvider
from agent.services.access import HOLD, REFUSAL_HOLD, AccessRoute, Candidate, ChannelState
from agent.testing import FrozenClock
from agent.testing.memory import API, ChannelView, InMemoryProvider, make_envelope

pytestmark = pytest.mark.anyio

MAILBOX = "ops@fabrikam.test"
MCP = ChannelView("mcp", Channel.PROVIDER_MCP, prefix="mcp:")


class Failing:
    """A channel whose named operations fail with ``error`` (the others pass through)."""

    def __init__(self, inner: InMemoryProvider, error: ProviderError, *ops: str) -> None:
        self.inner = inner
        self.error = error
        self.ops = set(ops)
        self.asked: list[str] = []

    def channel(self) -> MailProvider:
        """This channel, as the route builds it."""
        return cast("MailProvider", self)

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.inner, name)
        if name in {"changes", "fetch_body", "prepare", "send", "find_sent", "health"}:

            async def op(*args: Any) -> Any:
                self.asked.append(name)
                if name in self.ops:
                    raise self.error
                return await attr(*args)

            return op
        return attr


class World:
    def __init__(self) -> None:
        self.clock = FrozenClock(datetime(2026, 12, 2, 9, tzinfo=UTC))
        self.api = InMemoryProvider(MAILBOX, "microsoft", view=API, clock=self.clock)
        self.mcp = InMemoryProvider.through(self.api.state, MCP)
        self.records: list[str] = []
        for n in (1, 2, 3):
            self.api.deliver(make_envelope(mailbox_id=MAILBOX, message_no=n, thread_no=n))

    def route(
        self,
        api: Callable[[], MailProvider],
        mcp: Callable[[], MailProvider] | None = None,
        *,
        reads_after_refusal: bool = False,
        browser: bool = False,
    ) -> AccessRoute:
        candidates = [
            Candidate(Channel.API, api),
            Candidate(Channel.PROVIDER_MCP, mcp or self._mcp),
        ]
        if browser:
            candidates.append(Candidate(Channel.BROWSER, _no_browser))
        return AccessRoute(
            "microsoft",
            MAILBOX,
            candidates,
            clock=self.clock,
            reads_after_refusal=reads_after_refusal,
            record=lambda _, detail: self.records.append(detail),
        )

    def _mcp(self) -> MailProvider:
        return self.mcp


def _no_browser() -> MailProvider:
    raise Unsupported("the browser channel is not available yet in this version")


def _reply(world: World, mid: str = "<ours-1@fabrikam.test>") -> OutgoingMessage:
    [first] = [i.envelope for i in world.api.inbox[:1]]
    assert first is not None and first.internet_message_id is not None
    return OutgoingMessage(
        provider_thread_id=first.provider_thread_id,
        in_reply_to=first.internet_message_id,
        references=(first.internet_message_id,),
        sender=Address(address=MAILBOX),
        to=(first.sender,),
        subject=f"Re: {first.subject}",
        text="On it.",
        internet_message_id=mid,
    )


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


async def test_a_missing_connector_moves_on_to_the_permitted_provider_mcp_and_says_why() -> None:
    world = World()

    def no_api() -> MailProvider:
        raise ProviderError("its 'oauth_refresh_token' cannot be read from the vault")

    route = world.route(no_api)
    page = await route.changes(None)
    assert [i.item_ref for i in page.items] == ["mcp:pm-1", "mcp:pm-2", "mcp:pm-3"]
    assert route.capabilities.channel is Channel.PROVIDER_MCP
    assert any("api passed over: no connector" in r and "vault" in r for r in world.records)
    handover = await route.prepare(_reply(world))
    assert handover.channel == "provider_mcp"
    result = await route.send(handover)
    assert result.channel == "provider_mcp"
    assert len(world.api.sent) == 1


def access_records(caplog: pytest.LogCaptureFixture) -> list[dict[str, object]]:
    """The access decision records made so far, as their fields."""
    return [
        dict(found[1]) for r in caplog.records if (found := events.of(r)) and found[0] == "access"
    ]


async def test_a_transient_failure_moves_on_and_the_api_is_tried_first_again_after_the_hold(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger=events.ROOT)
    world = World()
    down = Failing(world.api, TransientFailure("Graph answered 503"), "changes", "health")
    route = world.route(down.channel)
    page = await route.changes(None)
    assert page.cursor.startswith("provider_mcp|")
    assert any("api passed over: TransientFailure: Graph answered 503" in r for r in world.records)
    # Within the hold the API is not asked again.
    asked = len(down.asked)
    await route.changes(page.cursor)
    assert len(down.asked) == asked
    # After it, the API is tried first; a cursor of another channel reads it from the start.
    down.ops.clear()
    world.clock.advance(seconds=HOLD.total_seconds() + 1)
    again = await route.changes(page.cursor)
    assert [i.item_ref for i in again.items] == ["pm-1", "pm-2", "pm-3"]
    assert again.cursor.startswith("api|")
    assert any("channel api in use (was provider_mcp)" in r for r in world.records)
    steps = [(r["channel"], r["outcome"], r["reason"]) for r in access_records(caplog)]
    assert steps == [
        ("api", "passed_over", "TransientFailure"),
        ("provider_mcp", "fallback", "from_api"),
        ("api", "fallback", "from_provider_mcp"),
    ]
    assert {r["mailbox_id"] for r in access_records(caplog)} == {MAILBOX}


async def test_an_explicit_refusal_is_never_routed_around_and_stops_sending(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger=events.ROOT)
    world = World()
    refusing = Failing(world.api, AccessRefused("Graph answered 403: Access is denied"), "prepare")
    route = world.route(refusing.channel)
    with pytest.raises(AccessRefused, match="403"):
        await route.prepare(_reply(world))
    assert world.mcp.sent == [] and world.api.sent == []
    assert route.refusal is not None and route.refusal.channel is Channel.API
    with pytest.raises(AccessRefused, match="no channel may be used to go around it"):
        await route.prepare(_reply(world, "<ours-2@fabrikam.test>"))
    assert refusing.asked == ["prepare"]  # the later send asked no channel at all
    # What the channel is stays known (the core reads it to record a refused attempt).
    assert route.capabilities.channel is Channel.API
    assert any("refused to send" in r and "not routed around" in r for r in world.records)
    [refused] = access_records(caplog)
    assert (refused["channel"], refused["outcome"], refused["reason"]) == (
        "api", "refused", "refused_to_send",
    )  # fmt: skip


async def test_reads_after_a_refusal_stop_unless_the_context_authorizes_them() -> None:
    world = World()
    refusing = Failing(world.api, AccessRefused("Graph answered 403"), "prepare")
    stopped = world.route(refusing.channel)
    with pytest.raises(AccessRefused):
        await stopped.prepare(_reply(world))
    with pytest.raises(AccessRefused, match="reads_after_refusal"):
        await stopped.changes(None)

    world2 = World()
    refusing2 = Failing(world2.api, AccessRefused("Graph answered 403"), "prepare")
    allowed = world2.route(refusing2.channel, reads_after_refusal=True)
    with pytest.raises(AccessRefused):
        await allowed.prepare(_reply(world2))
    page = await allowed.changes(None)
    assert [i.item_ref for i in page.items] == ["pm-1", "pm-2", "pm-3"]  # through the API
    # An authorized read still never goes past the channel that refused.
    refusing2.ops.add("changes")
    refusing2.error = TransientFailure("Graph answered 503")
    with pytest.raises(TransientFailure, match="no permitted channel can read"):
        await allowed.changes(None)
    assert world2.mcp.sent == []


async def test_a_route_of_a_later_channel_alone_honours_the_mailbox_s_refusal() -> None:
    """An operator's ``run --access browser`` is a route of the browser alone: a refusal
    the API met stops its sends, and even authorized reads, which never go past the
    refusing channel in the canonical order."""
    world = World()
    refusals: dict[str, Any] = {}
    refusing = Failing(world.api, AccessRefused("Graph answered 403"), "prepare")
    full = AccessRoute(
        "microsoft", MAILBOX, [Candidate(Channel.API, refusing.channel)],
        clock=world.clock, reads_after_refusal=True, refusals=refusals, key="binding-1",
    )  # fmt: skip
    with pytest.raises(AccessRefused):
        await full.prepare(_reply(world))
    opened: list[str] = []

    def later() -> MailProvider:
        opened.append("mcp")
        return world.mcp

    alone = AccessRoute(
        "microsoft", MAILBOX, [Candidate(Channel.PROVIDER_MCP, later)],
        clock=world.clock, reads_after_refusal=True, refusals=refusals, key="binding-1",
    )  # fmt: skip
    with pytest.raises(AccessRefused, match="reads go no further than api"):
        await alone.changes(None)
    with pytest.raises(AccessRefused, match="go around it"):
        await alone.prepare(_reply(world, "<ours-2@fabrikam.test>"))
    [status] = await alone.evaluate()
    assert status.state is ChannelState.NOT_TRIED and "api refused" in status.reason
    assert opened == [] and world.mcp.sent == []
    other = AccessRoute(
        "microsoft", MAILBOX, [Candidate(Channel.PROVIDER_MCP, later)],
        clock=world.clock, reads_after_refusal=True, refusals=refusals, key="binding-2",
    )  # fmt: skip
    page = await other.changes(None)  # another binding is asked afresh
    assert len(page.items) == 3


async def test_a_send_goes_through_the_channel_that_prepared_it_or_not_at_all() -> None:
    world = World()
    route = world.route(lambda: world.api)
    handover = await route.prepare(_reply(world))
    assert handover.channel == "api"
    moved = handover.model_copy(update={"channel": "provider_mcp"})
    with pytest.raises(NotHandedOver, match="prepare it again"):
        await route.send(moved)
    assert world.api.sent == []
    await route.send(handover)
    assert len(world.api.sent) == 1


async def test_a_copy_is_searched_only_through_channels_that_can_search_its_marker() -> None:
    world = World()
    route = world.route(lambda: world.api)
    handover = await route.prepare(_reply(world))
    await route.send(handover)
    assert handover.marker is not None
    found = await route.find_sent(handover.marker)
    assert found is not None
    only_body_tokens = ChannelView(
        "web", Channel.PROVIDER_MCP, prefix="w:", markers=(MarkerKind.BODY_TOKEN,),
        replaces_message_id=True, hands_mime=False,
    )  # fmt: skip
    web = InMemoryProvider.through(world.api.state, only_body_tokens)
    down = Failing(world.api, TransientFailure("down"), "find_sent")
    blind = world.route(down.channel, lambda: web)
    with pytest.raises(TransientFailure, match="no permitted channel can read"):
        await blind.find_sent(handover.marker)


async def test_access_status_evaluates_each_channel_in_order_and_the_browser_says_not_yet() -> None:
    world = World()

    def no_api() -> MailProvider:
        raise ProviderError("no OAuth client in the vault")

    world.mcp.healthy = False
    route = world.route(no_api, browser=True)
    statuses = await route.evaluate()
    assert [(s.channel.value, s.state) for s in statuses] == [
        ("api", ChannelState.GAP),
        ("provider_mcp", ChannelState.GAP),
        ("browser", ChannelState.NOT_AVAILABLE),
    ]
    assert "no connector" in statuses[0].reason
    assert "not available yet" in statuses[2].reason
    health = await route.health()
    assert not health.ok
    world.mcp.healthy = True
    statuses = await route.evaluate()
    assert [s.state for s in statuses] == [
        ChannelState.GAP,
        ChannelState.USABLE,
        ChannelState.NOT_TRIED,
    ]


async def test_a_send_is_recorded_against_the_channel_that_prepared_it_with_the_longest_latency() -> (
    None
):
    world = World()
    slow_search = ChannelView("mcp", Channel.PROVIDER_MCP, prefix="mcp:",
                              sent_copy_latency=timedelta(seconds=300))  # fmt: skip
    world.mcp = InMemoryProvider.through(world.api.state, slow_search)
    down = Failing(world.api, TransientFailure("Graph answered 503"), "prepare")
    route = world.route(down.channel)
    handover = await route.prepare(_reply(world))
    assert handover.channel == "provider_mcp"
    # A search between prepare and send goes through the API again once its hold ran out...
    world.clock.advance(seconds=HOLD.total_seconds() + 1)
    assert handover.marker is not None
    assert await route.find_sent(handover.marker) is None
    # ...and still the attempt is the preparing channel's, with the longest latency known.
    caps = route.capabilities
    assert caps.channel is Channel.PROVIDER_MCP
    assert caps.sent_copy_latency == timedelta(seconds=300)
    await route.send(handover)
    assert route.capabilities.channel is Channel.API


async def test_a_refusal_found_by_a_health_check_stops_the_evaluation_and_the_sends() -> None:
    world = World()
    refusing = Failing(world.api, AccessRefused("x"), "prepare")

    async def refused_health() -> ProviderHealth:
        return ProviderHealth(
            provider="microsoft", mailbox_id=MAILBOX, ok=False, detail="403", refused=True
        )

    refusing.health = refused_health  # type: ignore[method-assign]
    route = world.route(refusing.channel, browser=True)
    statuses = await route.evaluate()
    assert [s.state for s in statuses] == [
        ChannelState.REFUSED,
        ChannelState.NOT_TRIED,
        ChannelState.NOT_TRIED,
    ]
    assert "never routed around" in statuses[1].reason
    with pytest.raises(AccessRefused, match="go around it"):
        await route.prepare(_reply(world))
    assert refusing.asked == [] and world.mcp.sent == []


async def test_a_refusal_holds_for_a_day_then_the_refusing_channel_is_asked_again() -> None:
    world = World()
    refusing = Failing(world.api, AccessRefused("403"), "prepare")
    route = world.route(refusing.channel)
    with pytest.raises(AccessRefused):
        await route.prepare(_reply(world))
    world.clock.advance(seconds=REFUSAL_HOLD.total_seconds() - 1)
    with pytest.raises(AccessRefused, match="go around it"):
        await route.prepare(_reply(world))
    world.clock.advance(seconds=1)
    refusing.ops.clear()
    handover = await route.prepare(_reply(world))
    assert handover.channel == "api"
