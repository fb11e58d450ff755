"""Every storage role's contract suite (agent/testing/storage), run on SQLite and PostgreSQL.

A new backend is done when a pair of lines per role here passes for it.
"""

from __future__ import annotations

import inspect
import re
from pathlib import Path

from agent import ports
from agent.ports import EmbeddedStore
from agent.storage.postgres import PostgresStore
from agent.storage.sqlite import SqliteStore
from agent.testing.storage import (
    ROLE_CONTRACTS,
    ClaimsContract,
    DispatchContract,
    DraftsContract,
    HealthContract,
    InspectContract,
    ProposalsContract,
    RegistryContract,
    RunLedgerContract,
    SendLedgerContract,
    TaskBoardContract,
    TasksContract,
    ThreadAliasesContract,
)
from tests.conftest import pg_url_at


class OnSqlite:
    """A SQLite file in the test's directory."""

    def address(self, where: Path) -> str:
        return str(where / "store.db")

    @staticmethod
    def open_address(address: str) -> EmbeddedStore:
        return SqliteStore(Path(address))


class OnPostgres:
    """A schema of its own in the session's throwaway PostgreSQL cluster."""

    def address(self, where: Path) -> str:
        return pg_url_at(where)

    @staticmethod
    def open_address(address: str) -> EmbeddedStore:
        return PostgresStore(address)


class TestRegistryOnSqlite(OnSqlite, RegistryContract): ...


class TestRegistryOnPostgres(OnPostgres, RegistryContract): ...


class TestRunLedgerOnSqlite(OnSqlite, RunLedgerContract): ...


class TestRunLedgerOnPostgres(OnPostgres, RunLedgerContract): ...


class TestThreadAliasesOnSqlite(OnSqlite, ThreadAliasesContract): ...


class TestThreadAliasesOnPostgres(OnPostgres, ThreadAliasesContract): ...


class TestClaimsOnSqlite(OnSqlite, ClaimsContract): ...


class TestClaimsOnPostgres(OnPostgres, ClaimsContract): ...


class TestTasksOnSqlite(OnSqlite, TasksContract): ...


class TestTasksOnPostgres(OnPostgres, TasksContract): ...


class TestTaskBoardOnSqlite(OnSqlite, TaskBoardContract): ...


class TestTaskBoardOnPostgres(OnPostgres, TaskBoardContract): ...


class TestSendLedgerOnSqlite(OnSqlite, SendLedgerContract): ...


class TestSendLedgerOnPostgres(OnPostgres, SendLedgerContract): ...


class TestDraftsOnSqlite(OnSqlite, DraftsContract): ...


class TestDraftsOnPostgres(OnPostgres, DraftsContract): ...


class TestProposalsOnSqlite(OnSqlite, ProposalsContract): ...


class TestProposalsOnPostgres(OnPostgres, ProposalsContract): ...


class TestHealthOnSqlite(OnSqlite, HealthContract): ...


class TestHealthOnPostgres(OnPostgres, HealthContract): ...


class TestDispatchOnSqlite(OnSqlite, DispatchContract): ...


class TestDispatchOnPostgres(OnPostgres, DispatchContract): ...


class TestInspectOnSqlite(OnSqlite, InspectContract): ...


class TestInspectOnPostgres(OnPostgres, InspectContract): ...


def test_every_storage_role_suite_runs_on_both_backends() -> None:
    backends = {OnSqlite, OnPostgres}
    runs = {
        (suite, backend)
        for test_class in globals().values()
        if isinstance(test_class, type) and test_class.__name__.startswith("Test")
        for suite in ROLE_CONTRACTS
        if issubclass(test_class, suite)
        for backend in backends
        if issubclass(test_class, backend)
    }
    assert runs == {(suite, backend) for suite in ROLE_CONTRACTS for backend in backends}


def test_every_method_of_every_storage_role_is_called_by_a_contract_suite() -> None:
    suites = Path(ports.__file__).parent / "testing" / "storage"
    text = "\n".join(p.read_text(encoding="utf-8") for p in sorted(suites.glob("*.py")))
    roles = [r for r in inspect.getmro(ports.EmbeddedStore) if r.__module__ == ports.__name__]
    uncovered = [
        f"{role.__name__}.{name}"
        for role in roles
        for name, member in vars(role).items()
        if inspect.isfunction(member) and not name.startswith("_")
        if role not in (ports.Store, ports.EmbeddedStore)
        if not re.search(rf"\.{name}\(", text)
    ]
    assert uncovered == []
