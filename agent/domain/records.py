"""What services ask the store to write, and what the store answers."""

from __future__ import annotations

from datetime import datetime, timedelta
from enum import StrEnum

from pydantic import BaseModel, ConfigDict

from agent.domain.approval import ApprovalDecision, ApprovalRequest
from agent.domain.dispositions import Disposition, GateKind
from agent.domain.execution import ClaimOutcome, ExecutionRecord
from agent.domain.mail import Marker
from agent.domain.states import TaskState
from agent.domain.task import CommunicationState, Gate, MessageRef, NextAction, Task


class ClaimRequest(BaseModel):
    """``outloop.execution.claim`` with its complete live contract."""

    model_config = ConfigDict(frozen=True)

    key: str
    service: str
    holder: str
    run_id: str
    item_ref: str
    lease_seconds: float = 300.0


class TaskDraft(BaseModel):
    """What the claim holder creates, or merges into the thread's existing task."""

    model_config = ConfigDict(frozen=True)

    task_id: str
    occurrence_key: str
    """The claimed occurrence; a task it creates records it as ``created_by``."""
    workspace_id: str
    work_key: str
    provider: str
    mailbox_id: str
    provider_thread_id: str
    link_message_ids: tuple[str, ...]
    """In-Reply-To and References: exact secondary linkage to an existing task."""
    title: str
    original_subject: str
    received_at: datetime
    message: MessageRef
    sender_identity: str
    sender_side: str | None
    client_send_policy: str
    project_id: str | None
    intake_location_id: str | None
    next_action: NextAction
    package_version: str


class EscalationDraft(BaseModel):
    """An item no workspace can own, escalated to an unresolved queue."""

    model_config = ConfigDict(frozen=True)

    scope: str
    queue: str
    assignee: str
    reason: str
    provider: str
    mailbox_id: str
    item_ref: str


class ClaimResult(BaseModel):
    model_config = ConfigDict(frozen=True)

    outcome: ClaimOutcome
    execution: ExecutionRecord
    task: Task | None = None
    task_created: bool = False
    taken_over: bool = False


class TaskUpdate(BaseModel):
    """The holder's report of what the item's handling did to its task."""

    model_config = ConfigDict(frozen=True)

    state: TaskState | None = None
    resume_on_inbound: bool = False
    """A follow-up in the thread: resume the task from whatever state it is in when the
    report is written (a client reply resumes WAITING_CLIENT), instead of a fixed target.
    The next action is then replaced only if the task actually resumed."""
    sole_message: str | None = None
    """Apply ``state`` only while this provider message is the task's only message: a
    verdict about one message (automated noise) never closes a thread that meanwhile
    gained a real one."""
    add_gates: tuple[Gate, ...] = ()
    next_action: NextAction | None = None
    provisional_basis: dict[str, str] | None = None
    remaining_work: str | None = None
    approval_decision: ApprovalDecision | None = None
    """An approver's reply in the task's approval thread, as the server judged it. It moves
    a task waiting for approval of that very draft, and is recorded either way."""
    requester: str | None = None
    """A verified internal requester whose loop must be closed before release."""
    sender_name: str | None = None
    attachment_names: tuple[str, ...] | None = None
    content_flags: tuple[str, ...] = ()
    communication_state: CommunicationState | None = None


class TaskAmendment(BaseModel):
    """A change to a task outside a claim's report (an approval request sent, a requester's
    loop closed, a message class set). ``event`` names it uniquely; it is the task event's
    evidence."""

    model_config = ConfigDict(frozen=True)

    event: str
    expect_states: tuple[TaskState, ...] = ()
    """Refuse unless the task is in one of these states (empty: any state)."""
    state: TaskState | None = None
    add_gates: tuple[Gate, ...] = ()
    remove_gate_kinds: tuple[GateKind, ...] = ()
    approval_request: ApprovalRequest | None = None
    communication_state: CommunicationState | None = None
    requester_loop_closed: bool | None = None
    message_class: str | None = None
    next_action: NextAction | None = None
    sent_message: MessageRef | None = None
    """A message the workspace sent for the task; indexed so replies to it link here."""
    remaining_work: str | None = None
    sent_message_id: str | None = None
    """The Message-ID of the client reply sent for the task."""
    recipients: tuple[str, ...] | None = None
    """Who that reply went to."""
    readback_evidence: str | None = None
    """What the read-back of the provider's stored copy found."""
    approval_decision: ApprovalDecision | None = None
    """An approver's decision given outside mail (the console): recorded and applied with
    the same rules as an approver's reply."""


