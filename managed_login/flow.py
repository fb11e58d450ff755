"""What every managed login shares: the worker's sign-in values by reference, the report a
login gives (steps, never values), and recognising which page a provider shows.

A login is a loop over pages: wait (bounded) until one known page shows, do what it asks,
and go on until the mail app shows. Each provider's flow (``microsoft``, later ``google``)
names its pages and what to do on each; a page it does not know stops the login as a
challenge, never as a guess.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

from playwright.async_api import Error as PlaywrightError
from playwright.async_api import Locator, Page
from pydantic import BaseModel, ConfigDict

from agent.domain.errors import AuthChallengeUnresolved, SignInFailed
from agent.domain.secrets import Secret
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
