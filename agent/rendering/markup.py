"""Markdown (or plain text) as an agent writes it, to email-safe HTML fragments.

markdown-it-py parses the draft with raw HTML disabled: a tag typed into a draft is shown as
text, never passed through. Every block gets its own ``dir``, ``lang`` and alignment, and
inside right-to-left blocks each left-to-right fragment (URL, email address, price, date,
time, phone number, ID, Latin run) is wrapped in a bidi isolate, whole.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from html import escape
from typing import Any
from urllib.parse import quote

from markdown_it import MarkdownIt
from markdown_it.token import Token

from agent.rendering.bidi import (
    Direction,
    FragmentKind,
    paragraph_direction,
    script_language,
    segments,
    trim_trailing,
)

# Blocks whose own text decides their direction, and the containers that take the message's.
_TEXT_BLOCKS = ("paragraph_open", "heading_open", "th_open", "td_open")
_CONTAINERS = ("bullet_list_open", "ordered_list_open", "blockquote_open", "table_open")

_STYLE = {
    "p": "margin:0 0 12px 0;",
    "h1": "margin:0 0 12px 0;font-size:20px;",
    "h2": "margin:0 0 12px 0;font-size:18px;",
    "h3": "margin:0 0 12px 0;font-size:16px;",
    "blockquote": "margin:0 0 12px 0;",
    "table": "border-collapse:collapse;margin:0 0 12px 0;",
    "th": "border:1px solid #cccccc;padding:4px 8px;font-weight:bold;",
    "td": "border:1px solid #cccccc;padding:4px 8px;",
    "ul": "margin:0 0 12px 0;",
    "ol": "margin:0 0 12px 0;",
    "pre": "margin:0 0 12px 0;padding:8px;background:#f4f4f4;white-space:pre-wrap;",
}


@dataclass(frozen=True)
class Fragment:
    """A left-to-right fragment isolated inside right-to-left text."""

    text: str
    kind: FragmentKind


@dataclass(frozen=True)
class Block:
    """One block's text as a reader sees it (Markdown interpreted), and its direction."""

    text: str
    direction: Direction
    prefix: str = ""  # how the plain-text alternative marks it: "- ", "1. ", "> "
    code: tuple[tuple[int, int], ...] = ()  # inline code spans in ``text``, isolated whole


@dataclass
class Markup:
    """Rendered HTML for a run of blocks, with what the read-back must find in it."""

    html: str
    fragments: list[Fragment] = field(default_factory=list[Fragment])
    blocks: list[Block] = field(default_factory=list[Block])


def inline_text(children: Sequence[Token]) -> tuple[str, tuple[tuple[int, int], ...]]:
    """What an inline run reads as (its text and code, line breaks kept), and where its
    inline code spans are in that text."""
    out: list[str] = []
    code: list[tuple[int, int]] = []
    at = 0
    for tok in children:
        if tok.type == "code_inline":
            code.append((at, at + len(tok.content)))
        if tok.type in ("text", "code_inline"):
            out.append(tok.content)
            at += len(tok.content)
            continue
        if tok.type in ("softbreak", "hardbreak"):
            out.append("\n")
            at += 1
        elif tok.type == "image":
            out.append(tok.content)
            at += len(tok.content)
    return "".join(out), tuple(code)


def _parser() -> MarkdownIt:
    md = MarkdownIt("commonmark", {"html": False, "linkify": True, "typographer": False})
    md.enable(["table", "strikethrough", "linkify"])
    # Every link is parsed as a link, so its Markdown syntax never reaches the reader; one to
    # anything but the web, mail or phone is then rendered as its text alone (_safe_href).
    md.validateLink = lambda url: True  # pyright: ignore[reportAttributeAccessIssue]
    return md


_MD = _parser()


