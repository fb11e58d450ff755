"""The send ledger (the SendLedger role): a send is ledgered before any channel is asked, and
each attempt is recorded before its channel is asked.

A send is PREPARED (stored as 'intent', as the ledger stored it before attempts were
recorded), ATTEMPTING, UNCERTAIN, WITH_PERSON or CONFIRMED (stored as 'sent'):

- ``begin_send`` ledgers it PREPARED; ``take_over_send`` moves an unfinished send (PREPARED,
  ATTEMPTING, UNCERTAIN) from one holder to another, keeping its state;
- ``attempt_send``: its holder, from PREPARED or UNCERTAIN, to ATTEMPTING;
- ``mark_uncertain``: its holder, from ATTEMPTING, to UNCERTAIN;
- ``complete_send``: from any state but CONFIRMED, to CONFIRMED (again: nothing changes);
- ``hand_to_person``: from an unfinished state to WITH_PERSON (again: nothing changes);
- ``settle_send``: a person, from ATTEMPTING, UNCERTAIN or WITH_PERSON, to CONFIRMED, or to
  PREPARED with one more attempt allowed.

Every change is a compare-and-set on what it read under the send's row lock (``FOR UPDATE``
on PostgreSQL, the write lock on SQLite) and writes one ``send_events`` row in the same
transaction: who, when, what, on what evidence. A change the send's state or holder does
not allow raises ``SendStateConflict`` and writes nothing (``attempt_send`` returns None).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta

from agent.domain.errors import InvalidRequest, SendStateConflict, StoreError, UnknownSend
from agent.domain.mail import Marker, MarkerKind
from agent.domain.records import (
    UNFINISHED_SENDS,
    SendAttempt,
    SendEvent,
    SendIntent,
    SendRecord,
    SendState,
)
from agent.storage.sql.core import Row, SqlBase, Tx, Verified, dt, ts

ATTEMPTABLE = frozenset({SendState.PREPARED, SendState.UNCERTAIN})
"""States from which a holder may hand the send to a channel."""

UNSETTLED = frozenset({SendState.ATTEMPTING, SendState.UNCERTAIN, SendState.WITH_PERSON})
"""States a person may settle: an attempt was made and its outcome is not known."""

FINISHABLE = UNFINISHED_SENDS | {SendState.WITH_PERSON}
"""States from which proof that the send went out confirms it."""

TAKEN_OVER = "taken over from "
"""How a takeover's event begins (it records the state the send was in, unchanged)."""


def _in(states: frozenset[SendState]) -> str:
    """An SQL list of the states' stored values (fixed values, never input)."""
    return "(" + ", ".join(f"'{s.value}'" for s in sorted(states)) + ")"


def _name(stored: str) -> str:
    """A stored state as the ledger names it (PREPARED, not 'intent')."""
    return SendState(stored).name


def _refused_text(refused: Sequence[tuple[str, str]]) -> str:
    return "; ".join(f"{address} refused: {reason}" for address, reason in refused)


