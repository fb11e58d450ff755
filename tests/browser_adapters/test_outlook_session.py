"""A session that ends in the middle of a reply through Outlook on the web: Send is refused
for want of a session (nothing goes out), managed login signs in again, the draft the app
saved is reopened (its recipients checked again) - or the reply is written again when no
draft was saved - and the reply goes out exactly once."""

from __future__ import annotations

import pytest
from playwright.async_api import TimeoutError as PlaywrightTimeout
from playwright.async_api import expect

from agent.domain.errors import NotHandedOver
from agent.testing.providers import CLIENT
from browser_adapters import webmail
from browser_adapters.outlook_pages import Composer
from managed_login.flow import Step
from tests.browser_adapters.outlook_mock import (
    Insert,
    OutlookAccount,
    expiring,
    on_insert,
    prepared_reply,
)

pytestmark = pytest.mark.anyio
MAILBOX = "support@fabrikam.test"


@pytest.mark.parametrize("after_save", [True, False], ids=["draft_saved", "nothing_saved"])
async def test_a_session_ending_mid_reply_signs_in_again_and_sends_the_reply_once(
    account: OutlookAccount, monkeypatch: pytest.MonkeyPatch, after_save: bool
) -> None:
    channel = account.build()
    message, handover = await prepared_reply(account, channel)
    expiring(monkeypatch, account, after_save=after_save)
    result = await channel.send(handover)
    assert channel.last_login is not None and Step.PASSWORD in channel.last_login.steps
    assert handover.marker is not None
    copy = await channel.find_sent(handover.marker)
    assert copy is not None and copy.provider_message_id == result.provider_message_id
    assert [a.address for a in copy.to] == [CLIENT]
    assert account.sent_copies(message.internet_message_id) == 1
    assert account.stored("drafts") == []  # the saved draft was the one sent


async def test_a_half_written_draft_is_discarded_and_the_reply_written_again_after_sign_in(
    account: OutlookAccount, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The session ends after the app saved a draft holding half the reply: the draft is
    not what was planned, so it is discarded and the whole reply written and sent once."""
    channel = account.build()
    message, handover = await prepared_reply(
        account, channel, text="We are on it.\nThe second line."
    )
    calls: list[str] = []

    async def half_then_whole(inserted: Insert, composer: webmail.Composer, markup: str) -> None:
        calls.append(markup)
        if len(calls) > 1:
            await inserted(composer, markup)
            return
        await inserted(composer, markup.replace("The second line.", ""))
        await expect(composer.status).to_contain_text("Draft saved")
        account.admin.faults(expire_web_sessions=True)

    on_insert(monkeypatch, half_then_whole)
    await channel.send(handover)
    assert len(calls) == 2  # written again in full
    assert handover.marker is not None
    copy = await channel.find_sent(handover.marker)
    assert copy is not None and "The second line." in copy.text
    assert account.sent_copies(message.internet_message_id) == 1
    assert account.stored("drafts") == []


async def _no_discard(composer: Composer) -> None:
    """A page too far gone to discard its draft."""
    del composer


@pytest.mark.parametrize(
    ("discards", "next_attempt"),
    [(True, "same"), (False, "same"), (False, "another_worker")],
    ids=["discarded_at_once", "discarded_before_writing_again", "discarded_after_a_sign_in"],
)
async def test_a_page_that_stops_answering_before_send_sends_nothing_and_leaves_no_draft_behind(
    account: OutlookAccount, monkeypatch: pytest.MonkeyPatch, discards: bool, next_attempt: str
) -> None:
    """A composer that stops answering before Send: nothing was sent (NotHandedOver, so
    the send may be tried again). The draft the app saved on the way is discarded at once
    if the page still lets it; else before the channel writes the send again; and a worker
    that knows nothing of it discards it when a sign-in makes it reopen the send's drafts.
    No second copy of the reply is left to be sent by hand."""
    channel = account.build()
    message, handover = await prepared_reply(account, channel)
    calls: list[str] = []

    async def stuck_then_expiring(
        inserted: Insert, composer: webmail.Composer, markup: str
    ) -> None:
        calls.append(markup)
        await inserted(composer, markup)
        await expect(composer.status).to_contain_text("Draft saved")
        if len(calls) == 1:
            raise PlaywrightTimeout("Locator.click: Timeout 10000ms exceeded.")
        if next_attempt == "another_worker":
            account.admin.faults(expire_web_sessions=True)

    on_insert(monkeypatch, stuck_then_expiring)
    if not discards:
        monkeypatch.setattr(webmail, "discard_stuck", _no_discard)
    with pytest.raises(NotHandedOver, match="Send was not pressed"):
        await channel.send(handover)
    assert account.sent_copies(message.internet_message_id) == 0
    assert len(account.stored("drafts")) == (0 if discards else 1)
    again = channel if next_attempt == "same" else account.build()
    await again.send(handover)
    assert len(calls) == 2  # written once more, never a third time
    assert account.sent_copies(message.internet_message_id) == 1
    assert account.stored("drafts") == []
