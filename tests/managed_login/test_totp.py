"""Managed login's authenticator codes: never one step's code twice, never a code about to
expire, the secret never shown; the clock and the waits are the test's."""

from __future__ import annotations

import pickle

import pytest
from pyotp import random_base32
from pyotp.totp import TOTP

from agent.domain.secrets import Secret
from managed_login.totp import MIN_REMAINING_SECONDS, Codes, NotAnAuthenticatorSecret

pytestmark = pytest.mark.anyio

SEED = random_base32()
T = 1_800_000_000.0  # a step boundary


class Clock:
    """A clock the test moves; ``sleep`` moves it and records the wait."""

    def __init__(self, now: float) -> None:
        self.now = now
        self.waits: list[float] = []

    def __call__(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.waits.append(seconds)
        self.now += seconds


def codes_at(now: float) -> tuple[Codes, Clock]:
    clock = Clock(now)
    return Codes(Secret(SEED), clock=clock, sleep=clock.sleep), clock


def expected(at: float) -> str:
    return TOTP(SEED).at(int(at))


async def test_a_code_with_enough_of_its_step_left_is_given_at_once() -> None:
    codes, clock = codes_at(T + 5)
    code = await codes.next()
    assert code.reveal() == expected(T + 5) and clock.waits == []


async def test_a_code_about_to_expire_is_not_given_the_next_steps_is() -> None:
    codes, clock = codes_at(T + 30 - MIN_REMAINING_SECONDS + 1)  # 19 s left
    code = await codes.next()
    assert clock.waits == [pytest.approx(MIN_REMAINING_SECONDS - 1)]
    assert code.reveal() == expected(T + 30)


async def test_one_steps_code_is_never_given_twice() -> None:
    codes, clock = codes_at(T + 1)
    first = await codes.next()
    second = await codes.next()  # the same step: wait for the next one
    assert clock.waits == [pytest.approx(29)]
    assert first.reveal() == expected(T) and second.reveal() == expected(T + 30)
    assert first != second


async def test_the_wait_is_known_before_asking() -> None:
    codes, _ = codes_at(T + 2)
    assert codes.wait_before_next() == 0
    await codes.next()
    assert codes.wait_before_next() == pytest.approx(28)


def test_the_secret_never_shows_in_text_or_a_pickle() -> None:
    codes, _ = codes_at(T)
    assert SEED not in repr(codes) and SEED not in str(codes)
    with pytest.raises(TypeError):
        pickle.dumps(codes)


@pytest.mark.parametrize("stored", ["JBSWY3DPEHPK3PXP", "not base32!", ""])
def test_a_secret_no_authenticator_holds_is_refused_without_quoting_it(stored: str) -> None:
    with pytest.raises(NotAnAuthenticatorSecret) as refused:
        Codes(Secret(stored))
    message = str(refused.value)
    assert "outloop vault set" in message
    assert not stored or stored not in message
    assert refused.value.__cause__ is None and refused.value.__suppress_context__
