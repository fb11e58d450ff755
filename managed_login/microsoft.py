"""Managed login for Microsoft accounts (login.microsoftonline.com), page by page.

The pages, by what a screen reader meets on them: the account ("Enter your email, phone,
or Skype.", Next), the password ("Enter the password for <account>", "Sign in"), the
authenticator code (heading "Enter code", textbox "Code", Verify), the choice of methods
("Verify your identity": "Use a verification code"), "Stay signed in?" (Yes: the session is
kept for the headless adapter). Errors come in an alert: a refused password or account
stops the login (retrying a wrong password locks the account); a refused code is retried
once with the next step's code. The pages a person must answer - a push to approve with
number matching, "More information required", a locked account - are challenges: the login
stops there, before any client data, and says what the operator does.
"""

from __future__ import annotations

from playwright.async_api import Locator, Page

from agent.domain.errors import AuthChallengeUnresolved, PasswordRefused, SignInFailed
from managed_login.entry import clear_field, enter_secret
from managed_login.flow import PageByPage, Shown, Step

HEADED = (
    "complete it once in a visible browser with "
    "`outloop login --workspace {ws} --mailbox {mb} --headed`"
)
CHALLENGES = {
    "Approve sign in request": (
        "approve_sign_in",
        "Microsoft asks a person to approve the sign-in in the Authenticator app",
    ),
    "More information required": (
        "more_information_required",
        "Microsoft asks for more security information for the worker account",
    ),
    "Your account is locked": (
        "account_locked",
        "Microsoft has locked the worker account",
    ),
}
WRONG_PASSWORD = "Your account or password is incorrect"  # noqa: S105 - the page's wording
WRONG_CODE = "You didn't enter the expected verification code"
UNKNOWN_ACCOUNT = "This username may be incorrect"
TIMED_OUT = "Your sign-in timed out"


class MicrosoftSignInPages:
    """The page objects of Microsoft's sign-in: every locator, by role and name."""

    def __init__(self, page: Page, account: str) -> None:
        self.page = page
        self.account_field = page.get_by_role("textbox", name="Enter your email, phone, or Skype.")
        self.next = page.get_by_role("button", name="Next", exact=True)
        self.password_field = page.get_by_role(
            "textbox", name=f"Enter the password for {account}", exact=True
        )
        self.sign_in = page.get_by_role("button", name="Sign in", exact=True)
        self.code_heading = page.get_by_role("heading", name="Enter code", exact=True)
        self.code_field = page.get_by_role("textbox", name="Code", exact=True)
        self.verify = page.get_by_role("button", name="Verify", exact=True)
        self.methods_heading = page.get_by_role("heading", name="Verify your identity")
        self.use_code = page.get_by_role("button", name="Use a verification code")
        self.stay_signed_in = page.get_by_role("heading", name="Stay signed in?")
        self.yes = page.get_by_role("button", name="Yes", exact=True)
        self.alert = page.get_by_role("alert").filter(has_text=".")

    def challenge(self, heading: str) -> Locator:
        return self.page.get_by_role("heading", name=heading, exact=True)


class MicrosoftLogin(PageByPage):
    """Signs a browser page in to a Microsoft account, from whatever sign-in page shows to
    the mail app (``arrived``: a locator only the signed-in app shows)."""

    def _setup(self) -> None:
        self._pages = MicrosoftSignInPages(self._page, self._worker.account)
        self._headed = HEADED.format(ws=self._workspace_id, mb=self._mailbox_id)

    def _shown(self) -> list[Shown]:
        p = self._pages
        challenges = [Shown(f"challenge:{h}", p.challenge(h)) for h in CHALLENGES]
        return [
            Shown("arrived", self._arrived),
            *challenges,
            Shown("alert", p.alert),
            Shown("stay_signed_in", p.stay_signed_in),
            Shown("methods", p.methods_heading),
            Shown("code", p.code_heading),
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
            await self._press(Step.PASSWORD, p.sign_in)
        elif name == "methods":
            await self._press(Step.METHOD, p.use_code)
        elif name == "code":
            await self._code(p.code_field, p.verify)
        elif name == "stay_signed_in":
            await self._press(Step.STAY_SIGNED_IN, p.yes)

    async def _alerted(self) -> None:
        p = self._pages
        text = " ".join((await p.alert.first.inner_text()).split())
        await clear_field(p.password_field)
        await clear_field(p.code_field)
        if WRONG_CODE in text:
            await self._code_refused(p.code_field, p.verify, "Microsoft")
            return
        if WRONG_PASSWORD in text:
            raise PasswordRefused(
                f"{self._what}: Microsoft refused the stored password (not retried: retries "
                "lock the account)",
                "store the worker's current password with `outloop vault set`",
            )
        if UNKNOWN_ACCOUNT in text:
            raise SignInFailed(
                f"{self._what}: Microsoft does not know the account {self._worker.account}",
                "check the mailbox's sign-in account in the Workspace Context",
            )
        if TIMED_OUT in text:
            raise SignInFailed(f"{self._what}: the sign-in page timed out", "run the login again")
        raise AuthChallengeUnresolved(
            f"{self._what}: the sign-in showed an error managed login does not know: "
            f"{text[:200]!r}",
            self._headed,
            challenge="unknown_error",
        )

    def _challenge(self, heading: str) -> None:
        challenge, why = CHALLENGES[heading]
        raise AuthChallengeUnresolved(
            f"{self._what}: {why}; managed login does not answer it for a person",
            self._headed,
            challenge=challenge,
        )
