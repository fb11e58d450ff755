"""A database written by the release before the send ledger's attempts opens with this code on both
backends: every row keeps its key and its values, old records read as they were (a send in
'intent' is UNCERTAIN - it may have been handed over, so it is settled from the sent copy -
and one in 'sent' CONFIRMED, new fields defaulted), and new writes work on them.

The database is built by applying only the migrations up to the previous version, then
inserting rows exactly as that release's statements wrote them (the statements below are
copied from it, and the task record is the JSON it wrote).
"""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg.rows import DictRow, dict_row

from agent.domain.dispositions import Disposition
from agent.domain.envelope import legacy_occurrence_key, work_key
from agent.domain.errors import SendStateConflict
from agent.domain.execution import ClaimOutcome, ExecutionState
from agent.domain.mail import Marker, MarkerKind, ScannedMessage
from agent.domain.records import ClaimRequest, SendAttempt, SendState
from agent.domain.run import LedgerEntry, MailboxCursor, Reconciliation, ThreadLink
from agent.domain.states import TaskState
from agent.domain.task import Task
from agent.ports import EmbeddedStore
from agent.storage.postgres import PostgresStore
from agent.storage.postgres.store import _Tx as PgTx  # pyright: ignore[reportPrivateUsage]
from agent.storage.postgres.store import ddl
from agent.storage.schema import MIGRATIONS
from agent.storage.sql.core import Dialect, Tx, apply_migrations, ts
from agent.storage.sqlite import SqliteStore, begin_immediate
from agent.storage.sqlite import _Tx as SqliteTx  # pyright: ignore[reportPrivateUsage]
from agent.storage.sqlite import connect as sqlite_connect
from agent.testing import FrozenClock
from agent.testing.storage.base import ALIVE, DANA, DEAD, MAILBOX, WS, Harness, alive, draft_for
from agent.testing.storage.base import env as envelope
from agent.testing.storage.base import intent as send_intent
from tests.conftest import pg_url_at

PREVIOUS = 5
"""The schema version of the release that kept sends as 'intent' or 'sent' (later
migrations add tables and columns these rows must survive too)."""

E1, E2 = envelope(1, 1), envelope(2, 1)
WORK_KEY = work_key(WS, E1)
KEY_1 = legacy_occurrence_key(WS, E1)  # the keys that release gave its occurrences
KEY_2 = legacy_occurrence_key(WS, E2)
TASK_ID = "task-20261101-old1"


def at(day: int, hour: int = 0, minute: int = 0) -> float:
    return ts(datetime(2026, 11, day, hour, minute, tzinfo=UTC))


# The task record as that release wrote it (Task.model_dump_json of its model).
TASK_RECORD = (
    '{"task_id":"task-20261101-old1","workspace_id":"ws-contract","work_key":"11:ws-contract|6:'
    'memory|21:support@fabrikam.test|8:thread-1","origin":"mail","provider":"memory","mailbox_id"'
    ':"support@fabrikam.test","provider_thread_id":"thread-1","title":"Request 1","original_subje'
    'ct":"Request 1","occurrence_scope":"message","received_at":"2026-11-01T00:00:01Z","first_see'
    'n_at":"2026-11-01T00:05:00Z","updated_at":"2026-11-01T00:06:00Z","state":"TASK_RESOLVED","co'
    'mmunication_state":"none","readiness_tier":"ready","cycle_key":null,"sender_identity":"clien'
    't@example.test","sender_side":null,"client_send_policy":"draft_only","project_management_pro'
    'vider":"embedded","project_id":null,"intake_location_id":null,"open_gates":[],"approval_evid'
    'ence":[],"recipients":[],"sent_message_id":null,"readback_evidence":null,"execution_key":"11'
    ":ws-contract|6:memory|21:support@fabrikam.test|7:message|17:<m2@example.test>|32:ff7297a6116"
    '94430dbf8587dbb78f111","execution_result":null,"execution_outcome":"QUEUED","remaining_work"'
    ':"","next_action":{"description":"draft a reply","owner":"noa.bar@fabrikam.test"},"provision'
    'al_basis":{},"messages":[{"provider_message_id":"pm-1","internet_message_id":"<m1@example.tes'
    't>","direction":"inbound","received_at":"2026-11-01T00:00:01Z","sender":"client@example.test'
    '","body_ref":"pm-1","in_reply_to":null,"references":[]},{"provider_message_id":"pm-2","inter'
    'net_message_id":"<m2@example.test>","direction":"inbound","received_at":"2026-11-01T00:00:02'
    'Z","sender":"client@example.test","body_ref":"pm-2","in_reply_to":null,"references":[]}],"cr'
    'eated_by":"11:ws-contract|6:memory|21:support@fabrikam.test|7:message|17:<m1@example.test>|3'
    '2:a2ab41f48ad3c81f65382d99962b30a5","blocked_by":[],"package_version":"0.1.0","drift_status"'
    ':"in_sync","state_since":"2026-11-01T00:06:00Z","message_class":null,"approval_requests":[],'
    '"approval_decisions":[],"requester":null,"requester_loop_closed":false,"sender_name":"","att'
    'achment_names":[],"content_flags":[]}'
)

