"""The ports the core depends on. Adapters implement them; agent/testing ships the fakes
and the contract suites every adapter runs.

- ``Clock``: the time.
- ``MailProvider``: one mailbox through one channel (async: every real one is network or
  file I/O), with the capabilities it declares.
- ``TaskBoard``: where humans see and move tasks.
- Storage, one role per aggregate (synchronous: short transactions on an embedded or pooled
  database): ``Registry``, ``RunLedger``, ``ThreadAliases``, ``Claims``, ``Tasks``,
  ``SendLedger``, ``Drafts``, ``Proposals``, ``Health``, ``Inspect``; ``Store`` is all of
  them on one database, and ``EmbeddedStore`` a store that is the task board too.
- ``Credentials`` and ``Vault``: secrets for managed login, as opaque ``Secret`` values.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime, timedelta
from typing import Protocol, runtime_checkable

from agent.domain.dispositions import Disposition
from agent.domain.execution import ExecutionRecord, ExecutionState
from agent.domain.mail import (
    AttachmentData,
    Capabilities,
    ChangePage,
    Handover,
    Marker,
    MessageBody,
    OutgoingMessage,
    ProviderHealth,
    SendResult,
    StoredCopy,
)
from agent.domain.records import (
    Binding,
    ClaimRequest,
    ClaimResult,
    CycleRow,
    DispatcherRow,
    DraftRecord,
    Escalation,
    EscalationDraft,
    HealthRecord,
    LearningProposal,
    Lease,
    ProposalState,
    ReportRequest,
    SendAttempt,
    SendEvent,
    SendIntent,
    SendRecord,
    SendState,
    TaskAmendment,
    TaskDraft,
    WorkspaceRow,
)
from agent.domain.run import (
    LedgerEntry,
    MailboxCursor,
    OpenRun,
    Reconciliation,
    RunRow,
    ThreadLink,
)
from agent.domain.secrets import CredentialRef, Secret
from agent.domain.states import TaskState
from agent.domain.task import QueueEntry, Task


class Clock(Protocol):
    def now(self) -> datetime:
        """The current time, timezone-aware (UTC)."""
        ...


@runtime_checkable
class MailProvider(Protocol):
    """One mailbox through one channel. It normalizes and moves mail; it decides nothing.

    ``provider`` is the mailbox's mail system (google, microsoft, imap, maildir), the same
    through every channel; ``capabilities`` say what this channel can do (an adapter
    implements everything, and declares what its provider cannot). A channel never stores
    workflow state: no labels, flags, keywords, folders or moves, except what sending
    itself leaves (the sent copy). Failures are ``ProviderError`` subclasses.
    """

    @property
    def provider(self) -> str: ...

    @property
    def mailbox_id(self) -> str: ...

    @property
    def capabilities(self) -> Capabilities: ...

    async def changes(self, cursor: str | None) -> ChangePage:
        """One page of the inbox's messages that arrived since ``cursor`` (None: from the
        start), normalized to the canonical envelope. Raises ``CursorExpired`` when the
        cursor can no longer be used (the caller reads again from None)."""
        ...

    async def fetch_body(self, body_ref: str) -> MessageBody: ...

    async def fetch_attachment(self, ref: str) -> AttachmentData:
        """An inbound attachment's bytes, by the reference its envelope gave."""
        ...

    async def prepare(self, message: OutgoingMessage) -> Handover:
        """The exact form this channel would hand ``message`` over in (MIME bytes, any
        recipient lists it passes beside them, and the marker its sent copy will carry).
        Nothing is sent. A reply goes to the parent ``message.in_reply_to`` names, to
        exactly the recipients ``message`` lists."""
        ...

    async def send(self, handover: Handover) -> SendResult:
        """Hand over exactly ``handover`` (which the core has checked against the plan),
        inside the original thread. ``OutcomeUnknown`` when it was handed over and the
        answer was lost."""
        ...

    async def find_sent(self, marker: Marker) -> StoredCopy | None:
        """The sent copy carrying ``marker`` as the provider stores it (the read-back), or
        None if no copy is searchable now."""
        ...

    async def health(self) -> ProviderHealth: ...

    async def aclose(self) -> None:
        """Release the channel's connections (calling it twice is harmless)."""
        ...