def isolate_html(text: str, kind: FragmentKind, inner: str | None = None) -> str:
    """A fragment kept left to right inside right-to-left text. ``bdi`` is the isolate;
    the ``span dir="ltr"`` around it keeps the fragment isolated where a client drops
    ``bdi``, and its inline style does where a client drops the attribute. ``inner`` is the
    fragment's HTML when it carries markup of its own."""
    body = escape(text, quote=False) if inner is None else inner
    return (
        f'<span dir="ltr" data-ltr="{kind.value}" style="direction:ltr;unicode-bidi:isolate;">'
        f'<bdi dir="ltr">{body}</bdi></span>'
    )


_MARKS = {"strong_open": "strong", "em_open": "em", "s_open": "s"}


def _join_marked_runs(children: Sequence[Token]) -> list[Token]:
    """A Latin run that emphasis splits (``Contoso **Widget Pro**``) becomes one isolate
    holding the emphasis, so a right-to-left paragraph does not show its words reversed."""
    toks = list(children)
    k = 0
    while k + 2 < len(toks):
        opened, mid, closed = toks[k], toks[k + 1], toks[k + 2]
        tag = _MARKS.get(opened.type)
        whole = segments(mid.content) if mid.type == "text" else []
        if (
            tag is None
            or closed.type != opened.type.replace("_open", "_close")
            or len(whole) != 1
            or whole[0].kind is not FragmentKind.LATIN
        ):
            k += 1
            continue
        left = toks[k - 1] if k > 0 and toks[k - 1].type == "text" else None
        right = toks[k + 3] if k + 3 < len(toks) and toks[k + 3].type == "text" else None
        head, lead = _latin_tail(left.content) if left else ("", "")
        tail, rest = _latin_head(right.content) if right else ("", "")
        if not lead and not tail:
            k += 1
            continue
        inner = (
            escape(lead, quote=False)
            + f"<{tag}>{escape(mid.content, quote=False)}</{tag}>"
            + escape(tail, quote=False)
        )
        joined = Token("outloop_isolate", "", 0, content=lead + mid.content + tail)
        joined.meta = {"html": inner}
        start = k - 1 if left else k
        end = k + 4 if right else k + 3
        replacement = [
            *([left.copy(content=head)] if left and head else []),
            joined,
            *([right.copy(content=rest)] if right and rest else []),
        ]
        toks[start:end] = replacement
        k = start + len(replacement)
    return toks


def _latin_head(text: str) -> tuple[str, str]:
    """(the spaces and Latin run that open ``text``, after), or ("", text) if none does."""
    parts = segments(text)
    first = parts[0] if parts else None
    spaces = first.text if first and first.kind is None and not first.text.strip() else ""
    core = parts[1:] if spaces else parts
    if not core or core[0].kind is not FragmentKind.LATIN:
        return "", text
    tail = spaces + core[0].text
    return tail, text[len(tail) :]


def _latin_tail(text: str) -> tuple[str, str]:
    """(before, the Latin run and spaces that end ``text``), or (text, "") if none does."""
    parts = segments(text)
    last = parts[-1] if parts else None
    spaces = last.text if last and last.kind is None and not last.text.strip() else ""
    core = parts[:-1] if spaces else parts
    if not core or core[-1].kind is not FragmentKind.LATIN:
        return text, ""
    lead = core[-1].text + spaces
    return text[: len(text) - len(lead)], lead