SUMMARY = Reconciliation(
    run_id="run-old-1",
    scanned=2,
    terminal=0,
    non_terminal=2,
    claim_race=0,
    reconciliation_failed=0,
    by_disposition={"QUEUED": 2},
    clean=True,
    reconciled_at=datetime(2026, 11, 1, 0, 7, tzinfo=UTC),
)

OLD_ROWS: tuple[tuple[str, tuple[Any, ...]], ...] = (
    (
        "INSERT INTO workspaces (workspace_id, label, context_path, context_sha256,"
        " registered_at, updated_at, context_text) VALUES (?, ?, ?, ?, ?, ?, ?)"
        " ON CONFLICT (workspace_id) DO NOTHING RETURNING workspace_id",
        (WS, "Fabrikam support", "/srv/ws.yaml", "ab" * 32, at(1), at(1), "workspace: x\n"),
    ),
    (
        "INSERT INTO mailbox_bindings (provider, mailbox_id, workspace_id, shared)"
        " VALUES (?, ?, ?, ?)",
        ("memory", MAILBOX, WS, 0),
    ),
    (
        "INSERT INTO runs (run_id, scope, holder, started_at, lease_expires_at)"
        " VALUES (?, ?, ?, ?, ?)",
        ("run-old-1", WS, ALIVE, at(1), at(1, 0, 15)),
    ),
    (
        "INSERT INTO runs (run_id, scope, holder, started_at, lease_expires_at)"
        " VALUES (?, ?, ?, ?, ?)",
        ("run-old-2", WS, DEAD, at(2), at(2, 0, 15)),
    ),
    (
        "INSERT INTO run_items (run_id, item_ref, occurrence_key, detail, scanned_at)"
        " VALUES (?, ?, ?, ?, ?), (?, ?, ?, ?, ?)",
        ("run-old-1", "pm-1", KEY_1, "", at(1), "run-old-1", "pm-2", KEY_2, "", at(1)),
    ),
    (
        "INSERT INTO run_items (run_id, item_ref, occurrence_key, detail, scanned_at)"
        " VALUES (?, ?, ?, ?, ?)",
        ("run-old-2", "pm-2", KEY_2, "", at(2)),
    ),
    (
        "INSERT INTO tasks (task_id, workspace_id, work_key, state, terminal, received_at,"
        " record) VALUES (?, ?, ?, ?, ?, ?, ?)",
        (TASK_ID, WS, WORK_KEY, "TASK_RESOLVED", 0, ts(E1.received_at), TASK_RECORD),
    ),
    ("INSERT INTO task_threads (work_key, task_id) VALUES (?, ?)", (WORK_KEY, TASK_ID)),
    *(
        (
            "INSERT INTO task_messages (workspace_id, provider, mailbox_id, internet_message_id,"
            " provider_message_id, task_id, received_at) VALUES (?, ?, ?, ?, ?, ?, ?)"
            " ON CONFLICT DO NOTHING",
            (
                WS,
                "memory",
                MAILBOX,
                e.internet_message_id,
                e.provider_message_id,
                TASK_ID,
                ts(e.received_at),
            ),
        )
        for e in (E1, E2)
    ),
    (
        "INSERT INTO task_events (task_id, at, state, evidence) VALUES (?, ?, ?, ?)",
        (TASK_ID, at(1, 0, 5), "DISCOVERED", "claimed"),
    ),
    (
        "INSERT INTO task_events (task_id, at, state, evidence) VALUES (?, ?, ?, ?)",
        (TASK_ID, at(1, 0, 6), "TASK_RESOLVED", "QUEUED"),
    ),
    (  # a claim its holder reported
        "INSERT INTO executions (key, service, holder, state, generation, lease_expires_at,"
        " outcome, run_id, item_ref, task_id, claimed_at, reported_at)"
        " VALUES (?, ?, ?, 'DONE', 1, ?, 'QUEUED', ?, ?, ?, ?, ?)",
        (
            KEY_1,
            "email-intake",
            ALIVE,
            at(1, 0, 10),
            "run-old-1",
            "pm-1",
            TASK_ID,
            at(1, 0, 5),
            at(1, 0, 6),
        ),
    ),
    (  # a claim whose holder died: a new holder takes it over
        "INSERT INTO executions (key, service, holder, state, generation, lease_expires_at,"
        " run_id, item_ref, task_id, claimed_at) VALUES (?, ?, ?, 'CLAIMED', 1, ?, ?, ?, ?, ?)",
        (KEY_2, "email-intake", DEAD, at(2, 0, 5), "run-old-2", "pm-2", TASK_ID, at(2)),
    ),
    (
        "UPDATE run_items SET disposition = ?, detail = '', decided_at = ?"
        " WHERE run_id = ? AND disposition IS NULL",
        (Disposition.QUEUED.value, at(1, 0, 7), "run-old-1"),
    ),
    (
        "UPDATE runs SET reconciled_at = ?, clean = ?, summary = ? WHERE run_id = ?",
        (at(1, 0, 7), 1, SUMMARY.model_dump_json(), "run-old-1"),
    ),
    (  # an automated send whose worker died before it completed (written before cc existed)
        "INSERT INTO sends (key, workspace_id, kind, task_id, internet_message_id,"
        " recipients, holder, state, detail, created_at)"
        " VALUES (?, ?, ?, ?, ?, ?, ?, 'intent', '', ?)",
        (
            "send-old-intent",
            WS,
            "ack",
            TASK_ID,
            "<old-intent@fabrikam.test>",
            f'["{DANA}"]',
            DEAD,
            at(30, 8),
        ),
    ),
    (
        "INSERT INTO send_recipients (key, workspace_id, address, created_at) VALUES (?, ?, ?, ?)",
        ("send-old-intent", WS, DANA, at(30, 8)),
    ),
    (  # a reply that was sent, with a Cc
        "INSERT INTO sends (key, workspace_id, kind, task_id, internet_message_id,"
        " recipients, holder, state, detail, created_at, cc)"
        " VALUES (?, ?, ?, ?, ?, ?, ?, 'intent', '', ?, ?)",
        (
            "send-old-sent",
            WS,
            "client_reply",
            TASK_ID,
            "<old-sent@fabrikam.test>",
            f'["{DANA}", "noa.bar@fabrikam.test"]',
            ALIVE,
            at(30, 8, 30),
            '["noa.bar@fabrikam.test"]',
        ),
    ),
    (
        "INSERT INTO send_recipients (key, workspace_id, address, created_at) VALUES (?, ?, ?, ?)",
        ("send-old-sent", WS, DANA, at(30, 8, 30)),
    ),
    (
        "UPDATE sends SET state = 'sent', sent_at = ?, provider_message_id = ?,"
        " detail = ? WHERE key = ? RETURNING *",
        (at(30, 8, 31), "provider-old-1", "via memory", "send-old-sent"),
    ),
)

