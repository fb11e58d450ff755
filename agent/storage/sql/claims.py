"""Claims and execution records (the Claims role).

The claim is an ``INSERT ... ON CONFLICT DO NOTHING RETURNING`` on the execution key, in the
same transaction as the task write; UNIQUE(work_key) on ``task_threads`` makes a second task
for one thread impossible. A takeover is a compare-and-set on everything its decision read.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta
from typing import NoReturn

from agent import crashpoints
from agent.domain.dispositions import TERMINAL, parse_disposition
from agent.domain.envelope import compose_key
from agent.domain.errors import ClaimLost, StoreError
from agent.domain.execution import ClaimOutcome, ExecutionRecord, ExecutionState, contest
from agent.domain.records import (
    ClaimRequest,
    ClaimResult,
    Escalation,
    EscalationDraft,
    ReportRequest,
    TaskDraft,
)
from agent.domain.reporting import apply_report
from agent.domain.run import LedgerEntry
from agent.domain.states import TaskState
from agent.domain.task import Task
from agent.storage.sql.core import Row, Tx, Verified, chunks, dt, record_of, ts
from agent.storage.sql.runs import RunRows
from agent.storage.sql.tasks import TaskRows


class ClaimRows(TaskRows, RunRows):
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

    def reclaimable(
        self, scope: str, now: datetime, holder_alive: Callable[[str], bool]
    ) -> list[LedgerEntry]:
        # Only unfinished occurrences are read (a partial index keeps DONE ones out), each
        # with the item its last claim was made for.
        prefix = compose_key(scope) + "|"
        rows = self._read(
            "SELECT e.*, r.run_id AS r_run_id, r.item_ref AS r_item_ref, r.occurrence_key,"
            " r.disposition, r.detail, r.scanned, r.owner, r.mailbox_id, r.reason"
            " FROM executions e JOIN run_items r ON r.run_id = e.run_id"
            " AND r.item_ref = e.item_ref"
            " WHERE e.state <> 'DONE' AND e.key >= ? AND e.key < ? AND r.scanned IS NOT NULL"
            " ORDER BY e.key",
            (prefix, prefix[:-1] + "}"),
        )
        return [
            self._entry({**dict(r), "run_id": r["r_run_id"], "item_ref": r["r_item_ref"]})
            for r in rows
            if contest(self._execution(r), now, holder_alive) is None
        ]

    def claim(
        self,
        request: ClaimRequest,
        draft: TaskDraft | EscalationDraft,
        now: datetime,
        holder_alive: Callable[[str], bool],
    ) -> ClaimResult:
        def body(conn: Tx) -> ClaimResult:
            row = self._insert_execution(conn, request, draft, now)
            taken_over = row is None
            if row is None:
                decided = self._decide_contest(conn, request, now, holder_alive)
                if isinstance(decided, ClaimResult):
                    return decided
                row = decided
            return self._write_claimed(conn, request, draft, now, row, taken_over=taken_over)

        def verify(conn: Tx) -> Verified[ClaimResult]:
            return self._claim_committed(conn, request, now)

        return self._write(body, verify)

    @staticmethod
    def _insert_execution(
        conn: Tx, request: ClaimRequest, draft: TaskDraft | EscalationDraft, now: datetime
    ) -> Row | None:
        """The claim itself: the execution record, or None when the key has one already.
        It names the task it works on: the thread's task if the thread has one, else the new
        task's id (a conflict later corrects it, in the same transaction)."""
        work_key = draft.work_key if isinstance(draft, TaskDraft) else None
        new_task_id = draft.task_id if isinstance(draft, TaskDraft) else None
        return conn.execute(
            "INSERT INTO executions (key, service, holder, state, generation,"
            " lease_expires_at, run_id, item_ref, claimed_at, task_id)"
            " VALUES (?, ?, ?, 'CLAIMED', 1, ?, ?, ?, ?, coalesce((SELECT task_id FROM"
            " task_threads WHERE work_key = ?), ?))"
            " ON CONFLICT (key) DO NOTHING RETURNING *",
            (
                request.key,
                request.service,
                request.holder,
                ts(now + timedelta(seconds=request.lease_seconds)),
                request.run_id,
                request.item_ref,
                ts(now),
                work_key,
                new_task_id,
            ),
        ).fetchone()

    def _decide_contest(
        self,
        conn: Tx,
        request: ClaimRequest,
        now: datetime,
        holder_alive: Callable[[str], bool],
    ) -> ClaimResult | Row:
        """The key has an execution: this very claim's (an earlier attempt of this call
        committed), a claim-race outcome, or - the holder being dead, its lease out or its
        retry due - the taken-over execution row."""
        existing = conn.execute("SELECT * FROM executions WHERE key = ?", (request.key,)).fetchone()
        if self._is_this_claim(existing, request, now):
            return self._own_claim(conn, request, existing)
        outcome = self._contest(existing, now, holder_alive)
        if outcome is not None:
            return ClaimResult(outcome=outcome, execution=self._execution(existing))
        row = self._take_over(conn, request, now, existing)
        if row is not None:
            return row
        # The execution changed since the read (possible where writers run concurrently;
        # SQLite's write lock rules it out): decide on it as it is.
        current = conn.execute("SELECT * FROM executions WHERE key = ?", (request.key,)).fetchone()
        if self._is_this_claim(current, request, now):
            return self._own_claim(conn, request, current)
        lost = self._contest(current, now, holder_alive)
        return ClaimResult(
            outcome=lost or ClaimOutcome.EXECUTION_ALREADY_CLAIMED,
            execution=self._execution(current),
        )

    @staticmethod
    def _take_over(conn: Tx, request: ClaimRequest, now: datetime, existing: Row) -> Row | None:
        """A compare-and-set on everything the decision read - the generation, the state
        and the holder - so a report that finished the execution since (same generation,
        now DONE or RETRY_PENDING) wins; None when it did."""
        return conn.execute(
            "UPDATE executions SET holder = ?, state = 'CLAIMED', generation ="
            " generation + 1, lease_expires_at = ?, retry_at = NULL, run_id = ?,"
            " item_ref = ?, claimed_at = ? WHERE key = ? AND generation = ?"
            " AND state = ? AND holder = ? RETURNING *",
            (
                request.holder,
                ts(now + timedelta(seconds=request.lease_seconds)),
                request.run_id,
                request.item_ref,
                ts(now),
                request.key,
                existing["generation"],
                existing["state"],
                existing["holder"],
            ),
        ).fetchone()

    def _write_claimed(
        self,
        conn: Tx,
        request: ClaimRequest,
        draft: TaskDraft | EscalationDraft,
        now: datetime,
        row: Row,
        *,
        taken_over: bool,
    ) -> ClaimResult:
        """What a won claim writes in its transaction: the escalation, or the thread's task
        (created, or with the message added), and the execution pointed at that task."""
        task: Task | None = None
        created = False
        if isinstance(draft, EscalationDraft):
            self._insert_escalation(conn, request, draft, now)
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

    @staticmethod
    def _insert_escalation(
        conn: Tx, request: ClaimRequest, draft: EscalationDraft, now: datetime
    ) -> None:
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

    def _claim_committed(
        self, conn: Tx, request: ClaimRequest, now: datetime
    ) -> Verified[ClaimResult]:
        """Whether this claim committed, when its commit's outcome is unknown: the execution
        record says whether it won. It never claims again on a guess."""
        row = conn.execute("SELECT * FROM executions WHERE key = ?", (request.key,)).fetchone()
        if row is None or not self._is_this_claim(row, request, now):
            return None
        return (self._own_claim(conn, request, row),)

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
        for chunk in chunks(list(dict.fromkeys(keys))):
            marks = ", ".join("?" * len(chunk))
            for row in self._read(f"SELECT * FROM executions WHERE key IN ({marks})", chunk):
                found[row["key"]] = self._execution(row)
        return found

    def list_escalations(self, scope: str | None = None) -> list[Escalation]:
        sql = "SELECT * FROM escalations"
        params: tuple[str, ...] = ()
        if scope is not None:
            sql += " WHERE scope = ?"
            params = (scope,)
        rows = self._read(sql + " ORDER BY created_at, occurrence_key", params)
        return [record_of(Escalation, r, times=("created_at",)) for r in rows]