class _Renderer:
    def __init__(self, message: Direction, language: str) -> None:
        self.message = message
        self.language = language
        self.fragments: list[Fragment] = []
        self.blocks: list[Block] = []

    def text(self, content: str, direction: Direction) -> str:
        if direction is Direction.LTR:
            return escape(content, quote=False)
        out: list[str] = []
        for seg in segments(content):
            if seg.kind is None:
                out.append(escape(seg.text, quote=False))
            else:
                self.fragments.append(Fragment(seg.text, seg.kind))
                out.append(isolate_html(seg.text, seg.kind))
        return "".join(out)

    def block_attrs(self, tag: str, direction: Direction, lang: str) -> str:
        style = f"direction:{direction.value};text-align:{direction.align};" + _STYLE.get(tag, "")
        if tag == "blockquote":  # the quote bar on the side the text starts from
            side = "right" if direction is Direction.RTL else "left"
            style += f"border-{side}:3px solid #cccccc;padding-{side}:12px;"
        return f' dir="{direction.value}" lang="{lang}" style="{style}"'

    def render(self, tokens: Sequence[Token]) -> str:
        out: list[str] = []
        stack: list[Direction] = [self.message]
        block_dir = self.message
        lists: list[list[int]] = []  # per open list: [next number, or -1 for bullets]
        quotes = 0
        for i, tok in enumerate(tokens):
            if tok.type in _TEXT_BLOCKS:
                inline = tokens[i + 1] if i + 1 < len(tokens) else None
                content, code = inline_text(inline.children or []) if inline else ("", ())
                block_dir = paragraph_direction(content, self.message)
                lang = script_language(content, self.language)
                attrs = self.block_attrs(tok.tag, block_dir, lang)
                if tok.hidden:  # a tight list's item: a paragraph without the spacing
                    attrs = attrs.replace("margin:0 0 12px 0;", "margin:0;")
                out.append(f"<{tok.tag}{attrs}>")
                if content.strip():
                    prefix = "> " * quotes
                    if lists and tok.type == "paragraph_open":
                        number = lists[-1][0]
                        prefix += "- " if number < 0 else f"{number}. "
                    self.blocks.append(Block(content, block_dir, prefix, code))
                stack.append(block_dir)
            elif tok.type in _CONTAINERS:
                if tok.type == "bullet_list_open":
                    lists.append([-1])
                elif tok.type == "ordered_list_open":
                    lists.append([int(str(tok.attrs.get("start") or 1))])
                elif tok.type == "blockquote_open":
                    quotes += 1
                attrs = self.block_attrs(tok.tag, self.message, self.language)
                if tok.tag == "ol" and tok.attrs.get("start"):
                    attrs += f' start="{int(str(tok.attrs["start"]))}"'
                out.append(f"<{tok.tag}{attrs}>")
            elif tok.type == "list_item_open":
                out.append(f'<li dir="{self.message.value}">')
            elif tok.nesting == -1:
                if tok.type.replace("_close", "_open") in _TEXT_BLOCKS and len(stack) > 1:
                    stack.pop()
                    block_dir = stack[-1]
                elif tok.type in ("bullet_list_close", "ordered_list_close") and lists:
                    lists.pop()
                elif tok.type == "blockquote_close":
                    quotes -= 1
                elif tok.type == "list_item_close" and lists and lists[-1][0] >= 0:
                    lists[-1][0] += 1
                out.append(f"</{tok.tag}>")
            elif tok.type == "inline":
                out.append(self.inline(tok.children or [], block_dir))
            elif tok.type in ("fence", "code_block"):
                self.blocks.append(Block(tok.content.rstrip("\n"), Direction.LTR, "    "))
                out.append(
                    f'<pre dir="ltr" style="direction:ltr;text-align:left;{_STYLE["pre"]}">'
                    f'<code dir="ltr">{escape(tok.content, quote=False)}</code></pre>'
                )
            elif tok.type == "hr":
                out.append('<hr style="border:0;border-top:1px solid #cccccc;">')
            elif tok.nesting == 1:
                out.append(f"<{tok.tag}>")
        return "".join(out)

    def inline(self, children: Sequence[Token], direction: Direction) -> str:
        out: list[str] = []
        after_link = ""  # sentence punctuation a bare URL's link took along, put back after it
        links: list[bool] = []  # per open link: whether it was rendered as a link
        tokens = _untangle_linkified(children)
        if direction is Direction.RTL:
            tokens = _join_marked_runs(tokens)
        for tok in tokens:
            if tok.type == "outloop_isolate":
                self.fragments.append(Fragment(tok.content, FragmentKind.LATIN))
                out.append(isolate_html(tok.content, FragmentKind.LATIN, str(tok.meta["html"])))
                continue
            if tok.type == "link_close" and tok.meta.get("after"):
                after_link = str(tok.meta["after"])
            if tok.type == "text":
                out.append(self.text(tok.content, direction))
            elif tok.type == "code_inline":
                out.append(self._code(tok.content, direction))
            elif tok.type in ("softbreak", "hardbreak"):
                out.append("<br>" if tok.type == "hardbreak" else "\n")
            elif tok.type == "link_open":
                href = _safe_href(str(tok.attrs.get("href", "")))
                links.append(href is not None)
                if href is not None:
                    out.append(f'<a href="{escape(href)}" style="color:#1a0dab;">')
            elif tok.type == "link_close":
                if links.pop() if links else False:
                    out.append("</a>")
                if after_link:
                    out.append(self.text(after_link, direction))
                    after_link = ""
            elif tok.type == "image":
                # Images from a draft are not fetched or embedded: their text stays.
                out.append(self.text(tok.content, direction))
            elif tok.nesting == 1:
                out.append(f"<{tok.tag}>")
            elif tok.nesting == -1:
                out.append(f"</{tok.tag}>")
        return "".join(out)

    def _code(self, content: str, direction: Direction) -> str:
        code = f'<code dir="ltr">{escape(content, quote=False)}</code>'
        if direction is Direction.RTL:
            self.fragments.append(Fragment(content, FragmentKind.LATIN))
            return (
                f'<span dir="ltr" data-ltr="code" style="direction:ltr;unicode-bidi:isolate;">'
                f"{code}</span>"
            )
        return code


