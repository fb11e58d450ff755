"""A fake mailbox kept in a SQLite file, so several processes share one mailbox.

Each process opens ``FileMailbox(path, clock=FileClock(clock_path))`` on the same file (the
first, or the test, creates it with its ``mailbox_id``) and builds its channels on it
(``InMemoryProvider.through(state, view)``). Every change is one transaction, so a process
killed at any instant leaves the mailbox as it was before or after its change: a send killed
after its transaction committed has a stored copy, like a real send whose answer was lost.
"""

from __future__ import annotations

import json
import sqlite3
import uuid
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from agent.domain.mail import (
    AttachmentData,
    AttachmentRef,
    Marker,
    MarkerKind,
    MessageBody,
    ScannedMessage,
)
from agent.ports import Clock
from agent.testing.clocks import UtcClock
from agent.testing.mailbox import (
    Faults,
    MailboxState,
    SentRecord,
    message_from_json,
    message_json,
)
from agent.testing.shared_file import SharedFile

"""Connections a forked process inherited: never used, and never closed (closing one could
checkpoint and remove the write-ahead log under the parent's feet)."""

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    mailbox_id TEXT NOT NULL,
    provider TEXT NOT NULL,
    uid TEXT NOT NULL,
    generation INTEGER NOT NULL DEFAULT 0,
    faults TEXT NOT NULL DEFAULT '{}'
);
CREATE TABLE IF NOT EXISTS inbox (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    item TEXT NOT NULL,
    body_ref TEXT,
    body TEXT,
    message_id TEXT,
    thread TEXT
);
CREATE INDEX IF NOT EXISTS inbox_body_ref ON inbox (body_ref);
CREATE INDEX IF NOT EXISTS inbox_message_id ON inbox (message_id);
CREATE TABLE IF NOT EXISTS files (
    ref TEXT PRIMARY KEY,
    info TEXT NOT NULL,
    data BLOB NOT NULL
);
CREATE TABLE IF NOT EXISTS sent (
    number INTEGER PRIMARY KEY,
    channel TEXT NOT NULL,
    message TEXT NOT NULL,
    message_id TEXT NOT NULL,
    handed BLOB NOT NULL,
    stored BLOB,
    thread TEXT NOT NULL,
    native TEXT,
    delivered INTEGER NOT NULL,
    accepted_us INTEGER NOT NULL,
    visible_us INTEGER NOT NULL,
    answer_lost INTEGER NOT NULL,
    copy_message_id TEXT,
    copy_token TEXT,
    copy_text TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS sent_message_id ON sent (message_id);
CREATE INDEX IF NOT EXISTS sent_copy_message_id ON sent (copy_message_id);
CREATE INDEX IF NOT EXISTS sent_copy_token ON sent (copy_token);
CREATE INDEX IF NOT EXISTS sent_native ON sent (native);
"""

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_SENT_COLUMNS = (
    "number, channel, message, handed, stored, thread, native, delivered, accepted_us, "
    "visible_us, answer_lost, copy_message_id, copy_token, copy_text"
)
_SEARCH = {
    MarkerKind.MESSAGE_ID: "copy_message_id = ?",
    MarkerKind.HEADER: "copy_token = ?",
    MarkerKind.NATIVE: "native = ?",
    MarkerKind.BODY_TOKEN: "instr(copy_text, ?) > 0",
}


def _us(moment: datetime) -> int:
    return (moment - _EPOCH) // timedelta(microseconds=1)


def _moment(us: int) -> datetime:
    return _EPOCH + timedelta(microseconds=us)


def _faults_json(faults: Faults) -> str:
    return json.dumps(
        {
            "lost_count": faults.lost_count,
            "lost_probability": faults.lost_probability,
            "lost_seed": faults.lost_seed,
            "lost_channel": faults.lost_channel,
            "copy_delay_us": faults.copy_delay // timedelta(microseconds=1),
            "copy_delay_channel": faults.copy_delay_channel,
        }
    )


def _faults_of(text: str) -> Faults:
    raw: dict[str, Any] = json.loads(text)
    return Faults(
        lost_count=int(raw.get("lost_count", 0)),
        lost_probability=float(raw.get("lost_probability", 0.0)),
        lost_seed=int(raw.get("lost_seed", 0)),
        lost_channel=raw.get("lost_channel"),
        copy_delay=timedelta(microseconds=int(raw.get("copy_delay_us", 0))),
        copy_delay_channel=raw.get("copy_delay_channel"),
    )


class FileMailbox(MailboxState, SharedFile):
    """A mailbox's state in a SQLite file (WAL), shared by every process that opens it.

    ``mailbox_id`` creates the mailbox when the file holds none (opening an existing one it
    must match, or be left out). Each process opens its own; a forked child reconnects."""

    def __init__(
        self,
        path: Path,
        mailbox_id: str | None = None,
        provider: str = "memory",
        clock: Clock | None = None,
    ) -> None:
        self.path = path
        self.clock = clock or UtcClock()
        self._pid = -1
        self._db: sqlite3.Connection | None = None
        try:
            meta = self._write(lambda db: self._open(db, mailbox_id, provider))
        except BaseException:
            self.close()
            raise
        self.mailbox_id, self.provider, self.uid = meta

    @staticmethod
    def _open(
        db: sqlite3.Connection, mailbox_id: str | None, provider: str
    ) -> tuple[str, str, str]:
        for statement in _SCHEMA.split(";"):
            if statement.strip():
                db.execute(statement)
        row = db.execute("SELECT mailbox_id, provider, uid FROM meta").fetchone()
        if row is None:
            if mailbox_id is None:
                raise ValueError("the file holds no mailbox yet: give its mailbox_id")
            row = (mailbox_id.lower(), provider, uuid.uuid4().hex)
            db.execute("INSERT INTO meta (id, mailbox_id, provider, uid) VALUES (1, ?, ?, ?)", row)
        if mailbox_id is not None and mailbox_id.lower() != row[0]:
            raise ValueError(f"the file holds mailbox {row[0]}, not {mailbox_id}")
        return str(row[0]), str(row[1]), str(row[2])

    # -- storage -------------------------------------------------------------------------

    def add(
        self,
        item: ScannedMessage,
        body: MessageBody | None,
        files: Sequence[AttachmentData],
        message_id: str | None,
        thread: str | None,
    ) -> None:
        envelope = item.envelope

        def insert(db: sqlite3.Connection) -> None:
            db.execute(
                "INSERT INTO inbox (item, body_ref, body, message_id, thread)"
                " VALUES (?, ?, ?, ?, ?)",
                (
                    item.model_dump_json(),
                    None if envelope is None else envelope.body_ref,
                    None if body is None else body.model_dump_json(),
                    message_id,
                    thread,
                ),
            )
            db.executemany(
                "INSERT OR REPLACE INTO files (ref, info, data) VALUES (?, ?, ?)",
                [(f.ref.ref, f.ref.model_dump_json(), f.data) for f in files],
            )

        self._write(insert)

    def page(self, after: int, limit: int) -> tuple[list[tuple[int, ScannedMessage]], bool]:
        rows = self._read(
            "SELECT seq, item FROM inbox WHERE seq > ? ORDER BY seq LIMIT ?", after, limit + 1
        )
        chosen = [(int(seq), ScannedMessage.model_validate_json(item)) for seq, item in rows]
        return chosen[:limit], len(chosen) > limit

    def count(self) -> int:
        return int(self._read("SELECT coalesce(max(seq), 0) FROM inbox")[0][0])

    def generation(self) -> int:
        return int(self._read("SELECT generation FROM meta")[0][0])

    def expire_cursors(self) -> None:
        self._write(lambda db: db.execute("UPDATE meta SET generation = generation + 1"))

    def body(self, ref: str) -> MessageBody | None:
        rows = self._read(
            "SELECT body FROM inbox WHERE body_ref = ? AND body IS NOT NULL ORDER BY seq DESC",
            ref,
        )
        return MessageBody.model_validate_json(rows[0][0]) if rows else None

    def attachment(self, ref: str) -> AttachmentData | None:
        rows = self._read("SELECT info, data FROM files WHERE ref = ?", ref)
        if not rows:
            return None
        info, data = rows[0]
        return AttachmentData(ref=AttachmentRef.model_validate_json(info), data=bytes(data))

    def thread_of(self, message_id: str) -> str | None:
        rows = self._read(
            "SELECT thread FROM inbox WHERE message_id = ? AND thread IS NOT NULL"
            " UNION ALL SELECT thread FROM sent WHERE message_id = ? OR copy_message_id = ?"
            " LIMIT 1",
            message_id,
            message_id,
            message_id,
        )
        return str(rows[0][0]) if rows else None

    def record_send(self, draft: SentRecord, latency: timedelta) -> SentRecord:
        def keep(db: sqlite3.Connection) -> SentRecord:
            (faults_text, number) = db.execute(
                "SELECT faults, (SELECT coalesce(max(number), 0) + 1 FROM sent) FROM meta"
            ).fetchone()
            record, after = draft.settled(
                int(number), self.clock.now(), _faults_of(faults_text), latency
            )
            db.execute("UPDATE meta SET faults = ?", (_faults_json(after),))
            db.execute(
                f"INSERT INTO sent ({_SENT_COLUMNS}, message_id)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (*_sent_row(record), record.message.internet_message_id),
            )
            return record

        return self._write(keep)

    def sent_records(self) -> list[SentRecord]:
        rows = self._read(f"SELECT {_SENT_COLUMNS} FROM sent ORDER BY number")
        return [_sent_of(row) for row in rows]

    def find_copy(self, marker: Marker, now: datetime) -> SentRecord | None:
        rows = self._read(
            f"SELECT {_SENT_COLUMNS} FROM sent WHERE stored IS NOT NULL AND visible_us <= ?"
            f" AND {_SEARCH[marker.kind]} ORDER BY number LIMIT 1",
            _us(now),
            marker.value,
        )
        return _sent_of(rows[0]) if rows else None

    def faults(self) -> Faults:
        return _faults_of(str(self._read("SELECT faults FROM meta")[0][0]))

    def set_faults(self, faults: Faults) -> None:
        self._write(lambda db: db.execute("UPDATE meta SET faults = ?", (_faults_json(faults),)))

    def items(self) -> list[tuple[ScannedMessage, MessageBody | None]]:
        rows = self._read("SELECT item, body FROM inbox ORDER BY seq")
        return [
            (
                ScannedMessage.model_validate_json(item),
                None if body is None else MessageBody.model_validate_json(body),
            )
            for item, body in rows
        ]

    @property
    def inbox(self) -> list[ScannedMessage]:
        """The inbox in delivery order (a copy: reordering it changes nothing)."""
        return [item for item, _ in self.items()]


def _sent_row(record: SentRecord) -> tuple[object, ...]:
    return (
        record.number,
        record.channel,
        message_json(record.message),
        record.handed,
        record.stored,
        record.thread,
        record.native,
        int(record.delivered),
        _us(record.accepted_at),
        _us(record.visible_at),
        int(record.answer_lost),
        record.copy_message_id,
        record.copy_token,
        record.copy_text,
    )


def _sent_of(row: Sequence[Any]) -> SentRecord:
    return SentRecord(
        number=int(row[0]),
        channel=str(row[1]),
        message=message_from_json(row[2]),
        handed=bytes(row[3]),
        stored=None if row[4] is None else bytes(row[4]),
        thread=str(row[5]),
        native=row[6],
        delivered=bool(row[7]),
        accepted_at=_moment(int(row[8])),
        visible_at=_moment(int(row[9])),
        answer_lost=bool(row[10]),
        copy_message_id=row[11],
        copy_token=row[12],
        copy_text=str(row[13]),
    )
