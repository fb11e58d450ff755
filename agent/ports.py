"""The ports the core depends on. Adapters implement them; agent/testing ships the fakes
and the contract suites every adapter runs.

- ``Clock``: the time.
- ``MailProvider``: one mailbox through one channel (async: every real one is network or
  file I/O).
- ``TaskBoard``: where humans see and move tasks.
- Storage, one role per aggregate (synchronous: short transactions on an embedded or pooled
  database): ``Registry``, ``RunLedger``, ``Claims``, ``Tasks``, ``SendLedger``, ``Drafts``,
  ``Proposals``, ``Health``, ``Inspect``; ``Store`` is all of them on one database, and
  ``EmbeddedStore`` a store that is the task board too.
- ``Vault``: secrets for managed login.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Sequence
from datetime import datetime
from typing import Protocol, runtime_checkable

from agent.domain.dispositions import Disposition
from agent.domain.execution import ExecutionRecord, ExecutionState
from agent.domain.mail import (
    Handover,
    MessageBody,
    OutgoingMessage,
    ProviderHealth,
    ScannedMessage,
    SendResult,
    StoredCopy,
)
from agent.domain.records import (
    Binding,
    ClaimRequest,
    ClaimResult,
    DraftRecord,
    Escalation,
    EscalationDraft,
    HealthRecord,
    LearningProposal,
    ReportRequest,
    SendIntent,
    SendRecord,
    TaskAmendment,
    TaskDraft,
    WorkspaceRow,
)
from agent.domain.run import LedgerEntry, OpenRun, Reconciliation
from agent.domain.states import TaskState
from agent.domain.task import Task


class Clock(Protocol):
    def now(self) -> datetime:
        """The current time, timezone-aware (UTC)."""
        ...


@runtime_checkable
class MailProvider(Protocol):
    """One mailbox at one provider. It normalizes and moves mail; it decides nothing.

    A provider never stores workflow state: no labels, flags, folders or moves.
    """

    @property
    def provider(self) -> str: ...

    @property
    def mailbox_id(self) -> str: ...

    def scan(self) -> AsyncIterator[ScannedMessage]:
        """Every message currently in the inbox, normalized to the canonical envelope."""
        ...

    async def fetch_body(self, body_ref: str) -> MessageBody: ...

    async def prepare(self, message: OutgoingMessage) -> Handover:
        """The exact form this channel would hand ``message`` over in (MIME bytes, and any
        recipient lists it passes beside them). Nothing is sent."""
        ...

    async def send(self, handover: Handover) -> SendResult:
        """Hand over exactly ``handover`` (which the core has checked against the plan),
        inside the original thread. ``delivered`` says whether it reached anyone."""
        ...

    async def read_back(self, internet_message_id: str) -> StoredCopy | None:
        """The provider's stored copy of a sent message, or None if it has none."""
        ...

    async def health(self) -> ProviderHealth: ...


class TaskBoard(Protocol):
    """Where humans see tasks and move them. The embedded store's task table is the default
    board; a project tool's board (Asana, Jira) would be another adapter of this port."""

    def get_task(self, task_id: str) -> Task | None: ...

    def list_queue(self, workspace_id: str) -> list[Task]:
        """The workspace's non-terminal tasks, oldest received first."""
        ...

    def transition_task(
        self, task_id: str, target: TaskState, evidence: str, now: datetime
    ) -> Task: ...


# -- storage, one role per aggregate --------------------------------------------------------
# A service depends on the roles it uses (agent/storage implements them all on SQLite and
# PostgreSQL; agent/testing/storage ships one contract suite per role).


class Registry(Protocol):
    """Registered workspaces and the mailboxes each binds."""

    def register_workspace(self, row: WorkspaceRow, bindings: Sequence[Binding]) -> None: ...
    def update_workspace(self, row: WorkspaceRow, bindings: Sequence[Binding]) -> None: ...
    def get_workspace(self, workspace_id: str) -> WorkspaceRow | None: ...
    def list_workspaces(self) -> list[WorkspaceRow]: ...
    def bindings_for_mailbox(self, provider: str, mailbox_id: str) -> list[Binding]: ...


class RunLedger(Protocol):
    """Runs, the items each scanned and the one disposition each item got."""

    def start_run(
        self,
        run_id: str,
        scope: str,
        holder: str,
        started_at: datetime,
        lease_expires_at: datetime | None = None,
    ) -> None: ...
    def renew_run(self, run_id: str, holder: str, lease_expires_at: datetime) -> bool:
        """Extend the holder's lease on its open run; False if the run is no longer its
        own open run (another worker reconciled it after the lease ran out)."""
        ...

    def unreconciled_runs(self, scope: str) -> list[OpenRun]:
        """The scope's runs that were never reconciled, oldest first."""
        ...

    def record_scanned(self, entries: Sequence[LedgerEntry], now: datetime) -> None: ...
    def record_disposition(
        self, run_id: str, item_ref: str, disposition: Disposition, detail: str, now: datetime
    ) -> None: ...
    def record_dispositions(
        self, run_id: str, decided: Sequence[tuple[str, Disposition, str]], now: datetime
    ) -> None: ...
    def ledger(self, run_id: str) -> list[LedgerEntry]: ...
    def reconcile(self, run_id: str, now: datetime) -> Reconciliation: ...
    def reconcile_stale(
        self, run_id: str, now: datetime, holder_alive: Callable[[str], bool]
    ) -> Reconciliation | None:
        """Reconcile the run if, under its lock, it is still open and stale (its holder is
        provably dead or its lease ran out); else None."""
        ...

    def list_runs(self) -> list[str]: ...
    def run_summary(self, run_id: str) -> Reconciliation | None: ...


