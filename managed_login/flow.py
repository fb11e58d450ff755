"""What every managed login shares: the worker's sign-in values by reference, the report a
login gives (steps, never values), and recognising which page a provider shows.

A login is a loop over pages: wait (bounded) until one known page shows, do what it asks,
and go on until the mail app shows. Each provider's flow (``microsoft``, later ``google``)
names its pages and what to do on each; a page it does not know stops the login as a
challenge, never as a guess.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

from playwright.async_api import Error as PlaywrightError
from playwright.async_api import Locator, Page
from pydantic import BaseModel, ConfigDict

from agent.domain.errors import AuthChallengeUnresolved, SignInFailed
from agent.domain.secrets import Secret
from managed_login.entry import enter_secret, refuse_recording
from managed_login.totp import Codes

MAX_PAGES = 12
"""A sign-in that has not reached the mail app after this many pages is going round."""


class Step(StrEnum):
    """What a managed login did, in order (the report names steps, never values)."""

    ACCOUNT = "account"
    PASSWORD = "password"  # noqa: S105 - the name of a step, not a password
    METHOD = "method"
    CODE = "code"
    STAY_SIGNED_IN = "stay_signed_in"
    BY_PERSON = "completed_by_person"
    """A person completed what managed login may not (``outloop login --headed``)."""
    ARRIVED = "arrived"


class LoginReport(BaseModel):
    """How a managed login went: the account it signed in and the steps it took."""

    model_config = ConfigDict(frozen=True)

    account: str
    steps: tuple[Step, ...]
    signed_in: bool
    """False when the browser was signed in already (no page of the provider was shown)."""


@dataclass(frozen=True)
class WorkerSignIn:
    """A mailbox's dedicated worker credentials, read from the vault by reference: the
    account (no secret), its password and its authenticator codes."""

    account: str
    password: Secret
    codes: Codes

    def __repr__(self) -> str:
        return f"WorkerSignIn(account={self.account!r}, password=[redacted], codes=[redacted])"


SEEN = "data-outloop-seen"
"""Set on what a page showed before the login acted on it: the next page (or a new alert on
the same page) is told from the one just answered."""


@dataclass(frozen=True)
class Shown:
    """A page of a provider's sign-in, recognised by a locator that only it shows (and that
    was not marked seen)."""

    name: str
    marker: Locator

    def __post_init__(self) -> None:
        unseen = self.marker.page.locator(f":not([{SEEN}])")
        object.__setattr__(self, "marker", self.marker.and_(unseen))


async def mark_seen(marker: Locator) -> None:
    """Mark every element ``marker`` finds now as seen."""
    await marker.evaluate_all(f"els => els.forEach(e => e.setAttribute('{SEEN}', ''))")


async def first_shown(page: Page, shown: Sequence[Shown], timeout_ms: float, *, what: str) -> Shown:
    """The first of ``shown`` visible within ``timeout_ms`` (checked in order once one
    shows); a challenge naming the page's title when none does."""
    anyone = shown[0].marker
    for other in shown[1:]:
        anyone = anyone.or_(other.marker)
    try:
        await anyone.first.wait_for(state="visible", timeout=timeout_ms)
    except PlaywrightError:
        title = await _title(page)
        raise AuthChallengeUnresolved(
            f"{what}: the sign-in showed a page managed login does not know ({title!r})",
            "complete the sign-in once in a visible browser with `outloop login --headed`, "
            "or tell us the page so managed login can learn it",
            challenge="unknown_page",
        ) from None
    for candidate in shown:
        if await candidate.marker.first.is_visible():
            return candidate
    return await first_shown(page, shown, timeout_ms, what=what)


async def _title(page: Page) -> str:
    try:
        return (await page.title())[:120]
    except PlaywrightError:
        return ""


def too_many_pages(what: str) -> SignInFailed:
    return SignInFailed(
        f"{what}: the sign-in went through {MAX_PAGES} pages without reaching the mailbox",
        "sign in once with `outloop login --headed` to see where it loops",
    )


class PageByPage(ABC):
    """A provider's sign-in walked page by page, from whatever page shows to the mail app
    (``arrived``: a locator only the signed-in app shows). Each provider names its pages
    (``shown``, in the order they are told apart) and answers each (``answer``)."""

    def __init__(
        self,
        page: Page,
        worker: WorkerSignIn,
        arrived: Locator,
        *,
        workspace_id: str,
        mailbox_id: str,
        timeout_ms: float = 15_000,
    ) -> None:
        self._page = page
        self._worker = worker
        self._arrived = arrived
        self._timeout = timeout_ms
        self._workspace_id = workspace_id
        self._mailbox_id = mailbox_id
        self._what = f"mailbox {mailbox_id}"
        self._steps: list[Step] = []
        self._codes_refused = 0
        self._setup()

    @abstractmethod
    def _setup(self) -> None:
        """The provider's page objects and what it tells an operator, made once."""

    async def run(self) -> LoginReport:
        """Sign in (nothing typed when the app shows already); ``SignInFailed`` or
        ``AuthChallengeUnresolved`` when it cannot, with no client data read."""
        refuse_recording()
        for _ in range(MAX_PAGES):
            shown = await first_shown(self._page, self._shown(), self._timeout, what=self._what)
            if shown.name == "arrived":
                self._steps.append(Step.ARRIVED)
                return LoginReport(
                    account=self._worker.account,
                    steps=tuple(self._steps),
                    signed_in=len(self._steps) > 1,
                )
            await self._answer(shown.name)
        raise too_many_pages(self._what)

    @abstractmethod
    def _shown(self) -> list[Shown]:
        """The pages this sign-in tells apart, ``arrived`` first."""

    @abstractmethod
    async def _answer(self, name: str) -> None:
        """Do what the page ``name`` asks."""

    async def _press(self, step: Step, button: Locator) -> None:
        """Press ``button`` after marking what the page shows now as seen, so the next
        page (or a new alert on this one) is what the loop recognises next."""
        self._steps.append(step)
        for shown in self._shown():
            await mark_seen(shown.marker)
        await button.click(timeout=self._timeout)

    async def _code(self, field: Locator, submit: Locator) -> None:
        """The authenticator's next code (never one of a step already used), typed and sent."""
        code = await self._worker.codes.next()
        await enter_secret(field, code)
        await self._press(Step.CODE, submit)

    async def _code_refused(self, field: Locator, submit: Locator, provider: str) -> None:
        """A refused code is followed once by the next step's; a second refusal stops."""
        if self._codes_refused:
            raise SignInFailed(
                f"{self._what}: {provider} refused two authenticator codes in a row",
                "check the worker's authenticator secret in the vault (`outloop vault set` "
                "with the setup key) and this machine's clock",
            )
        self._codes_refused += 1
        await self._code(field, submit)
