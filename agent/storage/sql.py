"""The store's logic on any SQL database with UNIQUE constraints and ``ON CONFLICT``.

Uniqueness comes from UNIQUE constraints alone: the claim is an ``INSERT ... ON CONFLICT DO
NOTHING RETURNING`` on the execution key, in the same transaction as the task write. There is
no check-then-act and no advisory lock. Backends supply connections and transactions
(``agent/storage/sqlite.py``, ``agent/storage/postgres``); the statements are written once,
with ``?`` placeholders. Where writers run concurrently (PostgreSQL, READ COMMITTED), a
read-modify-write of a task or a run locks its row first (``FOR UPDATE``), and a change
decided on an unlocked read is a compare-and-set on everything that read saw (a claim
takeover); SQLite's write lock serializes every writer anyway.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any, NoReturn, Protocol, TypeVar

from agent import crashpoints
from agent.domain.dispositions import (
    CLAIM_RACE,
    NON_TERMINAL,
    TERMINAL,
    Disposition,
    parse_disposition,
)
from agent.domain.errors import ClaimLost, RegistryError, StoreError, TransitionError
from agent.domain.execution import ClaimOutcome, ExecutionRecord, ExecutionState, contest
from agent.domain.records import (
    Binding,
    ClaimRequest,
    ClaimResult,
    DraftRecord,
    Escalation,
    EscalationDraft,
    HealthRecord,
    LearningProposal,
    ProposalState,
    ReportRequest,
    SendIntent,
    SendRecord,
    SendState,
    TaskAmendment,
    TaskDraft,
    WorkspaceRow,
)
from agent.domain.reporting import apply_amendment, apply_report, readiness
from agent.domain.run import LedgerEntry, OpenRun, Reconciliation
from agent.domain.states import TERMINAL_STATES, TaskState, check_transition
from agent.domain.task import Task
from agent.storage.schema import MIGRATIONS

T = TypeVar("T")


class Row(Protocol):
    """A result row, read by column name."""

    def __getitem__(self, key: str, /) -> Any: ...


class Cursor(Protocol):
    """Results are read with fetchone/fetchall (where statements are pipelined, a fetch is
    what waits for the server)."""

    def fetchone(self) -> Any: ...

    def fetchall(self) -> list[Any]: ...


class Tx(Protocol):
    """One open transaction. Statements use ``?`` placeholders."""

    def execute(self, sql: str, params: Sequence[Any] = (), /) -> Cursor: ...

    def executemany(self, sql: str, params: Iterable[Sequence[Any]], /) -> Any: ...

    def execute_each(self, sql: str, params: Sequence[Sequence[Any]], /) -> list[Any]:
        """Run the statement once per parameter row; the first result row of each run (or
        None), in order. Drivers that can send them together do."""
        ...


Verified = tuple[T] | None
"""What a commit check found: ``(result,)`` when the transaction committed, else None."""


CHUNK_ROWS = 100
"""Rows per multi-row statement: under every database's parameter limit, and short enough
for drivers to cache the statement text."""


def _chunks(items: Sequence[T]) -> Iterator[Sequence[T]]:
    for start in range(0, len(items), CHUNK_ROWS):
        yield items[start : start + CHUNK_ROWS]


def ts(moment: datetime) -> float:
    return moment.timestamp()


def dt(value: float | None) -> datetime | None:
    return None if value is None else datetime.fromtimestamp(value, UTC)


class SqlStore:
    """The Store port's logic; a backend supplies ``_write``, ``_read`` and its dialect."""

    FOR_UPDATE = ""
    """The clause that locks the rows a read-modify-write selects."""

    FOR_SHARE = ""
    """The clause that keeps the rows a write depends on from changing until it commits."""

    def _write(self, body: Callable[[Tx], T], verify: Callable[[Tx], Verified[T]] | None) -> T:
        """Run ``body`` in one write transaction and commit. When the commit's outcome is
        unknown (the connection died during it), ``verify`` reads whether it took effect;
        without ``verify`` the body is safe to run again."""
        raise NotImplementedError

    def _read(self, sql: str, params: Sequence[Any] = ()) -> list[Any]:
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError

    def integrity_check(self) -> str:
        raise NotImplementedError

    # -- schema ---------------------------------------------------------------------------

    def _apply_migrations(
        self, conn: Tx, where: str, translate: Callable[[str], str] = lambda s: s
    ) -> None:
        """Apply the migrations this database lacks, inside the caller's transaction."""
        conn.execute("CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL)")
        row = conn.execute("SELECT max(version) AS v FROM schema_version").fetchone()
        current = int(row["v"] or 0)
        known = MIGRATIONS[-1][0]
        if current > known:
            raise StoreError(
                f"the database {where} has schema version {current}, newer than this "
                f"Outloop knows ({known}); upgrade Outloop before opening it"
            )
        for version, statements in MIGRATIONS:
            if version <= current:
                continue
            for statement in statements:
                conn.execute(translate(statement))
            conn.execute("INSERT INTO schema_version (version) VALUES (?)", (version,))

    def schema_version(self) -> int:
        return int(self._read("SELECT max(version) AS v FROM schema_version")[0]["v"])

    # -- registry ---------------------------------------------------------------------------

    def register_workspace(self, row: WorkspaceRow, bindings: Sequence[Binding]) -> None:
        def body(conn: Tx) -> None:
            inserted = conn.execute(
                "INSERT INTO workspaces (workspace_id, label, context_path, context_sha256,"
                " registered_at, updated_at, context_text) VALUES (?, ?, ?, ?, ?, ?, ?)"
                " ON CONFLICT (workspace_id) DO NOTHING RETURNING workspace_id",
                (
                    row.workspace_id,
                    row.label,
                    row.context_path,
                    row.context_sha256,
                    ts(row.registered_at),
                    ts(row.updated_at),
                    row.context_text,
                ),
            ).fetchone()
            if inserted is None:
                raise RegistryError(
                    f"workspace {row.workspace_id} is already registered; use "
                    "'outloop workspace update' to replace its context"
                )
            self._write_bindings(conn, row.workspace_id, bindings)

        def verify(conn: Tx) -> Verified[None]:
            found = conn.execute(
                "SELECT 1 FROM workspaces WHERE workspace_id = ? AND context_sha256 = ?"
                " AND registered_at = ?",
                (row.workspace_id, row.context_sha256, ts(row.registered_at)),
            ).fetchone()
            return (None,) if found is not None else None

        self._write(body, verify)

    def update_workspace(self, row: WorkspaceRow, bindings: Sequence[Binding]) -> None:
        def body(conn: Tx) -> None:
            updated = conn.execute(
                "UPDATE workspaces SET label = ?, context_path = ?, context_sha256 = ?,"
                " updated_at = ?, context_text = ? WHERE workspace_id = ? RETURNING workspace_id",
                (
                    row.label,
                    row.context_path,
                    row.context_sha256,
                    ts(row.updated_at),
                    row.context_text,
                    row.workspace_id,
                ),
            ).fetchone()
            if updated is None:
                raise RegistryError(
                    f"workspace {row.workspace_id} is not registered; use 'outloop workspace "
                    "add' first"
                )
            conn.execute("DELETE FROM mailbox_bindings WHERE workspace_id = ?", (row.workspace_id,))
            self._write_bindings(conn, row.workspace_id, bindings)

        self._write(body, None)  # running it again writes the same rows

    @staticmethod
    def _write_bindings(conn: Tx, workspace_id: str, bindings: Sequence[Binding]) -> None:
        conn.executemany(
            "INSERT INTO mailbox_bindings (provider, mailbox_id, workspace_id, shared)"
            " VALUES (?, ?, ?, ?)",
            [(b.provider, b.mailbox_id, workspace_id, int(b.shared)) for b in bindings],
        )

    @staticmethod
    def _workspace(row: Row) -> WorkspaceRow:
        return WorkspaceRow(
            workspace_id=row["workspace_id"],
            label=row["label"],
            context_path=row["context_path"],
            context_sha256=row["context_sha256"],
            registered_at=dt(row["registered_at"]) or datetime.now(UTC),
            updated_at=dt(row["updated_at"]) or datetime.now(UTC),
            context_text=row["context_text"],
        )

    def get_workspace(self, workspace_id: str) -> WorkspaceRow | None:
        rows = self._read("SELECT * FROM workspaces WHERE workspace_id = ?", (workspace_id,))
        return self._workspace(rows[0]) if rows else None

    def list_workspaces(self) -> list[WorkspaceRow]:
        return [self._workspace(r) for r in self._read("SELECT * FROM workspaces ORDER BY 1")]

    def bindings_for_mailbox(self, provider: str, mailbox_id: str) -> list[Binding]:
        rows = self._read(
            "SELECT * FROM mailbox_bindings WHERE provider = ? AND mailbox_id = ?"
            " ORDER BY workspace_id",
            (provider, mailbox_id.lower()),
        )
        return [
            Binding(
                workspace_id=r["workspace_id"],
                provider=r["provider"],
                mailbox_id=r["mailbox_id"],
                shared=bool(r["shared"]),
            )
            for r in rows
        ]

    # -- run ledger -------------------------------------------------------------------------

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

    def record_scanned(self, entries: Sequence[LedgerEntry], now: datetime) -> None:
        refs = [e.item_ref for e in entries]
        if len(set(refs)) != len(refs):
            twice = sorted({r for r in refs if refs.count(r) > 1})
            raise StoreError(f"items scanned twice in one run: {', '.join(twice[:5])}")
        if not entries:
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
            for chunk in _chunks(entries):
                marks = ", ".join(["(?, ?, ?, ?, ?)"] * len(chunk))
                conn.execute(
                    "INSERT INTO run_items (run_id, item_ref, occurrence_key, detail, scanned_at)"
                    f" VALUES {marks}",
                    [
                        value
                        for e in chunk
                        for value in (e.run_id, e.item_ref, e.occurrence_key, e.detail, ts(now))
                    ],
                )

        def verify(conn: Tx) -> Verified[None]:
            # The rows are written all or none, and only by this call.
            first = entries[0]
            found = conn.execute(
                "SELECT 1 FROM run_items WHERE run_id = ? AND item_ref = ? AND scanned_at = ?",
                (first.run_id, first.item_ref, ts(now)),
            ).fetchone()
            return (None,) if found is not None else None

        self._write(body, verify)

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
            SqlStore._refuse_disposition(conn, run_id, item_ref)

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
        return [
            LedgerEntry(
                run_id=r["run_id"],
                item_ref=r["item_ref"],
                occurrence_key=r["occurrence_key"],
                disposition=parse_disposition(r["disposition"]) if r["disposition"] else None,
                detail=r["detail"] or "",
            )
            for r in rows
        ]

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

    # -- claims -----------------------------------------------------------------------------

    @staticmethod
    def _execution(row: Row) -> ExecutionRecord:
        return ExecutionRecord(
            key=row["key"],
            service=row["service"],
            holder=row["holder"],
            state=ExecutionState(row["state"]),
            generation=int(row["generation"]),
            lease_expires_at=dt(row["lease_expires_at"]) or datetime.now(UTC),
            retry_at=dt(row["retry_at"]),
            outcome=parse_disposition(row["outcome"]) if row["outcome"] else None,
            result=row["result"],
            run_id=row["run_id"],
            item_ref=row["item_ref"],
            task_id=row["task_id"],
            claimed_at=dt(row["claimed_at"]) or datetime.now(UTC),
            reported_at=dt(row["reported_at"]),
        )

    def claim(
        self,
        request: ClaimRequest,
        draft: TaskDraft | EscalationDraft,
        now: datetime,
        holder_alive: Callable[[str], bool],
    ) -> ClaimResult:
        lease = ts(now + timedelta(seconds=request.lease_seconds))

        # The claim names the task it works on: the thread's task if the thread has one,
        # else the new task's id (a conflict below corrects it, in the same transaction).
        work_key = draft.work_key if isinstance(draft, TaskDraft) else None
        new_task_id = draft.task_id if isinstance(draft, TaskDraft) else None

        def body(conn: Tx) -> ClaimResult:
            row = conn.execute(
                "INSERT INTO executions (key, service, holder, state, generation,"
                " lease_expires_at, run_id, item_ref, claimed_at, task_id)"
                " VALUES (?, ?, ?, 'CLAIMED', 1, ?, ?, ?, ?, coalesce((SELECT task_id FROM"
                " task_threads WHERE work_key = ?), ?))"
                " ON CONFLICT (key) DO NOTHING RETURNING *",
                (
                    request.key,
                    request.service,
                    request.holder,
                    lease,
                    request.run_id,
                    request.item_ref,
                    ts(now),
                    work_key,
                    new_task_id,
                ),
            ).fetchone()
            taken_over = False
            if row is None:
                existing = conn.execute(
                    "SELECT * FROM executions WHERE key = ?", (request.key,)
                ).fetchone()
                if self._is_this_claim(existing, request, now):
                    # Committed by an earlier attempt of this call whose outcome was unknown.
                    return self._own_claim(conn, request, existing)
                outcome = self._contest(existing, now, holder_alive)
                if outcome is not None:
                    return ClaimResult(outcome=outcome, execution=self._execution(existing))
                # Takeover: a compare-and-set on everything the decision read - the
                # generation, the state and the holder - so a report that finished the
                # execution since (same generation, now DONE or RETRY_PENDING) wins.
                row = conn.execute(
                    "UPDATE executions SET holder = ?, state = 'CLAIMED', generation ="
                    " generation + 1, lease_expires_at = ?, retry_at = NULL, run_id = ?,"
                    " item_ref = ?, claimed_at = ? WHERE key = ? AND generation = ?"
                    " AND state = ? AND holder = ? RETURNING *",
                    (
                        request.holder,
                        lease,
                        request.run_id,
                        request.item_ref,
                        ts(now),
                        request.key,
                        existing["generation"],
                        existing["state"],
                        existing["holder"],
                    ),
                ).fetchone()
                if row is None:
                    # The execution changed since the read (possible where writers run
                    # concurrently; SQLite's write lock rules it out): decide on it as it is.
                    current = conn.execute(
                        "SELECT * FROM executions WHERE key = ?", (request.key,)
                    ).fetchone()
                    if self._is_this_claim(current, request, now):
                        return self._own_claim(conn, request, current)
                    lost = self._contest(current, now, holder_alive)
                    return ClaimResult(
                        outcome=lost or ClaimOutcome.EXECUTION_ALREADY_CLAIMED,
                        execution=self._execution(current),
                    )
                taken_over = True
            task: Task | None = None
            created = False
            if isinstance(draft, EscalationDraft):
                conn.execute(
                    "INSERT INTO escalations (occurrence_key, scope, queue, assignee, reason,"
                    " provider, mailbox_id, item_ref, created_at)"
                    " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT DO NOTHING",
                    (
                        request.key,
                        draft.scope,
                        draft.queue,
                        draft.assignee,
                        draft.reason,
                        draft.provider,
                        draft.mailbox_id,
                        draft.item_ref,
                        ts(now),
                    ),
                )
            else:
                claimed_task = row["task_id"]
                # What the claim's insert found: the thread's task, or (its own new id) none.
                found: str | None = None
                if not taken_over:
                    found = "" if claimed_task == draft.task_id else claimed_task
                task, created = self._upsert_task(conn, draft, now, found)
                if claimed_task != task.task_id:
                    row = conn.execute(
                        "UPDATE executions SET task_id = ? WHERE key = ? RETURNING *",
                        (task.task_id, request.key),
                    ).fetchone()
            crashpoints.hit("after_task_write")
            return ClaimResult(
                outcome=ClaimOutcome.CLAIMED,
                execution=self._execution(row),
                task=task,
                task_created=created,
                taken_over=taken_over,
            )

        def verify(conn: Tx) -> Verified[ClaimResult]:
            # The commit's outcome is unknown: the execution record says whether this claim
            # won. It never claims again on a guess.
            row = conn.execute("SELECT * FROM executions WHERE key = ?", (request.key,)).fetchone()
            if row is None or not self._is_this_claim(row, request, now):
                return None
            return (self._own_claim(conn, request, row),)

        return self._write(body, verify)

    @staticmethod
    def _is_this_claim(row: Row, request: ClaimRequest, now: datetime) -> bool:
        """Whether the record is this very claim (holder, run, item and time), still held."""
        return (
            row["state"] == ExecutionState.CLAIMED.value
            and row["holder"] == request.holder
            and row["run_id"] == request.run_id
            and row["item_ref"] == request.item_ref
            and row["claimed_at"] == ts(now)
        )

    def _own_claim(self, conn: Tx, request: ClaimRequest, row: Row) -> ClaimResult:
        """The result of this claim, read back from its committed execution record."""
        task = None if row["task_id"] is None else self._load_task(conn, row["task_id"])
        return ClaimResult(
            outcome=ClaimOutcome.CLAIMED,
            execution=self._execution(row),
            task=task,
            task_created=task is not None and task.created_by == request.key,
            taken_over=int(row["generation"]) > 1,
        )

    def _contest(
        self, existing: Row, now: datetime, holder_alive: Callable[[str], bool]
    ) -> ClaimOutcome | None:
        """None when the existing execution may be taken over, else the claim-race outcome."""
        return contest(self._execution(existing), now, holder_alive)

    def _find_task_id(
        self, conn: Tx, draft: TaskDraft, *, thread_read: bool = False
    ) -> tuple[str | None, bool]:
        """The thread's task id, and whether it was found by the work key itself
        (``thread_read``: the caller already found no task by the work key)."""
        if not thread_read:
            row = conn.execute(
                "SELECT task_id FROM task_threads WHERE work_key = ?", (draft.work_key,)
            ).fetchone()
            if row is not None:
                return str(row["task_id"]), True
        if not draft.link_message_ids:
            return None, False
        marks = ",".join("?" for _ in draft.link_message_ids)
        rows = conn.execute(
            "SELECT DISTINCT task_id FROM task_messages WHERE workspace_id = ? AND provider = ?"
            f" AND mailbox_id = ? AND internet_message_id IN ({marks}) LIMIT 2",
            (draft.workspace_id, draft.provider, draft.mailbox_id, *draft.link_message_ids),
        ).fetchall()
        # Exact linkage only: ids that name messages on two different tasks (a reused
        # Message-ID) link nothing, and the message starts its own task.
        return (str(rows[0]["task_id"]), False) if len(rows) == 1 else (None, False)

    @staticmethod
    def _new_task(draft: TaskDraft, now: datetime) -> tuple[Task, str]:
        task = Task(
            task_id=draft.task_id,
            workspace_id=draft.workspace_id,
            work_key=draft.work_key,
            provider=draft.provider,
            mailbox_id=draft.mailbox_id,
            provider_thread_id=draft.provider_thread_id,
            title=draft.title,
            original_subject=draft.original_subject,
            received_at=draft.received_at,
            first_seen_at=now,
            updated_at=now,
            state=TaskState.DISCOVERED,
            sender_identity=draft.sender_identity,
            sender_side=draft.sender_side,
            client_send_policy=draft.client_send_policy,
            project_id=draft.project_id,
            intake_location_id=draft.intake_location_id,
            next_action=draft.next_action,
            state_since=now,
            messages=(draft.message,),
            package_version=draft.package_version,
            created_by=draft.occurrence_key,
        )
        return task, task.model_dump_json()

    def _upsert_task(
        self,
        conn: Tx,
        draft: TaskDraft,
        now: datetime,
        thread_task: str | None = None,
    ) -> tuple[Task, bool]:
        """Create the thread's task or add the message to it. ``thread_task`` is what this
        transaction already read of the thread: its task id, "" for no task, None unread."""
        if thread_task:
            task_id, by_work_key = thread_task, True
        else:
            task_id, by_work_key = self._find_task_id(conn, draft, thread_read=thread_task == "")
        if task_id is None:
            # Built only by a claim that won and found no task for its thread.
            task, record = self._new_task(draft, now)
            self._insert_task(conn, task, record)
            if self._link_thread(conn, draft.work_key, task.task_id):
                self._record_message(conn, draft, task.task_id)
                return task, True
            # Another worker's transaction created this thread's task first (writers that
            # run concurrently); UNIQUE(work_key) decided it. Use that task instead.
            conn.execute("DELETE FROM tasks WHERE task_id = ?", (task.task_id,))
            task_id, by_work_key = self._find_task_id(conn, draft)
            if task_id is None or not by_work_key:
                raise StoreError(f"thread {draft.work_key} has no task after a conflict")
        elif not by_work_key and not self._link_thread(conn, draft.work_key, task_id):
            # Found by exact linkage, but another worker's transaction gave this thread its
            # own task first: the thread row decides, so the message joins that task.
            task_id, by_work_key = self._find_task_id(conn, draft)
            if task_id is None or not by_work_key:
                raise StoreError(f"thread {draft.work_key} has no task after a conflict")
        task = self._load_task(conn, task_id, lock=True)
        # A takeover of the claim that created the task is still its first handling.
        created = task.created_by == draft.occurrence_key
        known = {m.provider_message_id for m in task.messages}
        if draft.message.provider_message_id not in known:
            task = task.model_copy(
                update={"messages": (*task.messages, draft.message), "updated_at": now}
            )
            self._save_task(conn, task, task.state)
        self._record_message(conn, draft, task.task_id)
        return task, created

    @staticmethod
    def _record_message(conn: Tx, draft: TaskDraft, task_id: str) -> None:
        """Index the message for exact linkage of later replies."""
        conn.execute(
            "INSERT INTO task_messages (workspace_id, provider, mailbox_id, internet_message_id,"
            " provider_message_id, task_id, received_at) VALUES (?, ?, ?, ?, ?, ?, ?)"
            " ON CONFLICT DO NOTHING",
            (
                draft.workspace_id,
                draft.provider,
                draft.mailbox_id,
                draft.message.internet_message_id or "",
                draft.message.provider_message_id,
                task_id,
                ts(draft.message.received_at),
            ),
        )

    @staticmethod
    def _link_thread(conn: Tx, work_key: str, task_id: str) -> bool:
        """Point the thread at the task; False when the thread already has one.
        UNIQUE(work_key) makes a second task for one thread impossible."""
        row = conn.execute(
            "INSERT INTO task_threads (work_key, task_id) VALUES (?, ?)"
            " ON CONFLICT (work_key) DO NOTHING RETURNING task_id",
            (work_key, task_id),
        ).fetchone()
        return row is not None

    @staticmethod
    def _insert_task(conn: Tx, task: Task, record: str) -> None:
        conn.execute(
            "INSERT INTO tasks (task_id, workspace_id, work_key, state, terminal, received_at,"
            " record) VALUES (?, ?, ?, ?, ?, ?, ?)",
            (
                task.task_id,
                task.workspace_id,
                task.work_key,
                task.state.value,
                int(task.state in TERMINAL_STATES),
                ts(task.received_at),
                record,
            ),
        )

    @staticmethod
    def _save_task(conn: Tx, task: Task, previous: TaskState) -> None:
        conn.execute(
            "UPDATE tasks SET state = ?, record = ? WHERE task_id = ?",
            (task.state.value, task.model_dump_json(), task.task_id),
        )
        if (task.state in TERMINAL_STATES) != (previous in TERMINAL_STATES):
            # Only then does the queue index change.
            conn.execute(
                "UPDATE tasks SET terminal = ? WHERE task_id = ?",
                (int(task.state in TERMINAL_STATES), task.task_id),
            )

    def _load_task(self, conn: Tx, task_id: str, *, lock: bool = False) -> Task:
        """The task record; ``lock`` holds its row until the transaction ends, for a
        read-modify-write."""
        row = conn.execute(
            "SELECT record FROM tasks WHERE task_id = ?" + (self.FOR_UPDATE if lock else ""),
            (task_id,),
        ).fetchone()
        if row is None:
            raise StoreError(f"task {task_id} does not exist")
        return Task.model_validate_json(row["record"])

    def report(self, request: ReportRequest, now: datetime) -> ExecutionRecord:
        if request.retry_at is not None and request.disposition in TERMINAL:
            raise StoreError(
                f"a retry cannot carry the terminal disposition {request.disposition}; "
                "report a non-terminal outcome (for example QUEUED) with retry_at"
            )
        crashpoints.hit("before_report")

        def body(conn: Tx) -> ExecutionRecord:
            # Only the current holder of a live claim may report: compare-and-set.
            row = conn.execute(
                "UPDATE executions SET state = ?, outcome = ?, result = ?, reported_at = ?,"
                " retry_at = ? WHERE key = ? AND holder = ? AND state = 'CLAIMED' RETURNING *",
                (
                    "DONE" if request.retry_at is None else "RETRY_PENDING",
                    request.disposition.value,
                    request.detail,
                    ts(now),
                    None if request.retry_at is None else ts(request.retry_at),
                    request.key,
                    request.holder,
                ),
            ).fetchone()
            if row is None:
                self._refuse_report(conn, request)
            settled = request.disposition
            if row["task_id"] is not None:
                before = self._load_task(conn, row["task_id"], lock=True)
                task, settled = apply_report(
                    before,
                    key=request.key,
                    disposition=request.disposition,
                    detail=request.detail,
                    update=request.task_update,
                    retrying=request.retry_at is not None,
                    now=now,
                )
                self._save_task(conn, task, before.state)
            if settled is not request.disposition:
                row = conn.execute(
                    "UPDATE executions SET outcome = ? WHERE key = ? RETURNING *",
                    (settled.value, request.key),
                ).fetchone()
            self._set_disposition(
                conn, request.run_id, request.item_ref, settled, request.detail, now
            )
            return self._execution(row)

        def verify(conn: Tx) -> Verified[ExecutionRecord]:
            row = conn.execute(
                "SELECT * FROM executions WHERE key = ? AND holder = ? AND state <> 'CLAIMED'"
                " AND reported_at = ?",
                (request.key, request.holder, ts(now)),
            ).fetchone()
            return (self._execution(row),) if row is not None else None

        record = self._write(body, verify)
        crashpoints.hit("after_report")
        return record

    @staticmethod
    def _refuse_report(conn: Tx, request: ReportRequest) -> NoReturn:
        existing = conn.execute(
            "SELECT holder, state FROM executions WHERE key = ?", (request.key,)
        ).fetchone()
        if existing is None:
            raise StoreError(
                f"no execution record for {request.key}; claim the occurrence before reporting it"
            )
        raise ClaimLost(
            f"{request.holder} no longer holds {request.key} (holder {existing['holder']}, state"
            f" {existing['state']}); the execution record governs, so this report is refused"
        )

    def list_executions(self, state: ExecutionState | None = None) -> list[ExecutionRecord]:
        if state is None:
            rows = self._read("SELECT * FROM executions ORDER BY claimed_at, key")
        else:
            rows = self._read(
                "SELECT * FROM executions WHERE state = ? ORDER BY claimed_at, key", (state.value,)
            )
        return [self._execution(r) for r in rows]

    def get_execution(self, key: str) -> ExecutionRecord | None:
        rows = self._read("SELECT * FROM executions WHERE key = ?", (key,))
        return self._execution(rows[0]) if rows else None

    def get_executions(self, keys: Sequence[str]) -> dict[str, ExecutionRecord]:
        found: dict[str, ExecutionRecord] = {}
        for chunk in _chunks(list(dict.fromkeys(keys))):
            marks = ", ".join("?" * len(chunk))
            for row in self._read(f"SELECT * FROM executions WHERE key IN ({marks})", chunk):
                found[row["key"]] = self._execution(row)
        return found

    # -- tasks ------------------------------------------------------------------------------

    def get_task(self, task_id: str) -> Task | None:
        rows = self._read("SELECT record FROM tasks WHERE task_id = ?", (task_id,))
        return Task.model_validate_json(rows[0]["record"]) if rows else None

    def task_for_thread(self, work_key: str) -> Task | None:
        rows = self._read(
            "SELECT t.record FROM task_threads h JOIN tasks t USING (task_id) WHERE h.work_key = ?",
            (work_key,),
        )
        return Task.model_validate_json(rows[0]["record"]) if rows else None

    def list_tasks(self, workspace_id: str) -> list[Task]:
        rows = self._read(
            "SELECT record FROM tasks WHERE workspace_id = ? ORDER BY received_at, task_id",
            (workspace_id,),
        )
        return [Task.model_validate_json(r["record"]) for r in rows]

    def list_queue(self, workspace_id: str) -> list[Task]:
        rows = self._read(
            "SELECT record FROM tasks WHERE workspace_id = ? AND terminal = 0"
            " ORDER BY received_at, task_id",
            (workspace_id,),
        )
        return [Task.model_validate_json(r["record"]) for r in rows]

    def transition_task(
        self, task_id: str, target: TaskState, evidence: str, now: datetime
    ) -> Task:
        def body(conn: Tx) -> Task:
            before = self._load_task(conn, task_id, lock=True)
            check_transition(before.state, target)
            if target in TERMINAL_STATES and before.open_gates:
                raise TransitionError(
                    f"task {task_id} still has open gates ("
                    + ", ".join(f"{g.kind} owned by {g.owner}" for g in before.open_gates)
                    + "); a task with an unsatisfied gate cannot be closed"
                )
            task = before.model_copy(update={"state": target, "updated_at": now})
            if target is not before.state:
                task = task.model_copy(update={"state_since": now})
            task = task.model_copy(update={"readiness_tier": readiness(task)})
            self._save_task(conn, task, before.state)
            conn.execute(
                "INSERT INTO task_events (task_id, at, state, evidence) VALUES (?, ?, ?, ?)",
                (task_id, ts(now), target.value, evidence),
            )
            return task

        def verify(conn: Tx) -> Verified[Task]:
            found = conn.execute(
                "SELECT 1 FROM task_events WHERE task_id = ? AND at = ? AND state = ?",
                (task_id, ts(now), target.value),
            ).fetchone()
            return (self._load_task(conn, task_id),) if found is not None else None

        return self._write(body, verify)

    def amend_task(self, task_id: str, amendment: TaskAmendment, now: datetime) -> Task:
        def body(conn: Tx) -> Task:
            before = self._load_task(conn, task_id, lock=True)
            task = apply_amendment(before, amendment, now)
            self._save_task(conn, task, before.state)
            sent = amendment.sent_message
            if sent is not None and sent.internet_message_id:
                conn.execute(
                    "INSERT INTO task_messages (workspace_id, provider, mailbox_id,"
                    " internet_message_id, provider_message_id, task_id, received_at)"
                    " VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT DO NOTHING",
                    (
                        task.workspace_id,
                        task.provider,
                        task.mailbox_id,
                        sent.internet_message_id,
                        sent.provider_message_id,
                        task_id,
                        ts(sent.received_at),
                    ),
                )
            conn.execute(
                "INSERT INTO task_events (task_id, at, state, evidence) VALUES (?, ?, ?, ?)",
                (task_id, ts(now), task.state.value, amendment.event),
            )
            return task

        def verify(conn: Tx) -> Verified[Task]:
            found = conn.execute(
                "SELECT 1 FROM task_events WHERE task_id = ? AND at = ? AND evidence = ?",
                (task_id, ts(now), amendment.event),
            ).fetchone()
            return (self._load_task(conn, task_id),) if found is not None else None

        return self._write(body, verify)

    def task_events(self, task_id: str) -> list[tuple[datetime, TaskState, str]]:
        rows = self._read(
            "SELECT at, state, evidence FROM task_events WHERE task_id = ? ORDER BY at",
            (task_id,),
        )
        return [
            (dt(r["at"]) or datetime.now(UTC), TaskState(r["state"]), str(r["evidence"]))
            for r in rows
        ]

    # -- the sends ledger -------------------------------------------------------------------

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
        window = ts(now - timedelta(hours=24))

        def body(conn: Tx) -> SendRecord:
            # Automated sends of one workspace are decided one at a time, so two workers
            # can never both squeeze under the cap.
            locked = conn.execute(
                "SELECT workspace_id FROM workspaces WHERE workspace_id = ?" + self.FOR_UPDATE,
                (intent.workspace_id,),
            ).fetchone()
            if locked is None:
                raise StoreError(
                    f"workspace {intent.workspace_id} is not registered; only a registered "
                    "workspace sends mail (outloop workspace add)"
                )
            existing = conn.execute("SELECT * FROM sends WHERE key = ?", (intent.key,)).fetchone()
            if existing is not None:
                return self._send(existing)
            if intent.automated and cap is not None:
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

        def verify(conn: Tx) -> Verified[SendRecord]:
            row = conn.execute(
                "SELECT * FROM sends WHERE key = ? AND created_at = ?", (intent.key, ts(now))
            ).fetchone()
            return (self._send(row, created=True),) if row is not None else None

        return self._write(body, verify)

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

    # -- drafts and learning proposals -------------------------------------------------------

    @staticmethod
    def _draft(row: Row) -> DraftRecord:
        return DraftRecord(
            draft_id=row["draft_id"],
            task_id=row["task_id"],
            workspace_id=row["workspace_id"],
            digest=row["digest"],
            rendered=row["rendered"],
            created_at=dt(row["created_at"]) or datetime.now(UTC),
        )

    def save_draft(self, draft: DraftRecord) -> DraftRecord:
        def body(conn: Tx) -> DraftRecord:
            conn.execute(
                "INSERT INTO drafts (draft_id, task_id, workspace_id, digest, rendered,"
                " created_at) VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (draft_id) DO NOTHING",
                (
                    draft.draft_id,
                    draft.task_id,
                    draft.workspace_id,
                    draft.digest,
                    draft.rendered,
                    ts(draft.created_at),
                ),
            )
            row = conn.execute(
                "SELECT * FROM drafts WHERE draft_id = ?", (draft.draft_id,)
            ).fetchone()
            return self._draft(row)

        return self._write(body, None)

    def get_draft(self, draft_id: str) -> DraftRecord | None:
        rows = self._read("SELECT * FROM drafts WHERE draft_id = ?", (draft_id,))
        return self._draft(rows[0]) if rows else None

    @staticmethod
    def _proposal(row: Row, *, created: bool = False) -> LearningProposal:
        return LearningProposal(
            proposal_id=row["proposal_id"],
            workspace_id=row["workspace_id"],
            kind=row["kind"],
            summary=row["summary"],
            detail=row["detail"],
            evidence=tuple(json.loads(row["evidence"])),
            state=ProposalState(row["state"]),
            submitted_at=dt(row["submitted_at"]) or datetime.now(UTC),
            created=created,
        )

    def add_proposal(self, proposal: LearningProposal) -> LearningProposal:
        def body(conn: Tx) -> LearningProposal:
            row = conn.execute(
                "INSERT INTO learning_proposals (proposal_id, workspace_id, kind, summary,"
                " detail, evidence, state, submitted_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?)"
                " ON CONFLICT (proposal_id) DO NOTHING RETURNING *",
                (
                    proposal.proposal_id,
                    proposal.workspace_id,
                    proposal.kind,
                    proposal.summary,
                    proposal.detail,
                    json.dumps(list(proposal.evidence)),
                    proposal.state.value,
                    ts(proposal.submitted_at),
                ),
            ).fetchone()
            if row is not None:
                return self._proposal(row, created=True)
            existing = conn.execute(
                "SELECT * FROM learning_proposals WHERE proposal_id = ?",
                (proposal.proposal_id,),
            ).fetchone()
            return self._proposal(existing)

        return self._write(body, None)

    def list_proposals(self, workspace_id: str) -> list[LearningProposal]:
        rows = self._read(
            "SELECT * FROM learning_proposals WHERE workspace_id = ?"
            " ORDER BY submitted_at, proposal_id",
            (workspace_id,),
        )
        return [self._proposal(r) for r in rows]

    # -- escalations and health -------------------------------------------------------------

    def list_escalations(self, scope: str | None = None) -> list[Escalation]:
        sql = "SELECT * FROM escalations"
        params: tuple[str, ...] = ()
        if scope is not None:
            sql += " WHERE scope = ?"
            params = (scope,)
        rows = self._read(sql + " ORDER BY created_at, occurrence_key", params)
        return [
            Escalation(
                occurrence_key=r["occurrence_key"],
                scope=r["scope"],
                queue=r["queue"],
                assignee=r["assignee"],
                reason=r["reason"],
                provider=r["provider"],
                mailbox_id=r["mailbox_id"],
                item_ref=r["item_ref"],
                created_at=dt(r["created_at"]) or datetime.now(UTC),
            )
            for r in rows
        ]

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
            HealthRecord(
                key=r["key"],
                detail=r["detail"],
                count=int(r["count"]),
                recorded_at=dt(r["recorded_at"]) or datetime.now(UTC),
            )
            for r in self._read("SELECT * FROM health ORDER BY key")
        ]

    # -- inspection used by tests and the CLI -----------------------------------------------

    def counts(self) -> dict[str, int]:
        tables = (
            "executions",
            "tasks",
            "task_threads",
            "task_messages",
            "runs",
            "run_items",
            "escalations",
            "sends",
        )
        out = {t: int(self._read(f"SELECT count(*) AS n FROM {t}")[0]["n"]) for t in tables}
        out["executions_done"] = int(
            self._read("SELECT count(*) AS n FROM executions WHERE state = 'DONE'")[0]["n"]
        )
        return out

    def run_summary(self, run_id: str) -> Reconciliation | None:
        rows = self._read("SELECT summary FROM runs WHERE run_id = ?", (run_id,))
        if not rows or rows[0]["summary"] is None:
            return None
        return Reconciliation.model_validate(json.loads(rows[0]["summary"]))

    def list_runs(self) -> list[str]:
        return [str(r["run_id"]) for r in self._read("SELECT run_id FROM runs ORDER BY started_at")]