class TaskBoard(Protocol):
    """Where humans see tasks and move them. The embedded store's task table is the default
    board; a project tool's board (Asana, Jira) would be another adapter of this port."""

    def get_task(self, task_id: str) -> Task | None: ...

    def list_queue(self, workspace_id: str) -> list[Task]:
        """The workspace's non-terminal tasks, oldest received first."""
        ...

    def list_queue_entries(self, workspace_id: str) -> list[QueueEntry]:
        """The same queue, each task read only as far as a queue shows it."""
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
    def set_schedule(self, row: WorkspaceRow) -> None:
        """Record the row's schedule fields (for a row registered before schedules)."""
        ...

    def held_minutes(self) -> dict[int, str]:
        """Each schedule minute a workspace holds alone, and which workspace."""
        ...


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

    def record_scanned(
        self, entries: Sequence[LedgerEntry], now: datetime, cursor: MailboxCursor | None = None
    ) -> None:
        """Record scanned items, and advance ``cursor`` past them in the same transaction."""
        ...

    def get_cursor(self, scope: str, provider: str, mailbox_id: str, channel: str) -> str | None:
        """The scope's persisted cursor for the mailbox through the channel (None: none)."""
        ...

    def clear_cursor(self, scope: str, provider: str, mailbox_id: str, channel: str) -> None:
        """Forget the cursor (it expired: the next read starts from the beginning)."""
        ...

    def run_holder(self, run_id: str) -> OpenRun | None:
        """The run's holder and lease while it is open; None once reconciled or unknown."""
        ...

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
    def recent_runs(self, scope: str, limit: int = 20) -> list[RunRow]:
        """The scope's latest runs, newest first."""
        ...

    def run_summary(self, run_id: str) -> Reconciliation | None: ...


class ThreadAliases(Protocol):
    """Threads of mail systems whose channels show no common thread id: a thread is named
    by an alias kept per mailbox, reached from any Message-ID of the thread."""

    def resolve_thread(self, provider: str, mailbox_id: str, link: ThreadLink) -> str:
        """The alias of the thread ``link.message_id`` belongs to: its own alias if the id is
        this message's (the same ``identity``, or only referenced so far); else the alias
        of the first of ``link.related`` that has one and is no reused id; else
        ``link.if_reused`` when another message carries this id or the related ids it names
        are reused (a reused id is nobody's parent), else ``link.proposed``. The message (and
        every related id without one) keeps that alias; of concurrent callers the first to
        record wins."""
        ...

    def resolve_threads(
        self, provider: str, mailbox_id: str, links: Sequence[ThreadLink]
    ) -> list[str]:
        """``resolve_thread`` of each link, in order, in one transaction (a page of a
        mailbox's changes): each link sees what the ones before it recorded."""
        ...


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
    def reclaimable(
        self, scope: str, now: datetime, holder_alive: Callable[[str], bool]
    ) -> list[LedgerEntry]:
        """The scope's unfinished occurrences a claim may take over now (a retry that is
        due, a claim whose lease ran out or whose holder is dead), each as the item its last
        claim was made for: what a run takes up again, since no mailbox read brings them
        back."""
        ...

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

    def take_over_send(
        self,
        key: str,
        previous_holder: str,
        holder: str,
        now: datetime,
        state: SendState | None = None,
        attempts: int | None = None,
    ) -> bool:
        """Make ``holder`` the sender of an unfinished send still held by
        ``previous_holder`` and, when given, still in ``state`` after ``attempts`` attempts
        (compare-and-set on what the taker decided from: of several workers, one wins, and
        a holder that moved on since keeps its send)."""
        ...

    def attempt_send(
        self, key: str, holder: str, attempt: SendAttempt, now: datetime
    ) -> SendRecord | None:
        """Record that ``holder`` hands the send to ``attempt.channel`` now (ATTEMPTING),
        from PREPARED, or from UNCERTAIN once the caller proved no copy exists. None, and
        nothing written, when the send is not the holder's or not in one of those states."""
        ...

    def mark_uncertain(self, key: str, holder: str, detail: str, now: datetime) -> SendRecord:
        """The holder's attempt was handed over and its answer lost (UNCERTAIN)."""
        ...

    def complete_send(
        self,
        key: str,
        provider_message_id: str,
        detail: str,
        now: datetime,
        refused: Sequence[tuple[str, str]] = (),
    ) -> SendRecord:
        """The send went out (CONFIRMED); ``refused`` names recipients it did not reach."""
        ...

    def hand_to_person(self, key: str, reason: str, now: datetime) -> SendRecord:
        """No channel can settle the send: a person decides (WITH_PERSON)."""
        ...

    def settle_send(
        self, key: str, sent: bool, evidence: str, actor: str, now: datetime
    ) -> SendRecord:
        """A person's word on an unsettled send: sent (CONFIRMED), or not sent (PREPARED,
        allowing one more attempt). Audited with the evidence."""
        ...

    def send_events(self, key: str) -> list[SendEvent]:
        """Every recorded change of the send, oldest first."""
        ...

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
    def get_proposal(self, proposal_id: str) -> LearningProposal | None: ...
    def decide_proposal(
        self, proposal_id: str, state: ProposalState, by: str, note: str, at: datetime
    ) -> LearningProposal | None:
        """Accept or reject a queued proposal (compare-and-set on ``queued``); None when it
        is not queued (decided already, or unknown)."""
        ...

    def accept_proposal(
        self,
        proposal_id: str,
        by: str,
        note: str,
        at: datetime,
        row: WorkspaceRow,
        expect_sha256: str,
    ) -> LearningProposal | None:
        """In one transaction: accept the queued proposal and write ``row``'s context over
        the one whose digest is ``expect_sha256`` (its mailbox bindings unchanged). None
        when the proposal is not queued; InvalidRequest, nothing written, when the context
        is no longer that one."""
        ...


