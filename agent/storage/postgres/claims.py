"""A won claim on PostgreSQL in one round trip.

The claim of ``agent/storage/sql/claims.py`` is one transaction of six statements when it
wins (BEGIN, the execution insert, two task statements, the message link, COMMIT), each a
round trip, and every other worker's claim of the same thread waits on its locks meanwhile.
Here the common paths run as one call of a server-side function (``claims.sql``, installed
by the store at open) on an autocommit connection: one statement, one transaction, one
round trip. It runs the same statements in the same order, with the same locks and the
same UNIQUE constraints deciding every race; so it keeps every guarantee of the general
path, which stays the reference and handles everything else:

- An insert that lost writes nothing and returns the record it lost to. A race lost to a
  live claim (or to DONE) is decided on that record here, with no other round trip, as
  ``claim_occurrence`` decides on a record it read; a takeover (an expired lease, a dead
  holder, a due retry) runs the general path, whose compare-and-set decides it.
- What the function does not settle itself (a task row or a task record it cannot read)
  and data the server cannot take or read raise; the statement rolled back, and the
  general path runs instead.
- A connection lost during the statement leaves its outcome unknown: the store reads the
  execution record back (the general path's own check) before anything runs again.

The task record stays exactly what pydantic writes: a new task's record is serialized here
(``ClaimRows._new_task``); a message joining a task is spliced into the record's own text
by the function, with the message and ``updated_at`` serialized here.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta
from importlib import resources
from typing import Any

from pydantic import TypeAdapter

from agent import crashpoints
from agent.domain.execution import ClaimOutcome, ExecutionRecord, contest
from agent.domain.records import ClaimRequest, ClaimResult, EscalationDraft, TaskDraft
from agent.domain.states import TERMINAL_STATES
from agent.domain.task import Task
from agent.storage.sql import Row, SqlStore, T, Tx, Verified, ts

FUNCTIONS_SQL = (
    resources.files("agent.storage.postgres").joinpath("claims.sql").read_text(encoding="utf-8")
)
"""The server-side claim functions (kept in a .sql file: PL/pgSQL reads best as itself)."""

FUNCTIONS_DIGEST = "outloop claims.sql sha256:" + hashlib.sha256(FUNCTIONS_SQL.encode()).hexdigest()
"""Each function's comment: the store replaces the functions only when it differs."""

DECLINED = "OL001"
"""The SQLSTATE a claim function raises for a case it leaves to the general path."""


class Declined(Exception):
    """The one statement declined (or the server could not take or read its data); it
    rolled back, and nothing of it was committed."""


_EXECUTION_ARGS: tuple[tuple[str, str], ...] = (
    ("p_key", "text"),
    ("p_service", "text"),
    ("p_holder", "text"),
    ("p_lease_expires_at", "float8"),
    ("p_run_id", "text"),
    ("p_item_ref", "text"),
    ("p_claimed_at", "float8"),
)

TASK_FUNCTION = "outloop_claim_task_v1"
TASK_ARGS: tuple[tuple[str, str], ...] = (
    *_EXECUTION_ARGS,
    ("p_work_key", "text"),
    ("p_task_id", "text"),
    ("p_workspace_id", "text"),
    ("p_provider", "text"),
    ("p_mailbox_id", "text"),
    ("p_link_message_ids", "text[]"),
    ("p_task_state", "text"),
    ("p_task_terminal", "integer"),
    ("p_task_received_at", "float8"),
    ("p_task_record", "text"),
    ("p_message", "text"),
    ("p_provider_message_id", "text"),
    ("p_internet_message_id", "text"),
    ("p_message_received_at", "float8"),
    ("p_updated_at", "text"),
)

ESCALATION_FUNCTION = "outloop_claim_escalation_v1"
ESCALATION_ARGS: tuple[tuple[str, str], ...] = (
    *_EXECUTION_ARGS,
    ("p_scope", "text"),
    ("p_queue", "text"),
    ("p_assignee", "text"),
    ("p_reason", "text"),
    ("p_provider", "text"),
    ("p_mailbox_id", "text"),
    ("p_escalated_item_ref", "text"),
)


def _signature(function: str, args: Sequence[tuple[str, str]]) -> str:
    return f"{function}({', '.join(kind for _, kind in args)})"


def _call(function: str, args: Sequence[tuple[str, str]]) -> str:
    """The statement: named arguments, each cast to its parameter's type."""
    named = ", ".join(f"{name} => ?::{kind}" for name, kind in args)
    return f"SELECT c.won, c.task_record, (c.execution).* FROM {function}({named}) AS c"


TASK_CALL = _call(TASK_FUNCTION, TASK_ARGS)
ESCALATION_CALL = _call(ESCALATION_FUNCTION, ESCALATION_ARGS)
_SIGNATURES = (
    _signature(TASK_FUNCTION, TASK_ARGS),
    _signature(ESCALATION_FUNCTION, ESCALATION_ARGS),
)

INSTALLED = "SELECT " + ", ".join(
    f"obj_description(to_regprocedure(quote_ident(current_schema()) || '.{s}'), 'pg_proc') AS f{n}"
    for n, s in enumerate(_SIGNATURES)
)
"""Each function's comment in the store's schema (NULL where the function is missing)."""

