"""Clocks a test drives: ``FrozenClock`` in one process, ``FileClock`` shared by several.

Both move only when told to (``advance``), so a test never waits for time to pass.
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Generator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

START = datetime(2026, 11, 30, 9, 0, tzinfo=UTC)
"""Where a test clock starts unless told otherwise."""


@dataclass
class FrozenClock:
    """A clock that moves only when told to."""

    moment: datetime = field(default_factory=lambda: START)

    def now(self) -> datetime:
        return self.moment

    def advance(self, **delta: float) -> datetime:
        self.moment += timedelta(**delta)
        return self.moment


class UtcClock:
    """The real time, in UTC (what a fake uses when no test clock is given)."""

    def now(self) -> datetime:
        return datetime.now(UTC)


class FileClock:
    """A clock several processes share: its time is kept in a file, and it moves only when
    a test advances it (from any process). Each process opens it by the same path."""

    def __init__(self, path: Path, start: datetime = START) -> None:
        self.path = path
        self._lock = path.with_name(path.name + ".lock")
        with self._locked():
            if not path.exists():
                self._write(start)

    @contextmanager
    def _locked(self) -> Generator[None]:
        fd = os.open(self._lock, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # closing the descriptor releases the lock

    def _write(self, moment: datetime) -> None:
        if moment.tzinfo is None:
            raise ValueError("a clock's time is timezone-aware")
        partial = self.path.with_name(self.path.name + f".{os.getpid()}.tmp")
        partial.write_text(moment.astimezone(UTC).isoformat(), encoding="utf-8")
        partial.replace(self.path)  # readers see the old time or the new one, never half

    def now(self) -> datetime:
        return datetime.fromisoformat(self.path.read_text(encoding="utf-8"))

    def set(self, moment: datetime) -> None:
        with self._locked():
            self._write(moment)

    def advance(self, **delta: float) -> datetime:
        with self._locked():
            moment = self.now() + timedelta(**delta)
            self._write(moment)
        return moment
