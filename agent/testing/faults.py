"""Faults for a channel that cannot produce them itself: ``FaultyChannel`` wraps any
MailProvider (a Maildir writes its sent copy or fails, so it never loses an answer, and its
copy is searchable at once) and adds the two faults sending exactly once must survive:

- a **lost answer**: the inner channel took the message (its copy is kept), then the answer
  is lost (``OutcomeUnknown``); for the next ``count`` sends, or each send with a
  ``probability`` drawn from a hash of the seed, the Message-ID and the attempt number (the
  same decision in every process, whatever order they send in);
- a **late copy**: a copy accepted from now on is hidden from ``find_sent`` until the shared
  clock reaches its acceptance plus a delay (drawn per copy between ``at_least`` and
  ``delay``, from the same hash).

The switches and every accepted send (its acceptance time, when its copy shows, whether its
answer was lost, how many searches it was hidden from) are kept in a small SQLite file,
``ChannelFaults(path, clock)``, that every process opens; the clock is the one the test
drives (a ``FileClock`` when several processes share it).

It stays honest to what it declares: its capabilities are the inner channel's with
``sent_copy_latency`` raised to the one it is given, and a delay beyond that latency is
refused before anything is sent. It never shows a copy the inner channel does not have, and
hides a copy only while every accepted send of its Message-ID is still within its delay; a
copy accepted while the wrapper's process died before recording it is shown at once
(earlier than declared, never later). Everything else is the inner channel's.
"""

from __future__ import annotations

import random
import sqlite3
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

from agent.domain.errors import OutcomeUnknown
from agent.domain.mail import (
    AttachmentData,
    Capabilities,
    ChangePage,
    Handover,
    Marker,
    MessageBody,
    OutgoingMessage,
    ProviderHealth,
    SendResult,
    StoredCopy,
)
from agent.ports import Clock, MailProvider
from agent.testing.shared_file import SharedFile

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_SCHEMA = (
    """CREATE TABLE IF NOT EXISTS switches (
        id INTEGER PRIMARY KEY CHECK (id = 1),
        lost_count INTEGER NOT NULL DEFAULT 0,
        lost_probability REAL NOT NULL DEFAULT 0,
        seed INTEGER NOT NULL DEFAULT 0,
        delay_us INTEGER NOT NULL DEFAULT 0,
        at_least_us INTEGER NOT NULL DEFAULT 0
    )""",
    "INSERT OR IGNORE INTO switches (id) VALUES (1)",
    """CREATE TABLE IF NOT EXISTS accepted (
        message_id TEXT NOT NULL,
        attempt INTEGER NOT NULL,
        marker TEXT,
        accepted_us INTEGER NOT NULL,
        visible_us INTEGER NOT NULL,
        lost INTEGER NOT NULL,
        hidden_searches INTEGER NOT NULL DEFAULT 0,
        PRIMARY KEY (message_id, attempt)
    )""",
    "CREATE INDEX IF NOT EXISTS accepted_marker ON accepted (marker)",
)


def _us(moment: datetime) -> int:
    return (moment - _EPOCH) // timedelta(microseconds=1)


def _moment(us: int) -> datetime:
    return _EPOCH + timedelta(microseconds=us)


@dataclass(frozen=True)
class Accepted:
    """One send the wrapped channel accepted."""

    message_id: str
    attempt: int
    """1 for the first send of this Message-ID, 2 for the next (a duplicate, or a resend
    after a copy was proven absent)..."""
    marker: str | None
    accepted_at: datetime
    visible_at: datetime
    """When its copy shows in ``find_sent``."""
    lost: bool
    """Its answer was lost (``OutcomeUnknown`` was raised after the inner channel took it)."""
    hidden_searches: int
    """How many searches found its copy hidden (it was late past them)."""