V5_TABLES = (
    "workspaces",
    "mailbox_bindings",
    "executions",
    "tasks",
    "task_threads",
    "task_messages",
    "task_events",
    "runs",
    "run_items",
    "escalations",
    "health",
    "sends",
    "send_recipients",
    "drafts",
    "learning_proposals",
)


class Backend:
    """A backend's raw connection (for building the old database) and its store."""

    def __init__(
        self,
        dialect: Dialect,
        address: str,
        raw: Callable[[str], contextlib.AbstractContextManager[Tx]],
        store: Callable[[str], EmbeddedStore],
        translate: Callable[[str], str] = lambda s: s,
    ) -> None:
        self.dialect: Dialect = dialect
        self.address, self.raw, self.store = address, raw, store
        self.translate = translate

    def build_previous_release(self) -> dict[str, list[dict[str, Any]]]:
        """The database at the previous schema version, holding the old rows; its rows."""
        with self.raw(self.address) as tx:
            apply_migrations(tx, self.address, self.dialect, self.translate, upto=PREVIOUS)
            for statement, params in OLD_ROWS:
                tx.execute(statement, params)
        return self.rows()

    def rows(self) -> dict[str, list[dict[str, Any]]]:
        with self.raw(self.address) as tx:
            return {
                t: [dict(r) for r in tx.execute(f"SELECT * FROM {t}").fetchall()] for t in V5_TABLES
            }

    def version(self) -> int:
        with self.raw(self.address) as tx:
            return int(tx.execute("SELECT max(version) AS v FROM schema_version").fetchone()["v"])


