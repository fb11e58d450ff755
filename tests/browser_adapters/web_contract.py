"""The contract suites' mailbox reached through a web app: the hooks both web app modules
share (each module has its own mock server and its own kept session)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from datetime import timedelta
from typing import ClassVar

import pytest

from agent.domain.mail import MarkerKind
from agent.ports import MailProvider
from agent.testing.providers import MAILBOX, Fault, MailboxHooks
from fixtures.admin import MockAdmin
from tests.browser_adapters.kept_sessions import KeptSessions
from tests.browser_adapters.outlook_mock import OutlookAccount, WebClock
from tests.providers.private_mock import PrivateMock


class OnWebApp(MailboxHooks):
    """The contract's mailbox as an account of the module's mock (``mock``), reached
    through the web app of ``kind``; each test starts from the session the test before
    left (``kept``)."""

    faults: ClassVar[frozenset[Fault]] = frozenset(
        {Fault.LOST_ACK, Fault.LATE_SENT_COPY, Fault.DROPPED_MESSAGE_ID}
    )
    channels: ClassVar[tuple[str, ...]] = ("browser",)
    release_at: ClassVar[timedelta]
    """When delayed copies show: before any channel could prove them absent."""
    mock: ClassVar[PrivateMock]
    kept: ClassVar[KeptSessions]
    kind: ClassVar[type[OutlookAccount]]
    account: OutlookAccount

    def setup_mailbox(self) -> None:
        admin = self.mock.admin()
        self.kept.reset(admin, self.where / "browser-state")
        self.account = self.kind(
            admin,
            MAILBOX.lower(),
            self.where / "browser-state",
            WebClock(admin),
            create=self.make_accounts(admin),
        )
        self.held_for = timedelta(0)

    def make_accounts(self, admin: MockAdmin) -> bool:
        """Make the accounts the test's other channels need; whether the web account is
        still to be made."""
        del admin
        return True

    def api(self, markers: tuple[MarkerKind, ...] | None) -> MailProvider:
        """The mailbox's API channel, where the test's channels list ``api``."""
        raise AssertionError(f"{type(self).__name__} has no api channel ({markers})")

    @pytest.fixture(autouse=True)
    async def _close_channels(self, anyio_backend: str) -> AsyncIterator[None]:
        del anyio_backend
        self.built_api: list[MailProvider] = []
        yield
        for provider in self.built_api:
            await provider.aclose()
        account = getattr(self, "account", None)
        if account is not None:
            await account.aclose()
            self.kept.keep(account.state_dir)

    def build(
        self, *, channel: str | None = None, markers: tuple[MarkerKind, ...] | None = None
    ) -> MailProvider:
        """The browser channel (its one marker); the API's where the test has one and asks
        for it (first by default)."""
        if self.channels[0] == "api" and channel in (None, "api"):
            self.built_api.append(self.api(markers))
            return self.built_api[-1]
        return self.account.build()

    def deliver(self, raw: bytes) -> None:
        self.account.deliver(raw)

    def flip(self, fault: Fault) -> None:
        if fault is Fault.LOST_ACK:
            self.account.admin.faults(drop_send_ack=1)
        elif fault is Fault.LATE_SENT_COPY:
            self.account.admin.faults(delay_sent_copy_seconds=3600)
            self.held_for = timedelta(0)
        elif fault is not Fault.DROPPED_MESSAGE_ID:  # the app gives every web send its own
            raise AssertionError(f"{fault} is declared impossible")

    def advance(self, delta: timedelta) -> None:
        self.held_for += delta
        if self.held_for >= self.release_at:
            self.account.admin.faults(release_delayed=True)

    def snapshot(self) -> Mapping[str, str]:
        return self.account.snapshot()

    def sent_copies(self, message_id: str) -> int:
        return self.account.sent_copies(message_id)
