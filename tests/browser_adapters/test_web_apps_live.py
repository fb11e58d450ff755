"""Opt-in: each web app channel and its managed login against a real account
(docs/browser.md) - Outlook on the web with a Microsoft 365 account, Gmail with a Google
Workspace account.

Each app's tests are skipped, saying which variables to set, unless these are (``OWA`` for
Outlook on the web, ``GMAIL`` for Gmail): ``OUTLOOP_LIVE_<APP>_ADDRESS`` (the worker
account, also the mailbox), ``OUTLOOP_LIVE_<APP>_PASSWORD`` and
``OUTLOOP_LIVE_<APP>_TOTP_SECRET`` (the authenticator's setup key); optionally
``OUTLOOP_LIVE_<APP>_URL`` (default: the app's own) and ``OUTLOOP_BROWSER_EXECUTABLE``. The
session is kept in a temporary directory and dropped.

What they do to the mailbox: sign in (a real sign-in the account's sign-in log shows), set
the app's option that keeps opened mail unread (Outlook's "Don't automatically mark items
as read"; Gmail's reading pane with "Mark conversation as read: Never"), and read the
newest page of the inbox; nothing is sent, marked, labelled or moved. A challenge the
account meets (a push to approve; Google's "This browser or app may not be secure" or
"Verify it's you", which Google often shows automated browsers) fails the test with
AUTH_CHALLENGE_UNRESOLVED and the options the channel names - the honest result. No test
prints a secret.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from agent.domain.context import BrowserAccess, MailboxBinding
from agent.domain.mail import Channel
from agent.domain.secrets import Secret
from browser_adapters.gmail import open_gmail_web
from browser_adapters.outlook import open_outlook_web
from browser_adapters.session import Browsers, BrowserSettings
from browser_adapters.webmail import WebMail
from managed_login.flow import Step

REQUIRED = ("ADDRESS", "PASSWORD", "TOTP_SECRET")
APPS: dict[str, tuple[str, str, Callable[..., WebMail]]] = {
    "OWA": ("microsoft", "a real Microsoft 365 account", open_outlook_web),
    "GMAIL": ("google", "a real Google Workspace account", open_gmail_web),
}


def _app(name: str) -> Any:
    prefix = f"OUTLOOP_LIVE_{name}_"
    missing = [prefix + n for n in REQUIRED if not os.environ.get(prefix + n)]
    reason = (
        f"live {name} tests run against {APPS[name][1]}: set "
        + ", ".join(prefix + n for n in REQUIRED)
        + " (docs/browser.md)"
    )
    return pytest.param(name, marks=pytest.mark.skipif(bool(missing), reason=reason), id=name)


pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(params=[_app(name) for name in APPS])
async def channel(
    tmp_path: Path, request: pytest.FixtureRequest, anyio_backend: str
) -> AsyncIterator[WebMail]:
    del anyio_backend
    name: str = request.param
    provider, _, opened = APPS[name]
    prefix, env = f"OUTLOOP_LIVE_{name}_", os.environ
    url = env.get(prefix + "URL")
    binding = MailboxBinding(
        mailbox_id=env[prefix + "ADDRESS"],
        provider=provider,
        channels=(Channel.BROWSER,),
        browser=BrowserAccess(url=url) if url else BrowserAccess(),
    )
    values = {"password": env[prefix + "PASSWORD"], "totp": env[prefix + "TOTP_SECRET"]}
    browsers = Browsers(
        BrowserSettings(
            state_dir=tmp_path / "browser", executable=env.get("OUTLOOP_BROWSER_EXECUTABLE")
        )
    )
    found = opened(browsers, "ws-live", binding, read=lambda key: Secret(values[key]))
    try:
        yield found
    finally:
        await found.aclose()
        await browsers.aclose()


async def test_managed_login_signs_a_real_account_in_and_its_session_is_kept(
    channel: WebMail,
) -> None:
    report = await channel.login()
    assert report.signed_in and report.steps[-1] is Step.ARRIVED
    assert Step.PASSWORD in report.steps
    assert channel.session_file.exists()
    assert (channel.session_file.stat().st_mode & 0o777) == 0o600


async def test_the_inbox_reads_with_message_ids_and_nothing_is_marked(channel: WebMail) -> None:
    page = await channel.changes(None)
    for item in page.items:
        assert item.envelope is None or item.envelope.internet_message_id
    health = await channel.health()
    assert health.ok, health.detail
