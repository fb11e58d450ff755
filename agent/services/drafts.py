"""render: a task's reply drafted in Markdown becomes email-safe HTML and text, kept by id.

The server keeps every draft it renders. A gate check, an approval request and a send name
the draft by id, so what is approved and what is sent is exactly what the server rendered:
the caller never supplies content at send time, and any change makes a new draft (a new
digest, which no earlier approval covers).
"""

from __future__ import annotations

import hashlib

from agent.domain.errors import GateRefused, InvalidRequest, RegistryError
from agent.domain.gates import DraftFacts, draft_digest
from agent.domain.records import DraftRecord
from agent.domain.states import TERMINAL_STATES
from agent.ports import Clock, Store
from agent.rendering.render import RenderedMessage, render_message, reply_subject
from agent.services.gate_check import load_task
from agent.services.workspaces import load_context

MAX_DRAFT_CHARS = 100_000
"""The longest Markdown body rendered (an email reply, not a document)."""


def render_draft(
    store: Store,
    task_id: str,
    body_markdown: str,
    clock: Clock,
    *,
    language: str | None = None,
) -> tuple[DraftRecord, RenderedMessage]:
    """Render a reply for the task in its original thread's subject and keep it."""
    if len(body_markdown) > MAX_DRAFT_CHARS:
        raise InvalidRequest(
            f"the draft is {len(body_markdown)} characters; the limit is {MAX_DRAFT_CHARS}: "
            "send a shorter reply and attach long material"
        )
    if not body_markdown.strip():
        raise InvalidRequest("the draft is empty; write the reply's body in Markdown")
    task = load_task(store, task_id)
    if task.state in TERMINAL_STATES:
        raise GateRefused(f"task {task_id} is {task.state}; a closed task gets no new draft")
    context = load_context(store, task.workspace_id)
    rendered = render_message(
        body_markdown,
        subject=reply_subject(task.original_subject),
        context=context,
        language=language,
    )
    digest = draft_digest(rendered.subject, rendered.html, rendered.text)
    draft_id = "draft-" + hashlib.sha256(f"{task_id}|{digest}".encode()).hexdigest()[:20]
    record = store.save_draft(
        DraftRecord(
            draft_id=draft_id,
            task_id=task_id,
            workspace_id=task.workspace_id,
            digest=digest,
            rendered=rendered.model_dump_json(),
            created_at=clock.now(),
        )
    )
    return record, rendered


def load_draft(store: Store, task_id: str, draft_id: str) -> tuple[DraftRecord, RenderedMessage]:
    """A draft the server rendered for this very task (never another task's)."""
    record = store.get_draft(draft_id)
    if record is None:
        raise RegistryError(
            f"no draft {draft_id!r}; call render for the task and use the draft_id it returns"
        )
    if record.task_id != task_id:
        raise GateRefused(
            f"draft {draft_id} was rendered for another task; render a draft for task {task_id}"
        )
    return record, RenderedMessage.model_validate_json(record.rendered)


def facts(record: DraftRecord, rendered: RenderedMessage) -> DraftFacts:
    return DraftFacts(
        draft_id=record.draft_id, digest=record.digest, subject=rendered.subject, text=rendered.text
    )
