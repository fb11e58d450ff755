"""The Outlook on the web adapter in headless Chromium against the mock web app: the
MailProvider contract and the lifecycle core through it."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator, Mapping
from datetime import timedelta
from typing import ClassVar

import pytest

from agent.domain.mail import MarkerKind
from agent.testing.providers import MAILBOX, Fault, MailboxHooks, MailProviderContract
from browser_adapters.outlook import OutlookWeb
from tests.browser_adapters.outlook_mock import OutlookAccount, WebClock
from tests.providers.private_mock import PrivateMock

LATENCY = timedelta(seconds=120)

_private = PrivateMock("outlook-web")


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
    account: OutlookAccount

    def setup_mailbox(self) -> None:
        admin = _private.admin()
        admin.reset()
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

    def build(
        self, *, channel: str | None = None, markers: tuple[MarkerKind, ...] | None = None
    ) -> OutlookWeb:
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
        if self.held_for >= LATENCY * 3 / 4:
            self.account.admin.faults(release_delayed=True)

    def snapshot(self) -> Mapping[str, str]:
        return self.account.snapshot()

    def sent_copies(self, message_id: str) -> int:
        return self.account.sent_copies(message_id)


class TestOutlookWeb(OnOutlookWeb, MailProviderContract): ...