class ChannelFaults(SharedFile):
    """The fault switches of wrapped channels and what they accepted, in a SQLite file
    several processes share (each opens its own; a forked child reconnects)."""

    def __init__(self, path: Path, clock: Clock) -> None:
        self.path = path
        self.clock = clock
        self._db: sqlite3.Connection | None = None
        self._pid = -1
        self._write(lambda db: [db.execute(statement) for statement in _SCHEMA])

    # -- the switches ----------------------------------------------------------------------

    def lose_acks(self, count: int = 1, *, probability: float = 0.0, seed: int = 0) -> None:
        """Lose the answers of the next ``count`` sends (then, or instead when ``count`` is
        0, each send's with ``probability``)."""
        if count < 0 or not 0.0 <= probability <= 1.0:
            raise ValueError("a count of lost answers is >= 0 and a probability within [0, 1]")
        self._write(
            lambda db: db.execute(
                "UPDATE switches SET lost_count = ?, lost_probability = ?, seed = ?",
                (count, probability, seed),
            )
        )

    def delay_sent_copies(self, delay: timedelta, *, at_least: timedelta | None = None) -> None:
        """Copies accepted from now on show ``at_least`` to ``delay`` after their acceptance
        (each its own delay; ``at_least`` defaults to ``delay``; ``timedelta(0)``: at once)."""
        low = delay if at_least is None else at_least
        if not timedelta(0) <= low <= delay:
            raise ValueError("a copy's delay is never negative and at_least <= delay")
        self._write(
            lambda db: db.execute(
                "UPDATE switches SET delay_us = ?, at_least_us = ?",
                (delay // timedelta(microseconds=1), low // timedelta(microseconds=1)),
            )
        )

    def longest_delay(self) -> timedelta:
        return timedelta(microseconds=int(self._read("SELECT delay_us FROM switches")[0][0]))

    # -- what the wrapper asks -------------------------------------------------------------

    def accept(self, message_id: str, marker: Marker | None) -> Accepted:
        """Record a send the inner channel just accepted, deciding (once, for every process)
        whether its answer is lost and when its copy shows."""
        now = self.clock.now()

        def record(db: sqlite3.Connection) -> Accepted:
            count, probability, seed, delay_us, at_least_us = db.execute(
                "SELECT lost_count, lost_probability, seed, delay_us, at_least_us FROM switches"
            ).fetchone()
            (attempt,) = db.execute(
                "SELECT count(*) + 1 FROM accepted WHERE message_id = ?", (message_id,)
            ).fetchone()
            draw = random.Random(f"{seed}:{message_id}:{attempt}")  # noqa: S311 - a fault switch
            if count > 0:
                lost = True
                db.execute("UPDATE switches SET lost_count = lost_count - 1")
            else:
                lost = draw.random() < probability
            delay = timedelta(microseconds=draw.randint(at_least_us, delay_us))
            row = Accepted(
                message_id=message_id,
                attempt=int(attempt),
                marker=None if marker is None else marker.value,
                accepted_at=now,
                visible_at=now + delay,
                lost=lost,
                hidden_searches=0,
            )
            db.execute(
                "INSERT INTO accepted (message_id, attempt, marker, accepted_us, visible_us,"
                " lost) VALUES (?, ?, ?, ?, ?, ?)",
                (
                    row.message_id,
                    row.attempt,
                    row.marker,
                    _us(row.accepted_at),
                    _us(row.visible_at),
                    int(row.lost),
                ),
            )
            return row

        return self._write(record)

    def hides(self, column: str, value: str) -> bool:
        """Whether every accepted send whose ``column`` (marker, message_id) is ``value`` is
        still within its delay; counted on those sends when it is."""
        assert column in {"marker", "message_id"}
        now = _us(self.clock.now())
        [(shown, count)] = self._read(
            f"SELECT min(visible_us), count(*) FROM accepted WHERE {column} = ?", value
        )
        if count == 0 or shown <= now:
            return False
        self._write(
            lambda db: db.execute(
                f"UPDATE accepted SET hidden_searches = hidden_searches + 1 WHERE {column} = ?",
                (value,),
            )
        )
        return True

    def accepted(self) -> list[Accepted]:
        """Every accepted send, in the order they were recorded."""
        rows = self._read(
            "SELECT message_id, attempt, marker, accepted_us, visible_us, lost, hidden_searches"
            " FROM accepted ORDER BY rowid"
        )
        return [
            Accepted(
                message_id=str(r[0]),
                attempt=int(r[1]),
                marker=r[2],
                accepted_at=_moment(int(r[3])),
                visible_at=_moment(int(r[4])),
                lost=bool(r[5]),
                hidden_searches=int(r[6]),
            )
            for r in rows
        ]


class Passthrough:
    """The whole MailProvider port, each call handed to ``inner``: the base of a wrapper
    that changes one or two calls."""

    def __init__(self, inner: MailProvider) -> None:
        self.inner = inner

    @property
    def provider(self) -> str:
        return self.inner.provider

    @property
    def mailbox_id(self) -> str:
        return self.inner.mailbox_id

    @property
    def capabilities(self) -> Capabilities:
        return self.inner.capabilities

    async def changes(self, cursor: str | None) -> ChangePage:
        return await self.inner.changes(cursor)

    async def fetch_body(self, body_ref: str) -> MessageBody:
        return await self.inner.fetch_body(body_ref)

    async def fetch_attachment(self, ref: str) -> AttachmentData:
        return await self.inner.fetch_attachment(ref)

    async def prepare(self, message: OutgoingMessage) -> Handover:
        return await self.inner.prepare(message)

    async def send(self, handover: Handover) -> SendResult:
        return await self.inner.send(handover)

    async def find_sent(self, marker: Marker) -> StoredCopy | None:
        return await self.inner.find_sent(marker)

    async def health(self) -> ProviderHealth:
        return await self.inner.health()

    async def aclose(self) -> None:
        await self.inner.aclose()


class FaultyChannel(Passthrough):
    """``inner`` with lost answers and late copies (see the module).

    ``sent_copy_latency`` is what it declares (at least the inner channel's own): no copy is
    hidden longer than that after its acceptance."""

    def __init__(
        self,
        inner: MailProvider,
        faults: ChannelFaults,
        *,
        sent_copy_latency: timedelta = timedelta(0),
    ) -> None:
        super().__init__(inner)
        self.faults = faults
        own = inner.capabilities
        self._capabilities = own.model_copy(
            update={"sent_copy_latency": max(own.sent_copy_latency, sent_copy_latency)}
        )

    @property
    def capabilities(self) -> Capabilities:
        return self._capabilities

    async def send(self, handover: Handover) -> SendResult:
        latency = self._capabilities.sent_copy_latency
        if self.faults.longest_delay() > latency:
            raise ValueError(
                f"a sent copy delayed {self.faults.longest_delay()} would break this channel's "
                f"declared sent_copy_latency of {latency}: the wrapper keeps its declarations"
            )
        result = await self.inner.send(handover)
        accepted = self.faults.accept(handover.message.internet_message_id, handover.marker)
        if accepted.lost:
            raise OutcomeUnknown(
                f"the {self.inner.capabilities.channel} channel took the message and its "
                "answer was lost (a switched fault)"
            )
        return result

    async def find_sent(self, marker: Marker) -> StoredCopy | None:
        if marker.kind in self._capabilities.markers and self.faults.hides("marker", marker.value):
            return None  # its copies are all still late: no need to ask the inner channel
        copy = await self.inner.find_sent(marker)
        if copy is None or copy.internet_message_id is None:
            return copy
        return None if self.faults.hides("message_id", copy.internet_message_id) else copy
