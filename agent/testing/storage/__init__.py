"""The storage contract suites, one per role of ``agent.ports``, shipped as base classes.

A backend's tests subclass each suite and supply where a store lives and how it is opened::

    class OnMyBackend:
        def address(self, where: Path) -> str: ...
        @staticmethod
        def open_address(address: str) -> Store: ...

    class TestClaimsOnMyBackend(OnMyBackend, ClaimsContract): ...
"""

from agent.testing.storage.base import StoreContract
from agent.testing.storage.claims import ClaimsContract
from agent.testing.storage.dispatch import DispatchContract
from agent.testing.storage.drafts import DraftsContract
from agent.testing.storage.health import HealthContract
from agent.testing.storage.inspect import InspectContract
from agent.testing.storage.proposals import ProposalsContract
from agent.testing.storage.registry import RegistryContract
from agent.testing.storage.run_ledger import RunLedgerContract
from agent.testing.storage.send_ledger import SendLedgerContract
from agent.testing.storage.task_board import TaskBoardContract
from agent.testing.storage.tasks import TasksContract
from agent.testing.storage.thread_aliases import ThreadAliasesContract

__all__ = [
    "ROLE_CONTRACTS",
    "ClaimsContract",
    "DispatchContract",
    "DraftsContract",
    "HealthContract",
    "InspectContract",
    "ProposalsContract",
    "RegistryContract",
    "RunLedgerContract",
    "SendLedgerContract",
    "StoreContract",
    "TaskBoardContract",
    "TasksContract",
    "ThreadAliasesContract",
]

ROLE_CONTRACTS: tuple[type[StoreContract], ...] = (
    RegistryContract,
    RunLedgerContract,
    ThreadAliasesContract,
    ClaimsContract,
    TasksContract,
    TaskBoardContract,
    SendLedgerContract,
    DraftsContract,
    ProposalsContract,
    HealthContract,
    DispatchContract,
    InspectContract,
)
"""Every role's suite: a backend is done when it passes all of them."""
