"""A small world for gate and approval tests: one workspace, its mailbox, a clock."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime
from itertools import count
from typing import Any

from agent.domain.envelope import Address, Envelope
from agent.domain.gates import DraftFacts, GateResult, draft_digest
from agent.domain.states import TaskState
from agent.domain.task import Task
from agent.ports import EmbeddedStore
from agent.providers import rfc822
from agent.rendering.render import RenderedMessage, render_message, reply_subject
from agent.services import approvals, gate_check, intake, workspaces
from agent.testing import FrozenClock, InMemoryProvider, make_envelope
from tests.conftest import context_yaml, run_intake

MAILBOX = "support@fabrikam.test"
CLIENT = "dana.levi@contoso.test"
APPROVER = "noa.bar@fabrikam.test"
COLLEAGUE = "eli.tal@fabrikam.test"

EXTRA_CONTACTS = """\
  - {address: eli.tal@fabrikam.test, name: Eli Tal, side: internal, roles: [analyst]}
"""


def with_colleague(text: str) -> str:
    """A context with an internal colleague who holds no approval role."""
    return text.replace("contacts:\n", "contacts:\n" + EXTRA_CONTACTS, 1)


SECOND_APPROVER = "maya.sade@fabrikam.test"
TWO_APPROVERS = with_colleague(context_yaml()).replace(
    "contacts:\n",
    "contacts:\n  - {address: maya.sade@fabrikam.test, name: Maya Sade, side: internal, "
    "roles: [approver]}\n",
    1,
)
"""The test context with the colleague and a second approver."""


@dataclass
class World:
    store: EmbeddedStore
    data_dir: workspaces.DataDir
    workspace_id: str
    clock: FrozenClock
    box: InMemoryProvider = field(default_factory=lambda: InMemoryProvider(MAILBOX))
    numbers: Any = field(default_factory=lambda: count(1))

    def deliver(
        self,
        *,
        sender: str,
        thread: int | str,
        sender_name: str = "",
        text: str = "",
        html: str | None = None,
        subject: str = "Quote request",
        in_reply_to: str | None = None,
        received_at: datetime | None = None,
        **changes: Any,
    ) -> Envelope:
        n = next(self.numbers)
        envelope = make_envelope(
            mailbox_id=MAILBOX,
            message_no=n,
            thread_no=0,
            sender=sender,
            subject=subject,
            in_reply_to=in_reply_to,
            received_at=received_at or self.clock.now(),
        )
        update: dict[str, Any] = {
            "provider_thread_id": f"thread-{thread}",
            "sender": Address(address=sender, name=sender_name),
            **changes,
        }
        envelope = envelope.model_copy(update=update)
        self.box.deliver(envelope, text, html)
        return envelope

    async def approver_replies(
        self,
        *,
        thread: int | str,
        text: str = "",
        in_reply_to: str | None = None,
        **changes: Any,
    ) -> Envelope:
        """A minute on, the approver's message in ``thread`` is delivered and taken in."""
        self.clock.advance(minutes=1)
        reply = self.deliver(
            sender=APPROVER, thread=thread, text=text, in_reply_to=in_reply_to, **changes
        )
        await self.intake()
        return reply

    async def intake(self, *, from_start: bool = False) -> intake.RunResult:
        return await run_intake(
            self.store,
            self.data_dir,
            self.workspace_id,
            self.clock,
            self.box,
            from_start=from_start,
        )

    def task(self, task_id: str) -> Task:
        found = self.store.get_task(task_id)
        assert found is not None
        return found

    def only_task(self) -> Task:
        [task] = self.store.list_tasks(self.workspace_id)
        return task

    def to_draft_ready(self, task_id: str) -> Task:
        for state in (TaskState.EXECUTING, TaskState.DRAFT_READY):
            self.store.transition_task(task_id, state, "internal work done", self.clock.now())
        return self.task(task_id)

    def render(
        self, task: Task, body: str = "The price is **$1,200** (ID A-17)."
    ) -> RenderedMessage:
        context = workspaces.load_context(self.store, self.workspace_id)
        return render_message(
            body, subject=reply_subject(task.original_subject), context=context, language="en"
        )

    def gate(
        self, task: Task, rendered: RenderedMessage, to: tuple[str, ...], draft_id: str = "d1"
    ) -> GateResult:
        facts = DraftFacts(
            draft_id=draft_id,
            digest=draft_digest(rendered.subject, rendered.html, rendered.text),
            subject=rendered.subject,
            text=rendered.text,
        )
        return gate_check.check_send(self.store, task.task_id, facts, to=to)


def address(value: str, name: str = "") -> Address:
    return Address(address=value, name=name)


# -- a client request and its approval -----------------------------------------------------


async def approval_requested(world: World) -> tuple[str, str]:
    """A client's request worked to a draft and sent for approval: the task and the approval
    request's Message-ID."""
    world.deliver(sender=CLIENT, thread=1, text="Quote please")
    await world.intake()
    task = world.to_draft_ready(world.only_task().task_id)
    request = await approvals.request_approval(
        world.store, world.box, task.task_id, "d1", world.render(task), (CLIENT,), world.clock
    )
    return task.task_id, request.internet_message_id


async def approved_by_reply(world: World) -> tuple[str, str, str]:
    """``approval_requested``, then approved by the approver's reply: the task, the request's
    and the approval's Message-IDs."""
    task_id, request = await approval_requested(world)
    approval = await world.approver_replies(thread="a", text="Approved.", in_reply_to=request)
    assert world.task(task_id).state is TaskState.APPROVED_TO_SEND
    assert approval.internet_message_id is not None
    return task_id, request, approval.internet_message_id


def ready_for_client(world: World, task_id: str) -> bool:
    """Whether the gate lets the task's current draft go to the client."""
    task = world.task(task_id)
    return world.gate(task, world.render(task), (CLIENT,)).ready


def normalize_raw(
    raw: bytes,
    *,
    provider: str = "maildir",
    provider_message_id: str = "p",
    thread_id: str = "t",
    received_at: datetime | None = None,
) -> Envelope:
    """``raw`` normalized as a message of the workspace mailbox, all in one thread."""
    return rfc822.normalize(
        raw,
        provider=provider,
        mailbox_id=MAILBOX,
        provider_message_id=provider_message_id,
        thread_id_for=lambda *_: thread_id,
        fallback_received_at=received_at or datetime.now(UTC),
    )
