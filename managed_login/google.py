"""Managed login for Google accounts (accounts.google.com), page by page.

The pages, by what a screen reader meets on them: the account ("Email or phone", Next), the
password ("Enter your password", Next), 2-Step Verification with a code from the
authenticator app ("Enter code", Next; "Don't ask again on this device" is left checked, so
the session is kept for the headless adapter), and the choice of another way ("Choose how
you want to sign in:"), where the authenticator is chosen. A phone prompt offered first
("Check your phone") is answered with "Try another way", once. Google has no "Stay signed
in?" page: a right code ends the sign-in.

Errors come in an alert: a refused password stops the login (never retried); a refused code
is followed once by the next step's. Google shows automated browsers "This browser or app
may not be secure" or "Verify it's you": those are challenges, never evaded. The login stops
there, before any client data, and names the operator's options: the Gmail API with OAuth
(the supported path), or a visible browser where the workspace's policy allows it.
"""

from __future__ import annotations

from playwright.async_api import Locator, Page

from agent.domain.errors import AuthChallengeUnresolved, PasswordRefused, SignInFailed
from managed_login.entry import clear_field, enter_secret
from managed_login.flow import PageByPage, Shown, Step

OPTIONS = (
    "the supported path is the Gmail API with OAuth: connect the mailbox with "
    "`outloop connect --workspace {ws} --mailbox {mb}` and permit its api channel; or, where "
    "the workspace's policy allows it, complete the sign-in once in a visible browser with "
    "`outloop login --workspace {ws} --mailbox {mb} --headed`"
)
CHALLENGES = {
    "Couldn't sign you in": (
        "insecure_browser",
        'Google refused the browser ("This browser or app may not be secure")',
    ),
    "Verify it's you": (
        "verify_its_you",
        "Google asks the account's owner to verify it is really them",
    ),
}
AUTHENTICATOR = "Get a verification code from the Google Authenticator app"
WRONG_PASSWORD = "Wrong password"  # noqa: S105 - the page's wording
WRONG_CODE = "Wrong code"
UNKNOWN_ACCOUNT = "Couldn't find your Google Account"


class GoogleSignInPages:
    """The page objects of Google's sign-in: every locator, by role and name."""

    def __init__(self, page: Page) -> None:
        self.page = page
        self.account_field = page.get_by_role("textbox", name="Email or phone", exact=True)
        self.next = page.get_by_role("button", name="Next", exact=True)
        self.password_field = page.get_by_role("textbox", name="Enter your password", exact=True)
        self.code_field = page.get_by_role("textbox", name="Enter code", exact=True)
        self.choices = page.get_by_text("Choose how you want to sign in:", exact=True)
        self.authenticator = page.get_by_role("link", name=AUTHENTICATOR, exact=True)
        self.phone_prompt = page.get_by_role("heading", name="Check your phone", exact=True)
        self.another_way = page.get_by_role("button", name="Try another way", exact=True)
        self.alert = page.get_by_role("alert").filter(has_text=".")

    def challenge(self, heading: str) -> Locator:
        return self.page.get_by_role("heading", name=heading, exact=True)


class GoogleLogin(PageByPage):
    """Signs a browser page in to a Google account, from whatever sign-in page shows to the
    mail app (``arrived``: a locator only the signed-in app shows)."""

    def _setup(self) -> None:
        self._pages = GoogleSignInPages(self._page)
        self._options = OPTIONS.format(ws=self._workspace_id, mb=self._mailbox_id)
        self._asked_another_way = False

    def _shown(self) -> list[Shown]:
        p = self._pages
        challenges = [Shown(f"challenge:{h}", p.challenge(h)) for h in CHALLENGES]
        return [
            Shown("arrived", self._arrived),
            *challenges,
            Shown("alert", p.alert),
            Shown("code", p.code_field),
            Shown("choices", p.choices),
            Shown("phone_prompt", p.phone_prompt),
            Shown("password", p.password_field),
            Shown("account", p.account_field),
        ]

    async def _answer(self, name: str) -> None:
        p = self._pages
        if name.startswith("challenge:"):
            self._challenge(name.removeprefix("challenge:"))
        if name == "alert":
            await self._alerted()
        elif name == "account":
            await p.account_field.fill(self._worker.account)
            await self._press(Step.ACCOUNT, p.next)
        elif name == "password":
            await enter_secret(p.password_field, self._worker.password)
            await self._press(Step.PASSWORD, p.next)
        elif name == "code":
            await self._code(p.code_field, p.next)
        elif name == "choices":
            await self._choose_authenticator()
        elif name == "phone_prompt":
            await self._another_way()

    async def _choose_authenticator(self) -> None:
        p = self._pages
        if not await p.authenticator.count():
            raise AuthChallengeUnresolved(
                f"{self._what}: Google offers no sign-in with an authenticator code for the "
                "worker account",
                "turn on Google Authenticator for the worker account and store its setup key "
                f"with `outloop vault set`; {self._options}",
                challenge="no_authenticator",
            )
        await self._press(Step.METHOD, p.authenticator)

    async def _another_way(self) -> None:
        """A phone prompt is answered with "Try another way", once: a second one means the
        account offers nothing else, and a person must tap Yes."""
        if self._asked_another_way:
            raise AuthChallengeUnresolved(
                f"{self._what}: Google asks a person to tap Yes on the worker account's phone",
                self._options,
                challenge="phone_prompt",
            )
        self._asked_another_way = True
        await self._press(Step.METHOD, self._pages.another_way)

    async def _alerted(self) -> None:
        p = self._pages
        text = " ".join((await p.alert.first.inner_text()).split())
        await clear_field(p.password_field)
        await clear_field(p.code_field)
        if WRONG_CODE in text:
            await self._code_refused(p.code_field, p.next, "Google")
            return
        if WRONG_PASSWORD in text:
            raise PasswordRefused(
                f"{self._what}: Google refused the stored password (not retried)",
                "store the worker's current password with `outloop vault set`",
            )
        if UNKNOWN_ACCOUNT in text:
            raise SignInFailed(
                f"{self._what}: Google does not know the account {self._worker.account}",
                "check the mailbox's sign-in account in the Workspace Context",
            )
        raise AuthChallengeUnresolved(
            f"{self._what}: the sign-in showed an error managed login does not know: "
            f"{text[:200]!r}",
            self._options,
            challenge="unknown_error",
        )

    def _challenge(self, heading: str) -> None:
        challenge, why = CHALLENGES[heading]
        raise AuthChallengeUnresolved(
            f"{self._what}: {why}; managed login never works around it", self._options,
            challenge=challenge,
        )  # fmt: skip
