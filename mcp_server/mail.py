"""The ``internal_mail`` MCP tool, its unread resource, and the session that keeps the
server's mailbox reachable while the server runs.

The tool takes the seed's call envelope as is (``action``, ``input``, ``reasoning``, the
optional ``summarize``) and hands it to the core whole: unknown root fields are refused by
the tool's strict schema, everything else by ``agent.domain.internal_mail.parse_call``,
before any mailbox is touched. A result carries the unread lane in
``_meta.agent_meta.notifications.persistent.email`` (and new ``email.bounce`` events in
``_meta.agent_meta.events``); a refusal is a tool error (``isError``) whose structured
content names its ``code``.
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncGenerator
from contextlib import asynccontextmanager
from typing import Annotated, Any, Literal, cast

import anyio
import anyio.to_thread
from mcp.server.mcpserver import Context
from mcp.server.subscriptions import ResourceUpdated, SubscriptionBus
from mcp.types import CallToolResult, TextContent
from pydantic import BaseModel, ConfigDict, Field

from agent.domain.internal_mail import MailError
from agent.services.internal_mail import InternalMail, MailResult, deliver_due
from agent.services.internal_mail.folders import Folders

logger = logging.getLogger(__name__)

UNREAD_URI = "outloop://internal-mail/unread"
HEARTBEAT_EVERY_SECONDS = 30.0

DESCRIPTION = """\
Internal mail between this workstation's agents and operators (not internet email).
Call as internal_mail(action=..., input={...}, reasoning="why"); input holds only the
action's fields. Actions: send {address, message, subject?, cc?, attachments?, delay?,
mode?}, check {folder?, n?, filter?}, read {email_id:[...]}, dismiss {email_id:[...]},
reply / reply_all {email_id:[one id], message}, search {query, folder?}, archive
{email_id}, delete {email_id} (inbox/archive only), contacts {}, add_contact {address,
name, note?}, remove_contact {address}, edit_contact {address, name?, note?}, settings {},
manual {}. Addresses are bare names or paths (no @). Unread mail arrives in full in
_meta.agent_meta.notifications.persistent.email; reply on the arrival channel and dismiss
what you handled. Call manual {} before anything unusual."""


def result_of(answer: MailResult) -> CallToolResult:
    text = json.dumps(answer.payload, ensure_ascii=False)
    return CallToolResult.model_validate(
        {
            "content": [TextContent(type="text", text=text)],
            "structuredContent": answer.payload,
            "_meta": answer.meta,
        }
    )


def refused(exc: MailError) -> CallToolResult:
    payload = {"status": "error", "code": exc.code, "message": str(exc)}
    return CallToolResult(
        content=[TextContent(type="text", text=f"{exc.code}: {exc}")],
        structured_content=payload,
        is_error=True,
    )


async def call(mail: InternalMail, raw: dict[str, Any]) -> CallToolResult:
    try:
        answer = await anyio.to_thread.run_sync(mail.call, raw)
    except MailError as exc:
        return refused(exc)
    return result_of(answer)


def mail_of(ctx: Context) -> InternalMail:
    runtime: Any = ctx.request_context.lifespan_context
    return cast(InternalMail, runtime.mail)


class MailAnswer(BaseModel):
    """An action's answer: ``status`` (``sent``, ``ok``, or ``error`` with ``code`` and
    ``message``) and the action's own fields (see the manual)."""

    model_config = ConfigDict(extra="allow")

    status: str


ActionName = Literal[
    "send", "check", "read", "dismiss", "reply", "reply_all", "search", "archive", "delete",
    "contacts", "add_contact", "remove_contact", "edit_contact", "settings", "manual",
]  # fmt: skip


async def internal_mail_tool(
    action: Annotated[ActionName, Field(description="What to do (see the tool description).")],
    input: Annotated[
        dict[str, Any],
        Field(description="The action's own fields only ({} when it has none)."),
    ],
    reasoning: Annotated[str, Field(description="Why you make this call, in a sentence.")],
    ctx: Context,
    summarize: Annotated[
        bool | None,
        Field(description="check, search, read: the gist only (no ids, addresses, bodies)."),
    ] = None,
) -> Annotated[CallToolResult, MailAnswer]:
    """Internal mail (see the tool description and the manual action)."""
    raw: dict[str, Any] = {"action": action, "input": input, "reasoning": reasoning}
    if summarize is not None:
        raw["summarize"] = summarize
    return await call(mail_of(ctx), raw)


def unread_text(mail: InternalMail) -> str:
    """The unread lane as the resource shows it."""
    mail.ensure_mailbox()
    config = mail.network.config()
    block = Folders(mail.box).unread_block(config.settings.unread_max_entries)
    return json.dumps(block, ensure_ascii=False, indent=2)


def refresh_mirror(mail: InternalMail) -> None:
    Folders(mail.box).refresh_mirror(mail.network.clock.now().isoformat())


def inbox_signature(mail: InternalMail) -> tuple[int, ...]:
    folders = Folders(mail.box)
    unread = folders.unread_ids()
    return (len(unread), hash(tuple(unread)))


@asynccontextmanager
async def mail_session(
    mail: InternalMail, bus: SubscriptionBus, poll_seconds: float
) -> AsyncGenerator[None]:
    """While the server runs: its mailbox exists and has a fresh heartbeat, due mail of the
    whole network is delivered, and a change of the unread mail is published as an update
    of the unread resource. The heartbeat goes when the server stops."""
    await anyio.to_thread.run_sync(mail.ensure_mailbox)
    await anyio.to_thread.run_sync(mail.network.beat, mail.box, "mcp")  # reachable from the start
    seen = await anyio.to_thread.run_sync(inbox_signature, mail)
    async with anyio.create_task_group() as group:
        group.start_soon(_keep_session, mail, bus, poll_seconds, seen)
        try:
            yield
        finally:
            group.cancel_scope.cancel()
            mail.network.end_session(mail.box)


async def _keep_session(
    mail: InternalMail, bus: SubscriptionBus, poll_seconds: float, seen: tuple[int, ...]
) -> None:
    last_beat = anyio.current_time()
    while True:
        if anyio.current_time() - last_beat >= HEARTBEAT_EVERY_SECONDS:
            await anyio.to_thread.run_sync(mail.network.beat, mail.box, "mcp")
            last_beat = anyio.current_time()
        await anyio.to_thread.run_sync(_deliver_quietly, mail)
        now = await anyio.to_thread.run_sync(inbox_signature, mail)
        if now != seen:  # new mail: the mirror file and the resource's listeners learn it
            await anyio.to_thread.run_sync(refresh_mirror, mail)
            await bus.publish(ResourceUpdated(uri=UNREAD_URI))
        seen = now
        await anyio.sleep(poll_seconds)


def _deliver_quietly(mail: InternalMail) -> None:
    """One courier pass; a failure is logged and the session stays up (broken settings are
    reported by every call; anything else is retried on the next pass)."""
    try:
        deliver_due(mail.network)
    except MailError:
        return
    except Exception:
        logger.exception("internal mail: a courier pass failed; the next pass tries again")
