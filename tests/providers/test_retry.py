"""The adapters' declared retries: what is retried, how long it waits, what never is."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterator

import pytest
import stamina

from agent.domain.errors import (
    AccessRefused,
    AuthenticationExpired,
    CursorExpired,
    NotFound,
    OutcomeUnknown,
    ProviderError,
    Throttled,
    TransientFailure,
    Unsupported,
)
from agent.providers.retry import ATTEMPTS, LONGEST_WAIT, retry_decision, with_retries

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def attempts() -> Iterator[None]:
    """Testing mode with the real number of attempts (still no waits)."""
    with stamina.set_testing(True, attempts=ATTEMPTS):
        yield


def failing(*errors: Exception) -> tuple[list[int], Callable[[], Awaitable[str]]]:
    """A coroutine function raising ``errors`` one per call, then answering "done"."""
    calls: list[int] = []

    @with_retries
    async def call() -> str:
        calls.append(len(calls))
        if len(calls) <= len(errors):
            raise errors[len(calls) - 1]
        return "done"

    return calls, call


def test_the_suite_runs_with_one_attempt_and_no_waits() -> None:
    assert stamina.is_testing()


def test_a_throttle_naming_a_wait_is_retried_after_exactly_that_wait() -> None:
    assert retry_decision(Throttled("slow down", retry_after=2.5)) == 2.5
    assert retry_decision(Throttled("slow down", retry_after=0)) == 0.0
    assert retry_decision(Throttled("slow down")) is True


def test_a_throttle_asking_for_more_than_the_longest_wait_is_given_up() -> None:
    too_long = LONGEST_WAIT.total_seconds() + 1
    assert retry_decision(Throttled("come back tomorrow", retry_after=too_long)) is False


def test_only_transient_failures_and_throttles_are_retried() -> None:
    assert retry_decision(TransientFailure("connection reset")) is True
    for never in (
        OutcomeUnknown("the answer was lost"),
        AccessRefused("policy"),
        AuthenticationExpired("token"),
        NotFound("gone"),
        CursorExpired("old"),
        Unsupported("no"),
        ProviderError("unknown kind"),
        ValueError("a bug"),
    ):
        assert retry_decision(never) is False, type(never).__name__


@pytest.mark.usefixtures("attempts")
async def test_transient_failures_are_retried_until_the_call_succeeds() -> None:
    calls, call = failing(TransientFailure("reset"), Throttled("slow", retry_after=1.0))

    assert await call() == "done"
    assert len(calls) == 3


@pytest.mark.usefixtures("attempts")
async def test_retries_stop_after_the_bounded_number_of_attempts() -> None:
    calls, call = failing(*(TransientFailure(f"reset {n}") for n in range(ATTEMPTS + 2)))

    with pytest.raises(TransientFailure, match=f"reset {ATTEMPTS - 1}"):
        await call()
    assert len(calls) == ATTEMPTS


@pytest.mark.usefixtures("attempts")
async def test_a_lost_send_answer_is_never_retried() -> None:
    calls, call = failing(OutcomeUnknown("handed over, answer lost"))

    with pytest.raises(OutcomeUnknown):
        await call()
    assert len(calls) == 1


@pytest.mark.usefixtures("attempts")
async def test_a_refusal_is_never_retried() -> None:
    calls, call = failing(AccessRefused("the administrator's policy refuses it"))

    with pytest.raises(AccessRefused):
        await call()
    assert len(calls) == 1


async def test_in_the_suite_a_transient_failure_is_tried_once() -> None:
    calls, call = failing(TransientFailure("reset"))

    with pytest.raises(TransientFailure):
        await call()
    assert len(calls) == 1
