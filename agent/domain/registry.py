"""Workspace resolution: by immutable workspace id only, exactly one or none.

Display names, tenant numbers and folders never resolve a workspace. A shared mailbox binds
an item only by its exact rules (recipient addresses listed in ``bind_to``).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from agent.domain.context import MailboxBinding, WorkspaceContext
from agent.domain.envelope import Envelope


class ResolutionStatus(StrEnum):
    RESOLVED = "resolved"
    ESCALATE_IN_WORKSPACE = "escalate_in_workspace"
    UNRESOLVED = "unresolved"


@dataclass(frozen=True)
class Candidate:
    """A registry row binding this mailbox to a workspace, with its live context (or why not)."""

    workspace_id: str
    binding: MailboxBinding | None
    context: WorkspaceContext | None
    load_error: str | None = None


@dataclass(frozen=True)
class Resolution:
    status: ResolutionStatus
    workspace_id: str | None
    reason: str


def resolve_workspace(envelope: Envelope, candidates: list[Candidate]) -> Resolution:
    """Resolve exactly one workspace for the envelope from registered, verified bindings."""
    if not candidates:
        return Resolution(
            ResolutionStatus.UNRESOLVED,
            None,
            f"mailbox {envelope.mailbox_id} ({envelope.provider}) is bound to no workspace",
        )
    recipients = {a.address for a in (*envelope.to, *envelope.cc)}
    matched: list[Candidate] = []
    for cand in candidates:
        if (
            cand.binding is None
            or not cand.binding.shared
            or recipients & set(cand.binding.bind_to)
        ):
            matched.append(cand)
    if len(matched) != 1:
        ids = ", ".join(sorted(c.workspace_id for c in matched)) or "none"
        return Resolution(
            ResolutionStatus.UNRESOLVED,
            None,
            f"mailbox {envelope.mailbox_id} binding rules matched {len(matched)} workspaces "
            f"({ids}); exactly one is required",
        )
    chosen = matched[0]
    if chosen.context is None:
        return Resolution(
            ResolutionStatus.UNRESOLVED,
            None,
            f"workspace {chosen.workspace_id}: live context could not be read back "
            f"({chosen.load_error})",
        )
    if chosen.context.workspace_id != chosen.workspace_id:
        return Resolution(
            ResolutionStatus.UNRESOLVED,
            None,
            f"registry row {chosen.workspace_id} reads back a context for "
            f"{chosen.context.workspace_id}; the binding is not verified",
        )
    if chosen.binding is None:
        return Resolution(
            ResolutionStatus.ESCALATE_IN_WORKSPACE,
            chosen.workspace_id,
            f"workspace {chosen.workspace_id}'s live context no longer lists mailbox "
            f"{envelope.mailbox_id}; the binding is not verified",
        )
    return Resolution(ResolutionStatus.RESOLVED, chosen.workspace_id, "bound mailbox")