class SendState(StrEnum):
    """Where one outbound message is. The stored values of the first two are the names the
    ledger used before the channel was recorded, so old rows read as they were."""

    PREPARED = "intent"
    """Ledgered, never handed to a channel (or a person said it was not sent)."""
    ATTEMPTING = "attempting"
    """Being handed to ``channel`` now; if its worker dies here the outcome is unknown."""
    UNCERTAIN = "uncertain"
    """Handed over, and the answer was lost: settled only from the sent copies."""
    WITH_PERSON = "with_person"
    """The channel keeps no sent copy to settle it from: a person decides (``detail``)."""
    CONFIRMED = "sent"
    """The channel accepted it, or its sent copy (or a person) proved it went out."""
    REFUSED = "refused"
    """Never recorded: the per-recipient cap (or a gate) held the send back this time."""


UNFINISHED_SENDS = frozenset({SendState.PREPARED, SendState.ATTEMPTING, SendState.UNCERTAIN})
"""States from which the send ledger may still move a send to a channel."""


class SendAttempt(BaseModel):
    """One handover of a send to a channel, recorded before the channel is asked."""

    model_config = ConfigDict(frozen=True)

    channel: str
    marker: Marker | None
    """None only for a channel that keeps no sent copy (nothing could be searched for)."""
    keeps_sent_copy: bool
    sent_copy_latency: timedelta
    """How long the channel's sent copy may take to become searchable."""


class SendEvent(BaseModel):
    """One audited change of a send (who, when, what, on what evidence)."""

    model_config = ConfigDict(frozen=True)

    key: str
    at: datetime
    state: SendState
    actor: str
    detail: str


class SendIntent(BaseModel):
    """One outbound message, ledgered before it is handed to the provider."""

    model_config = ConfigDict(frozen=True)

    key: str
    workspace_id: str
    kind: str
    task_id: str | None
    internet_message_id: str
    recipients: tuple[str, ...]
    """To, then Cc, in order."""
    automated: bool
    holder: str = ""
    """The worker sending it (filled in by the sending service)."""
    cc: tuple[str, ...] = ()
    """The recipients that were Cc (the last ones of ``recipients``)."""
    marker: Marker | None = None
    """The mark the channel said its sent copy will carry (from ``prepare``)."""


class SendRecord(BaseModel):
    model_config = ConfigDict(frozen=True)

    key: str
    workspace_id: str
    kind: str
    task_id: str | None
    internet_message_id: str
    recipients: tuple[str, ...]
    holder: str = ""
    state: SendState
    detail: str = ""
    created_at: datetime
    sent_at: datetime | None = None
    provider_message_id: str | None = None
    created: bool = False
    """True when this call recorded the intent (False: the key was already ledgered)."""
    cc: tuple[str, ...] = ()
    marker: Marker | None = None
    """The mark of the last attempt's copy (or the one planned, before any attempt)."""
    channel: str = ""
    """The channel of the last attempt ("" before any)."""
    attempts: int = 0
    attempted_at: datetime | None = None
    uncertain_at: datetime | None = None
    """When the last attempt's outcome was found lost (its worker returned without an
    answer, or was found dead): no acceptance of that attempt comes later."""
    keeps_sent_copy: bool = True
    sent_copy_latency: timedelta = timedelta(0)
    """The last attempt's channel's declared wait until its sent copy is searchable."""
    refused: tuple[tuple[str, str], ...] = ()
    """Recipients the channel refused (address, reason): a partial delivery."""
    resend_allowed: bool = False
    """A person settled the last attempt as not sent: one more attempt may go without a
    search of the sent copies."""

    @property
    def to(self) -> tuple[str, ...]:
        return self.recipients[: len(self.recipients) - len(self.cc)]

    @property
    def partial(self) -> bool:
        """Confirmed, but some recipients were refused."""
        return self.state is SendState.CONFIRMED and bool(self.refused)


