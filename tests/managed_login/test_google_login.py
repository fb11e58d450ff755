"""Managed Google login against the mock sign-in pages in headless Chromium: a browser sent
to sign in by Gmail signs itself in with the worker's password and authenticator code; what
it cannot answer - "This browser or app may not be secure", "Verify it's you", a phone
prompt with no other way - stops it before the mail app shows, naming the operator's
options (the Gmail API with OAuth, or a visible browser)."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass

import pytest
from playwright.async_api import Browser, Locator, Page, async_playwright

from agent.domain.errors import AuthChallengeUnresolved, PasswordRefused, SignInFailed
from agent.domain.secrets import Secret
from fixtures.admin import MockAdmin, WebClock
from managed_login.flow import LoginReport, Step, WorkerSignIn
from managed_login.google import GoogleLogin
from managed_login.totp import STEP_SECONDS, Codes
from tests.browser import LAUNCH_ARGS, chromium_executable
from tests.browser_adapters.outlook_mock import SECRET
from tests.providers.private_mock import PrivateMock

pytestmark = pytest.mark.anyio
MAILBOX = "worker@contoso.test"
GMAIL = "/web/gmail/mail/u/0/"
FULL = (Step.ACCOUNT, Step.PASSWORD, Step.CODE, Step.ARRIVED)

_private = PrivateMock("google-login")


@pytest.fixture(scope="module", autouse=True)
def _stop_private_mock() -> Iterator[None]:
    yield
    _private.stop()


@dataclass
class Google:
    """The worker's Google account on the mock, and a page of a browser to sign in with."""

    admin: MockAdmin
    clock: WebClock
    page: Page
    password: str = "pw-" + MAILBOX

    def worker(self) -> WorkerSignIn:
        codes = Codes(Secret(SECRET), clock=self.clock, sleep=self.clock.sleep)
        return WorkerSignIn(account=MAILBOX, password=Secret(self.password), codes=codes)

    @property
    def inbox(self) -> Locator:
        """What only the signed-in Gmail shows: its account button."""
        return self.page.get_by_role("button", name=re.compile(r"^Google Account: "))

    async def sign_in(self, worker: WorkerSignIn | None = None) -> LoginReport:
        await self.page.goto(self.admin.base_url + GMAIL)
        login = GoogleLogin(
            self.page, worker or self.worker(), self.inbox,
            workspace_id="ws-google", mailbox_id=MAILBOX, timeout_ms=10_000,
        )  # fmt: skip
        return await login.run()


@pytest.fixture(scope="module")
async def browser(anyio_backend: str) -> AsyncIterator[Browser]:
    del anyio_backend
    async with async_playwright() as playwright:
        found = await playwright.chromium.launch(
            executable_path=chromium_executable(), headless=True, args=LAUNCH_ARGS
        )
        yield found
        await found.close()


@pytest.fixture
async def google(browser: Browser) -> AsyncIterator[Google]:
    admin = _private.admin()
    admin.reset()
    admin.account(MAILBOX, "google")
    context = await browser.new_context()
    try:
        yield Google(admin, WebClock(admin), await context.new_page())
    finally:
        await context.close()
        admin.clear_faults()


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    return "asyncio"


async def test_a_signed_out_browser_signs_in_with_password_and_code(google: Google) -> None:
    report = await google.sign_in()
    assert report.steps == FULL and report.signed_in
    assert await google.inbox.is_visible()
    again = await google.sign_in()  # the session is kept: nothing typed
    assert again.steps == (Step.ARRIVED,) and not again.signed_in


async def test_the_authenticator_is_chosen_when_google_offers_a_choice_of_ways(
    google: Google,
) -> None:
    google.admin.faults(web_method_choice=True)
    report = await google.sign_in()
    assert report.steps == (Step.ACCOUNT, Step.PASSWORD, Step.METHOD, Step.CODE, Step.ARRIVED)


@pytest.mark.parametrize(
    ("switch", "challenge"),
    [("insecure_browser", "insecure_browser"), ("verify_its_you", "verify_its_you")],
    ids=["this_browser_may_not_be_secure", "verify_it_s_you"],
)
async def test_google_s_checks_of_automated_browsers_stop_the_login_and_name_the_options(
    google: Google, switch: str, challenge: str
) -> None:
    google.admin.faults(web_challenge=switch)
    with pytest.raises(AuthChallengeUnresolved) as stopped:
        await google.sign_in()
    assert stopped.value.challenge == challenge
    assert "outloop connect" in stopped.value.action and "--headed" in stopped.value.action
    assert not await google.inbox.is_visible()  # no mail shown: no client data read


async def test_a_refused_password_is_not_typed_again(google: Google) -> None:
    google.password = "not-the-password"
    with pytest.raises(PasswordRefused):
        await google.sign_in()
    field = google.page.get_by_role("textbox", name="Enter your password", exact=True)
    assert await field.input_value() == ""  # the refused value is not left in the page


async def test_two_wrong_codes_stop_the_login_and_name_the_secret_and_the_clock(
    google: Google,
) -> None:
    """A wrong code is followed once by the next step's; a second wrong one stops."""
    other = Codes(Secret("GEZDGNBVGY3TQOJQGEZDGNBVGY3TQOJQ"), clock=google.clock,
                  sleep=google.clock.sleep)  # fmt: skip
    worker = WorkerSignIn(account=MAILBOX, password=Secret(google.password), codes=other)
    started = google.clock()
    with pytest.raises(SignInFailed, match="two authenticator codes") as stopped:
        await google.sign_in(worker)
    assert "clock" in stopped.value.action and "setup key" in stopped.value.action
    assert google.clock() // STEP_SECONDS > started // STEP_SECONDS  # a later step's code
    assert not await google.inbox.is_visible()


async def test_a_code_step_already_used_is_never_submitted_again(google: Google) -> None:
    first = google.worker()
    await google.sign_in(first)
    await google.page.context.clear_cookies()  # signed out, on a device Google forgot
    second = google.worker()
    second.codes.used_through(first.codes.last_step)
    report = await google.sign_in(second)
    assert Step.CODE in report.steps
    assert second.codes.last_step is not None and first.codes.last_step is not None
    assert second.codes.last_step > first.codes.last_step
