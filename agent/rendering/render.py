"""Render a reply: the Workspace Context decides the voice, the runtime decides the markup.

``render_message`` turns an agent's Markdown (or plain text) draft into an email-safe HTML
document and a plain-text alternative. The direction lives on the message wrapper (a
``div`` and the layout table inside it, never the ``html`` or ``body`` element), every block
carries its own ``dir``, ``lang`` and alignment, and left-to-right fragments inside
right-to-left text are isolated. What a read-back must find is returned with the message.
"""

from __future__ import annotations

import re
from functools import cache

from jinja2 import Environment, PackageLoader, StrictUndefined
from markupsafe import Markup as SafeHtml
from pydantic import BaseModel, ConfigDict, Field

from agent.domain.context import WorkspaceContext
from agent.domain.envelope import header_text
from agent.domain.mail import AttachmentRef
from agent.rendering.bidi import (
    Direction,
    isolate_plain,
    language_direction,
    strong_counts,
)
from agent.rendering.markup import Block, render_markdown, render_plain_block

REPLY_PREFIX = re.compile(r"^\s*(re|aw|sv|vs|antw|odp|r|res|ynt|השב|رد)\s*:", re.IGNORECASE)


class IsolatedFragment(BaseModel):
    model_config = ConfigDict(frozen=True)

    text: str
    kind: str


class RenderedBlock(BaseModel):
    """One block of text as it must read back: its text and its direction."""

    model_config = ConfigDict(frozen=True)

    text: str
    direction: Direction


class RenderedMessage(BaseModel):
    """A rendered reply, and everything a read-back of the provider's copy must find."""

    model_config = ConfigDict(frozen=True)

    subject: str
    language: str
    direction: Direction
    html: str
    text: str
    fragments: tuple[IsolatedFragment, ...] = ()
    blocks: tuple[RenderedBlock, ...] = ()
    warnings: tuple[str, ...] = Field(default=(), description="what the renderer had to decide")
    attachments: tuple[AttachmentRef, ...] = ()
    """Files that go with the message, by reference, with the size and digest they had when
    the draft was rendered (an approval covers exactly these)."""


@cache
def environment() -> Environment:
    """The template environment (autoescape on, undefined names an error)."""
    return Environment(
        loader=PackageLoader("agent.rendering", "templates"),
        autoescape=True,
        undefined=StrictUndefined,
        keep_trailing_newline=True,
    )


def detect_language(draft: str, fallback: str) -> str:
    """The fallback (the workspace's language) unless the draft is plainly in a script of
    the other direction."""
    ltr, rtl = strong_counts(draft)
    wanted = language_direction(fallback)
    if wanted is Direction.RTL and ltr and not rtl:
        return "en"
    if wanted is Direction.LTR and rtl and not ltr:
        arabic = sum(1 for ch in draft if "\u0600" <= ch <= "\u08ff")
        return "ar" if arabic * 2 > rtl else "he"
    return fallback


def reply_subject(original: str, *, add_prefix: bool = True) -> str:
    """The reply's subject: the original as a header carries it (on one line, control
    characters as spaces, its ends trimmed), with ``Re: `` in front only when the thread needs
    one and it has no reply prefix yet."""
    subject = header_text(original).strip()
    if not add_prefix or REPLY_PREFIX.match(subject):
        return subject
    return f"Re: {subject}"


def render_message(
    draft: str,
    *,
    subject: str,
    context: WorkspaceContext | None = None,
    language: str | None = None,
    greeting: str | None = None,
    signature: str | None = None,
) -> RenderedMessage:
    """Render ``draft`` (Markdown or plain text) as the reply body.

    ``language`` overrides the workspace's; greeting and signature default to the
    Workspace Context's ``communication`` settings. The subject is kept verbatim.
    """
    base = language or (context.language if context else "en")
    lang = language or detect_language(draft, base)
    direction = language_direction(lang)
    comm = context.communication if context else None
    greeting = comm.greeting if greeting is None and comm else greeting or ""
    signature = comm.signature if signature is None and comm else signature or ""

    body = render_markdown(draft, direction, lang)
    head = render_plain_block(greeting.strip(), direction, lang) if greeting.strip() else None
    tail = render_plain_block(signature.strip(), direction, lang) if signature.strip() else None
    parts = [part for part in (head, body, tail) if part is not None]

    html = (
        environment()
        .get_template("message.html.j2")
        .render(
            direction=direction.value,
            align=direction.align,
            lang=lang,
            # Built by markup.py, which escapes every piece of text it emits.
            greeting=SafeHtml(head.html if head else ""),  # noqa: S704
            body=SafeHtml(body.html),  # noqa: S704
            signature=SafeHtml(tail.html if tail else ""),  # noqa: S704
        )
    )
    blocks = [b for part in parts for b in part.blocks]
    text = _plain_text(blocks)
    warnings: list[str] = []
    if language is None and lang != base:
        warnings.append(f"the draft is written in another script: rendered as {lang}")
    return RenderedMessage(
        subject=subject,
        language=lang,
        direction=direction,
        html=html,
        text=text,
        fragments=tuple(
            IsolatedFragment(text=f.text, kind=f.kind.value)
            for part in parts
            for f in part.fragments
        ),
        blocks=tuple(RenderedBlock(text=b.text, direction=b.direction) for b in blocks),
        warnings=tuple(warnings),
    )


def _plain_text(blocks: list[Block]) -> str:
    """The text alternative: every block as a reader sees it (no Markdown syntax), opened
    by a mark that fixes its direction, with its left-to-right fragments isolated."""
    paragraphs: list[str] = []
    for block in blocks:
        lines = isolate_plain(block.text, block.direction, block.code).split("\n")
        paragraphs.append("\n".join(f"{block.prefix}{line}" for line in lines))
    return "\n\n".join(paragraphs) + "\n"
