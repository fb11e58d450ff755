"""Health events operators watch (the Health role)."""

from __future__ import annotations

from datetime import datetime

from agent.domain.records import HealthRecord
from agent.storage.sql.core import SqlBase, Tx, Verified, record_of, ts


class HealthRows(SqlBase):
    def record_health(self, key: str, detail: str, now: datetime) -> None:
        def body(conn: Tx) -> None:
            conn.execute(
                "INSERT INTO health (key, detail, count, recorded_at) VALUES (?, ?, 1, ?)"
                " ON CONFLICT (key) DO UPDATE SET detail = excluded.detail,"
                " count = health.count + 1, recorded_at = excluded.recorded_at",
                (key, detail, ts(now)),
            )

        def verify(conn: Tx) -> Verified[None]:
            found = conn.execute(
                "SELECT 1 FROM health WHERE key = ? AND detail = ? AND recorded_at = ?",
                (key, detail, ts(now)),
            ).fetchone()
            return (None,) if found is not None else None

        self._write(body, verify)

    def list_health(self) -> list[HealthRecord]:
        return [
            record_of(HealthRecord, r, times=("recorded_at",))
            for r in self._read("SELECT * FROM health ORDER BY key")
        ]
