"""The operator's queue of learning proposals (the Proposals role)."""

from __future__ import annotations

import json
from datetime import datetime

from agent.domain.errors import InvalidRequest
from agent.domain.records import LearningProposal, ProposalState, WorkspaceRow
from agent.storage.sql.core import Row, SqlBase, Tx, Verified, record_of, ts


class ProposalRows(SqlBase):
    @staticmethod
    def _proposal(row: Row, *, created: bool = False) -> LearningProposal:
        return record_of(
            LearningProposal,
            row,
            times=("submitted_at", "decided_at"),
            lists=("evidence",),
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

    def get_proposal(self, proposal_id: str) -> LearningProposal | None:
        rows = self._read("SELECT * FROM learning_proposals WHERE proposal_id = ?", (proposal_id,))
        return self._proposal(rows[0]) if rows else None

    def decide_proposal(
        self, proposal_id: str, state: ProposalState, by: str, note: str, at: datetime
    ) -> LearningProposal | None:
        def body(conn: Tx) -> LearningProposal | None:
            row = conn.execute(
                "UPDATE learning_proposals SET state = ?, decided_by = ?, decided_at = ?,"
                " decision_note = ? WHERE proposal_id = ? AND state = ? RETURNING *",
                (state.value, by, ts(at), note, proposal_id, ProposalState.QUEUED.value),
            ).fetchone()
            return None if row is None else self._proposal(row)

        def verify(conn: Tx) -> Verified[LearningProposal | None]:
            row = conn.execute(
                "SELECT * FROM learning_proposals WHERE proposal_id = ? AND state = ?"
                " AND decided_by = ? AND decided_at = ?",
                (proposal_id, state.value, by, ts(at)),
            ).fetchone()
            return (self._proposal(row),) if row is not None else None

        return self._write(body, verify)

    def accept_proposal(
        self,
        proposal_id: str,
        by: str,
        note: str,
        at: datetime,
        row: WorkspaceRow,
        expect_sha256: str,
    ) -> LearningProposal | None:
        def body(conn: Tx) -> LearningProposal | None:
            decided = conn.execute(
                "UPDATE learning_proposals SET state = ?, decided_by = ?, decided_at = ?,"
                " decision_note = ? WHERE proposal_id = ? AND workspace_id = ? AND state = ?"
                " RETURNING *",
                (ProposalState.ACCEPTED.value, by, ts(at), note, proposal_id,
                 row.workspace_id, ProposalState.QUEUED.value),
            ).fetchone()  # fmt: skip
            if decided is None:
                return None
            written = conn.execute(
                "UPDATE workspaces SET label = ?, context_sha256 = ?, updated_at = ?,"
                " context_text = ? WHERE workspace_id = ? AND context_sha256 = ?"
                " RETURNING workspace_id",
                (row.label, row.context_sha256, ts(row.updated_at), row.context_text,
                 row.workspace_id, expect_sha256),
            ).fetchone()  # fmt: skip
            if written is None:  # raising rolls the decision back with it
                raise InvalidRequest(
                    f"workspace {row.workspace_id}'s context changed since that diff was "
                    "shown: review the new diff and accept again"
                )
            return self._proposal(decided)

        def verify(conn: Tx) -> Verified[LearningProposal | None]:
            found = conn.execute(
                "SELECT * FROM learning_proposals WHERE proposal_id = ? AND state = ?"
                " AND decided_by = ? AND decided_at = ?",
                (proposal_id, ProposalState.ACCEPTED.value, by, ts(at)),
            ).fetchone()
            return (self._proposal(found),) if found is not None else None

        return self._write(body, verify)