class WorkspaceRow(BaseModel):
    model_config = ConfigDict(frozen=True)

    workspace_id: str
    label: str
    context_path: str
    context_sha256: str
    registered_at: datetime
    updated_at: datetime
    # The registered context itself, so every machine sharing the store reads the same one
    # (None only for rows registered before the store kept it; then context_path is read).
    context_text: str | None = None
    # The schedule's minute, chosen once at registration (None for rows registered before
    # schedules were kept), its expression, and its derivation (a MinuteChoice as JSON).
    schedule_minute: int | None = None
    schedule_expression: str | None = None
    schedule_derivation: str | None = None
    schedule_shared: bool = False
    """Every minute was held when it was chosen: it shares its derived minute."""


class Binding(BaseModel):
    model_config = ConfigDict(frozen=True)

    workspace_id: str
    provider: str
    mailbox_id: str
    shared: bool


class Escalation(BaseModel):
    model_config = ConfigDict(frozen=True)

    occurrence_key: str
    scope: str
    queue: str
    assignee: str
    reason: str
    provider: str
    mailbox_id: str
    item_ref: str
    created_at: datetime


class Lease(BaseModel):
    """Who holds a named lease (a workspace's dispatcher, a shared mailbox's scan) and until
    when: another holder may take it only once it expired or its holder is proven dead."""

    model_config = ConfigDict(frozen=True)

    name: str
    holder: str
    acquired_at: datetime
    renewed_at: datetime
    expires_at: datetime


class DispatcherRow(BaseModel):
    """A dispatcher process as it last reported itself."""

    model_config = ConfigDict(frozen=True)

    holder: str
    workspace_id: str
    role: str
    """``active`` (holds the lease), ``standby``, ``one-shot`` (one cycle, as a host timer
    runs it) or ``stopped``."""
    executable: str
    install: str
    version: str
    started_at: datetime
    seen_at: datetime
    detail: str = ""


class CycleRow(BaseModel):
    """One scheduled cycle of a workspace: who ran it, and whether it finished."""

    model_config = ConfigDict(frozen=True)

    workspace_id: str
    scheduled_for: datetime
    holder: str
    started_at: datetime
    finished_at: datetime | None = None
    run_id: str | None = None
    outcome: str | None = None


class HealthRecord(BaseModel):
    model_config = ConfigDict(frozen=True)

    key: str
    detail: str
    count: int
    recorded_at: datetime


class ReportRequest(BaseModel):
    model_config = ConfigDict(frozen=True)

    key: str
    holder: str
    run_id: str
    item_ref: str
    disposition: Disposition
    detail: str = ""
    task_update: TaskUpdate | None = None
    retry_at: datetime | None = None
    """Set when the work hit a transient failure: the execution record becomes RETRY_PENDING
    (claimable again from this time on) and the task BLOCKED_RETRY_PENDING. Retry state lives
    on the execution record only."""


class DraftRecord(BaseModel):
    """A draft the server rendered for a task. ``rendered`` is the rendering's JSON; the
    digest covers its subject, HTML and text, and an approval binds to it."""

    model_config = ConfigDict(frozen=True)

    draft_id: str
    task_id: str
    workspace_id: str
    digest: str
    rendered: str
    created_at: datetime


class ProposalState(StrEnum):
    QUEUED = "queued"
    ACCEPTED = "accepted"
    REJECTED = "rejected"


class LearningProposal(BaseModel):
    """A change to a Workspace Context an agent proposed, queued for an operator. Its text
    came from an agent that reads untrusted mail: it is shown to the operator, never applied."""

    model_config = ConfigDict(frozen=True)

    proposal_id: str
    workspace_id: str
    kind: str
    summary: str
    detail: str
    evidence: tuple[str, ...] = ()
    state: ProposalState = ProposalState.QUEUED
    submitted_at: datetime
    decided_by: str | None = None
    """The operator who accepted or rejected it."""
    decided_at: datetime | None = None
    decision_note: str | None = None
    """Why it was rejected, or what its acceptance wrote into the context."""
    created: bool = False
    """True when this call queued it (False: the same proposal was already queued)."""