@contextlib.contextmanager
def sqlite_tx(address: str) -> Iterator[Tx]:
    conn = sqlite_connect(Path(address))
    conn.row_factory = sqlite3.Row
    try:
        begin_immediate(conn, Path(address))
        try:
            yield SqliteTx(conn)
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise
    finally:
        conn.close()


@contextlib.contextmanager
def postgres_tx(address: str) -> Iterator[Tx]:
    with psycopg.Connection[DictRow].connect(address, row_factory=dict_row) as conn:  # commits
        yield PgTx(conn)


@pytest.fixture(params=["sqlite", "postgres"])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Backend:
    if request.param == "sqlite":
        return Backend(
            "sqlite", str(tmp_path / "store.db"), sqlite_tx, lambda a: SqliteStore(Path(a))
        )
    return Backend("postgresql", pg_url_at(tmp_path), postgres_tx, PostgresStore, ddl)


@pytest.fixture
def old_rows(backend: Backend) -> dict[str, list[dict[str, Any]]]:
    rows = backend.build_previous_release()
    assert backend.version() == PREVIOUS
    assert {t: len(r) for t, r in rows.items() if r} == {
        "workspaces": 1, "mailbox_bindings": 1, "executions": 2, "tasks": 1, "task_threads": 1,
        "task_messages": 2, "task_events": 2, "runs": 2, "run_items": 3, "sends": 2,
        "send_recipients": 2,
    }  # fmt: skip
    return rows


@pytest.fixture
def store(backend: Backend, old_rows: dict[str, list[dict[str, Any]]]) -> Iterator[EmbeddedStore]:
    del old_rows
    opened = backend.store(backend.address)
    yield opened
    opened.close()


def sorted_rows(rows: list[dict[str, Any]], columns: list[str]) -> list[tuple[Any, ...]]:
    return sorted((tuple(r[c] for c in columns) for r in rows), key=repr)


def test_every_old_row_keeps_its_key_and_values_and_new_columns_are_defaulted(
    backend: Backend, old_rows: dict[str, list[dict[str, Any]]], store: EmbeddedStore
) -> None:
    assert store.schema_version() == MIGRATIONS[-1][0]
    assert store.integrity_check() == "ok"
    now = backend.rows()
    for table, before in old_rows.items():
        columns = [c for c in (before[0] if before else []) if (table, c) != ("sends", "state")]
        assert sorted_rows(now[table], columns) == sorted_rows(before, columns), table
    sends = {r["key"]: r for r in now["sends"]}
    # An old intent may have been handed over before its worker stopped: it is an attempt
    # whose outcome is unknown, to be settled from the sent copy by its Message-ID.
    intent, sent = sends["send-old-intent"], sends["send-old-sent"]
    assert (intent["state"], intent["marker_kind"], intent["marker_value"]) == (
        "uncertain", "message_id", intent["internet_message_id"],
    )  # fmt: skip
    assert (intent["attempts"], intent["attempted_at"]) == (1, intent["created_at"])
    assert (sent["state"], sent["marker_kind"], sent["marker_value"]) == ("sent", None, None)
    assert (sent["attempts"], sent["attempted_at"]) == (0, None)
    for row in sends.values():
        assert row["channel"] == ""
        assert (row["keeps_sent_copy"], row["sent_copy_latency"]) == (1, 0)
        assert (row["refused"], row["resend_allowed"]) == (None, 0)
    assert {(r["owner"], r["mailbox_id"], r["scanned"]) for r in now["run_items"]} == {
        ("", "", None)
    }
    # Reopening applies nothing again.
    backend.store(backend.address).close()
    assert backend.version() == MIGRATIONS[-1][0]


