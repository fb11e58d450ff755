"""Versioned schema migrations, applied once, in order, inside one write transaction.

Times are stored as UTC epoch seconds (REAL) so ordering and lease comparisons are numeric.
A step is one statement both backends run (PostgreSQL's through ``ddl``), or a
``PerBackend`` pair where the two must differ (SQLite cannot alter a constraint: it
rebuilds the table instead).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class PerBackend:
    """A migration step written once per backend."""

    sqlite: tuple[str, ...]
    postgresql: tuple[str, ...]


Step = str | PerBackend


# -- version 6: the send ledger records each attempt; scanned items, cursors, thread aliases

_SEND_STATES_V6 = "state IN ('intent', 'attempting', 'uncertain', 'with_person', 'sent')"
"""'intent' is PREPARED and 'sent' CONFIRMED: the values the ledger stored before."""

_SEND_COLUMNS_V5 = (
    "key, workspace_id, kind, task_id, internet_message_id, recipients, holder, state,"
    " detail, created_at, sent_at, provider_message_id, cc"
)

_SEND_COLUMNS_ADDED_V6 = (
    # The marker the last attempt's copy carries (or the one planned, before any attempt).
    "marker_kind TEXT",
    "marker_value TEXT",
    # The last attempt: its channel, when it was handed over, how many there were, and
    # whether (and how late) that channel's sent copy can be searched.
    "channel TEXT NOT NULL DEFAULT ''",
    "attempts INTEGER NOT NULL DEFAULT 0",
    "attempted_at REAL",
    # When the last attempt's outcome was found lost: a provider may have accepted the
    # message at any moment until then, so its copy's latency runs from here.
    "uncertain_at REAL",
    "keeps_sent_copy INTEGER NOT NULL DEFAULT 1",
    "sent_copy_latency REAL NOT NULL DEFAULT 0",
    # Recipients the channel refused (a JSON array of [address, reason]; NULL: none).
    "refused TEXT",
    # A person settled the last attempt as not sent: one more attempt may go.
    "resend_allowed INTEGER NOT NULL DEFAULT 0",
)

_SENDS_REBUILT_ON_SQLITE = (
    f"""CREATE TABLE sends_v6 (
                key TEXT PRIMARY KEY,
                workspace_id TEXT NOT NULL,
                kind TEXT NOT NULL,
                task_id TEXT,
                internet_message_id TEXT NOT NULL,
                recipients TEXT NOT NULL,
                holder TEXT NOT NULL,
                state TEXT NOT NULL CHECK ({_SEND_STATES_V6}),
                detail TEXT NOT NULL,
                created_at REAL NOT NULL,
                sent_at REAL,
                provider_message_id TEXT,
                cc TEXT,
                {", ".join(_SEND_COLUMNS_ADDED_V6)}
            )""",
    f"INSERT INTO sends_v6 ({_SEND_COLUMNS_V5}) SELECT {_SEND_COLUMNS_V5} FROM sends",
    # send_recipients references sends: it is rebuilt too, so that no row ever references
    # a dropped table (foreign keys stay on inside the migration's transaction).
    """CREATE TABLE send_recipients_v6 (
                key TEXT NOT NULL REFERENCES sends_v6 (key),
                workspace_id TEXT NOT NULL,
                address TEXT NOT NULL,
                created_at REAL NOT NULL,
                PRIMARY KEY (key, address)
            )""",
    "INSERT INTO send_recipients_v6 (key, workspace_id, address, created_at)"
    " SELECT key, workspace_id, address, created_at FROM send_recipients",
    "DROP TABLE send_recipients",
    "DROP TABLE sends",
    # Renaming rewrites send_recipients_v6's reference to the new name.
    "ALTER TABLE sends_v6 RENAME TO sends",
    "ALTER TABLE send_recipients_v6 RENAME TO send_recipients",
    "CREATE INDEX send_recipients_cap ON send_recipients (workspace_id, address, created_at)",
)

_SENDS_ALTERED_ON_POSTGRESQL = (
    "ALTER TABLE sends DROP CONSTRAINT sends_state_check",
    f"ALTER TABLE sends ADD CONSTRAINT sends_state_check CHECK ({_SEND_STATES_V6})",
    *(f"ALTER TABLE sends ADD COLUMN {column}" for column in _SEND_COLUMNS_ADDED_V6),
)

MIGRATIONS: tuple[tuple[int, tuple[Step, ...]], ...] = (
    (
        1,
        (
            """CREATE TABLE workspaces (
                workspace_id TEXT PRIMARY KEY,
                label TEXT NOT NULL,
                context_path TEXT NOT NULL,
                context_sha256 TEXT NOT NULL,
                registered_at REAL NOT NULL,
                updated_at REAL NOT NULL
            )""",
            """CREATE TABLE mailbox_bindings (
                provider TEXT NOT NULL,
                mailbox_id TEXT NOT NULL,
                workspace_id TEXT NOT NULL REFERENCES workspaces (workspace_id),
                shared INTEGER NOT NULL,
                PRIMARY KEY (provider, mailbox_id, workspace_id)
            )""",
            """CREATE TABLE executions (
                key TEXT PRIMARY KEY,
                service TEXT NOT NULL,
                holder TEXT NOT NULL,
                state TEXT NOT NULL CHECK (state IN ('CLAIMED', 'DONE', 'RETRY_PENDING')),
                generation INTEGER NOT NULL,
                lease_expires_at REAL NOT NULL,
                retry_at REAL,
                outcome TEXT,
                result TEXT,
                run_id TEXT,
                item_ref TEXT,
                task_id TEXT,
                claimed_at REAL NOT NULL,
                reported_at REAL
            ) WITHOUT ROWID""",
            """CREATE TABLE tasks (
                task_id TEXT PRIMARY KEY,
                workspace_id TEXT NOT NULL,
                work_key TEXT NOT NULL,
                state TEXT NOT NULL,
                terminal INTEGER NOT NULL,
                received_at REAL NOT NULL,
                record TEXT NOT NULL
            )""",
            "CREATE INDEX tasks_queue ON tasks (workspace_id, terminal, received_at)",
            """CREATE TABLE task_threads (
                work_key TEXT PRIMARY KEY,
                task_id TEXT NOT NULL REFERENCES tasks (task_id)
            ) WITHOUT ROWID""",
            # Keyed for exact secondary linkage (In-Reply-To/References -> the task).
            """CREATE TABLE task_messages (
                workspace_id TEXT NOT NULL,
                provider TEXT NOT NULL,
                mailbox_id TEXT NOT NULL,
                internet_message_id TEXT NOT NULL,
                provider_message_id TEXT NOT NULL,
                task_id TEXT NOT NULL REFERENCES tasks (task_id),
                received_at REAL NOT NULL,
                PRIMARY KEY (workspace_id, provider, mailbox_id, internet_message_id,
                             provider_message_id)
            ) WITHOUT ROWID""",
            """CREATE TABLE task_events (
                task_id TEXT NOT NULL REFERENCES tasks (task_id),
                at REAL NOT NULL,
                state TEXT NOT NULL,
                evidence TEXT NOT NULL
            )""",
            """CREATE TABLE runs (
                run_id TEXT PRIMARY KEY,
                scope TEXT NOT NULL,
                holder TEXT NOT NULL,
                started_at REAL NOT NULL,
                reconciled_at REAL,
                clean INTEGER,
                summary TEXT
            )""",
            "CREATE INDEX runs_open ON runs (reconciled_at)",
            """CREATE TABLE run_items (
                run_id TEXT NOT NULL REFERENCES runs (run_id),
                item_ref TEXT NOT NULL,
                occurrence_key TEXT,
                disposition TEXT,
                detail TEXT,
                scanned_at REAL NOT NULL,
                decided_at REAL,
                PRIMARY KEY (run_id, item_ref)
            ) WITHOUT ROWID""",
            """CREATE TABLE escalations (
                occurrence_key TEXT PRIMARY KEY,
                scope TEXT NOT NULL,
                queue TEXT NOT NULL,
                assignee TEXT NOT NULL,
                reason TEXT NOT NULL,
                provider TEXT NOT NULL,
                mailbox_id TEXT NOT NULL,
                item_ref TEXT NOT NULL,
                created_at REAL NOT NULL
            ) WITHOUT ROWID""",
            """CREATE TABLE health (
                key TEXT PRIMARY KEY,
                detail TEXT NOT NULL,
                count INTEGER NOT NULL,
                recorded_at REAL NOT NULL
            )""",
        ),
    ),
    (
        2,
        (
            # Runs on other machines: a run whose lease ran out may be reconciled by anyone.
            "ALTER TABLE runs ADD COLUMN lease_expires_at REAL",
            # Workers on other machines read the registered context from the store itself.
            "ALTER TABLE workspaces ADD COLUMN context_text TEXT",
        ),
    ),
    (
        3,
        (
            # Every outbound message, ledgered before the provider is asked: an intent whose
            # outcome is unknown is resolved by reading the provider's sent copy, never by
            # sending blind, so nothing automated goes out twice.
            """CREATE TABLE sends (
                key TEXT PRIMARY KEY,
                workspace_id TEXT NOT NULL,
                kind TEXT NOT NULL,
                task_id TEXT,
                internet_message_id TEXT NOT NULL,
                recipients TEXT NOT NULL,
                holder TEXT NOT NULL,
                state TEXT NOT NULL CHECK (state IN ('intent', 'sent')),
                detail TEXT NOT NULL,
                created_at REAL NOT NULL,
                sent_at REAL,
                provider_message_id TEXT
            )""",
            # One row per recipient of an automated send: the per-recipient cap counts these.
            """CREATE TABLE send_recipients (
                key TEXT NOT NULL REFERENCES sends (key),
                workspace_id TEXT NOT NULL,
                address TEXT NOT NULL,
                created_at REAL NOT NULL,
                PRIMARY KEY (key, address)
            )""",
            "CREATE INDEX send_recipients_cap"
            " ON send_recipients (workspace_id, address, created_at)",
        ),
    ),
    (
        4,
        (
            # Rendered drafts, by id: an approval binds to a draft's exact digest, and a send
            # or an approval request names the draft the server rendered, never content the
            # caller supplies at send time.
            """CREATE TABLE drafts (
                draft_id TEXT PRIMARY KEY,
                task_id TEXT NOT NULL REFERENCES tasks (task_id),
                workspace_id TEXT NOT NULL,
                digest TEXT NOT NULL,
                rendered TEXT NOT NULL,
                created_at REAL NOT NULL
            )""",
            # What an agent proposes to change in a Workspace Context: queued for an operator,
            # never applied by the proposal itself.
            """CREATE TABLE learning_proposals (
                proposal_id TEXT PRIMARY KEY,
                workspace_id TEXT NOT NULL,
                kind TEXT NOT NULL,
                summary TEXT NOT NULL,
                detail TEXT NOT NULL,
                evidence TEXT NOT NULL,
                state TEXT NOT NULL CHECK (state IN ('queued', 'accepted', 'rejected')),
                submitted_at REAL NOT NULL
            )""",
            "CREATE INDEX learning_proposals_queue"
            " ON learning_proposals (workspace_id, state, submitted_at)",
        ),
    ),
    (
        5,
        (
            # Which of a send's recipients were Cc (the rest were To, in order): read-back
            # checks the stored copy's To and Cc against exactly what was sent.
            "ALTER TABLE sends ADD COLUMN cc TEXT",
        ),
    ),
    (
        6,
        (
            # A send is PREPARED, ATTEMPTING (handed to a channel now), UNCERTAIN (handed over,
            # the answer lost), WITH_PERSON or CONFIRMED; old rows keep their values and keys.
            PerBackend(sqlite=_SENDS_REBUILT_ON_SQLITE, postgresql=_SENDS_ALTERED_ON_POSTGRESQL),
            # Every change of a send: who, when, what, on what evidence (oldest first by seq).
            """CREATE TABLE send_events (
                key TEXT NOT NULL REFERENCES sends (key),
                seq INTEGER NOT NULL,
                at REAL NOT NULL,
                state TEXT NOT NULL,
                actor TEXT NOT NULL,
                detail TEXT NOT NULL,
                PRIMARY KEY (key, seq)
            ) WITHOUT ROWID""",
            # What the ledger knew of the sends it held before events were kept.
            "INSERT INTO send_events (key, seq, at, state, actor, detail)"
            " SELECT key, 1, created_at, 'intent', holder,"
            " 'ledgered (recorded before send events were kept)' FROM sends",
            "INSERT INTO send_events (key, seq, at, state, actor, detail)"
            " SELECT key, 2, coalesce(sent_at, created_at), 'sent', holder, detail"
            " FROM sends WHERE state = 'sent'",
            # An intent of the earlier ledger may have been handed to the provider before its
            # worker stopped: its outcome is unknown, so it is settled from the sent copy
            # (found by its Message-ID) before anything is sent again.
            "UPDATE sends SET state = 'uncertain', attempts = 1, attempted_at = created_at,"
            " uncertain_at = created_at,"
            " marker_kind = 'message_id', marker_value = internet_message_id"
            " WHERE state = 'intent'",
            "INSERT INTO send_events (key, seq, at, state, actor, detail)"
            " SELECT key, 2, created_at, 'uncertain', holder,"
            " 'recorded before attempts were kept: settled from the sent copy first'"
            " FROM sends WHERE state = 'uncertain'",
            # Threads of mail systems whose channels show no common thread id: every
            # Message-ID of a thread reaches the thread's alias, per mailbox.
            # ``identity``: the header digest of the message that carries the id (NULL while
            # the id is only referenced); ``reused``: another message carried it too, so it is
            # nobody's parent.
            """CREATE TABLE thread_aliases (
                provider TEXT NOT NULL,
                mailbox_id TEXT NOT NULL,
                message_id TEXT NOT NULL,
                alias TEXT NOT NULL,
                identity TEXT,
                reused INTEGER NOT NULL DEFAULT 0,
                PRIMARY KEY (provider, mailbox_id, message_id)
            ) WITHOUT ROWID""",
            # Where each scope's reading of a mailbox through a channel got to; advanced in
            # the transaction that records the items it covered.
            """CREATE TABLE mailbox_cursors (
                scope TEXT NOT NULL,
                provider TEXT NOT NULL,
                mailbox_id TEXT NOT NULL,
                channel TEXT NOT NULL,
                cursor TEXT NOT NULL,
                updated_at REAL NOT NULL,
                PRIMARY KEY (scope, provider, mailbox_id, channel)
            ) WITHOUT ROWID""",
            # A scanned item as it was read (the ScannedMessage as JSON), the scope that owns
            # it and its mailbox: what any worker on any machine needs to claim it.
            # The unfinished occurrences a run takes up again (retries, lapsed claims).
            "CREATE INDEX executions_unfinished ON executions (key) WHERE state <> 'DONE'",
            "ALTER TABLE run_items ADD COLUMN scanned TEXT",
            "ALTER TABLE run_items ADD COLUMN owner TEXT NOT NULL DEFAULT ''",
            "ALTER TABLE run_items ADD COLUMN mailbox_id TEXT NOT NULL DEFAULT ''",
            # Why the item was planned for escalation ('' when it resolved): kept apart from
            # the detail its disposition writes, so a worker taking it up plans it the same.
            "ALTER TABLE run_items ADD COLUMN reason TEXT NOT NULL DEFAULT ''",
        ),
    ),
    (
        7,
        (
            # The schedule's minute, chosen once when the workspace is registered, with its
            # expression and derivation. Two workspaces hold one minute only when every
            # minute is held (``schedule_shared``): the index keeps the others apart.
            "ALTER TABLE workspaces ADD COLUMN schedule_minute INTEGER",
            "ALTER TABLE workspaces ADD COLUMN schedule_expression TEXT",
            "ALTER TABLE workspaces ADD COLUMN schedule_derivation TEXT",
            "ALTER TABLE workspaces ADD COLUMN schedule_shared INTEGER NOT NULL DEFAULT 0",
            "CREATE UNIQUE INDEX workspaces_schedule_minute ON workspaces (schedule_minute)"
            " WHERE schedule_shared = 0 AND schedule_minute IS NOT NULL",
            # Named leases: one workspace's dispatcher, one shared mailbox's scan.
            """CREATE TABLE leases (
                name TEXT PRIMARY KEY,
                holder TEXT NOT NULL,
                acquired_at REAL NOT NULL,
                renewed_at REAL NOT NULL,
                expires_at REAL NOT NULL
            )""",
            # Every dispatcher process as it last reported itself: what verify reads.
            """CREATE TABLE dispatchers (
                holder TEXT PRIMARY KEY,
                workspace_id TEXT NOT NULL,
                role TEXT NOT NULL,
                executable TEXT NOT NULL,
                install TEXT NOT NULL,
                version TEXT NOT NULL,
                started_at REAL NOT NULL,
                seen_at REAL NOT NULL,
                detail TEXT NOT NULL
            )""",
            "CREATE INDEX dispatchers_workspace ON dispatchers (workspace_id, seen_at)",
            # Each scheduled cycle once: started by one dispatcher, finished or taken over.
            """CREATE TABLE dispatch_cycles (
                workspace_id TEXT NOT NULL,
                scheduled_for REAL NOT NULL,
                holder TEXT NOT NULL,
                started_at REAL NOT NULL,
                finished_at REAL,
                run_id TEXT,
                outcome TEXT,
                PRIMARY KEY (workspace_id, scheduled_for)
            )""",
        ),
    ),
    (
        8,
        (
            # An operator's decision on a learning proposal: who, when, and why (a rejection's
            # reason, or the digest of the context an acceptance wrote).
            "ALTER TABLE learning_proposals ADD COLUMN decided_by TEXT",
            "ALTER TABLE learning_proposals ADD COLUMN decided_at REAL",
            "ALTER TABLE learning_proposals ADD COLUMN decision_note TEXT",
        ),
    ),
)
