"""The store's logic on any SQL database with UNIQUE constraints and ``ON CONFLICT``, one
module per aggregate over one transaction core (``core.py``):

- ``registry.py``: workspaces and mailbox bindings (Registry)
- ``runs.py``: runs, scanned items, dispositions, reconciliation, mailbox cursors (RunLedger)
- ``aliases.py``: thread aliases of mail systems without a common thread id (ThreadAliases)
- ``claims.py``: claims, execution records, escalations (Claims)
- ``tasks.py``: task records and the embedded task board (Tasks, TaskBoard)
- ``sends.py``, ``drafts.py``, ``proposals.py``, ``health.py``: one role each
- ``dispatch.py``: named leases, dispatcher processes, scheduled cycles (Dispatch)

``SqlStore`` is all of them on one database; a backend subclasses it with its connections.
"""

from __future__ import annotations

from agent.storage.sql.aliases import AliasRows
from agent.storage.sql.claims import ClaimRows
from agent.storage.sql.core import Cursor, Row, SqlBase, T, Tx, Verified, dt, ts
from agent.storage.sql.dispatch import DispatchRows
from agent.storage.sql.drafts import DraftRows
from agent.storage.sql.health import HealthRows
from agent.storage.sql.proposals import ProposalRows
from agent.storage.sql.registry import RegistryRows
from agent.storage.sql.sends import SendRows

__all__ = ["Cursor", "Row", "SqlBase", "SqlStore", "T", "Tx", "Verified", "dt", "ts"]


class SqlStore(
    RegistryRows,
    ClaimRows,
    AliasRows,
    SendRows,
    DraftRows,
    ProposalRows,
    HealthRows,
    DispatchRows,
):
    """Every storage role and the embedded task board, on one SQL database."""