def test_old_workspaces_tasks_executions_and_runs_still_resolve(store: EmbeddedStore) -> None:
    workspace = store.get_workspace(WS)
    assert workspace is not None and workspace.context_text == "workspace: x\n"
    assert [b.workspace_id for b in store.bindings_for_mailbox("memory", MAILBOX)] == [WS]
    task = store.get_task(TASK_ID)
    assert task == Task.model_validate_json(TASK_RECORD)
    assert task is not None and store.task_for_thread(WORK_KEY) == task
    assert [m.provider_message_id for m in task.messages] == ["pm-1", "pm-2"]
    assert [(state, evidence) for _, state, evidence in store.task_events(TASK_ID)] == [
        (TaskState.DISCOVERED, "claimed"), (TaskState.TASK_RESOLVED, "QUEUED"),
    ]  # fmt: skip
    done = store.get_execution(KEY_1)
    assert done is not None and done.state is ExecutionState.DONE and done.task_id == TASK_ID
    held = store.get_execution(KEY_2)
    assert held is not None and held.state is ExecutionState.CLAIMED and held.holder == DEAD
    assert store.run_summary("run-old-1") == SUMMARY
    assert [(e.item_ref, e.occurrence_key, e.disposition) for e in store.ledger("run-old-1")] == [
        ("pm-1", KEY_1, Disposition.QUEUED), ("pm-2", KEY_2, Disposition.QUEUED),
    ]  # fmt: skip
    [old] = store.ledger("run-old-2")
    assert (old.scanned, old.owner, old.mailbox_id, old.disposition) == (None, "", "", None)
    assert [r.run_id for r in store.unreconciled_runs(WS)] == ["run-old-2"]
    holder = store.run_holder("run-old-2")
    assert holder is not None and holder.holder == DEAD
    assert store.run_holder("run-old-1") is None


def test_old_sends_read_as_uncertain_and_confirmed_with_their_history(
    store: EmbeddedStore,
) -> None:
    unsettled = store.get_send("send-old-intent")
    assert unsettled is not None and unsettled.state is SendState.UNCERTAIN
    assert (unsettled.holder, unsettled.recipients, unsettled.cc) == (DEAD, (DANA,), ())
    assert unsettled.created_at == datetime(2026, 11, 30, 8, tzinfo=UTC)
    marker = Marker(kind=MarkerKind.MESSAGE_ID, value="<old-intent@fabrikam.test>")
    assert (unsettled.marker, unsettled.channel, unsettled.attempts) == (marker, "", 1)
    assert unsettled.attempted_at == unsettled.created_at
    assert unsettled.keeps_sent_copy and unsettled.sent_copy_latency == timedelta(0)
    assert unsettled.refused == () and not unsettled.resend_allowed and not unsettled.partial
    confirmed = store.get_send("send-old-sent")
    assert confirmed is not None and confirmed.state is SendState.CONFIRMED
    assert confirmed.provider_message_id == "provider-old-1"
    assert confirmed.sent_at == datetime(2026, 11, 30, 8, 31, tzinfo=UTC)
    assert (confirmed.to, confirmed.cc) == ((DANA,), ("noa.bar@fabrikam.test",))
    assert [s.key for s in store.list_sends(WS)] == ["send-old-intent", "send-old-sent"]
    # The history the old ledger implies: ledgered, and (for the sent one) confirmed.
    assert [(e.state, e.actor) for e in store.send_events("send-old-intent")] == [
        (SendState.PREPARED, DEAD), (SendState.UNCERTAIN, DEAD),
    ]  # fmt: skip
    events = store.send_events("send-old-sent")
    assert [(e.state, e.actor, e.at) for e in events] == [
        (SendState.PREPARED, ALIVE, confirmed.created_at),
        (SendState.CONFIRMED, ALIVE, confirmed.sent_at),
    ]
    assert events[1].detail == "via memory"


