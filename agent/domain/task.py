"""The durable task record (seed 000, section 5) and the task title rule."""

from __future__ import annotations

import re
import secrets
import unicodedata
from collections.abc import Collection
from datetime import datetime
from enum import StrEnum

from pydantic import BaseModel, ConfigDict, Field

from agent.domain.approval import ApprovalDecision, ApprovalRequest
from agent.domain.dispositions import GateKind
from agent.domain.envelope import Address, OccurrenceScope
from agent.domain.headers import msg_id, references_for
from agent.domain.states import TaskState

# Reply and forward prefixes in common languages: English, German, French, Spanish,
# Portuguese, Italian, Dutch, Nordic, Polish, Turkish, Hebrew, Arabic, Greek, Chinese, Japanese.
_PREFIXES = (
    r"re",
    r"fw",
    r"fwd",
    r"aw",
    r"wg",
    r"tr",
    r"rv",
    r"enc",
    r"res",
    r"r",
    r"i",
    r"sv",
    r"vs",
    r"antw",
    r"doorst",
    r"odp",
    r"pd",
    r"ynt",
    r"ilt",
    r"ynt",
    r"השב",
    r"תשובה",
    r"הועבר",
    r"העבר",
    r"رد",
    r"إعادة توجيه",
    r"تحويل",
    r"απ",
    r"σχετ",
    r"πρθ",
    r"回复",
    r"答复",
    r"转发",
    r"回覆",
    r"轉寄",
)
_PREFIX_RE = re.compile(
    r"^\s*(?:\[[^\]]{0,40}\]\s*)?(?:"
    + "|".join(_PREFIXES)
    + r")\s*(?:\[\d+\]|\(\d+\))?\s*[:：]\s*",  # noqa: RUF001 - the fullwidth colon is how CJK mail clients write the reply colon
    re.IGNORECASE,
)
_BRACKET_TAG_ONLY = re.compile(r"^\s*\[(?:fwd?|re)\s*:[^\]]*\]\s*$", re.IGNORECASE)


def new_task_id(now: datetime) -> str:
    """A task id that sorts by creation time (so new tasks append to the store's index)."""
    return f"task-{int(now.timestamp() * 1000):012x}-{secrets.token_hex(6)}"


def normalize_subject(subject: str) -> str:
    """The task title: reply/forward prefixes stripped, whitespace folded.

    Only the title is normalized; the exact original subject is kept beside it.
    """
    text = unicodedata.normalize("NFC", subject)
    text = " ".join(text.split())
    while True:
        stripped = _PREFIX_RE.sub("", text, count=1)
        if stripped == text:
            break
        text = stripped.strip()
    if _BRACKET_TAG_ONLY.match(text):
        text = text.strip()[1:-1]
    return text.strip() or "(no subject)"


class CommunicationState(StrEnum):
    """Where the task's outward communication stands, apart from its work state."""

    NONE = "none"
    INTERNAL_UPDATE_SENT = "internal_update_sent"
    ACK_SENT = "ack_sent"
    DRAFT_AWAITING_APPROVAL = "draft_awaiting_approval"
    CLIENT_REPLY_HANDED_OVER = "client_reply_handed_over"
    """A client reply went to the channel; it counts as sent once its copy is read back."""
    CLIENT_REPLY_SENT = "client_reply_sent"
    AWAITING_CLIENT = "awaiting_client"


class ReadinessTier(StrEnum):
    """Whether the task's next action can run now."""

    READY = "ready"
    PENDING_GATES = "pending_gates"
    BLOCKED = "blocked"
    DONE = "done"


class Gate(BaseModel):
    model_config = ConfigDict(frozen=True)

    kind: GateKind
    owner: str
    since: datetime
    reason: str


class NextAction(BaseModel):
    model_config = ConfigDict(frozen=True)

    description: str
    owner: str


class MessageRef(BaseModel):
    """One message linked to the task (inbound or sent)."""

    model_config = ConfigDict(frozen=True)

    provider_message_id: str
    internet_message_id: str | None = None
    direction: str = "inbound"
    received_at: datetime
    sender: str
    body_ref: str | None = None
    """Where the provider keeps the body (None for sent messages and older records)."""
    in_reply_to: str | None = None
    references: tuple[str, ...] = ()
    """The message's own threading headers: a reply's References are built from them."""
    attachment_refs: tuple[str, ...] = ()
    """The references its attachments are fetched by (a reply may attach them)."""

    def reply_headers(self) -> tuple[str | None, tuple[str, ...]]:
        """In-Reply-To and References of a reply to this message (RFC 5322 section 3.6.4)."""
        return msg_id(self.internet_message_id), references_for(
            self.internet_message_id, self.references, self.in_reply_to
        )


