"""A mailbox of a mock server of the module's own, reached through its web app in headless
Chromium (Microsoft's through Outlook on the web here; ``gmail_mock`` for Google's): what
the web app adapters' tests share."""

from __future__ import annotations

import base64
import email
import email.policy
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import pytest
from playwright.async_api import expect

from agent.domain.mail import Handover, OutgoingMessage
from agent.domain.secrets import Secret
from agent.providers import mime
from agent.testing.providers import envelopes, raw_message, read_all, reply
from browser_adapters import webmail
from browser_adapters.outlook import OutlookWeb
from browser_adapters.session import Browsers, BrowserSettings, MailboxBrowser
from browser_adapters.webmail import WebMail
from fixtures.admin import MockAdmin, WebClock
from managed_login.flow import WorkerSignIn
from managed_login.totp import Codes
from tests.browser import chromium_executable

SECRET = "JBSWY3DPEHPK3PXPJBSWY3DPEHPK3PXP"
CLOCK = WebClock.now
"""The web clock of these tests: one second into a TOTP step (29 s of it left)."""
APP = "/web/outlook/mail/"


@dataclass
class OutlookAccount:
    """One Microsoft account of the mock, and adapters reaching it through the web."""

    admin: MockAdmin
    address: str
    state_dir: Path
    clock: WebClock
    password: str = ""
    create: bool = True
    """Create the account (False: another part of the test made it)."""
    browsers: list[Browsers] = field(default_factory=list[Browsers])
    made: dict[str, Any] = field(default_factory=dict[str, Any])
    """What the mock answered when it made the account (its OAuth client and tokens)."""

    PROVIDER: ClassVar[str] = "microsoft"
    CHANNEL: ClassVar[type[WebMail]] = OutlookWeb
    APP_PATH: ClassVar[str] = APP

    def __post_init__(self) -> None:
        if self.create:
            self.made = self.admin.account(self.address, self.PROVIDER)
        self.password = self.password or "pw-" + self.address

    def worker(self) -> WorkerSignIn:
        codes = Codes(Secret(SECRET), clock=self.clock, sleep=self.clock.sleep)
        return WorkerSignIn(account=self.address, password=Secret(self.password), codes=codes)

    def settings(self) -> BrowserSettings:
        return BrowserSettings(
            state_dir=self.state_dir, executable=chromium_executable(), timeout_seconds=10
        )

    def build(
        self,
        *,
        page_size: int = 3,
        worker: Callable[[], WorkerSignIn] | None = None,
        challenges: webmail.ChallengeKeeper | None = None,
    ) -> WebMail:
        browsers = Browsers(self.settings())
        self.browsers.append(browsers)
        return self.CHANNEL(
            MailboxBrowser(browsers, "ws-test", self.address),
            self.address,
            self.admin.base_url + self.APP_PATH,
            worker or self.worker,
            workspace_id="ws-test",
            page_size=page_size,
            challenges=challenges,
        )

    async def aclose(self) -> None:
        for browsers in self.browsers:
            await browsers.aclose()
        self.browsers.clear()

    def deliver(self, raw: bytes) -> dict[str, Any]:
        return self.admin.deliver(self.address, raw)

    def stored(self, folder: str | None = None) -> list[dict[str, Any]]:
        return self.admin.stored(self.address, folder)

    def snapshot(self) -> dict[str, str]:
        return self.admin.snapshot(self.address)

    def sent_copies(self, message_id: str) -> int:
        """Sent copies of the send of ``message_id`` through any channel of the mailbox:
        those carrying its Message-ID (an API's) or its token (ours through the web, in a
        header or in the decoded HTML), and every copy of the account the mock still delays
        (it lists those by id only)."""
        token = mime.send_token(message_id)
        filed = sum(
            _carries(base64.b64decode(stored["raw_base64"]), message_id, token)
            for stored in self.stored("sent")
        )
        pending = self.admin.call("GET", "/_admin/faults")["delayed"]
        return filed + sum(1 for p in pending if p["account"] == self.address)


def _carries(raw: bytes, message_id: str, token: str) -> bool:
    parsed = email.message_from_bytes(raw, policy=email.policy.default)
    if str(parsed.get("Message-ID", "")).strip() == message_id or token.encode() in raw:
        return True
    return any(
        token in str(part.get_content())
        for part in parsed.walk()
        if part.get_content_maintype() == "text"
    )


Insert = Callable[[webmail.Composer, str], Awaitable[None]]
"""How the adapter puts the rendered HTML into the app's editor."""


def on_insert(
    monkeypatch: pytest.MonkeyPatch,
    then: Callable[[Insert, webmail.Composer, str], Awaitable[None]],
) -> None:
    """The adapter's HTML insertion replaced by ``then``, handed the real one: the moment a
    test makes something happen in the middle of writing a reply."""
    inserted: Insert = webmail.insert_composed

    async def instead(composer: webmail.Composer, markup: str) -> None:
        await then(inserted, composer, markup)

    monkeypatch.setattr(webmail, "insert_composed", instead)


def expiring(monkeypatch: pytest.MonkeyPatch, account: OutlookAccount, *, after_save: bool) -> None:
    """The session ends once, when the reply's HTML goes into the editor (after the app
    saved the draft, or before it could)."""
    ended: list[bool] = []

    async def then_expire(inserted: Insert, composer: webmail.Composer, markup: str) -> None:
        if not after_save and not ended:
            ended.append(True)
            account.admin.faults(expire_web_sessions=True)
        await inserted(composer, markup)
        if after_save and not ended:
            ended.append(True)
            await expect(composer.status).to_contain_text("Draft saved")
            account.admin.faults(expire_web_sessions=True)

    on_insert(monkeypatch, then_expire)


async def prepared_reply(
    account: OutlookAccount, channel: WebMail, **update: object
) -> tuple[OutgoingMessage, Handover]:
    """The client's first message delivered and read through ``channel``, and our reply to
    it (with ``update``'s fields) prepared."""
    account.deliver(raw_message(1))
    [parent] = envelopes((await read_all(channel))[0])
    message = reply(parent, channel.capabilities).model_copy(update=update)
    return message, await channel.prepare(message)
