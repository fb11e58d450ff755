"""Sending through Gmail on the web, where it can go wrong: a session that ends in the middle
of a reply (Send refused for want of a session, managed login, the saved draft reopened or
the reply written again: sent once), and a search for our copy that cannot read the whole
of Sent (its absence not proven, so the send stays uncertain rather than going out again)."""

from __future__ import annotations

import base64
from email.message import EmailMessage

import httpx
import pytest

from agent.domain.errors import TransientFailure
from agent.domain.mail import Marker, MarkerKind
from agent.providers import mime
from agent.testing.providers import CLIENT
from managed_login.flow import Step
from tests.browser_adapters.gmail_mock import GmailAccount
from tests.browser_adapters.outlook_mock import expiring, prepared_reply

pytestmark = pytest.mark.anyio
MAILBOX = "support@fabrikam.test"
ACCOUNT = GmailAccount
PAGE = 50
"""The conversations Gmail's lists show a page, by default."""


@pytest.mark.parametrize("after_save", [True, False], ids=["draft_saved", "nothing_saved"])
async def test_a_session_ending_mid_reply_in_gmail_signs_in_again_and_sends_the_reply_once(
    account: GmailAccount, monkeypatch: pytest.MonkeyPatch, after_save: bool
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


def _sent_through_the_api(account: GmailAccount, count: int) -> list[str]:
    """``count`` messages, each in a thread of its own, sent through the Gmail API: their
    Message-IDs, oldest first."""
    sent: list[str] = []
    headers = {"Authorization": f"Bearer {account.made['access_token']}"}
    url = f"{account.admin.base_url}/gmail/v1/users/me/messages/send"
    with httpx.Client(timeout=30) as client:
        for n in range(count):
            message = EmailMessage()
            message["From"] = MAILBOX
            message["To"] = CLIENT
            message["Subject"] = f"Statement {n}"
            message["Message-ID"] = f"<statement-{n}@fabrikam.test>"
            message.set_content(f"Statement {n} is attached.")
            raw = base64.urlsafe_b64encode(message.as_bytes()).decode()
            client.post(url, json={"raw": raw}, headers=headers).raise_for_status()
            sent.append(str(message["Message-ID"]))
    return sent


async def test_a_copy_not_on_the_first_page_of_sent_is_not_proven_absent(
    account: GmailAccount,
) -> None:
    """Sent lists more than a page: a copy on the first page is found; a copy that is not
    there is not proven absent (it could be on an older page), whichever marker asks."""
    sent = _sent_through_the_api(account, PAGE + 1)
    channel = account.build()
    newest = await channel.find_sent(Marker(kind=MarkerKind.MESSAGE_ID, value=sent[-1]))
    assert newest is not None and newest.internet_message_id == sent[-1]
    for marker in (
        Marker(kind=MarkerKind.MESSAGE_ID, value="<never-sent@fabrikam.test>"),
        Marker(kind=MarkerKind.NATIVE, value="gweb-sent::" + mime.send_token("<x@y.test>")),
    ):
        with pytest.raises(TransientFailure, match="absence is not proven"):
            await channel.find_sent(marker)