class Health(Protocol):
    """Health events operators watch (a failing provider, an overdue reminder)."""

    def record_health(self, key: str, detail: str, now: datetime) -> None: ...
    def list_health(self) -> list[HealthRecord]: ...


class Dispatch(Protocol):
    """Named leases, the dispatcher processes and the scheduled cycles they ran."""

    def take_lease(
        self, name: str, holder: str, now: datetime, ttl: timedelta, dead: str | None = None
    ) -> Lease | None:
        """Take or renew; None while another live holder keeps it (``dead``: a holder the
        caller proved dead, whose lease is taken before it expires)."""
        ...

    def get_lease(self, name: str) -> Lease | None: ...
    def release_lease(self, name: str, holder: str) -> None: ...
    def record_dispatcher(self, row: DispatcherRow) -> None: ...
    def list_dispatchers(self, workspace_id: str) -> list[DispatcherRow]: ...
    def start_cycle(
        self,
        workspace_id: str,
        scheduled_for: datetime,
        holder: str,
        now: datetime,
        dead: str | None = None,
    ) -> bool:
        """Start the cycle due then; False when it finished, or a live holder runs it."""
        ...

    def finish_cycle(
        self,
        workspace_id: str,
        scheduled_for: datetime,
        holder: str,
        now: datetime,
        run_id: str | None,
        outcome: str,
    ) -> None: ...
    def list_cycles(self, workspace_id: str, limit: int = 20) -> list[CycleRow]: ...


class Inspect(Protocol):
    """What contract suites, benchmarks and operators read of the database itself."""

    def schema_version(self) -> int: ...
    def integrity_check(self) -> str: ...
    def counts(self) -> dict[str, int]: ...


class Store(
    Registry,
    RunLedger,
    ThreadAliases,
    Claims,
    Tasks,
    SendLedger,
    Drafts,
    Proposals,
    Health,
    Dispatch,
    Inspect,
    Protocol,
):
    """Every storage role on one database: what a backend implements and the composition
    root opens. Services ask for the roles they use, never for this."""

    def close(self) -> None: ...


class EmbeddedStore(Store, TaskBoard, Protocol):
    """A store whose own task table is the task board: the embedded default, and what the
    SQLite and PostgreSQL backends are."""


class Credentials(Protocol):
    """Where an adapter's authentication call gets a secret. The core only passes
    references and opaque ``Secret`` values; it never unwraps one."""

    def secret(self, ref: CredentialRef) -> Secret:
        """The secret, or ``ContextError`` naming the missing reference (never a value)."""
        ...

    def has_secret(self, ref: CredentialRef) -> bool:
        """Whether a secret is stored for ``ref``, answered without reading its value."""
        ...


class Vault(Credentials, Protocol):
    """The operator's store of secrets (``outloop vault``). Values enter only from a hidden
    prompt or stdin and are never listed: the vault keeps an index of names only."""

    def set_secret(self, ref: CredentialRef, value: Secret) -> None: ...

    def delete_secret(self, ref: CredentialRef) -> bool:
        """Forget the secret; False when there was none."""
        ...

    def list_refs(self, workspace_id: str | None = None) -> list[CredentialRef]:
        """The stored references (of one workspace if given), sorted; never a value."""
        ...
