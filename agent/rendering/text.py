"""The text a person sees in an inbound HTML body (for reading a reply's own words).

Whitespace is collapsed the way a browser does and blocks become lines. Comments, scripts
and styles are left out, and so is quoted history that mail clients mark as such (Gmail's
``gmail_quote``, ``blockquote type="cite"``). ``html_risk`` says when markup could make what
a person sees differ from the text (hidden or struck-through elements, generated content,
form fields): a reader of approvals then does not trust the HTML part.
"""

from __future__ import annotations

import re
from urllib.parse import unquote

from selectolax.lexbor import LexborHTMLParser

from agent.domain.untrusted import shown

_HIDING_STYLE = re.compile(
    r"display\s*:\s*none|visibility\s*:|font-size\s*:\s*0|opacity\s*:|max-height\s*:|"
    r"height\s*:\s*0|line-through|clip|position\s*:|text-indent\s*:\s*-|"
    r"(?<![-\w])color\s*:\s*(?:#fff\b|#ffffff|white|transparent|rgba?\(\s*255\s*,\s*255\s*,\s*255)|"
    r"content\s*:",
    re.IGNORECASE,
)
_RISKY_ELEMENTS = "del, s, strike, input, textarea, select, noscript, template, svg, object"
_BLOCKS = "p, div, br, li, tr, h1, h2, h3, h4, h5, h6, blockquote, pre, table"
_QUOTES = "blockquote.gmail_quote, blockquote[type=cite], div.gmail_quote"


def html_risk(html: str) -> str | None:
    """Why the visible text of this HTML might differ from its text, or None."""
    tree = LexborHTMLParser(html)
    if tree.css_first(_RISKY_ELEMENTS) is not None:
        return "struck-through, hidden or form content"
    for node in tree.css("[hidden], [style]"):
        if "hidden" in node.attributes or _HIDING_STYLE.search(node.attributes.get("style") or ""):
            return "styles that hide, move, recolour or strike text"
    for node in tree.css("style"):
        if _HIDING_STYLE.search(node.text() or ""):
            return "a style sheet that hides, moves, recolours or generates text"
    return None


def visible_text(html: str) -> str:
    tree = LexborHTMLParser(re.sub(r"\s+", " ", html))  # as a browser collapses whitespace
    for node in tree.css("script, style, head, template, noscript"):
        node.decompose()
    for node in tree.css(_QUOTES):
        node.decompose()  # quoted history, as the mail client marked it
    for node in tree.css("[hidden], [style]"):
        style = node.attributes.get("style") or ""
        if "hidden" in node.attributes or re.search(r"display\s*:\s*none", style, re.I):
            node.decompose()
    for node in tree.css(_BLOCKS):
        node.insert_after("\n")
    root = tree.body or tree.root
    if root is None:
        return ""
    lines = (" ".join(line.split()) for line in root.text(separator="").split("\n"))
    return "\n".join(line for line in lines if line)


def link_targets(html: str) -> tuple[str, ...]:
    """Every URL an element of the HTML points at (href, src, action, ...), decoded."""
    root = LexborHTMLParser(html).root
    if root is None:
        return ()
    found: list[str] = []
    for node in root.traverse():
        for name in ("href", "src", "action", "formaction", "cite", "background", "poster"):
            value = node.attributes.get(name)
            if value:
                found.append(unquote(value))
    return tuple(dict.fromkeys(found))


def readable_text(text: str, html: str | None) -> str:
    """A message's words as it is safe to show them: the plain-text part (else the visible
    text of the HTML part), every control and format character written out except line
    breaks."""
    words = text if text.strip() else (visible_text(html) if html else "")
    return shown(words.replace("\r\n", "\n")).replace("[U+000A]", "\n")
