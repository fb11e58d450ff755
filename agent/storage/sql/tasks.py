"""Task records (the Tasks role) and the embedded task board (the TaskBoard port).

A read-modify-write of a task locks its row (``FOR UPDATE`` where writers run
concurrently); the state column mirrors the record so the queue is one indexed read.
"""

from __future__ import annotations

from datetime import UTC, datetime

from agent.domain.errors import StoreError, TransitionError
from agent.domain.records import TaskAmendment
from agent.domain.reporting import apply_amendment, readiness
from agent.domain.states import TERMINAL_STATES, TaskState, check_transition
from agent.domain.task import QueueEntry, Task
from agent.storage.sql.core import SqlBase, Tx, Verified, dt, ts


class TaskRows(SqlBase):
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
        return [Task.model_validate_json(r) for r in self._queue_records(workspace_id)]

    def list_queue_entries(self, workspace_id: str) -> list[QueueEntry]:
        return [QueueEntry.model_validate_json(r) for r in self._queue_records(workspace_id)]

    def _queue_records(self, workspace_id: str) -> list[str]:
        """The workspace's non-terminal task records, oldest received first."""
        rows = self._read(
            "SELECT record FROM tasks WHERE workspace_id = ? AND terminal = 0"
            " ORDER BY received_at, task_id",
            (workspace_id,),
        )
        return [str(r["record"]) for r in rows]

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
