"""Versioned schema migrations, applied once, in order, inside one write transaction.

Times are stored as UTC epoch seconds (REAL) so ordering and lease comparisons are numeric.
"""

from __future__ import annotations

MIGRATIONS: tuple[tuple[int, tuple[str, ...]], ...] = (
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
)
