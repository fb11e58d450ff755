"""Bounded retries of a channel's calls, declared once (stamina).

An adapter decorates the calls that may meet a passing failure with ``with_retries``; what is
retried is decided here, from the error the adapter translated its vendor's error into:

- ``TransientFailure`` (a dropped connection, a 5xx answer): retried with exponential backoff;
- ``Throttled``: retried after the wait the provider named (``retry_after``), or with backoff
  when it named none; a wait longer than ``LONGEST_WAIT`` is not waited for here - the
  caller gets ``Throttled`` and comes back later;
- never ``OutcomeUnknown``, although it is a ``TransientFailure``: a send whose answer was
  lost may have gone out, and is settled from the sent copies, never by sending again;
- never anything else: ``AccessRefused``, ``AuthenticationExpired``, ``NotFound``,
  ``CursorExpired``, ``Unsupported`` and a plain ``ProviderError`` fail at once.

At most ``ATTEMPTS`` attempts within ``TIMEOUT``. Tests turn stamina's testing mode on
(``stamina.set_testing(True)`` in tests/conftest.py): one attempt and no waits, unless a test
asks for more attempts.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import ParamSpec, TypeVar

import stamina

from agent.domain.errors import OutcomeUnknown, Throttled, TransientFailure

P = ParamSpec("P")
T = TypeVar("T")

ATTEMPTS = 4
"""Attempts in all, the first one included."""
TIMEOUT = timedelta(seconds=60)
"""The longest all attempts of one call may take together."""
LONGEST_WAIT = timedelta(seconds=30)
"""The longest wait between attempts; a provider asking for more is answered by giving up."""


def retry_decision(exc: Exception) -> bool | float:
    """Whether ``exc`` is retried, and when the provider named the wait, that wait in
    seconds (stamina's backoff hook: a float is a retry after exactly that long)."""
    if isinstance(exc, OutcomeUnknown):
        return False
    if isinstance(exc, Throttled):
        if exc.retry_after is None:
            return True
        if exc.retry_after > LONGEST_WAIT.total_seconds():
            return False
        return max(float(exc.retry_after), 0.0)
    return isinstance(exc, TransientFailure)


def with_retries(call: Callable[P, T]) -> Callable[P, T]:
    """``call`` (a function or coroutine function) retried by the rules above."""
    return stamina.retry(
        on=retry_decision,
        attempts=ATTEMPTS,
        timeout=TIMEOUT,
        wait_initial=timedelta(milliseconds=200),
        wait_max=LONGEST_WAIT,
        wait_jitter=timedelta(seconds=1),
    )(call)