class Claims(Protocol):
    """Claims and execution records: one holder per occurrence, and what its claim wrote
    (the thread's task, or an escalation for an item no workspace can claim)."""

    def claim(  # a lost claim writes nothing; its caller records the claim-race disposition
        self,
        request: ClaimRequest,
        draft: TaskDraft | EscalationDraft,
        now: datetime,
        holder_alive: Callable[[str], bool],
    ) -> ClaimResult: ...
    def report(self, request: ReportRequest, now: datetime) -> ExecutionRecord: ...
    def get_execution(self, key: str) -> ExecutionRecord | None: ...
    def get_executions(self, keys: Sequence[str]) -> dict[str, ExecutionRecord]:
        """The execution records of those keys that have one."""
        ...

    def list_executions(self, state: ExecutionState | None = None) -> list[ExecutionRecord]: ...
    def list_escalations(self, scope: str | None = None) -> list[Escalation]: ...


class Tasks(Protocol):
    """Task records: one per verified thread, changed by claims' reports and amendments."""

    def get_task(self, task_id: str) -> Task | None: ...
    def task_for_thread(self, work_key: str) -> Task | None: ...
    def list_tasks(self, workspace_id: str) -> list[Task]: ...
    def amend_task(self, task_id: str, amendment: TaskAmendment, now: datetime) -> Task:
        """Apply one amendment under the task's row lock (refused, changing nothing, when
        the task's state does not allow it)."""
        ...

    def task_events(self, task_id: str) -> list[tuple[datetime, TaskState, str]]: ...


class SendLedger(Protocol):
    """Every outbound message, ledgered before the provider is asked."""

    def begin_send(self, intent: SendIntent, now: datetime, cap: int | None = None) -> SendRecord:
        """Ledger an outbound message before the provider is asked. Returns the existing
        record when the key is already ledgered (``created`` False), or a REFUSED record,
        storing nothing, when an automated send would exceed ``cap`` messages to one
        recipient in 24 hours."""
        ...

    def take_over_send(self, key: str, previous_holder: str, holder: str, now: datetime) -> bool:
        """Make ``holder`` the sender of an unfinished intent still held by
        ``previous_holder`` (compare-and-set: of several workers, one wins)."""
        ...

    def complete_send(
        self, key: str, provider_message_id: str, detail: str, now: datetime
    ) -> SendRecord: ...
    def get_send(self, key: str) -> SendRecord | None: ...
    def list_sends(self, workspace_id: str) -> list[SendRecord]: ...


class Drafts(Protocol):
    """Drafts the server rendered, kept by id."""

    def save_draft(self, draft: DraftRecord) -> DraftRecord:
        """Keep a rendered draft (saving the same draft id again keeps the first)."""
        ...

    def get_draft(self, draft_id: str) -> DraftRecord | None: ...


class Proposals(Protocol):
    """The operator's queue of learning proposals."""

    def add_proposal(self, proposal: LearningProposal) -> LearningProposal:
        """Queue a proposal (the same proposal id again returns the queued one)."""
        ...

    def list_proposals(self, workspace_id: str) -> list[LearningProposal]: ...


class Health(Protocol):
    """Health events operators watch (a failing provider, an overdue reminder)."""

    def record_health(self, key: str, detail: str, now: datetime) -> None: ...
    def list_health(self) -> list[HealthRecord]: ...


class Inspect(Protocol):
    """What contract suites, benchmarks and operators read of the database itself."""

    def schema_version(self) -> int: ...
    def integrity_check(self) -> str: ...
    def counts(self) -> dict[str, int]: ...


class Store(
    Registry, RunLedger, Claims, Tasks, SendLedger, Drafts, Proposals, Health, Inspect, Protocol
):
    """Every storage role on one database: what a backend implements and the composition
    root opens. Services ask for the roles they use, never for this."""

    def close(self) -> None: ...


class EmbeddedStore(Store, TaskBoard, Protocol):
    """A store whose own task table is the task board: the embedded default, and what the
    SQLite and PostgreSQL backends are."""


class Vault(Protocol):
    """Secrets for managed login. Values never leave the implementation's package."""

    def has_secret(self, workspace_id: str, name: str) -> bool: ...