INSTALL = (
    FUNCTIONS_SQL
    + "\n"
    + "".join(f"COMMENT ON FUNCTION {s} IS '{FUNCTIONS_DIGEST}';\n" for s in _SIGNATURES)
)
"""The script that (re)creates the functions in the store's schema and marks them."""

_DATETIME = TypeAdapter(datetime)


def install_functions(tx: Tx, run_script: Callable[[str], object]) -> None:
    """Create or replace the claim functions in the current schema, unless they are these
    already (replacing them would make every session recompile them). Runs in the
    migration transaction, under its lock."""
    row = tx.execute(INSTALLED).fetchone()
    if row is None or any(row[f"f{n}"] != FUNCTIONS_DIGEST for n in range(len(_SIGNATURES))):
        run_script(INSTALL)


class OneStatementClaims(SqlStore):
    """``claim`` as one statement where it can be; a backend supplies ``_write_one``."""

    def _write_one(
        self,
        sql: str,
        params: Sequence[Any],
        result: Callable[[Row | None], T],
        verify: Callable[[Tx], Verified[T]] | None,
    ) -> T:
        """Run one statement as its own transaction; ``result`` makes its first row (or
        None) the result. When the outcome is unknown, ``verify`` reads it back first, as in
        ``_write``. Raises ``Declined`` when the statement declines (SQLSTATE DECLINED) or
        the server cannot take or read its data: it rolled back."""
        raise NotImplementedError

    def claim(
        self,
        request: ClaimRequest,
        draft: TaskDraft | EscalationDraft,
        now: datetime,
        holder_alive: Callable[[str], bool],
    ) -> ClaimResult:
        new_task: Task | None = None
        if isinstance(draft, TaskDraft):
            new_task, record = self._new_task(draft, now)
            sql, params = TASK_CALL, _task_params(request, draft, now, new_task, record)
        else:
            sql, params = ESCALATION_CALL, _escalation_params(request, draft, now)
        occurrence = draft.occurrence_key if isinstance(draft, TaskDraft) else ""

        def read(row: Row | None) -> ClaimResult | ExecutionRecord | None:
            return self._read_claim(row, request, now, new_task, occurrence)

        def verify(conn: Tx) -> Verified[ClaimResult | ExecutionRecord | None]:
            return self._claim_committed(conn, request, now)

        # The statement is the claim's whole transaction, its task write included: a worker
        # that dies here commits nothing, as one that dies after the general path's task
        # write (before its COMMIT) does.
        crashpoints.hit("after_task_write")
        try:
            found = self._write_one(sql, params, read, verify)
        except Declined:
            found = None
        if isinstance(found, ClaimResult):
            return found
        if found is not None:
            # Lost to a live claim or a finished one: decided on the record the insert lost
            # to, as claim_occurrence decides on one it read. DONE is final, and a live
            # claim is taken over only once its holder is dead or its lease ran out.
            outcome = contest(found, now, holder_alive)
            if outcome is not None:
                return ClaimResult(outcome=outcome, execution=found)
        # A takeover, or what the statement left to the general path.
        return super().claim(request, draft, now, holder_alive)

    def _read_claim(
        self,
        row: Row | None,
        request: ClaimRequest,
        now: datetime,
        new_task: Task | None,
        occurrence: str,
    ) -> ClaimResult | ExecutionRecord | None:
        """The won claim; or the record the insert lost to; or None: the general path
        decides (no record, or this very claim committed by an earlier attempt)."""
        if row is None or row["key"] is None:
            return None
        if not row["won"]:
            return None if self._is_this_claim(row, request, now) else self._execution(row)
        task, created = new_task, new_task is not None
        if row["task_record"] is not None:
            task = Task.model_validate_json(row["task_record"])
            created = task.created_by == occurrence
        return ClaimResult(
            outcome=ClaimOutcome.CLAIMED,
            execution=self._execution(row),
            task=task,
            task_created=created,
        )


def _execution_params(request: ClaimRequest, now: datetime) -> tuple[Any, ...]:
    """The execution record's columns, as both functions take them first."""
    return (
        request.key,
        request.service,
        request.holder,
        ts(now + timedelta(seconds=request.lease_seconds)),
        request.run_id,
        request.item_ref,
        ts(now),
    )


def _task_params(
    request: ClaimRequest, draft: TaskDraft, now: datetime, new_task: Task, record: str
) -> tuple[Any, ...]:
    """The task function's arguments: the execution, the draft, the new task and its
    record, and the message and updated_at serialized as the record holds them."""
    return (
        *_execution_params(request, now),
        draft.work_key,
        draft.task_id,
        draft.workspace_id,
        draft.provider,
        draft.mailbox_id,
        list(draft.link_message_ids),
        new_task.state.value,
        int(new_task.state in TERMINAL_STATES),
        ts(new_task.received_at),
        record,
        draft.message.model_dump_json(),
        draft.message.provider_message_id,
        draft.message.internet_message_id or "",
        ts(draft.message.received_at),
        _DATETIME.dump_json(now).decode(),
    )


def _escalation_params(
    request: ClaimRequest, draft: EscalationDraft, now: datetime
) -> tuple[Any, ...]:
    """The escalation function's arguments: the execution, then the escalation."""
    return (
        *_execution_params(request, now),
        draft.scope,
        draft.queue,
        draft.assignee,
        draft.reason,
        draft.provider,
        draft.mailbox_id,
        draft.item_ref,
    )
