"""The Gmail web adapter in headless Chromium against the mock Gmail web app: the
MailProvider contract, and the lifecycle core through the Gmail API and Gmail on the web as
two channels of one mailbox (the same occurrences and tasks whichever reads it; a send left
uncertain on one settled from its copy before the other may send)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator, Mapping
from datetime import timedelta
from typing import ClassVar

import pytest

from agent.domain.context import ApiAccess
from agent.domain.mail import MarkerKind
from agent.domain.secrets import Secret
from agent.ports import MailProvider
from agent.providers import gmail_api
from agent.providers.api_http import oauth_api_client
from agent.providers.gmail_api import GmailApiProvider, read_error
from agent.testing.channel_contract import ChannelLifecycleContract
from agent.testing.providers import MAILBOX, Fault, MailboxHooks, MailProviderContract
from tests.browser_adapters.gmail_mock import GmailAccount
from tests.browser_adapters.kept_sessions import KeptSessions
from tests.browser_adapters.outlook_mock import WebClock
from tests.providers.private_mock import PrivateMock

LATENCY = timedelta(seconds=120)

_private = PrivateMock("gmail-web")
_kept = KeptSessions()


@pytest.fixture(scope="module", autouse=True)
def _stop_private_mock() -> Iterator[None]:
    yield
    _private.stop()


class OnGmailWeb(MailboxHooks):
    """The contract's mailbox as a Google account, reached through Gmail on the web."""

    faults: ClassVar[frozenset[Fault]] = frozenset(
        {Fault.LOST_ACK, Fault.LATE_SENT_COPY, Fault.DROPPED_MESSAGE_ID}
    )
    cannot: ClassVar[Mapping[Fault, str]] = {
        Fault.EXPIRED_CURSOR: "the cursor is this channel's own record of the threads and "
        "messages it read; nothing in Gmail invalidates it (a cursor that is not this "
        "channel's is refused as expired: tested)",
        Fault.NO_SENT_COPY: "Gmail files every message it sends in Sent; it has no way to "
        "send without a copy",
    }
    channels: ClassVar[tuple[str, ...]] = ("browser",)
    release_at: ClassVar[timedelta] = LATENCY * 3 / 4
    """When delayed copies show: before any channel could prove them absent."""
    account: GmailAccount

    def setup_mailbox(self) -> None:
        admin = _private.admin()
        _kept.reset(admin, self.where / "browser-state")
        self.account = GmailAccount(
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
        elif fault is not Fault.DROPPED_MESSAGE_ID:  # Gmail gives every web send its own
            raise AssertionError(f"{fault} is declared impossible")

    def advance(self, delta: timedelta) -> None:
        self.held_for += delta
        if self.held_for >= self.release_at:
            self.account.admin.faults(release_delayed=True)

    def snapshot(self) -> Mapping[str, str]:
        return self.account.snapshot()

    def sent_copies(self, message_id: str) -> int:
        return self.account.sent_copies(message_id)


class TestGmailWeb(OnGmailWeb, MailProviderContract): ...


class OnGmailApiAndGmailWeb(OnGmailWeb):
    """The same mailbox through the Gmail API (``api``) and Gmail on the web (``browser``):
    the failover the access order makes when the API fails or is not permitted."""

    channels: ClassVar[tuple[str, ...]] = ("api", "browser")

    def setup_mailbox(self) -> None:
        admin = _private.admin()
        _kept.reset(admin, self.where / "browser-state")
        made = admin.account(MAILBOX.lower(), "google")
        self.secrets = {
            "oauth_client_id": str(made["client_id"]),
            "oauth_client_secret": str(made["client_secret"]),
            "oauth_refresh_token": str(made["refresh_token"]),
        }
        self.account = GmailAccount(
            admin, MAILBOX.lower(), self.where / "browser-state", WebClock(admin), create=False
        )
        self.held_for = timedelta(0)

    @pytest.fixture(autouse=True)
    async def _close_api(self, anyio_backend: str) -> AsyncIterator[None]:
        del anyio_backend
        self.built_api: list[MailProvider] = []
        yield
        for provider in self.built_api:
            await provider.aclose()

    def build(
        self, *, channel: str | None = None, markers: tuple[MarkerKind, ...] | None = None
    ) -> MailProvider:
        if channel in (None, "api"):
            provider = self._api(markers)
            self.built_api.append(provider)
            return provider
        return self.account.build()

    def _api(self, markers: tuple[MarkerKind, ...] | None) -> GmailApiProvider:
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
