"""The shape the code keeps: functions short enough to read as the rule they implement."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("agent", "mcp_server", "browser_adapters", "managed_login", "fixtures", "bench")
SHIPPED_TESTS = ("agent/testing/storage",)  # contract suites are tests, shipped in the package
MAX_LINES = 60
EXCUSE = "# Long on purpose:"


def long_functions(path: Path, root: Path = ROOT) -> list[str]:
    """Functions over MAX_LINES lines (``def`` to last line) without an EXCUSE comment in the
    lines right above them (or above their decorators)."""
    text = path.read_text(encoding="utf-8")
    lines = text.splitlines()
    found: list[str] = []
    for node in ast.walk(ast.parse(text, filename=str(path))):
        if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
        length = (node.end_lineno or node.lineno) - node.lineno + 1
        above = [line.strip() for line in lines[max(0, first - 4) : first - 1]]
        if length > MAX_LINES and not any(line.startswith(EXCUSE) for line in above):
            found.append(f"{path.relative_to(root)}:{node.lineno} {node.name} ({length} lines)")
    return found


def test_no_function_outside_the_tests_runs_over_sixty_lines_without_saying_why() -> None:
    offenders = [
        problem
        for package in PACKAGES
        for path in sorted((ROOT / package).rglob("*.py"))
        if not path.relative_to(ROOT).as_posix().startswith(SHIPPED_TESTS)
        for problem in long_functions(path)
    ]
    assert offenders == []


def test_a_long_function_is_found_and_an_excused_one_is_not(tmp_path: Path) -> None:
    body = "\n".join(f"    x{n} = {n}" for n in range(MAX_LINES))
    probe = tmp_path / "probe.py"
    probe.write_text(f"def long():\n{body}\n\n\n{EXCUSE} a table\ndef excused():\n{body}\n")
    assert [p.split()[1] for p in long_functions(probe, tmp_path)] == ["long"]
