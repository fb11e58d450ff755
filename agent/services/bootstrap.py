"""Bootstrapping a workspace: the binding an install creates, proven before it is written.

Only the workspace being installed is registered (a public install starts with zero rows).
Each mailbox it binds is read back live from its provider first - it answers, and it is the
bound mailbox - and nothing is written unless every one is. Then the registry row is written
with the workspace's schedule minute, read back and compared field by field, and the report
says ``runtime_operational`` or names exactly what is missing.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Protocol

import anyio

from agent.domain.context import MailboxBinding, StationConfig, WorkspaceContext
from agent.domain.errors import OutloopError, RegistryError, StoreError
from agent.domain.records import WorkspaceRow
from agent.ports import Health, Registry
from agent.services import workspaces
from agent.services.intake import ProviderFactory
from agent.services.schedule import choice_of
from agent.services.workspaces import DataDir

READ_BACK_SECONDS = 120.0
"""How long one mailbox's live read-back may take (a browser channel signs in first)."""


class BootstrapRefused(RegistryError):
    """The workspace cannot be bootstrapped as it stands; nothing was written."""


@dataclass(frozen=True)
class MailboxReadBack:
    mailbox_id: str
    provider: str
    ok: bool
    detail: str


@dataclass
class BootstrapReport:
    workspace_id: str
    row: WorkspaceRow
    mailboxes: list[MailboxReadBack]
    missing: list[str] = field(default_factory=list[str])

    @property
    def runtime_operational(self) -> bool:
        return not self.missing


async def read_back(
    provider_for: ProviderFactory, workspace_id: str, binding: MailboxBinding
) -> MailboxReadBack:
    """The mailbox asked live, through its permitted channels in order: does it answer, and
    is it the bound one (each adapter's health compares the account it signed in to)."""

    def result(ok: bool, detail: str) -> MailboxReadBack:
        return MailboxReadBack(binding.mailbox_id, binding.provider, ok, detail)

    try:
        provider = provider_for(workspace_id, binding)
    except OutloopError as exc:
        return result(False, str(exc))
    try:
        with anyio.fail_after(READ_BACK_SECONDS):
            health = await provider.health()
    except TimeoutError:
        return result(False, f"no answer within {READ_BACK_SECONDS:.0f} s")
    except OutloopError as exc:
        return result(False, str(exc))
    finally:
        await provider.aclose()
    account = (health.account or binding.mailbox_id).lower()
    if health.ok and account != binding.mailbox_id:
        return result(
            False,
            f"it signs in as {account}, not {binding.mailbox_id}: these are another "
            "mailbox's credentials (bind the mailbox they sign in to, or fix the login)",
        )
    return result(health.ok, health.detail)


def _gaps(context: WorkspaceContext, station: StationConfig) -> list[str]:
    """What the runtime needs beyond the binding: where escalated work goes (the station's
    destinations only matter when a mailbox is shared: only then can an item be no
    workspace's)."""
    missing = [
        f"the context's {name} (where this workspace's unresolved items go)"
        for name, value in (
            ("unresolved_queue", context.unresolved_queue),
            ("escalation_contact", context.escalation_contact),
        )
        if not value
    ]
    if any(m.shared for m in context.mailboxes):
        missing += [
            f"station.yaml's {name} (where items of the shared mailbox no workspace can claim go)"
            for name, value in (
                ("unresolved_queue", station.unresolved_queue),
                ("escalation_contact", station.escalation_contact),
            )
            if not value
        ]
    return missing


def _refuse_second(store: Registry, context: WorkspaceContext, source: Path) -> None:
    existing = store.get_workspace(context.workspace_id)
    if existing is None:
        return
    raise BootstrapRefused(
        f"workspace {context.workspace_id} is already registered (since "
        f"{existing.registered_at:%Y-%m-%d %H:%M} UTC): a second bootstrap writes nothing. "
        f"Check it with 'outloop schedule verify --workspace {context.workspace_id}'; replace "
        f"its context with 'outloop workspace update --context {source}'"
    )


def _confirm(store: Registry, row: WorkspaceRow, context: WorkspaceContext) -> None:
    """The exact row, read back: every field as written, every mailbox bound to it."""
    stored = store.get_workspace(row.workspace_id)
    if stored is None or stored != row:
        raise StoreError(
            f"the registry row of {row.workspace_id} read back differs from what was written; "
            "run 'outloop schedule verify' and check the store"
        )
    for mailbox in context.mailboxes:
        bound = store.bindings_for_mailbox(mailbox.provider, mailbox.mailbox_id)
        if row.workspace_id not in {b.workspace_id for b in bound}:
            raise StoreError(
                f"the registry does not bind {mailbox.mailbox_id} to {row.workspace_id} after "
                "writing it; check the store"
            )
    if choice_of(stored) is None:
        raise StoreError(f"the registry row of {row.workspace_id} has no schedule minute")


class BootstrapStore(Registry, Health, Protocol):
    """What a bootstrap writes: the registry row, and a health record of what is missing."""


async def bootstrap(
    store: BootstrapStore,
    data_dir: DataDir,
    source: Path,
    provider_for: ProviderFactory,
    now: datetime,
) -> BootstrapReport:
    """Verify every mailbox live, then register the one workspace and confirm its row."""
    context, _ = workspaces.read_context_file(source)
    _refuse_second(store, context, source)
    if not context.mailboxes:
        raise BootstrapRefused(
            f"{source} binds no mailbox: add the workspace's mailbox under 'mailboxes:' "
            "(docs/workspace-context.md); nothing was registered"
        )
    checks = [await read_back(provider_for, context.workspace_id, m) for m in context.mailboxes]
    failed = [c for c in checks if not c.ok]
    if failed:
        shown = "; ".join(f"mailbox {c.mailbox_id} ({c.provider}): {c.detail}" for c in failed)
        raise BootstrapRefused(
            f"the binding of workspace {context.workspace_id} was not verified, so nothing "
            f"was registered: {shown}"
        )
    row = workspaces.add_workspace(store, data_dir, source, now, context)
    _confirm(store, row, context)
    missing = _gaps(context, workspaces.load_station(data_dir))
    for gap in missing:
        store.record_health(f"bootstrap {context.workspace_id}: {gap.split(' (')[0]}", gap, now)
    return BootstrapReport(context.workspace_id, row, checks, missing)
