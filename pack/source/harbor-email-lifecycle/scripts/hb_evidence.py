"""Reading the evidence a helper command is given: one JSON object, from a file or stdin.

Shared by the lifecycle skill's helper commands. A helper only reads: it grants no
authority, sends nothing and stores nothing; its verdict is printed as JSON.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

from agent.domain.context import WorkspaceContext, parse_context
from agent.domain.errors import ContextError

EXIT_CLEAR = 0
EXIT_BAD_EVIDENCE = 2
EXIT_BLOCKED = 3


class HbEvidenceError(Exception):
    """Evidence that cannot be read: the helper says what to fix and decides nothing."""


def read_evidence(argv: list[str]) -> dict[str, Any]:
    """The evidence object from the file named by the only argument, or from stdin."""
    if len(argv) > 1:
        raise HbEvidenceError("give one evidence file, or the evidence on stdin")
    try:
        text = Path(argv[0]).read_text(encoding="utf-8") if argv else sys.stdin.read()
    except (OSError, UnicodeDecodeError) as exc:
        raise HbEvidenceError(f"the evidence cannot be read: {exc}") from None
    try:
        found: Any = json.loads(text)
    except json.JSONDecodeError as exc:
        raise HbEvidenceError(f"the evidence is not JSON: {exc}") from None
    if not isinstance(found, dict):
        raise HbEvidenceError("the evidence is one JSON object")
    return cast("dict[str, Any]", found)


def context_at(path: object) -> WorkspaceContext:
    """The Workspace Context file the evidence names (live Context: read, never written)."""
    if not isinstance(path, str) or not path:
        raise HbEvidenceError("'context' names the workspace's Workspace Context file")
    try:
        return parse_context(Path(path).read_text(encoding="utf-8"), source=path)
    except (OSError, ContextError) as exc:
        raise HbEvidenceError(f"the Workspace Context {path} cannot be read: {exc}") from None


def strings(evidence: dict[str, Any], key: str) -> list[str]:
    value: object = evidence.get(key, [])
    items = cast("list[object]", value) if isinstance(value, list) else None
    if items is None or not all(isinstance(v, str) for v in items):
        raise HbEvidenceError(f"'{key}' is a list of strings")
    return [str(v) for v in items]


def flag(evidence: dict[str, Any], key: str) -> bool:
    value = evidence.get(key, False)
    if not isinstance(value, bool):
        raise HbEvidenceError(f"'{key}' is true or false")
    return value


def finish(verdict: dict[str, Any], blocked: bool) -> int:
    print(json.dumps(verdict, ensure_ascii=False, indent=2))
    return EXIT_BLOCKED if blocked else EXIT_CLEAR


def refuse(error: HbEvidenceError) -> int:
    print(json.dumps({"error": str(error)}, ensure_ascii=False), file=sys.stderr)
    return EXIT_BAD_EVIDENCE


def run(evaluate: Callable[[dict[str, Any]], tuple[dict[str, Any], bool]], argv: list[str]) -> int:
    """A helper command: the evidence read, evaluated, and the verdict printed; exit 0
    clear, 3 blocked, 2 unreadable evidence."""
    try:
        verdict, blocked = evaluate(read_evidence(argv))
    except HbEvidenceError as exc:
        return refuse(exc)
    return finish(verdict, blocked)