def _untangle_linkified(children: Sequence[Token]) -> list[Token]:
    """A bare URL that was made a link keeps sentence punctuation that follows it (an Arabic
    comma, a closing Hebrew quote) out of both its text and its address."""
    out = list(children)
    for i, tok in enumerate(out):
        if tok.type != "link_open" or tok.markup != "linkify" or i + 2 >= len(out):
            continue
        text, close = out[i + 1], out[i + 2]
        if text.type != "text" or close.type != "link_close":
            continue
        kept = trim_trailing(text.content)
        if kept == text.content or not kept:
            continue
        tail = text.content[len(kept) :]
        out[i + 1] = text.copy(content=kept)
        out[i + 2] = close.copy(meta={**close.meta, "after": tail})
        href = str(tok.attrs.get("href", ""))
        if href.endswith(quote(tail, safe="")) or href.endswith(tail):
            cut = len(quote(tail, safe="")) if href.endswith(quote(tail, safe="")) else len(tail)
            out[i] = tok.copy(attrs={**tok.attrs, "href": href[:-cut]})
    return out


_SAFE_SCHEMES = ("http://", "https://", "mailto:", "tel:")


def _safe_href(href: str) -> str | None:
    """Only web, mail and phone links; anything else (javascript:, data:, a relative path)
    is no link at all: its text stays, without an address."""
    return href if href.lower().startswith(_SAFE_SCHEMES) else None


def render_markdown(draft: str, message: Direction, language: str) -> Markup:
    """The draft's blocks as HTML, each with its direction, language and alignment."""
    renderer = _Renderer(message, language)
    env: dict[str, Any] = {}
    html = renderer.render(_MD.parse(draft, env))
    return Markup(html=html, fragments=renderer.fragments, blocks=renderer.blocks)


def render_plain_block(text: str, message: Direction, language: str, tag: str = "p") -> Markup:
    """One block of plain text (a greeting, a signature line) rendered like a paragraph."""
    renderer = _Renderer(message, language)
    direction = paragraph_direction(text, message)
    lang = script_language(text, language)
    lines = text.split("\n")
    body = "<br>".join(renderer.text(line, direction) for line in lines)
    html = f"<{tag}{renderer.block_attrs(tag, direction, lang)}>{body}</{tag}>"
    blocks = [Block(text, direction)] if text.strip() else []
    return Markup(html=html, fragments=renderer.fragments, blocks=blocks)
