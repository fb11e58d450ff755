"""Named leases, dispatcher processes and scheduled cycles (the Dispatch role).

A lease changes hands by compare-and-set on the holder that was read: a lease is taken only
when absent, expired, already ours, or held by a holder the caller proved dead.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from agent.domain.records import CycleRow, DispatcherRow, Lease
from agent.storage.sql.core import Row, SqlBase, Tx, Verified, record_of, ts

KEPT = timedelta(days=90)
"""How long a dispatcher's report and a finished cycle are kept."""


class DispatchRows(SqlBase):
    def take_lease(
        self, name: str, holder: str, now: datetime, ttl: timedelta, dead: str | None = None
    ) -> Lease | None:
        """Take or renew the lease; None when another live holder keeps it. ``dead`` is a
        holder the caller proved dead: its lease is taken even before it expires."""
        expires = ts(now + ttl)

        def body(conn: Tx) -> Lease | None:
            # One statement: a row another holder keeps is left as it is and returns nothing.
            row = conn.execute(
                "INSERT INTO leases (name, holder, acquired_at, renewed_at, expires_at)"
                " VALUES (?, ?, ?, ?, ?) ON CONFLICT (name) DO UPDATE SET"
                " acquired_at = CASE WHEN leases.holder = excluded.holder"
                " THEN leases.acquired_at ELSE excluded.acquired_at END,"
                " holder = excluded.holder, renewed_at = excluded.renewed_at,"
                " expires_at = excluded.expires_at"
                " WHERE leases.holder = excluded.holder OR leases.expires_at < ?"
                " OR leases.holder = ?"
                " RETURNING name, holder, acquired_at, renewed_at, expires_at",
                (name, holder, ts(now), ts(now), expires, ts(now), dead or ""),
            ).fetchone()
            return None if row is None else _lease(row)

        return self._write(body, None)  # taking it again as its holder changes nothing

    def get_lease(self, name: str) -> Lease | None:
        rows = self._read("SELECT * FROM leases WHERE name = ?", (name,))
        return _lease(rows[0]) if rows else None

    def release_lease(self, name: str, holder: str) -> None:
        def body(conn: Tx) -> None:
            conn.execute("DELETE FROM leases WHERE name = ? AND holder = ?", (name, holder))

        self._write(body, None)

    def record_dispatcher(self, row: DispatcherRow) -> None:
        def body(conn: Tx) -> None:
            conn.execute(
                "INSERT INTO dispatchers (holder, workspace_id, role, executable, install,"
                " version, started_at, seen_at, detail) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)"
                " ON CONFLICT (holder) DO UPDATE SET role = excluded.role,"
                " seen_at = excluded.seen_at, detail = excluded.detail",
                (
                    row.holder,
                    row.workspace_id,
                    row.role,
                    row.executable,
                    row.install,
                    row.version,
                    ts(row.started_at),
                    ts(row.seen_at),
                    row.detail,
                ),
            )
            # Bounded: a dispatcher not seen for KEPT is forgotten.
            conn.execute(
                "DELETE FROM dispatchers WHERE workspace_id = ? AND seen_at < ?",
                (row.workspace_id, ts(row.seen_at - KEPT)),
            )

        self._write(body, None)  # the same report again changes nothing

    def list_dispatchers(self, workspace_id: str) -> list[DispatcherRow]:
        rows = self._read(
            "SELECT * FROM dispatchers WHERE workspace_id = ? ORDER BY started_at, holder",
            (workspace_id,),
        )
        return [record_of(DispatcherRow, r, times=("started_at", "seen_at")) for r in rows]

    def start_cycle(
        self,
        workspace_id: str,
        scheduled_for: datetime,
        holder: str,
        now: datetime,
        dead: str | None = None,
    ) -> bool:
        """Start the cycle due at ``scheduled_for``: False when it finished already, or when
        a live holder other than ``dead`` (proven dead by the caller) started it."""

        def body(conn: Tx) -> bool:
            conn.execute(
                "INSERT INTO dispatch_cycles (workspace_id, scheduled_for, holder, started_at)"
                " VALUES (?, ?, ?, ?) ON CONFLICT (workspace_id, scheduled_for) DO UPDATE"
                " SET holder = excluded.holder, started_at = excluded.started_at"
                " WHERE dispatch_cycles.finished_at IS NULL"
                " AND dispatch_cycles.holder IN (?, ?)",
                (workspace_id, ts(scheduled_for), holder, ts(now), holder, dead or ""),
            )
            row = conn.execute(
                "SELECT holder, finished_at FROM dispatch_cycles"
                " WHERE workspace_id = ? AND scheduled_for = ?",
                (workspace_id, ts(scheduled_for)),
            ).fetchone()
            return row["holder"] == holder and row["finished_at"] is None

        def verify(conn: Tx) -> Verified[bool]:
            row = conn.execute(
                "SELECT holder FROM dispatch_cycles WHERE workspace_id = ? AND scheduled_for = ?",
                (workspace_id, ts(scheduled_for)),
            ).fetchone()
            return (row is not None and row["holder"] == holder,) if row is not None else None

        return self._write(body, verify)

    def finish_cycle(
        self,
        workspace_id: str,
        scheduled_for: datetime,
        holder: str,
        now: datetime,
        run_id: str | None,
        outcome: str,
    ) -> None:
        def body(conn: Tx) -> None:
            conn.execute(
                "UPDATE dispatch_cycles SET finished_at = ?, run_id = ?, outcome = ?"
                " WHERE workspace_id = ? AND scheduled_for = ? AND holder = ?",
                (ts(now), run_id, outcome, workspace_id, ts(scheduled_for), holder),
            )
            conn.execute(  # bounded: finished cycles older than KEPT are forgotten
                "DELETE FROM dispatch_cycles WHERE workspace_id = ? AND scheduled_for < ?"
                " AND finished_at IS NOT NULL",
                (workspace_id, ts(now - KEPT)),
            )

        self._write(body, None)

    def list_cycles(self, workspace_id: str, limit: int = 20) -> list[CycleRow]:
        """The workspace's latest cycles, newest first."""
        rows = self._read(
            "SELECT * FROM dispatch_cycles WHERE workspace_id = ?"
            " ORDER BY scheduled_for DESC LIMIT ?",
            (workspace_id, limit),
        )
        return [
            record_of(CycleRow, r, times=("scheduled_for", "started_at", "finished_at"))
            for r in rows
        ]


def _lease(row: Row) -> Lease:
    return record_of(Lease, row, times=("acquired_at", "renewed_at", "expires_at"))
