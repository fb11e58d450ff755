"""Authenticator codes for a managed login, taken as identity providers want them taken.

A code is good for its 30-second step (and, at most providers, the step after), and a
provider refuses a code of a step already used. So a login never submits one code twice,
and never submits a code with fewer than ``MIN_REMAINING_SECONDS`` of its step left (it
might expire between the form and the server): it waits for the next step instead.

The secret and every code stay ``Secret`` values: a code is unwrapped only by the login
flow, at the moment it reaches the page. The clock and the wait are given, so tests drive
them and never wait for a window.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import NoReturn

import anyio
from pyotp.totp import TOTP

from agent.domain.secrets import Secret

STEP_SECONDS = 30
MIN_REMAINING_SECONDS = 20.0


class NotAnAuthenticatorSecret(ValueError):
    """The stored TOTP secret is not base32 of at least 112 bits (no value in the text)."""


class Codes:
    """The codes of one authenticator secret, each step's at most once."""

    def __init__(
        self,
        secret: Secret,
        *,
        clock: Callable[[], float] = time.time,
        sleep: Callable[[float], Awaitable[None]] = anyio.sleep,
    ) -> None:
        try:
            self._totp = TOTP(secret.reveal(), interval=STEP_SECONDS)
            self._totp.byte_secret()
        except (ValueError, TypeError):
            raise NotAnAuthenticatorSecret(
                "the stored TOTP secret is not an authenticator's (base32, 112 bits or more): "
                "store the setup key the provider showed, with `outloop vault set`"
            ) from None
        self._clock = clock
        self._sleep = sleep
        self._last_step: int | None = None

    def __repr__(self) -> str:
        return "Codes(secret=[redacted])"

    def __reduce__(self) -> NoReturn:
        raise TypeError("authenticator codes are never pickled (the secret would leave the vault)")

    @property
    def last_step(self) -> int | None:
        """The step of the last code given (a number, not a code), if any."""
        return self._last_step

    def used_through(self, step: int | None) -> None:
        """Codes up to ``step`` were submitted already (by an earlier login): never again."""
        if step is not None and (self._last_step is None or step > self._last_step):
            self._last_step = step

    def wait_before_next(self) -> float:
        """Seconds to wait before ``next`` may give a code (0: one is ready now)."""
        now = self._clock()
        step = int(now // STEP_SECONDS)
        remaining = (step + 1) * STEP_SECONDS - now
        if (self._last_step is not None and step <= self._last_step) or (
            remaining < MIN_REMAINING_SECONDS
        ):
            return remaining
        return 0.0

    async def next(self) -> Secret:
        """A code of a step not used yet, with enough of its step left; waits if needed."""
        while (wait := self.wait_before_next()) > 0:
            await self._sleep(wait)
        step = int(self._clock() // STEP_SECONDS)
        self._last_step = step
        return Secret(self._totp.at(step * STEP_SECONDS))
