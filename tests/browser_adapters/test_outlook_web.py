"""The Outlook on the web adapter in headless Chromium against the mock web app: the
MailProvider contract, and the lifecycle core through Graph and Outlook on the web as two
channels of one mailbox (the same occurrences and tasks whichever reads it; a send left
uncertain on one settled from its copy before the other may send)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from datetime import timedelta
from typing import ClassVar

import pytest

from agent.domain.mail import MarkerKind
from agent.ports import MailProvider
from agent.testing.channel_contract import ChannelLifecycleContract
from agent.testing.providers import MAILBOX, Fault, MailProviderContract
from fixtures.admin import MockAdmin
from tests.browser_adapters.kept_sessions import KeptSessions
from tests.browser_adapters.outlook_mock import OutlookAccount
from tests.browser_adapters.web_contract import OnWebApp
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


class OnOutlookWeb(OnWebApp):
    """The contract's mailbox as a Microsoft account, reached through Outlook on the web."""

    cannot: ClassVar[Mapping[Fault, str]] = {
        Fault.EXPIRED_CURSOR: "the cursor is this channel's own record of the conversations "
        "and items it read; nothing in Outlook invalidates it (a cursor that is not this "
        "channel's is refused as expired: tested)",
        Fault.NO_SENT_COPY: "Outlook on the web files every message it sends in Sent Items; "
        "it has no way to send without a copy",
    }
    release_at: ClassVar[timedelta] = min(LATENCY, GRAPH_LATENCY) * 3 / 4
    mock: ClassVar[PrivateMock] = _private
    kept: ClassVar[KeptSessions] = _kept
    kind: ClassVar[type[OutlookAccount]] = OutlookAccount


class TestOutlookWeb(OnOutlookWeb, MailProviderContract): ...


class OnGraphAndOutlookWeb(OnOutlookWeb):
    """The same mailbox through Graph (``api``) and Outlook on the web (``browser``): the
    failover the access order makes when Graph fails or is not permitted."""

    channels: ClassVar[tuple[str, ...]] = ("api", "browser")
    graph: GraphAccount

    def make_accounts(self, admin: MockAdmin) -> bool:
        self.graph = GraphAccount(admin, MAILBOX)
        return False

    def api(self, markers: tuple[MarkerKind, ...] | None) -> MailProvider:
        return self.graph.build(markers=markers)


class TestCoreOnGraphAndOutlookWeb(OnGraphAndOutlookWeb, ChannelLifecycleContract): ...
