"""Runs, the items each scanned and their dispositions, and the mailbox cursors that advance
with the items they covered (the RunLedger role).

A run's lock row (``runs``) serializes its dispositions and its reconciliation, so an item
gets exactly one disposition and a reconciled run takes none.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import NoReturn

from agent import crashpoints
from agent.domain.dispositions import (
    CLAIM_RACE,
    NON_TERMINAL,
    TERMINAL,
    Disposition,
    parse_disposition,
)
from agent.domain.errors import StoreError
from agent.domain.mail import ScannedMessage
from agent.domain.run import LedgerEntry, MailboxCursor, OpenRun, Reconciliation, RunRow
from agent.storage.sql.core import Row, SqlBase, Tx, Verified, chunks, dt, record_of, ts


class RunRows(SqlBase):
    def start_run(
        self,
        run_id: str,
        scope: str,
        holder: str,
        started_at: datetime,
        lease_expires_at: datetime | None = None,
    ) -> None:
        lease = None if lease_expires_at is None else ts(lease_expires_at)

        def body(conn: Tx) -> None:
            conn.execute(
                "INSERT INTO runs (run_id, scope, holder, started_at, lease_expires_at)"
                " VALUES (?, ?, ?, ?, ?)",
                (run_id, scope, holder, ts(started_at), lease),
            )

        def verify(conn: Tx) -> Verified[None]:
            found = conn.execute(
                "SELECT 1 FROM runs WHERE run_id = ? AND holder = ?", (run_id, holder)
            ).fetchone()
            return (None,) if found is not None else None

        self._write(body, verify)

    def renew_run(self, run_id: str, holder: str, lease_expires_at: datetime) -> bool:
        def body(conn: Tx) -> bool:
            row = conn.execute(
                "UPDATE runs SET lease_expires_at = ? WHERE run_id = ? AND holder = ?"
                " AND reconciled_at IS NULL RETURNING run_id",
                (ts(lease_expires_at), run_id, holder),
            ).fetchone()
            return row is not None

        return self._write(body, None)  # setting the same lease again changes nothing

    def unreconciled_runs(self, scope: str) -> list[OpenRun]:
        rows = self._read(
            "SELECT run_id, holder, lease_expires_at FROM runs WHERE reconciled_at IS NULL"
            " AND scope = ? ORDER BY started_at, run_id",
            (scope,),
        )
        return [
            OpenRun(
                run_id=r["run_id"], holder=r["holder"], lease_expires_at=dt(r["lease_expires_at"])
            )
            for r in rows
        ]

    def record_scanned(
        self, entries: Sequence[LedgerEntry], now: datetime, cursor: MailboxCursor | None = None
    ) -> None:
        refs = [e.item_ref for e in entries]
        if len(set(refs)) != len(refs):
            twice = sorted({r for r in refs if refs.count(r) > 1})
            raise StoreError(f"items scanned twice in one run: {', '.join(twice[:5])}")
        if not entries and cursor is None:
            return

        run_ids = sorted({e.run_id for e in entries})

        def body(conn: Tx) -> None:
            for run_id in run_ids:
                run = conn.execute(
                    "SELECT reconciled_at FROM runs WHERE run_id = ?" + self.FOR_SHARE, (run_id,)
                ).fetchone()
                if run is not None and run["reconciled_at"] is not None:
                    raise StoreError(
                        f"run {run_id} was already reconciled (its lease ran out before its "
                        "items were recorded); its worker stops, and the next run scans again"
                    )
            for chunk in chunks(entries):
                self._insert_items(conn, chunk, now)
            if cursor is not None:
                self._advance_cursor(conn, cursor, now)

        def verify(conn: Tx) -> Verified[None]:
            # The rows and the cursor are written all or none, and only by this call.
            if entries:
                first = entries[0]
                found = conn.execute(
                    "SELECT 1 FROM run_items WHERE run_id = ? AND item_ref = ? AND scanned_at = ?",
                    (first.run_id, first.item_ref, ts(now)),
                ).fetchone()
            else:
                assert cursor is not None
                found = conn.execute(
                    "SELECT 1 FROM mailbox_cursors WHERE scope = ? AND provider = ? AND"
                    " mailbox_id = ? AND channel = ? AND cursor = ? AND updated_at = ?",
                    (*self._cursor_key(cursor), cursor.cursor, ts(now)),
                ).fetchone()
            return (None,) if found is not None else None

        self._write(body, verify)

    @staticmethod
    def _insert_items(conn: Tx, chunk: Sequence[LedgerEntry], now: datetime) -> None:
        marks = ", ".join(["(?, ?, ?, ?, ?, ?, ?, ?, ?)"] * len(chunk))
        inserted = conn.execute(
            "INSERT INTO run_items (run_id, item_ref, occurrence_key, detail, scanned_at,"
            f" scanned, owner, mailbox_id, reason) VALUES {marks}"
            " ON CONFLICT (run_id, item_ref) DO NOTHING RETURNING item_ref",
            [
                value
                for e in chunk
                for value in (
                    e.run_id,
                    e.item_ref,
                    e.occurrence_key,
                    e.detail,
                    ts(now),
                    None if e.scanned is None else e.scanned.model_dump_json(by_alias=True),
                    e.owner,
                    e.mailbox_id,
                    e.reason,
                )
            ],
        ).fetchall()
        if len(inserted) != len(chunk):
            new = {r["item_ref"] for r in inserted}
            again = [f"{e.item_ref} (run {e.run_id})" for e in chunk if e.item_ref not in new]
            raise StoreError(
                f"items already recorded as scanned: {', '.join(again[:5])}; an item is "
                "scanned once per run"
            )

    @staticmethod
    def _cursor_key(cursor: MailboxCursor) -> tuple[str, str, str, str]:
        return (cursor.scope, cursor.provider, cursor.mailbox_id, cursor.channel)

    @staticmethod
    def _advance_cursor(conn: Tx, cursor: MailboxCursor, now: datetime) -> None:
        conn.execute(
            "INSERT INTO mailbox_cursors (scope, provider, mailbox_id, channel, cursor,"
            " updated_at) VALUES (?, ?, ?, ?, ?, ?)"
            " ON CONFLICT (scope, provider, mailbox_id, channel)"
            " DO UPDATE SET cursor = excluded.cursor, updated_at = excluded.updated_at",
            (*RunRows._cursor_key(cursor), cursor.cursor, ts(now)),
        )

    def get_cursor(self, scope: str, provider: str, mailbox_id: str, channel: str) -> str | None:
        rows = self._read(
            "SELECT cursor FROM mailbox_cursors WHERE scope = ? AND provider = ?"
            " AND mailbox_id = ? AND channel = ?",
            (scope, provider, mailbox_id, channel),
        )
        return str(rows[0]["cursor"]) if rows else None

    def clear_cursor(self, scope: str, provider: str, mailbox_id: str, channel: str) -> None:
        def body(conn: Tx) -> None:
            conn.execute(
                "DELETE FROM mailbox_cursors WHERE scope = ? AND provider = ?"
                " AND mailbox_id = ? AND channel = ?",
                (scope, provider, mailbox_id, channel),
            )

        self._write(body, None)  # deleting again changes nothing

    def run_holder(self, run_id: str) -> OpenRun | None:
        rows = self._read(
            "SELECT run_id, scope, holder, lease_expires_at FROM runs WHERE run_id = ?"
            " AND reconciled_at IS NULL",
            (run_id,),
        )
        if not rows:
            return None
        r = rows[0]
        return OpenRun(
            run_id=r["run_id"],
            holder=r["holder"],
            lease_expires_at=dt(r["lease_expires_at"]),
            scope=r["scope"],
        )

    @staticmethod
    def _set_disposition(
        conn: Tx,
        run_id: str,
        item_ref: str,
        disposition: Disposition,
        detail: str,
        now: datetime,
    ) -> None:
        decided = conn.execute(
            "UPDATE run_items SET disposition = ?, detail = CASE WHEN ? = '' THEN detail ELSE ?"
            " END, decided_at = ? WHERE run_id = ? AND item_ref = ? AND disposition IS NULL"
            " RETURNING item_ref",
            (disposition.value, detail, detail, ts(now), run_id, item_ref),
        ).fetchone()
        if decided is None:
            RunRows._refuse_disposition(conn, run_id, item_ref)

    @staticmethod
    def _refuse_disposition(conn: Tx, run_id: str, item_ref: str) -> NoReturn:
        existing = conn.execute(
            "SELECT disposition FROM run_items WHERE run_id = ? AND item_ref = ?",
            (run_id, item_ref),
        ).fetchone()
        if existing is None:
            raise StoreError(
                f"item {item_ref} was never recorded as scanned in run {run_id}; record "
                "the scan before deciding its disposition"
            )
        raise StoreError(
            f"item {item_ref} already has disposition {existing['disposition']} in run "
            f"{run_id}; an item gets exactly one disposition per run"
        )

    def record_disposition(
        self, run_id: str, item_ref: str, disposition: Disposition, detail: str, now: datetime
    ) -> None:
        self.record_dispositions(run_id, [(item_ref, disposition, detail)], now)

    def record_dispositions(
        self, run_id: str, decided: Sequence[tuple[str, Disposition, str]], now: datetime
    ) -> None:
        """Record several items' dispositions in one transaction (all or none)."""
        if not decided:
            return

        refs = [item_ref for item_ref, _, _ in decided]
        if len(set(refs)) != len(refs):
            twice = sorted({r for r in refs if refs.count(r) > 1})
            raise StoreError(
                f"items given two dispositions at once in run {run_id}: {', '.join(twice[:5])}"
            )

        def body(conn: Tx) -> None:
            # One statement per item, each an exact primary-key lookup (a set-based update
            # lets a planner with stale statistics scan the whole run for every batch).
            firsts = conn.execute_each(
                "UPDATE run_items SET disposition = ?, detail = CASE WHEN ? = '' THEN detail"
                " ELSE ? END, decided_at = ? WHERE run_id = ? AND item_ref = ? AND"
                " disposition IS NULL RETURNING item_ref",
                [
                    (disposition.value, detail, detail, ts(now), run_id, item_ref)
                    for item_ref, disposition, detail in decided
                ],
            )
            for (item_ref, _, _), first in zip(decided, firsts, strict=True):
                if first is None:
                    self._refuse_disposition(conn, run_id, item_ref)

        def verify(conn: Tx) -> Verified[None]:
            item_ref, disposition, _ = decided[0]
            found = conn.execute(
                "SELECT 1 FROM run_items WHERE run_id = ? AND item_ref = ? AND disposition = ?"
                " AND decided_at = ?",
                (run_id, item_ref, disposition.value, ts(now)),
            ).fetchone()
            return (None,) if found is not None else None

        self._write(body, verify)

    def ledger(self, run_id: str) -> list[LedgerEntry]:
        rows = self._read(
            "SELECT * FROM run_items WHERE run_id = ? ORDER BY scanned_at, item_ref", (run_id,)
        )
        return [self._entry(r) for r in rows]

    @staticmethod
    def _entry(r: Row) -> LedgerEntry:
        return LedgerEntry(
            run_id=r["run_id"],
            item_ref=r["item_ref"],
            occurrence_key=r["occurrence_key"],
            disposition=parse_disposition(r["disposition"]) if r["disposition"] else None,
            detail=r["detail"] or "",
            scanned=ScannedMessage.model_validate_json(r["scanned"]) if r["scanned"] else None,
            owner=r["owner"],
            mailbox_id=r["mailbox_id"],
            reason=r["reason"],
        )

    def reconcile(self, run_id: str, now: datetime) -> Reconciliation:
        def body(conn: Tx) -> Reconciliation:
            # The run's row lock serializes two reconciles of one run.
            found = conn.execute(
                "SELECT summary FROM runs WHERE run_id = ?" + self.FOR_UPDATE, (run_id,)
            ).fetchone()
            if found is None:
                raise StoreError(f"run {run_id} does not exist; nothing to reconcile")
            if found["summary"] is not None:
                # Reconciled already (by another worker after its lease ran out, or by an
                # earlier attempt of this call): its summary stands.
                return Reconciliation.model_validate_json(found["summary"])
            return self._reconcile_in(conn, run_id, now)

        return self._write(body, None)  # running it again finds the run reconciled

    def reconcile_stale(
        self, run_id: str, now: datetime, holder_alive: Callable[[str], bool]
    ) -> Reconciliation | None:
        def body(conn: Tx) -> Reconciliation | None:
            # Decided under the run's row lock: a renewal that committed first keeps the
            # run its worker's, and one that comes after finds the run reconciled.
            row = conn.execute(
                "SELECT holder, lease_expires_at, reconciled_at FROM runs WHERE run_id = ?"
                + self.FOR_UPDATE,
                (run_id,),
            ).fetchone()
            if row is None or row["reconciled_at"] is not None:
                return None
            run = OpenRun(
                run_id=run_id, holder=row["holder"], lease_expires_at=dt(row["lease_expires_at"])
            )
            if not run.stale(now, holder_alive):
                return None
            return self._reconcile_in(conn, run_id, now)

        def verify(conn: Tx) -> Verified[Reconciliation | None]:
            row = conn.execute(
                "SELECT summary FROM runs WHERE run_id = ? AND reconciled_at = ?",
                (run_id, ts(now)),
            ).fetchone()
            if row is None or row["summary"] is None:
                return None
            return (Reconciliation.model_validate_json(row["summary"]),)

        return self._write(body, verify)

    def _reconcile_in(self, conn: Tx, run_id: str, now: datetime) -> Reconciliation:
        # Reports write the ledger in their own transaction, so an item without an
        # outcome now never got one in this run.
        conn.execute(
            "UPDATE run_items SET disposition = 'RECONCILIATION_FAILED', decided_at = ?,"
            " detail = 'no outcome was recorded for this item in this run'"
            " WHERE run_id = ? AND disposition IS NULL",
            (ts(now), run_id),
        )
        crashpoints.hit("mid_reconcile")
        counts: dict[str, int] = {
            r["disposition"]: int(r["n"])
            for r in conn.execute(
                "SELECT disposition, count(*) AS n FROM run_items WHERE run_id = ?"
                " GROUP BY disposition",
                (run_id,),
            ).fetchall()
        }
        scanned = sum(counts.values())
        by = {parse_disposition(k): v for k, v in counts.items()}
        terminal = sum(v for k, v in by.items() if k in TERMINAL)
        non_terminal = sum(v for k, v in by.items() if k in NON_TERMINAL)
        race = sum(v for k, v in by.items() if k in CLAIM_RACE)
        failed = by.get(Disposition.RECONCILIATION_FAILED, 0)
        clean = failed == 0 and scanned == terminal + non_terminal + race
        result = Reconciliation(
            run_id=run_id,
            scanned=scanned,
            terminal=terminal,
            non_terminal=non_terminal,
            claim_race=race,
            reconciliation_failed=failed,
            by_disposition={k.value: v for k, v in sorted(by.items())},
            clean=clean,
            reconciled_at=now,
        )
        conn.execute(
            "UPDATE runs SET reconciled_at = ?, clean = ?, summary = ? WHERE run_id = ?",
            (ts(now), int(clean), result.model_dump_json(), run_id),
        )
        return result

    def run_summary(self, run_id: str) -> Reconciliation | None:
        rows = self._read("SELECT summary FROM runs WHERE run_id = ?", (run_id,))
        if not rows or rows[0]["summary"] is None:
            return None
        return Reconciliation.model_validate(json.loads(rows[0]["summary"]))

    def recent_runs(self, scope: str, limit: int = 20) -> list[RunRow]:
        rows = self._read(
            "SELECT run_id, scope, holder, started_at, summary FROM runs WHERE scope = ?"
            " ORDER BY started_at DESC, run_id DESC LIMIT ?",
            (scope, limit),
        )
        return [
            record_of(
                RunRow, r, times=("started_at",),
                summary=None if r["summary"] is None
                else Reconciliation.model_validate(json.loads(r["summary"])),
            )
            for r in rows
        ]  # fmt: skip

    def list_runs(self) -> list[str]:
        return [str(r["run_id"]) for r in self._read("SELECT run_id FROM runs ORDER BY started_at")]
