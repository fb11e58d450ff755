"""A workspace's context as a file gives it and as the registry holds it."""

from __future__ import annotations

import functools
import hashlib
from pathlib import Path

from agent.domain.context import WorkspaceContext, parse_context
from agent.domain.errors import ContextError
from agent.domain.records import WorkspaceRow


def read_context_file(path: Path) -> tuple[WorkspaceContext, str]:
    """Parse a context file; returns the context and the sha256 of its bytes."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ContextError(
            f"cannot read the Workspace Context file {path}: {exc.strerror}"
        ) from exc
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ContextError(f"{path} is not UTF-8 text") from exc
    return parse_context(text, source=str(path)), hashlib.sha256(data).hexdigest()


def registered_context(row: WorkspaceRow) -> WorkspaceContext:
    """The context the registry holds: the text stored with the row (the same on every
    machine sharing the store), else the data directory's copy for older rows."""
    if row.context_text is not None:
        return _parsed(row.context_text, row.workspace_id)
    context, _ = read_context_file(Path(row.context_path))
    return context


@functools.lru_cache(maxsize=256)
def _parsed(text: str, workspace_id: str) -> WorkspaceContext:
    """A registered context, parsed once per text: the row is still read on every call, so
    an update takes effect at once, and the parsed context is immutable, so sharing it is
    safe."""
    return parse_context(text, source=f"registered context of {workspace_id}")
