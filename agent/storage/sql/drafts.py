"""Rendered drafts, kept by id (the Drafts role)."""

from __future__ import annotations

from agent.domain.records import DraftRecord
from agent.storage.sql.core import Row, SqlBase, Tx, record_of, ts


class DraftRows(SqlBase):
    @staticmethod
    def _draft(row: Row) -> DraftRecord:
        return record_of(DraftRecord, row, times=("created_at",))

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
