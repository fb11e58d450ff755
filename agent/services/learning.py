"""submit_learning: the only way an agent proposes a change to a Workspace Context.

A proposal is queued for an operator and shown as the agent wrote it (untrusted: the agent
reads client mail). Nothing in it changes the context, the contact list or any policy; only
an operator's ``outloop workspace update`` does.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from typing import Protocol

from agent.domain.records import LearningProposal
from agent.ports import Clock, Proposals, Registry
from agent.services.workspaces import load_context


class LearningStore(Registry, Proposals, Protocol):
    """What queueing a proposal needs: the registered workspace and the queue."""


def submit(
    store: LearningStore,
    workspace_id: str,
    *,
    kind: str,
    summary: str,
    detail: str,
    evidence: Sequence[str],
    clock: Clock,
) -> LearningProposal:
    """Queue one proposal for the workspace's operator (the same proposal twice is queued
    once)."""
    load_context(store, workspace_id)  # a registered workspace, or a clear error
    digest = hashlib.sha256(
        json.dumps([workspace_id, kind, summary, detail, list(evidence)]).encode()
    ).hexdigest()
    return store.add_proposal(
        LearningProposal(
            proposal_id=f"lp-{digest[:20]}",
            workspace_id=workspace_id,
            kind=kind,
            summary=summary,
            detail=detail,
            evidence=tuple(evidence),
            submitted_at=clock.now(),
        )
    )
