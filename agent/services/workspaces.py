"""The workspace registry: register, update and read back workspaces in one data directory.

A public install starts with zero rows. Each workspace is registered from its Workspace
Context file; the registry keeps a copy beside it, and every run re-reads that copy.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import yaml

from agent.domain.context import (
    StationConfig,
    WorkspaceContext,
    parse_station,
)
from agent.domain.errors import ContextError, UnknownWorkspace, WorkspaceExists
from agent.domain.records import Binding, WorkspaceRow
from agent.domain.registry import Candidate
from agent.ports import Registry
from agent.services import schedule
from agent.services.contexts import read_context_file, registered_context

STATION_FILE = "station.yaml"


@dataclass(frozen=True)
class DataDir:
    """The layout of one Outloop data directory."""

    root: Path

    @property
    def database(self) -> Path:
        return self.root / "outloop.db"

    @property
    def station_file(self) -> Path:
        return self.root / STATION_FILE

    def context_file(self, workspace_id: str) -> Path:
        return self.root / "workspaces" / workspace_id / "context.yaml"

    def tenant_config(self, workspace_id: str) -> Path:
        """The workspace's tenant-config.md: its schedule minute and how it was chosen."""
        return self.root / "workspaces" / workspace_id / "tenant-config.md"

    @property
    def pack(self) -> Path:
        """Where ``outloop pack install`` installs the public pack by default."""
        return self.root / "pack"


def _bindings(context: WorkspaceContext) -> list[Binding]:
    return [
        Binding(
            workspace_id=context.workspace_id,
            provider=m.provider,
            mailbox_id=m.mailbox_id,
            shared=m.shared,
        )
        for m in context.mailboxes
    ]


def stored_text(context: WorkspaceContext, base: Path) -> str:
    """The context text to store, with relative Maildir paths made absolute."""
    data = context.model_dump(mode="json", by_alias=True, exclude_defaults=False)
    for mailbox in data["mailboxes"]:
        if mailbox.get("path"):
            mailbox["path"] = str((base / mailbox["path"]).resolve())
    # The stubs leave one overload parameter untyped; the call itself is fully typed.
    return yaml.safe_dump(data, sort_keys=False, allow_unicode=True)  # pyright: ignore[reportUnknownMemberType]


def _save_copy(data_dir: DataDir, context: WorkspaceContext, source: Path) -> tuple[Path, str, str]:
    text = stored_text(context, source.parent)
    target = save_text(data_dir, context.workspace_id, text)
    return target, hashlib.sha256(text.encode("utf-8")).hexdigest(), text


def save_text(data_dir: DataDir, workspace_id: str, text: str) -> Path:
    """Write the data directory's copy of a workspace's stored context text, atomically."""
    target = data_dir.context_file(workspace_id)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_suffix(".yaml.tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(target)
    return target


def add_workspace(
    store: Registry,
    data_dir: DataDir,
    source: Path,
    now: datetime,
    context: WorkspaceContext | None = None,
) -> WorkspaceRow:
    """Register the workspace of the context file ``source`` (or of ``context``, the file as
    it was read and checked already: what was checked is what is registered)."""
    if context is None:
        context, _ = read_context_file(source)
    if store.get_workspace(context.workspace_id) is not None:
        raise WorkspaceExists(context.workspace_id)
    path, sha, text = _save_copy(data_dir, context, source)
    row = WorkspaceRow(
        workspace_id=context.workspace_id,
        label=context.label,
        context_path=str(path),
        context_sha256=sha,
        registered_at=now,
        updated_at=now,
        context_text=text,
    )
    tenant_config = data_dir.tenant_config(context.workspace_id)
    return schedule.register(store, tenant_config, row, _bindings(context))


def update_workspace(
    store: Registry,
    data_dir: DataDir,
    source: Path,
    now: datetime,
    context: WorkspaceContext | None = None,
) -> WorkspaceRow:
    """Replace the workspace's context with the file ``source`` (or with ``context``, read
    and checked already; relative paths in it are taken from ``source``'s directory)."""
    if context is None:
        context, _ = read_context_file(source)
    existing = store.get_workspace(context.workspace_id)
    if existing is None:
        raise UnknownWorkspace(context.workspace_id)
    path, sha, text = _save_copy(data_dir, context, source)
    row = existing.model_copy(
        update={
            "label": context.label,
            "context_path": str(path),
            "context_sha256": sha,
            "updated_at": now,
            "context_text": text,
        }
    )
    store.update_workspace(row, _bindings(context))
    return schedule.restore(store, data_dir.tenant_config(context.workspace_id), row)


def load_context(store: Registry, workspace_id: str) -> WorkspaceContext:
    """Read back the live context of a registered workspace (re-read on every run)."""
    row = store.get_workspace(workspace_id)
    if row is None:
        raise UnknownWorkspace(workspace_id)
    context = registered_context(row)
    if context.workspace_id != workspace_id:
        raise ContextError(
            f"{row.context_path} now names workspace {context.workspace_id}, not {workspace_id}"
        )
    return context


def candidates(store: Registry, provider: str, mailbox_id: str) -> list[Candidate]:
    """Registry rows for a mailbox, each with its live context read back (or why not)."""
    out: list[Candidate] = []
    for binding in store.bindings_for_mailbox(provider, mailbox_id):
        row = store.get_workspace(binding.workspace_id)
        if row is None:
            continue
        try:
            context = registered_context(row)
        except ContextError as exc:
            out.append(Candidate(binding.workspace_id, None, None, str(exc)))
            continue
        out.append(Candidate(binding.workspace_id, context.mailbox(provider, mailbox_id), context))
    return out


def load_station(data_dir: DataDir) -> StationConfig:
    """The station file; a missing file is an empty configuration (health names the keys)."""
    path = data_dir.station_file
    if not path.exists():
        return StationConfig()
    return parse_station(path.read_text(encoding="utf-8"), source=str(path))
