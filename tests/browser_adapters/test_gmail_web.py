"""The Gmail web adapter in headless Chromium against the mock Gmail web app: the
MailProvider contract, and the lifecycle core through the Gmail API and Gmail on the web as
two channels of one mailbox (the same occurrences and tasks whichever reads it; a send left
uncertain on one settled from its copy before the other may send)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from datetime import timedelta
from typing import ClassVar

import pytest

from agent.domain.context import ApiAccess
from agent.domain.mail import MarkerKind
from agent.domain.secrets import Secret
from agent.providers import gmail_api
from agent.providers.api_http import oauth_api_client
from agent.providers.gmail_api import GmailApiProvider, read_error
from agent.testing.channel_contract import ChannelLifecycleContract
from agent.testing.providers import MAILBOX, Fault, MailProviderContract
from fixtures.admin import MockAdmin
from tests.browser_adapters.gmail_mock import GmailAccount
from tests.browser_adapters.kept_sessions import KeptSessions
from tests.browser_adapters.outlook_mock import OutlookAccount
from tests.browser_adapters.web_contract import OnWebApp
from tests.providers.private_mock import PrivateMock

LATENCY = timedelta(seconds=120)

_private = PrivateMock("gmail-web")
_kept = KeptSessions()


@pytest.fixture(scope="module", autouse=True)
def _stop_private_mock() -> Iterator[None]:
    yield
    _private.stop()


class OnGmailWeb(OnWebApp):
    """The contract's mailbox as a Google account, reached through Gmail on the web."""

    cannot: ClassVar[Mapping[Fault, str]] = {
        Fault.EXPIRED_CURSOR: "the cursor is this channel's own record of the threads and "
        "messages it read; nothing in Gmail invalidates it (a cursor that is not this "
        "channel's is refused as expired: tested)",
        Fault.NO_SENT_COPY: "Gmail files every message it sends in Sent; it has no way to "
        "send without a copy",
    }
    release_at: ClassVar[timedelta] = LATENCY * 3 / 4
    mock: ClassVar[PrivateMock] = _private
    kept: ClassVar[KeptSessions] = _kept
    kind: ClassVar[type[OutlookAccount]] = GmailAccount


class TestGmailWeb(OnGmailWeb, MailProviderContract): ...


class OnGmailApiAndGmailWeb(OnGmailWeb):
    """The same mailbox through the Gmail API (``api``) and Gmail on the web (``browser``):
    the failover the access order makes when the API fails or is not permitted."""

    channels: ClassVar[tuple[str, ...]] = ("api", "browser")

    def make_accounts(self, admin: MockAdmin) -> bool:
        made = admin.account(MAILBOX.lower(), "google")
        self.secrets = {
            "oauth_client_id": str(made["client_id"]),
            "oauth_client_secret": str(made["client_secret"]),
            "oauth_refresh_token": str(made["refresh_token"]),
        }
        return False

    def api(self, markers: tuple[MarkerKind, ...] | None) -> GmailApiProvider:
        base = self.account.admin.base_url
        access = ApiAccess(
            base_url=base + "/gmail/v1",
            token_url=base + "/oauth2/google/token",
            sent_copy_latency_seconds=int(LATENCY.total_seconds()),
        )
        api = oauth_api_client(
            access,
            MAILBOX.lower(),
            base_url=gmail_api.BASE_URL,
            token_url=gmail_api.TOKEN_URL,
            read_error=read_error,
            read=lambda name: Secret(self.secrets[name]),
            write=lambda name, value: self.secrets.__setitem__(name, value.reveal()),
            reconnect="outloop connect --workspace ws-test --mailbox " + MAILBOX.lower(),
        )
        return GmailApiProvider(
            api, MAILBOX, sent_copy_latency=LATENCY, page_size=3, markers=markers
        )


class TestCoreOnGmailApiAndGmailWeb(OnGmailApiAndGmailWeb, ChannelLifecycleContract): ...