class SendRows(SqlBase):
    @staticmethod
    def _send(row: Row, *, created: bool = False) -> SendRecord:
        marker = (
            None
            if row["marker_kind"] is None
            else Marker(kind=MarkerKind(row["marker_kind"]), value=row["marker_value"])
        )
        refused: list[list[str]] = json.loads(row["refused"]) if row["refused"] else []
        return SendRecord(
            key=row["key"],
            workspace_id=row["workspace_id"],
            kind=row["kind"],
            task_id=row["task_id"],
            internet_message_id=row["internet_message_id"],
            recipients=tuple(json.loads(row["recipients"])),
            holder=row["holder"],
            state=SendState(row["state"]),
            detail=row["detail"],
            created_at=dt(row["created_at"]) or datetime.now(UTC),
            sent_at=dt(row["sent_at"]),
            provider_message_id=row["provider_message_id"],
            created=created,
            cc=tuple(json.loads(row["cc"])) if row["cc"] else (),
            marker=marker,
            channel=row["channel"],
            attempts=int(row["attempts"]),
            attempted_at=dt(row["attempted_at"]),
            uncertain_at=dt(row["uncertain_at"]),
            keeps_sent_copy=bool(row["keeps_sent_copy"]),
            sent_copy_latency=timedelta(seconds=float(row["sent_copy_latency"])),
            refused=tuple((address, reason) for address, reason in refused),
            resend_allowed=bool(row["resend_allowed"]),
        )

    @staticmethod
    def _event(
        conn: Tx, key: str, now: datetime, state: SendState, actor: str, detail: str
    ) -> None:
        """Audit one change of the send (its row is locked by the caller's transaction, so
        the sequence number is the next one)."""
        conn.execute(
            "INSERT INTO send_events (key, seq, at, state, actor, detail)"
            " SELECT ?, coalesce(max(seq), 0) + 1, ?, ?, ?, ? FROM send_events WHERE key = ?",
            (key, ts(now), state.value, actor, detail, key),
        )

    @staticmethod
    def _committed(
        conn: Tx, key: str, now: datetime, state: SendState, actor: str
    ) -> Verified[SendRecord]:
        """``(the send,)`` when the change that wrote this event committed, else None."""
        found = conn.execute(
            "SELECT 1 FROM send_events WHERE key = ? AND at = ? AND state = ? AND actor = ?"
            " AND detail NOT LIKE ?",  # a takeover's event keeps the state it found
            (key, ts(now), state.value, actor, TAKEN_OVER + "%"),
        ).fetchone()
        if found is None:
            return None
        row = conn.execute("SELECT * FROM sends WHERE key = ?", (key,)).fetchone()
        return (SendRows._send(row),) if row is not None else None

    def _locked(self, conn: Tx, key: str) -> Row | None:
        return conn.execute(
            "SELECT * FROM sends WHERE key = ?" + self.FOR_UPDATE, (key,)
        ).fetchone()

    def _locked_or_refuse(self, conn: Tx, key: str) -> Row:
        row = self._locked(conn, key)
        if row is None:
            raise StoreError(f"no send {key!r} in the ledger; begin_send records it first")
        return row

    # -- PREPARED --------------------------------------------------------------------------

    def begin_send(self, intent: SendIntent, now: datetime, cap: int | None = None) -> SendRecord:
        def body(conn: Tx) -> SendRecord:
            self._lock_workspace(conn, intent.workspace_id)
            existing = conn.execute("SELECT * FROM sends WHERE key = ?", (intent.key,)).fetchone()
            if existing is not None:
                return self._send(existing)
            if intent.automated and cap is not None:
                refused = self._over_cap(conn, intent, now, cap)
                if refused is not None:
                    return refused
            return self._insert_intent(conn, intent, now)

        def verify(conn: Tx) -> Verified[SendRecord]:
            row = conn.execute(
                "SELECT * FROM sends WHERE key = ? AND created_at = ?", (intent.key, ts(now))
            ).fetchone()
            return (self._send(row, created=True),) if row is not None else None

        return self._write(body, verify)

    def _lock_workspace(self, conn: Tx, workspace_id: str) -> None:
        """Automated sends of one workspace are decided one at a time, so two workers can
        never both squeeze under the cap; only a registered workspace sends mail."""
        locked = conn.execute(
            "SELECT workspace_id FROM workspaces WHERE workspace_id = ?" + self.FOR_UPDATE,
            (workspace_id,),
        ).fetchone()
        if locked is None:
            raise StoreError(
                f"workspace {workspace_id} is not registered; only a registered workspace "
                "sends mail"
            )

    @staticmethod
    def _over_cap(conn: Tx, intent: SendIntent, now: datetime, cap: int) -> SendRecord | None:
        """A REFUSED record (stored nowhere) when a recipient already had ``cap`` automated
        messages in the 24 hours before ``now``; else None."""
        window = ts(now - timedelta(hours=24))
        for address in intent.recipients:
            row = conn.execute(
                "SELECT count(*) AS n FROM send_recipients WHERE workspace_id = ?"
                " AND address = ? AND created_at > ?",
                (intent.workspace_id, address, window),
            ).fetchone()
            if int(row["n"]) >= cap:
                return SendRecord(
                    **intent.model_dump(exclude={"automated"}),
                    state=SendState.REFUSED,
                    detail=f"{address} already had {cap} automated messages in the last"
                    " 24 hours (automation.max_per_recipient_per_day)",
                    created_at=now,
                )
        return None

    def _insert_intent(self, conn: Tx, intent: SendIntent, now: datetime) -> SendRecord:
        """Ledger the intent (and, for an automated send, each recipient against the cap)."""
        marker = intent.marker
        row = conn.execute(
            "INSERT INTO sends (key, workspace_id, kind, task_id, internet_message_id,"
            " recipients, holder, state, detail, created_at, cc, marker_kind, marker_value)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, 'intent', '', ?, ?, ?, ?) RETURNING *",
            (
                intent.key,
                intent.workspace_id,
                intent.kind,
                intent.task_id,
                intent.internet_message_id,
                json.dumps(list(intent.recipients)),
                intent.holder,
                ts(now),
                json.dumps(list(intent.cc)),
                None if marker is None else marker.kind.value,
                None if marker is None else marker.value,
            ),
        ).fetchone()
        if intent.automated:
            for address in dict.fromkeys(intent.recipients):
                conn.execute(
                    "INSERT INTO send_recipients (key, workspace_id, address, created_at)"
                    " VALUES (?, ?, ?, ?)",
                    (intent.key, intent.workspace_id, address, ts(now)),
                )
        self._event(
            conn, intent.key, now, SendState.PREPARED, intent.holder, "ledgered before any channel"
        )
        return self._send(row, created=True)

    def take_over_send(
        self,
        key: str,
        previous_holder: str,
        holder: str,
        now: datetime,
        state: SendState | None = None,
        attempts: int | None = None,
    ) -> bool:
        # The taker decided on what it read: the state and attempt count as well as the
        # holder. A holder that moved on since (a live worker's new attempt) keeps its send.
        read = ""
        params: list[object] = [holder, ts(now), key, previous_holder]
        if state is not None:
            read += " AND state = ?"
            params.append(state.value)
        if attempts is not None:
            read += " AND attempts = ?"
            params.append(attempts)

        def body(conn: Tx) -> bool:
            # created_at restarts: the new holder's own time in flight is measured from now.
            row = conn.execute(
                "UPDATE sends SET holder = ?, created_at = ? WHERE key = ? AND holder = ?"
                f" AND state IN {_in(UNFINISHED_SENDS)}{read} RETURNING state",
                tuple(params),
            ).fetchone()
            if row is None:
                return False
            state = SendState(row["state"])
            self._event(conn, key, now, state, holder, TAKEN_OVER + previous_holder)
            return True

        def verify(conn: Tx) -> Verified[bool]:
            found = conn.execute(
                "SELECT 1 FROM send_events WHERE key = ? AND at = ? AND actor = ? AND detail = ?",
                (key, ts(now), holder, TAKEN_OVER + previous_holder),
            ).fetchone()
            return (True,) if found is not None else None  # not taken: try again

        return self._write(body, verify)

    # -- ATTEMPTING and UNCERTAIN ----------------------------------------------------------

    def attempt_send(
        self, key: str, holder: str, attempt: SendAttempt, now: datetime
    ) -> SendRecord | None:
        def body(conn: Tx) -> SendRecord | None:
            before = self._locked(conn, key)
            if before is None or before["holder"] != holder:
                return None
            was = SendState(before["state"])
            if was not in ATTEMPTABLE:
                return None
            marker = attempt.marker
            marked = (
                "unmarked (the channel keeps no sent copy)"
                if marker is None
                else f"marked {marker.kind.value} {marker.value}"
            )
            detail = f"attempt {int(before['attempts']) + 1} through {attempt.channel}, {marked}"
            if was is SendState.UNCERTAIN:
                detail += "; the uncertain attempt before it left no sent copy"
            elif before["resend_allowed"]:
                detail += "; a person settled the attempt before it as not sent"
            row = conn.execute(
                "UPDATE sends SET state = 'attempting', channel = ?, marker_kind = ?,"
                " marker_value = ?, attempts = attempts + 1, attempted_at = ?,"
                " keeps_sent_copy = ?, sent_copy_latency = ?, resend_allowed = 0, detail = ?"
                f" WHERE key = ? AND holder = ? AND state IN {_in(ATTEMPTABLE)} RETURNING *",
                (
                    attempt.channel,
                    None if marker is None else marker.kind.value,
                    None if marker is None else marker.value,
                    ts(now),
                    int(attempt.keeps_sent_copy),
                    attempt.sent_copy_latency.total_seconds(),
                    detail,
                    key,
                    holder,
                ),
            ).fetchone()
            if row is None:
                return None
            self._event(conn, key, now, SendState.ATTEMPTING, holder, detail)
            return self._send(row)

        def verify(conn: Tx) -> Verified[SendRecord | None]:
            return self._committed(conn, key, now, SendState.ATTEMPTING, holder)

        return self._write(body, verify)

    def mark_uncertain(self, key: str, holder: str, detail: str, now: datetime) -> SendRecord:
        def body(conn: Tx) -> SendRecord:
            before = self._locked_or_refuse(conn, key)
            if before["holder"] != holder or before["state"] != SendState.ATTEMPTING.value:
                raise SendStateConflict(
                    key,
                    _name(before["state"]),
                    before["holder"],
                    f"marking it uncertain by {holder}",
                    "to its holder while it is attempting",
                )
            row = conn.execute(
                "UPDATE sends SET state = 'uncertain', detail = ?, uncertain_at = ? WHERE key = ?"
                " AND holder = ? AND state = 'attempting' RETURNING *",
                (detail, ts(now), key, holder),
            ).fetchone()
            self._event(conn, key, now, SendState.UNCERTAIN, holder, detail)
            return self._send(row)

        def verify(conn: Tx) -> Verified[SendRecord]:
            return self._committed(conn, key, now, SendState.UNCERTAIN, holder)

        return self._write(body, verify)

    # -- CONFIRMED and WITH_PERSON ---------------------------------------------------------

    def complete_send(
        self,
        key: str,
        provider_message_id: str,
        detail: str,
        now: datetime,
        refused: Sequence[tuple[str, str]] = (),
    ) -> SendRecord:
        refused_json = json.dumps([list(r) for r in refused]) if refused else None

        def body(conn: Tx) -> SendRecord:
            before = self._locked_or_refuse(conn, key)
            if before["state"] == SendState.CONFIRMED.value:
                return self._send(before)  # confirmed once; a repeat changes nothing
            row = conn.execute(
                "UPDATE sends SET state = 'sent', sent_at = ?, provider_message_id = ?,"
                " detail = ?, refused = ?, resend_allowed = 0"
                f" WHERE key = ? AND state IN {_in(FINISHABLE)} RETURNING *",
                (ts(now), provider_message_id, detail, refused_json, key),
            ).fetchone()
            audit = f"{detail} (provider message {provider_message_id})"
            if refused:
                audit += f"; partial delivery: {_refused_text(refused)}"
            self._event(conn, key, now, SendState.CONFIRMED, before["holder"], audit)
            return self._send(row)

        return self._write(body, None)  # running it again finds the send confirmed

    def hand_to_person(self, key: str, reason: str, now: datetime) -> SendRecord:
        def body(conn: Tx) -> SendRecord:
            before = self._locked_or_refuse(conn, key)
            if before["state"] == SendState.WITH_PERSON.value:
                return self._send(before)  # with a person already; a repeat changes nothing
            if SendState(before["state"]) not in UNFINISHED_SENDS:
                raise SendStateConflict(
                    key,
                    _name(before["state"]),
                    before["holder"],
                    "handing it to a person",
                    "while it is unfinished (prepared, attempting or uncertain)",
                )
            row = conn.execute(
                "UPDATE sends SET state = 'with_person', detail = ?"
                f" WHERE key = ? AND state IN {_in(UNFINISHED_SENDS)} RETURNING *",
                (reason, key),
            ).fetchone()
            self._event(conn, key, now, SendState.WITH_PERSON, before["holder"], reason)
            return self._send(row)

        return self._write(body, None)  # running it again finds the send with the person

    def settle_send(
        self, key: str, sent: bool, evidence: str, actor: str, now: datetime
    ) -> SendRecord:
        if not evidence.strip() or not actor.strip():
            raise InvalidRequest(
                f"settling send {key} needs the person who decides and the evidence they "
                "decided on; nothing was changed"
            )
        target = SendState.CONFIRMED if sent else SendState.PREPARED

        def body(conn: Tx) -> SendRecord:
            before = self._locked(conn, key)
            if before is None:
                raise UnknownSend(key)
            if SendState(before["state"]) not in UNSETTLED:
                raise SendStateConflict(
                    key,
                    _name(before["state"]),
                    before["holder"],
                    "settling it",
                    "once it was attempted and its outcome is unsettled (attempting, "
                    "uncertain or with a person)",
                )
            if sent:
                update = "state = 'sent', sent_at = ?, detail = ?, resend_allowed = 0"
                params: tuple[object, ...] = (ts(now), evidence)
            else:
                update = "state = 'intent', detail = ?, resend_allowed = 1"
                params = (evidence,)
            row = conn.execute(
                f"UPDATE sends SET {update} WHERE key = ? AND state IN {_in(UNSETTLED)}"
                " RETURNING *",
                (*params, key),
            ).fetchone()
            self._event(conn, key, now, target, actor, evidence)
            return self._send(row)

        def verify(conn: Tx) -> Verified[SendRecord]:
            return self._committed(conn, key, now, target, actor)

        return self._write(body, verify)

    # -- reads -----------------------------------------------------------------------------

    def send_events(self, key: str) -> list[SendEvent]:
        rows = self._read("SELECT * FROM send_events WHERE key = ? ORDER BY seq", (key,))
        return [
            SendEvent(
                key=r["key"],
                at=dt(r["at"]) or datetime.now(UTC),
                state=SendState(r["state"]),
                actor=r["actor"],
                detail=r["detail"],
            )
            for r in rows
        ]

    def get_send(self, key: str) -> SendRecord | None:
        rows = self._read("SELECT * FROM sends WHERE key = ?", (key,))
        return self._send(rows[0]) if rows else None

    def list_sends(self, workspace_id: str) -> list[SendRecord]:
        rows = self._read(
            "SELECT * FROM sends WHERE workspace_id = ? ORDER BY created_at, key", (workspace_id,)
        )
        return [self._send(r) for r in rows]
