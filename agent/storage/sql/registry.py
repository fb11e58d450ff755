"""Registered workspaces and the mailboxes they bind (the Registry role)."""

from __future__ import annotations

from collections.abc import Sequence

from agent.domain.errors import MinuteTaken, UnknownWorkspace, WorkspaceExists
from agent.domain.records import Binding, WorkspaceRow
from agent.storage.sql.core import Row, SqlBase, Tx, Verified, record_of, ts


class RegistryRows(SqlBase):
    def register_workspace(self, row: WorkspaceRow, bindings: Sequence[Binding]) -> None:
        def body(conn: Tx) -> None:
            inserted = conn.execute(
                "INSERT INTO workspaces (workspace_id, label, context_path, context_sha256,"
                " registered_at, updated_at, context_text, schedule_minute,"
                " schedule_expression, schedule_derivation, schedule_shared)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
                " ON CONFLICT DO NOTHING RETURNING workspace_id",
                (
                    row.workspace_id,
                    row.label,
                    row.context_path,
                    row.context_sha256,
                    ts(row.registered_at),
                    ts(row.updated_at),
                    row.context_text,
                    row.schedule_minute,
                    row.schedule_expression,
                    row.schedule_derivation,
                    int(row.schedule_shared),
                ),
            ).fetchone()
            if inserted is None:
                exists = conn.execute(
                    "SELECT 1 FROM workspaces WHERE workspace_id = ?", (row.workspace_id,)
                ).fetchone()
                if exists is not None:
                    raise WorkspaceExists(row.workspace_id)
                raise MinuteTaken(f"minute {row.schedule_minute} was taken meanwhile")
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
                raise UnknownWorkspace(row.workspace_id)
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
        return record_of(WorkspaceRow, row, times=("registered_at", "updated_at"))

    def set_schedule(self, row: WorkspaceRow) -> None:
        """Record the row's schedule fields (a workspace registered before schedules were
        kept, or one whose registry copy was edited by hand); a minute another workspace
        holds alone is refused by the registry's unique index."""

        def body(conn: Tx) -> None:
            updated = conn.execute(
                "UPDATE workspaces SET schedule_minute = ?, schedule_expression = ?,"
                " schedule_derivation = ?, schedule_shared = ? WHERE workspace_id = ?"
                " RETURNING workspace_id",
                (
                    row.schedule_minute,
                    row.schedule_expression,
                    row.schedule_derivation,
                    int(row.schedule_shared),
                    row.workspace_id,
                ),
            ).fetchone()
            if updated is None:
                raise UnknownWorkspace(row.workspace_id)

        self._write(body, None)  # writing the same values again changes nothing

    def held_minutes(self) -> dict[int, str]:
        """Each schedule minute a registered workspace holds alone, and which one."""
        rows = self._read(
            "SELECT schedule_minute, workspace_id FROM workspaces"
            " WHERE schedule_minute IS NOT NULL AND schedule_shared = 0"
        )
        return {int(r["schedule_minute"]): str(r["workspace_id"]) for r in rows}

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
