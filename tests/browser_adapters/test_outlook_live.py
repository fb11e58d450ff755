"""Opt-in: the Outlook on the web channel and managed Microsoft login against a real
Microsoft 365 account (docs/browser.md).

Skipped, saying which variables to set, unless these are: ``OUTLOOP_LIVE_OWA_ADDRESS`` (the
worker account, also the mailbox), ``OUTLOOP_LIVE_OWA_PASSWORD`` and
``OUTLOOP_LIVE_OWA_TOTP_SECRET`` (the authenticator's setup key); optionally
``OUTLOOP_LIVE_OWA_URL`` (default https://outlook.office.com/mail/) and
``OUTLOOP_BROWSER_EXECUTABLE``. The session is kept in a temporary directory and dropped.

What they do to the mailbox: sign in (a real sign-in the account's sign-in log shows), set
the "Mark as read" option to "Don't automatically mark items as read", and read the newest
page of the inbox; nothing is sent, marked, labelled or moved. A challenge the account meets
(a push to approve, "More information required") fails the test with its code, as the
channel would report it. No test prints a secret.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from agent.domain.context import BrowserAccess, MailboxBinding
from agent.domain.mail import Channel
from agent.domain.secrets import Secret
from browser_adapters.outlook import OutlookWeb, open_outlook_web
from browser_adapters.session import Browsers, BrowserSettings
from managed_login.flow import Step

PREFIX = "OUTLOOP_LIVE_OWA_"
REQUIRED = ("ADDRESS", "PASSWORD", "TOTP_SECRET")
MISSING = [PREFIX + name for name in REQUIRED if not os.environ.get(PREFIX + name)]

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.skipif(
        bool(MISSING),
        reason="live Outlook on the web tests run against a real Microsoft 365 account: set "
        + ", ".join(PREFIX + n for n in REQUIRED)
        + " (docs/browser.md)",
    ),
]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
async def channel(tmp_path: Path, anyio_backend: str) -> AsyncIterator[OutlookWeb]:
    del anyio_backend
    env = os.environ
    url = env.get(PREFIX + "URL")
    binding = MailboxBinding(
        mailbox_id=env[PREFIX + "ADDRESS"],
        provider="microsoft",
        channels=(Channel.BROWSER,),
        browser=BrowserAccess(url=url) if url else BrowserAccess(),
    )
    values = {"password": env[PREFIX + "PASSWORD"], "totp": env[PREFIX + "TOTP_SECRET"]}
    browsers = Browsers(
        BrowserSettings(
            state_dir=tmp_path / "browser", executable=env.get("OUTLOOP_BROWSER_EXECUTABLE")
        )
    )
    found = open_outlook_web(browsers, "ws-live", binding, read=lambda name: Secret(values[name]))
    try:
        yield found
    finally:
        await found.aclose()
        await browsers.aclose()


async def test_managed_login_signs_a_real_account_in_and_its_session_is_kept(
    channel: OutlookWeb,
) -> None:
    report = await channel.login()
    assert report.signed_in and report.steps[-1] is Step.ARRIVED
    assert Step.PASSWORD in report.steps
    assert channel.session_file.exists()
    assert (channel.session_file.stat().st_mode & 0o777) == 0o600


async def test_the_inbox_reads_with_message_ids_and_nothing_is_marked(
    channel: OutlookWeb,
) -> None:
    page = await channel.changes(None)
    for item in page.items:
        assert item.envelope is None or item.envelope.internet_message_id
    health = await channel.health()
    assert health.ok, health.detail
