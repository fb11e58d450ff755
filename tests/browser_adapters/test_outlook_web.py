"""The Outlook on the web adapter in headless Chromium against the mock web app: the
MailProvider contract, and the lifecycle core through Graph and Outlook on the web as two
channels of one mailbox (the same occurrences and tasks whichever reads it; a send left
uncertain on one settled from its copy before the other may send)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator, Mapping
from datetime import timedelta
from typing import ClassVar

import pytest

from agent.domain.mail import MarkerKind
from agent.ports import MailProvider
from agent.testing.channel_contract import ChannelLifecycleContract
from agent.testing.providers import MAILBOX, Fault, MailboxHooks, MailProviderContract
from tests.browser_adapters.kept_sessions import KeptSessions
from tests.browser_adapters.outlook_mock import OutlookAccount, WebClock
from tests.providers.private_mock import PrivateMock
from tests.providers.test_msgraph import LATENCY as GRAPH_LATENCY
from tests.providers.test_msgraph import GraphAccount

LATENCY = timedelta(seconds=120)

_private = PrivateMock("outlook-web")
_kept = KeptSessions()


@pytest.fixture(scope="module", autouse=True)
def _stop_private_mock() -> Iterator[None]:
    yield
    _private.stop()


class OnOutlookWeb(MailboxHooks):
    """The contract's mailbox as a Microsoft account, reached through Outlook on the web."""

    faults: ClassVar[frozenset[Fault]] = frozenset(
        {Fault.LOST_ACK, Fault.LATE_SENT_COPY, Fault.DROPPED_MESSAGE_ID}
    )
    cannot: ClassVar[Mapping[Fault, str]] = {
        Fault.EXPIRED_CURSOR: "the cursor is this channel's own record of the conversations "
        "and items it read; nothing in Outlook invalidates it (a cursor that is not this "
        "channel's is refused as expired: tested)",
        Fault.NO_SENT_COPY: "Outlook on the web files every message it sends in Sent Items; "
        "it has no way to send without a copy",
    }
    channels: ClassVar[tuple[str, ...]] = ("browser",)
    release_at: ClassVar[timedelta] = min(LATENCY, GRAPH_LATENCY) * 3 / 4
    """When delayed copies show: before any channel could prove them absent."""
    account: OutlookAccount

    def setup_mailbox(self) -> None:
        admin = _private.admin()
        _kept.reset(admin, self.where / "browser-state")
        self.account = OutlookAccount(
            admin, MAILBOX.lower(), self.where / "browser-state", WebClock(admin)
        )
        self.held_for = timedelta(0)

    @pytest.fixture(autouse=True)
    async def _close_browsers(self, anyio_backend: str) -> AsyncIterator[None]:
        del anyio_backend
        yield
        account = getattr(self, "account", None)
        if account is not None:
            await account.aclose()
            _kept.keep(account.state_dir)

    def build(
        self, *, channel: str | None = None, markers: tuple[MarkerKind, ...] | None = None
    ) -> MailProvider:
        del channel, markers  # one channel, one marker
        return self.account.build()

    def deliver(self, raw: bytes) -> None:
        self.account.deliver(raw)

    def flip(self, fault: Fault) -> None:
        if fault is Fault.LOST_ACK:
            self.account.admin.faults(drop_send_ack=1)
        elif fault is Fault.LATE_SENT_COPY:
            self.account.admin.faults(delay_sent_copy_seconds=3600)
            self.held_for = timedelta(0)
        elif fault is not Fault.DROPPED_MESSAGE_ID:  # Exchange gives every web send its own
            raise AssertionError(f"{fault} is declared impossible")

    def advance(self, delta: timedelta) -> None:
        self.held_for += delta
        if self.held_for >= self.release_at:
            self.account.admin.faults(release_delayed=True)

    def snapshot(self) -> Mapping[str, str]:
        return self.account.snapshot()

    def sent_copies(self, message_id: str) -> int:
        return self.account.sent_copies(message_id)


class TestOutlookWeb(OnOutlookWeb, MailProviderContract): ...


class OnGraphAndOutlookWeb(OnOutlookWeb):
    """The same mailbox through Graph (``api``) and Outlook on the web (``browser``): the
    failover the access order makes when Graph fails or is not permitted."""

    channels: ClassVar[tuple[str, ...]] = ("api", "browser")
    graph: GraphAccount

    def setup_mailbox(self) -> None:
        admin = _private.admin()
        _kept.reset(admin, self.where / "browser-state")
        self.graph = GraphAccount(admin, MAILBOX)
        self.account = OutlookAccount(
            admin, MAILBOX.lower(), self.where / "browser-state", WebClock(admin), create=False
        )
        self.held_for = timedelta(0)

    @pytest.fixture(autouse=True)
    async def _close_graph(self, anyio_backend: str) -> AsyncIterator[None]:
        del anyio_backend
        self.built_graph: list[MailProvider] = []
        yield
        for provider in self.built_graph:
            await provider.aclose()

    def build(
        self, *, channel: str | None = None, markers: tuple[MarkerKind, ...] | None = None
    ) -> MailProvider:
        if channel in (None, "api"):
            provider = self.graph.build(markers=markers)
            self.built_graph.append(provider)
            return provider
        return self.account.build()


class TestCoreOnGraphAndOutlookWeb(OnGraphAndOutlookWeb, ChannelLifecycleContract): ...
