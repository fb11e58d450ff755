"""The text a person sees in an inbound HTML body (for reading a reply's own words).

Comments, scripts, styles and elements hidden by markup (``hidden``, ``display:none``,
``visibility:hidden``, zero font size or opacity) are left out: text nobody sees is not
what the sender said.
"""

from __future__ import annotations

import re

from selectolax.lexbor import LexborHTMLParser

_HIDDEN_STYLE = re.compile(
    r"display\s*:\s*none|visibility\s*:\s*hidden|font-size\s*:\s*0(?![.\d]*[1-9])|"
    r"opacity\s*:\s*0(?![.\d]*[1-9])|max-height\s*:\s*0(?![.\d]*[1-9])",
    re.IGNORECASE,
)
_BLOCKS = "p, div, br, li, tr, h1, h2, h3, h4, h5, h6, blockquote, pre, table"


def visible_text(html: str) -> str:
    tree = LexborHTMLParser(html)
    for node in tree.css("script, style, head, template, noscript"):
        node.decompose()
    for node in tree.css("[hidden], [style]"):
        style = node.attributes.get("style") or ""
        if "hidden" in node.attributes or _HIDDEN_STYLE.search(style):
            node.decompose()
    for node in tree.css("blockquote"):
        node.decompose()  # quoted history
    for node in tree.css(_BLOCKS):
        node.insert_after("\n")
    root = tree.body or tree.root
    if root is None:
        return ""
    lines = (" ".join(line.split()) for line in root.text(separator="").split("\n"))
    return "\n".join(line for line in lines if line)