class Task(BaseModel):
    """The human-visible record of one verified thread's work."""

    model_config = ConfigDict(frozen=True)

    task_id: str
    workspace_id: str
    work_key: str
    origin: str = "mail"
    provider: str
    mailbox_id: str
    provider_thread_id: str
    title: str
    original_subject: str
    occurrence_scope: OccurrenceScope = OccurrenceScope.MESSAGE
    received_at: datetime
    first_seen_at: datetime
    updated_at: datetime
    state: TaskState
    communication_state: CommunicationState = CommunicationState.NONE
    readiness_tier: ReadinessTier = ReadinessTier.READY
    cycle_key: str | None = None
    sender_identity: str
    sender_side: str | None = None
    client_send_policy: str
    project_management_provider: str = "embedded"
    project_id: str | None = None
    intake_location_id: str | None = None
    open_gates: tuple[Gate, ...] = ()
    approval_evidence: tuple[str, ...] = ()
    recipients: tuple[Address, ...] = ()
    sent_message_id: str | None = None
    readback_evidence: str | None = None
    execution_key: str | None = None
    execution_result: str | None = None
    execution_outcome: str | None = None
    remaining_work: str = ""
    next_action: NextAction
    provisional_basis: dict[str, str] = Field(
        default_factory=dict[str, str],
        description="provisional values for context gaps; never official KPIs",
    )
    messages: tuple[MessageRef, ...] = ()
    created_by: str = ""
    """The occurrence key whose claim created the task (a takeover of that claim is still
    the task's first handling, not a follow-up)."""
    blocked_by: tuple[str, ...] = ()
    """The execution keys whose retries block the task; the retry state itself lives on
    those execution records."""
    package_version: str = ""
    """The Outloop that created the task; the installed pack and its drift are read live."""
    state_since: datetime | None = None
    """When the task entered its current state (reminders count business days from it)."""
    message_class: str | None = None
    """The class of the work's reply, set by classification; standing approvals cover a
    message class exactly."""
    approval_requests: tuple[ApprovalRequest, ...] = ()
    approval_decisions: tuple[ApprovalDecision, ...] = ()
    requester: str | None = None
    """A verified internal requester, whose loop is closed before the occurrence is released."""
    requester_loop_closed: bool = False
    sender_name: str = ""
    """The sender's display name as it may be shown (control characters written out)."""
    attachment_names: tuple[str, ...] = ()
    content_flags: tuple[str, ...] = ()
    """What in the untrusted display fields could mislead a reader; shown with them."""

    def latest_inbound(self, senders: Collection[str] = ()) -> MessageRef | None:
        """The thread's latest inbound message with a Message-ID (from one of ``senders``
        when any are given). An approver's reply belongs to the approval thread, not to the
        thread being answered."""
        approval_thread = {d.evidence_message_id for d in self.approval_decisions}
        wanted = {s.strip().lower() for s in senders}
        for message in reversed(self.messages):
            if (
                message.direction == "inbound"
                and message.internet_message_id
                and message.internet_message_id not in approval_thread
                and (not wanted or message.sender in wanted)
            ):
                return message
        return None

    def answered_message(self, recipients: Collection[str]) -> MessageRef | None:
        """The message a reply to ``recipients`` answers: the thread's latest message from
        one of them, else the latest from the task's requester (its internal requester, or
        whoever opened it). A message from anyone else in the thread is never answered."""
        return self.latest_inbound(recipients) or self.latest_inbound(
            (self.requester or self.sender_identity,)
        )


class QueueEntry(BaseModel):
    """A task as a queue shows it: read from its record without the rest (a page of
    thousands reads only this)."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    task_id: str
    workspace_id: str
    state: TaskState
    state_since: datetime | None = None
    received_at: datetime
    open_gates: tuple[Gate, ...] = ()
    next_action: NextAction
    title: str
    sender_identity: str
    sender_name: str = ""
    content_flags: tuple[str, ...] = ()
