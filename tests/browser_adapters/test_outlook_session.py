"""A session that ends in the middle of a reply through Outlook on the web: Send is refused
for want of a session (nothing goes out), managed login signs in again, the draft the app
saved is reopened (its recipients checked again) - or the reply is written again when no
draft was saved - and the reply goes out exactly once."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path

import pytest
from playwright.async_api import expect

from agent.testing.providers import CLIENT, envelopes, raw_message, read_all, reply
from browser_adapters import outlook
from browser_adapters.outlook_pages import Composer
from managed_login.flow import Step
from tests.browser_adapters.outlook_mock import OutlookAccount, WebClock
from tests.providers.private_mock import PrivateMock

pytestmark = pytest.mark.anyio
MAILBOX = "support@fabrikam.test"

_private = PrivateMock("outlook-session")


@pytest.fixture(scope="module", autouse=True)
def _stop_private_mock() -> Iterator[None]:
    yield
    _private.stop()


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
async def account(tmp_path: Path, anyio_backend: str) -> AsyncIterator[OutlookAccount]:
    del anyio_backend
    admin = _private.admin()
    admin.reset()
    found = OutlookAccount(admin, MAILBOX, tmp_path / "browser", WebClock(admin))
    yield found
    await found.aclose()


def _expiring(
    monkeypatch: pytest.MonkeyPatch, account: OutlookAccount, *, after_save: bool
) -> None:
    """The session ends once, when the reply's HTML goes into the editor (after the app
    saved the draft, or before it could)."""
    inserted: Callable[[Composer, str], Awaitable[None]] = outlook._insert_html  # pyright: ignore[reportPrivateUsage]
    ended: list[bool] = []

    async def then_expire(composer: Composer, markup: str) -> None:
        if not after_save and not ended:
            ended.append(True)
            account.admin.faults(expire_web_sessions=True)
        await inserted(composer, markup)
        if after_save and not ended:
            ended.append(True)
            await expect(composer.status).to_contain_text("Draft saved")
            account.admin.faults(expire_web_sessions=True)

    monkeypatch.setattr(outlook, "_insert_html", then_expire)


@pytest.mark.parametrize("after_save", [True, False], ids=["draft_saved", "nothing_saved"])
async def test_a_session_ending_mid_reply_signs_in_again_and_sends_the_reply_once(
    account: OutlookAccount, monkeypatch: pytest.MonkeyPatch, after_save: bool
) -> None:
    channel = account.build()
    account.deliver(raw_message(1))
    [parent] = envelopes((await read_all(channel))[0])
    message = reply(parent, channel.capabilities)
    handover = await channel.prepare(message)
    _expiring(monkeypatch, account, after_save=after_save)
    result = await channel.send(handover)
    assert channel.last_login is not None and Step.PASSWORD in channel.last_login.steps
    assert handover.marker is not None
    copy = await channel.find_sent(handover.marker)
    assert copy is not None and copy.provider_message_id == result.provider_message_id
    assert [a.address for a in copy.to] == [CLIENT]
    assert account.sent_copies(message.internet_message_id) == 1
    assert account.stored("drafts") == []  # the saved draft was the one sent
