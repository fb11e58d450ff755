"""submit_learning: the only way an agent proposes a change to a Workspace Context.

A proposal is queued for an operator and shown as the agent wrote it (untrusted: the agent
reads client mail). Nothing in it changes the context, the contact list or any policy; only
an operator does: by ``outloop workspace update``, or by accepting it in the console with
the context it leads to, checked the same way and shown as a diff first.
"""

from __future__ import annotations

import difflib
import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Protocol

from agent.domain.context import WorkspaceContext, parse_context
from agent.domain.errors import ContextError, InvalidRequest, UnknownWorkspace
from agent.domain.records import LearningProposal, ProposalState, WorkspaceRow
from agent.ports import Clock, Proposals, Registry
from agent.services.console import require_operator
from agent.services.contexts import registered_context
from agent.services.workspaces import DataDir, load_context, save_text, stored_text


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


@dataclass(frozen=True)
class ProposedChange:
    """What accepting a proposal would write: the checked context, the text stored for it
    and its diff against the context it replaces (whose digest it must still be)."""

    proposal: LearningProposal
    context: WorkspaceContext
    text: str
    diff: str
    base_sha256: str


class DecisionStore(Registry, Proposals, Protocol):
    """What deciding a proposal needs: the registry it writes and the queue."""


def queued_proposal(store: Proposals, proposal_id: str) -> LearningProposal:
    """The proposal, still waiting on a decision; InvalidRequest naming why not."""
    proposal = store.get_proposal(proposal_id)
    if proposal is None:
        raise InvalidRequest(f"there is no learning proposal {proposal_id}")
    if proposal.state is not ProposalState.QUEUED:
        raise InvalidRequest(
            f"proposal {proposal_id} was {proposal.state.value} by {proposal.decided_by} at "
            f"{proposal.decided_at:%Y-%m-%d %H:%M} UTC: it is decided once"
        )
    return proposal


def preview_change(
    store: DecisionStore, data_dir: DataDir, proposal_id: str, text: str
) -> ProposedChange:
    """Check ``text`` as the proposal's workspace's new context, exactly as ``outloop
    workspace update`` checks a file, and show what it changes; ContextError naming the key
    or line at fault, InvalidRequest when it changes nothing or names another workspace."""
    proposal = queued_proposal(store, proposal_id)
    row = store.get_workspace(proposal.workspace_id)
    if row is None:
        raise UnknownWorkspace(proposal.workspace_id)
    context = parse_context(text, source=f"the context for proposal {proposal_id}")
    if context.workspace_id != proposal.workspace_id:
        raise ContextError(
            f"the context for proposal {proposal_id} names workspace {context.workspace_id}; "
            f"the proposal is about {proposal.workspace_id}"
        )
    path = data_dir.context_file(proposal.workspace_id)
    stored = stored_text(context, path.parent)
    current = row.context_text or ""
    if stored == current:
        raise InvalidRequest(f"that context is the one {proposal.workspace_id} has now")
    _console_may_change(registered_context(row), context)
    diff = "".join(
        difflib.unified_diff(
            current.splitlines(keepends=True),
            stored.splitlines(keepends=True),
            fromfile=f"{proposal.workspace_id} context now",
            tofile=f"{proposal.workspace_id} context with {proposal_id}",
        )
    )
    return ProposedChange(proposal, context, stored, diff, row.context_sha256)


def accept(
    store: DecisionStore,
    data_dir: DataDir,
    proposal_id: str,
    *,
    text: str,
    base_sha256: str,
    by: str,
    where: str,
    now: datetime,
) -> tuple[LearningProposal, WorkspaceRow]:
    """An operator accepts a proposal by writing the context it leads to: checked as
    ``outloop workspace update`` checks a file, leaving ``CLI_ONLY`` alone, and written in
    the transaction that decides the proposal, over the context the operator saw the diff
    of (a context changed since is refused, nothing written)."""
    change = preview_change(store, data_dir, proposal_id, text)
    require_operator(load_context(store, change.proposal.workspace_id), by, "accept a proposal")
    if change.base_sha256 != base_sha256:
        raise InvalidRequest(
            f"workspace {change.proposal.workspace_id}'s context changed since that diff was "
            "shown: review the new diff and accept again"
        )
    existing = store.get_workspace(change.proposal.workspace_id)
    if existing is None:
        raise UnknownWorkspace(change.proposal.workspace_id)
    digest = hashlib.sha256(change.text.encode("utf-8")).hexdigest()
    row = existing.model_copy(
        update={"label": change.context.label, "context_sha256": digest,
                "context_text": change.text, "updated_at": now},
    )  # fmt: skip
    note = f"context {digest[:12]} written (from {where})"
    decided = store.accept_proposal(proposal_id, by, note, now, row, base_sha256)
    if decided is None:
        queued_proposal(store, proposal_id)  # names who decided it meanwhile
        raise InvalidRequest(f"proposal {proposal_id} is no longer queued")
    save_text(data_dir, row.workspace_id, row.context_text or "")
    return decided, row


CLI_ONLY = ("mailboxes", "grants", "task_board", "schedule")
"""What an accepted proposal may not change: how the station reaches the mailboxes (servers,
endpoints, paths, channels, credentials), the licence and grants, the task board and the
schedule. Those change on the command line, where they are verified live."""


def _console_may_change(now: WorkspaceContext, proposed: WorkspaceContext) -> None:
    changed = [
        name
        for name in CLI_ONLY
        if now.model_dump(include={name}) != proposed.model_dump(include={name})
    ]
    if changed:
        raise InvalidRequest(
            f"an accepted proposal does not change {', '.join(changed)}: change those in "
            "the context file and run 'outloop workspace update' (or 'outloop workspace "
            "bootstrap'), where they are verified"
        )


def reject(
    store: DecisionStore, proposal_id: str, *, reason: str, by: str, where: str, now: datetime
) -> LearningProposal:
    """An operator rejects a proposal, saying why; the context is not touched."""
    reason = reason.strip()
    if not reason:
        raise InvalidRequest("say why the proposal is rejected (the reason is recorded)")
    proposal = queued_proposal(store, proposal_id)
    require_operator(load_context(store, proposal.workspace_id), by, "reject a proposal")
    decided = store.decide_proposal(
        proposal_id, ProposalState.REJECTED, by, f"{reason} (from {where})", now
    )
    if decided is None:
        queued_proposal(store, proposal_id)
        raise InvalidRequest(f"proposal {proposal_id} is no longer queued")
    return decided
