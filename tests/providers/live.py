"""What the opt-in live tests share: waiting, within a bound, for a real mail system."""

from __future__ import annotations

import os
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import TypeVar

import anyio

T = TypeVar("T")


def live_wait() -> float:
    """OUTLOOP_LIVE_WAIT_SECONDS (120): how long mail is looked for."""
    return float(os.environ.get("OUTLOOP_LIVE_WAIT_SECONDS") or 120)


async def poll(probe: Callable[[], Awaitable[T | None]]) -> T:
    """What ``probe`` finds on a real server, asked again until the bound: its mail takes
    its own time to arrive (the only waiting in the suite, and it is opt-in)."""
    deadline = time.monotonic() + live_wait()
    while True:
        found = await probe()
        if found is not None:
            return found
        if time.monotonic() > deadline:
            raise AssertionError(f"nothing within {live_wait():.0f} s (at {datetime.now(UTC)})")
        await anyio.sleep(2)