def test_new_writes_work_on_the_old_data(store: EmbeddedStore) -> None:
    clock = FrozenClock()  # 2026-11-30 09:00, an hour after the old sends
    h = Harness(store, clock)
    # The old unfinished send: taken over from its dead worker, its copy proven absent (by
    # the service), attempted again, confirmed.
    assert store.take_over_send("send-old-intent", DEAD, ALIVE, clock.now())
    marker = Marker(kind=MarkerKind.MESSAGE_ID, value="<old-intent@fabrikam.test>")
    attempt = SendAttempt(
        channel="api", marker=marker, keeps_sent_copy=True, sent_copy_latency=timedelta(0)
    )
    attempted = store.attempt_send("send-old-intent", ALIVE, attempt, clock.advance(seconds=1))
    assert attempted is not None and attempted.attempts == 2 and attempted.marker == marker
    done = store.complete_send("send-old-intent", "provider-2", "accepted", clock.now())
    assert done.state is SendState.CONFIRMED
    assert [e.state for e in store.send_events("send-old-intent")] == [
        SendState.PREPARED, SendState.UNCERTAIN, SendState.UNCERTAIN, SendState.ATTEMPTING,
        SendState.CONFIRMED,
    ]  # fmt: skip
    with pytest.raises(SendStateConflict):
        store.settle_send("send-old-sent", False, "a person looked", "noa", clock.now())
    # Ledgering an old key again returns it; the old recipients still count against the cap.
    assert not store.begin_send(send_intent("send-old-sent"), clock.now(), cap=2).created
    capped = store.begin_send(send_intent("send-new"), clock.now(), cap=2)
    assert capped.state is SendState.REFUSED and store.get_send("send-new") is None

    # The dead holder's old claim is taken over, and joins the old task.
    run_id = h.run(envelope(3, 1))
    request = ClaimRequest(
        key=KEY_2, service="email-intake", holder=ALIVE, run_id="run-old-2", item_ref="pm-2"
    )
    taken = store.claim(request, draft_for(E2), clock.now(), alive)
    assert taken.outcome is ClaimOutcome.CLAIMED and taken.taken_over
    assert taken.task is not None and taken.task.task_id == TASK_ID
    # A new message in the old thread joins the old task.
    joined = h.claim(run_id, envelope(3, 1))
    assert joined.task is not None and joined.task.task_id == TASK_ID and not joined.task_created
    task = store.get_task(TASK_ID)
    assert task is not None and [m.provider_message_id for m in task.messages] == [
        "pm-1", "pm-2", "pm-3",
    ]  # fmt: skip

    # The old open run takes new items, as read, with a cursor; then it is reconciled.
    scanned = ScannedMessage(item_ref="pm-4", envelope=envelope(4, 2))
    entry = LedgerEntry(run_id="run-old-2", item_ref="pm-4", scanned=scanned, owner=WS,
                        mailbox_id=MAILBOX)  # fmt: skip
    cursor = MailboxCursor(scope=WS, provider="memory", mailbox_id=MAILBOX, channel="local",
                           cursor="c-1")  # fmt: skip
    store.record_scanned([entry], clock.now(), cursor)
    assert store.get_cursor(WS, "memory", MAILBOX, "local") == "c-1"
    assert [e.item_ref for e in store.ledger("run-old-2")] == ["pm-2", "pm-4"]
    assert store.ledger("run-old-2")[1] == entry
    summary = store.reconcile("run-old-2", clock.now())
    assert summary.scanned == 2 and summary.reconciliation_failed == 2
    link = ThreadLink(message_id="<m1@example.test>", identity="i", proposed="t-1", if_reused="r")
    assert store.resolve_thread("memory", MAILBOX, link) == "t-1"
