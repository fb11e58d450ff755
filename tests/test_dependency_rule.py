"""The dependency rule of ARCHITECTURE.md, enforced on every import statement."""

from __future__ import annotations

import ast
from collections.abc import Iterable
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PROJECT = {"agent", "mcp_server", "browser_adapters", "managed_login", "fixtures", "bench"}
VENDOR = {"mcp", "playwright", "keyring", "httpx", "psycopg", "psycopg_pool", "keyrings"}
CLI = "mcp_server/cli"
# What each layer may import of the project (mcp_server/cli -> mcp_server -> browser_adapters
# -> managed_login -> agent; fixtures import nothing of the product). The CLI is a front end
# above the MCP server: the only layer that runs the fixtures and the benchmarks.
ALLOWED = {
    "agent": {"agent"},
    "managed_login": {"managed_login", "agent"},
    "browser_adapters": {"browser_adapters", "managed_login", "agent"},
    "mcp_server": {"mcp_server", "browser_adapters", "managed_login", "agent"},
    CLI: {"mcp_server", "browser_adapters", "managed_login", "agent", "fixtures", "bench"},
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


def imported_names(path: Path, package: tuple[str, ...] | None = None) -> set[str]:
    """``imports_of`` plus each name a ``from`` import takes (``from mcp_server import cli``
    gives ``mcp_server.cli``), relative imports resolved against the module's ``package``
    (by default where it sits in the project)."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    found = imports_of(path)
    if package is None:
        package = path.parent.relative_to(ROOT).parts if path.is_relative_to(ROOT) else ()
    for node in ast.walk(tree):
        if not isinstance(node, ast.ImportFrom):
            continue
        base = node.module or ""
        if node.level:
            parent = package[: len(package) - node.level + 1]
            base = ".".join(part for part in (*parent, base) if part)
            found.add(base)
        found.update(f"{base}.{alias.name}" for alias in node.names)
    return found


def modules(package: str) -> list[Path]:
    return sorted((ROOT / package).rglob("*.py"))


def layer_modules(layer: str) -> list[Path]:
    """A layer's modules, without those of a layer nested in it (mcp_server/cli)."""
    nested = [ROOT / other for other in ALLOWED if other.startswith(layer + "/")]
    return [p for p in modules(layer) if not any(p.is_relative_to(n) for n in nested)]


def _shown(path: Path) -> str:
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def layer_offenders(layer: str, paths: Iterable[Path]) -> list[str]:
    """Each import of the project that ``layer`` may not make."""
    return [
        f"{_shown(path)} imports {name}"
        for path in paths
        for name in sorted(imports_of(path))
        if name.split(".")[0] in PROJECT and name.split(".")[0] not in ALLOWED[layer]
    ]


@pytest.mark.parametrize("layer", sorted(ALLOWED))
def test_each_layer_imports_only_the_layers_below_it(layer: str) -> None:
    assert layer_offenders(layer, layer_modules(layer)) == []


@pytest.mark.parametrize("package", ["bench", "fixtures"])
def test_only_the_cli_imports_the_benchmarks_and_the_fixtures(package: str) -> None:
    offenders = [
        f"{_shown(path)} imports {name}"
        for layer in ALLOWED
        if layer not in (CLI, package)
        for path in layer_modules(layer)
        for name in sorted(imported_names(path))
        if name.split(".")[0] == package
    ]
    assert offenders == []


def test_nothing_but_the_cli_imports_the_cli() -> None:
    cli = ROOT / CLI
    offenders = [
        f"{_shown(path)} imports {name}"
        for package in sorted(PROJECT)
        for path in modules(package)
        if not path.is_relative_to(cli)
        for name in sorted(imported_names(path))
        if name == "mcp_server.cli" or name.startswith("mcp_server.cli.")
    ]
    assert offenders == []


def test_the_layer_check_sees_a_server_module_that_runs_a_benchmark_or_a_fixture(
    tmp_path: Path,
) -> None:
    # Guard against a layer split that hides what it should check.
    server_module = tmp_path / "tools.py"
    server_module.write_text(
        "from bench import claims\nimport fixtures.serve\nfrom agent.ports import Store\n",
        encoding="utf-8",
    )
    assert layer_offenders("mcp_server", [server_module]) == [
        f"{server_module} imports bench",
        f"{server_module} imports fixtures.serve",
    ]
    assert layer_offenders(CLI, [server_module]) == []
    assert ROOT / CLI / "bench.py" in modules("mcp_server")
    assert ROOT / CLI / "bench.py" not in layer_modules("mcp_server")
    assert ROOT / CLI / "bench.py" in layer_modules(CLI)


def test_domain_imports_nothing_else_of_the_project() -> None:
    offenders = [
        f"{path.relative_to(ROOT)} imports {name}"
        for path in modules("agent/domain")
        for name in imports_of(path)
        if name.split(".")[0] in PROJECT and not name.startswith("agent.domain")
    ]
    assert offenders == []


# Each adapter inside agent/ imports only its own client library.
ADAPTER_LIBRARIES = {
    "agent/storage/postgres": {"psycopg", "psycopg_pool"},
    # The provider MCP channel is an MCP client; it speaks Graph's requests over its tools.
    "agent/providers/provider_mcp": {"mcp", "httpx"},
    "agent/providers": {"httpx"},  # the API channels' HTTP client
}


@pytest.mark.parametrize("package", ["agent/domain", "agent/services", "agent"])
def test_core_imports_no_vendor_library(package: str) -> None:
    offenders = []
    for path in modules(package):
        rel = path.relative_to(ROOT).as_posix()
        allowed = next(
            (
                libs
                for prefix, libs in ADAPTER_LIBRARIES.items()
                if rel.startswith(prefix + "/") or rel == prefix + ".py"
            ),
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


def test_the_cli_check_sees_a_from_import_and_a_relative_import(tmp_path: Path) -> None:
    absolute = tmp_path / "absolute.py"
    absolute.write_text("from mcp_server import cli\n", encoding="utf-8")
    assert "mcp_server.cli" in imported_names(absolute)
    relative = tmp_path / "relative.py"
    relative.write_text("from .cli import main\nfrom . import cli\n", encoding="utf-8")
    assert {"mcp_server.cli", "mcp_server.cli.main"} <= imported_names(relative, ("mcp_server",))


def test_print_appears_only_in_the_cli_layer() -> None:
    offenders = []
    for package in sorted(PROJECT):
        for path in modules(package):
            if path.is_relative_to(ROOT / CLI):
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
