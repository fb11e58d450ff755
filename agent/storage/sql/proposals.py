"""The operator's queue of learning proposals (the Proposals role)."""

from __future__ import annotations

import json

from agent.domain.records import LearningProposal
from agent.storage.sql.core import Row, SqlBase, Tx, record_of, ts


class ProposalRows(SqlBase):
    @staticmethod
    def _proposal(row: Row, *, created: bool = False) -> LearningProposal:
        return record_of(
            LearningProposal,
            row,
            times=("submitted_at",),
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
