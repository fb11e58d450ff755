"""The send ledger (the SendLedger role): an intent is ledgered before the provider is asked."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

from agent.domain.errors import StoreError
from agent.domain.records import SendIntent, SendRecord, SendState
from agent.storage.sql.core import Row, SqlBase, Tx, Verified, dt, ts


class SendRows(SqlBase):
    @staticmethod
    def _send(row: Row, *, created: bool = False) -> SendRecord:
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
        )

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
        row = conn.execute(
            "INSERT INTO sends (key, workspace_id, kind, task_id, internet_message_id,"
            " recipients, holder, state, detail, created_at, cc)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, 'intent', '', ?, ?) RETURNING *",
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
            ),
        ).fetchone()
        if intent.automated:
            for address in dict.fromkeys(intent.recipients):
                conn.execute(
                    "INSERT INTO send_recipients (key, workspace_id, address, created_at)"
                    " VALUES (?, ?, ?, ?)",
                    (intent.key, intent.workspace_id, address, ts(now)),
                )
        return self._send(row, created=True)

    def take_over_send(self, key: str, previous_holder: str, holder: str, now: datetime) -> bool:
        def body(conn: Tx) -> bool:
            row = conn.execute(
                "UPDATE sends SET holder = ?, created_at = ? WHERE key = ? AND holder = ?"
                " AND state = 'intent' RETURNING key",
                (holder, ts(now), key, previous_holder),
            ).fetchone()
            return row is not None

        def verify(conn: Tx) -> Verified[bool]:
            row = conn.execute(
                "SELECT 1 FROM sends WHERE key = ? AND holder = ? AND created_at = ?",
                (key, holder, ts(now)),
            ).fetchone()
            return (True,) if row is not None else (False,)

        return self._write(body, verify)

    def complete_send(
        self, key: str, provider_message_id: str, detail: str, now: datetime
    ) -> SendRecord:
        def body(conn: Tx) -> SendRecord:
            row = conn.execute(
                "UPDATE sends SET state = 'sent', sent_at = ?, provider_message_id = ?,"
                " detail = ? WHERE key = ? RETURNING *",
                (ts(now), provider_message_id, detail, key),
            ).fetchone()
            if row is None:
                raise StoreError(f"no send {key!r} in the ledger; begin_send records it first")
            return self._send(row)

        return self._write(body, None)

    def get_send(self, key: str) -> SendRecord | None:
        rows = self._read("SELECT * FROM sends WHERE key = ?", (key,))
        return self._send(rows[0]) if rows else None

    def list_sends(self, workspace_id: str) -> list[SendRecord]:
        rows = self._read(
            "SELECT * FROM sends WHERE workspace_id = ? ORDER BY created_at, key", (workspace_id,)
        )
        return [self._send(r) for r in rows]
