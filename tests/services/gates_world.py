"""A small world for gate and approval tests: one workspace, its mailbox, a clock."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from itertools import count
from typing import Any

from agent.domain.envelope import Address, Envelope
from agent.domain.gates import DraftFacts, GateResult, draft_digest
from agent.domain.states import TaskState
from agent.domain.task import Task
from agent.ports import Store
from agent.rendering.render import RenderedMessage, render_message, reply_subject
from agent.services import gate_check, intake, workspaces
from agent.testing import FrozenClock, InMemoryProvider, make_envelope
from tests.conftest import run_intake

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


@dataclass
class World:
    store: Store
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

    async def intake(self) -> intake.RunResult:
        return await run_intake(self.store, self.data_dir, self.workspace_id, self.clock, self.box)

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
