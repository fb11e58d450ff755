"""The dependency rule of ARCHITECTURE.md, enforced on every import statement."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PROJECT = {"agent", "mcp_server", "browser_adapters", "managed_login", "fixtures", "bench"}
VENDOR = {"mcp", "playwright", "keyring", "httpx", "psycopg", "psycopg_pool", "keyrings"}
# What each layer may import of the project (mcp_server -> browser_adapters ->
# managed_login -> agent; fixtures import nothing of the product).
ALLOWED = {
    "agent": {"agent"},
    "managed_login": {"managed_login", "agent"},
    "browser_adapters": {"browser_adapters", "managed_login", "agent"},
    "mcp_server": {"mcp_server", "browser_adapters", "managed_login", "agent", "fixtures", "bench"},
    "fixtures": {"fixtures"},
    "bench": {"bench", "agent"},
}


def imports_of(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
    return found


def modules(package: str) -> list[Path]:
    return sorted((ROOT / package).rglob("*.py"))


@pytest.mark.parametrize("package", sorted(ALLOWED))
def test_each_package_imports_only_the_layers_below_it(package: str) -> None:
    offenders = []
    for path in modules(package):
        for name in imports_of(path):
            top = name.split(".")[0]
            if top in PROJECT and top not in ALLOWED[package]:
                offenders.append(f"{path.relative_to(ROOT)} imports {name}")
    assert offenders == []


def test_domain_imports_nothing_else_of_the_project() -> None:
    offenders = [
        f"{path.relative_to(ROOT)} imports {name}"
        for path in modules("agent/domain")
        for name in imports_of(path)
        if name.split(".")[0] in PROJECT and not name.startswith("agent.domain")
    ]
    assert offenders == []


# Each adapter inside agent/ imports only its own client library.
ADAPTER_LIBRARIES = {"agent/storage/postgres": {"psycopg", "psycopg_pool"}}


@pytest.mark.parametrize("package", ["agent/domain", "agent/services", "agent"])
def test_core_imports_no_vendor_library(package: str) -> None:
    offenders = []
    for path in modules(package):
        rel = path.relative_to(ROOT).as_posix()
        allowed = next(
            (libs for prefix, libs in ADAPTER_LIBRARIES.items() if rel.startswith(prefix + "/")),
            set[str](),
        )
        offenders += [
            f"{rel} imports {name}"
            for name in imports_of(path)
            if name.split(".")[0] in VENDOR and name.split(".")[0] not in allowed
        ]
    assert offenders == []


def test_the_rule_checker_sees_a_violation() -> None:
    # Guard against a checker that can never fail: a synthetic module breaking the rule.
    bad = ROOT / "tests" / "_tmp_bad_module.py"
    bad.write_text("import mcp\nfrom mcp_server.cli import main\n", encoding="utf-8")
    try:
        assert imports_of(bad) == {"mcp", "mcp_server.cli"}
    finally:
        bad.unlink()


def test_print_appears_only_in_the_cli_layer() -> None:
    offenders = []
    for package in sorted(PROJECT):
        for path in modules(package):
            if path.name == "cli.py":
                continue
            tree = ast.parse(path.read_text(encoding="utf-8"))
            for node in ast.walk(tree):
                if (
                    isinstance(node, ast.Call)
                    and isinstance(node.func, ast.Name)
                    and node.func.id == "print"
                ):
                    offenders.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert offenders == []
