"""Read-back verification: does the provider's stored copy say what was rendered?

Providers rewrite what they store (they add wrappers, strip or move styles, reorder
attributes), so nothing here compares markup. It compares what a reader gets: recipients,
subject, thread, message id, the direction, language and alignment every block displays
with, every isolated fragment whole inside a left-to-right isolate, and the text, equal
modulo whitespace. Each check that fails is named, with what was found.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterator

from pydantic import BaseModel, ConfigDict
from selectolax.lexbor import LexborHTMLParser, LexborNode

from agent.domain.envelope import Address
from agent.domain.mail import AttachmentRef, OutgoingMessage, SendResult, StoredCopy
from agent.rendering.bidi import Direction
from agent.rendering.render import RenderedMessage


class Check(BaseModel):
    model_config = ConfigDict(frozen=True)

    name: str
    ok: bool
    detail: str = ""

    @classmethod
    def of(cls, name: str, ok: bool, detail: str) -> Check:
        """A check whose failure says ``detail`` (a passed check carries none)."""
        return cls(name=name, ok=ok, detail="" if ok else detail)


class ReadBackReport(BaseModel):
    """The outcome of one read-back: every check, passed or not."""

    model_config = ConfigDict(frozen=True)

    checks: tuple[Check, ...]

    @property
    def ok(self) -> bool:
        return all(c.ok for c in self.checks)

    @property
    def failed(self) -> tuple[Check, ...]:
        return tuple(c for c in self.checks if not c.ok)


_INVISIBLE = re.compile("[\u200b-\u200f\u202a-\u202e\u2066-\u2069\ufeff\u00ad]")
_WHITESPACE = re.compile(r"\s+")
_DIRECTION_STYLE = re.compile(r"(?:^|;)\s*direction\s*:\s*(ltr|rtl)", re.IGNORECASE)
_ALIGN_STYLE = re.compile(r"(?:^|;)\s*text-align\s*:\s*([a-z-]+)", re.IGNORECASE)


def squash(text: str) -> str:
    """Text compared modulo whitespace and invisible formatting characters."""
    return _WHITESPACE.sub("", _INVISIBLE.sub("", text))


def _text(node: LexborNode) -> str:
    return node.text(deep=True, separator="")


def _attr(node: LexborNode, name: str) -> str | None:
    value = node.attributes.get(name)
    return None if value is None else value.strip().lower()


def _ancestry(node: LexborNode | None) -> Iterator[LexborNode]:
    while node is not None and node.tag not in ("-document", None):
        yield node
        node = node.parent


def displayed_direction(node: LexborNode) -> Direction:
    """The direction a block displays with: the nearest ``dir`` attribute or CSS
    ``direction`` on it or above it; left to right when there is none."""
    for current in _ancestry(node):
        found = _attr(current, "dir")
        if found in ("ltr", "rtl"):
            return Direction(found)
        style = _DIRECTION_STYLE.search(current.attributes.get("style") or "")
        if style:
            return Direction(style.group(1).lower())
    return Direction.LTR


def displayed_alignment(node: LexborNode, direction: Direction) -> str:
    """``left`` or ``right``: the nearest ``text-align`` (or ``align``), with ``start``
    and ``end`` resolved against the direction; start of the direction when none is set."""
    for current in _ancestry(node):
        style = _ALIGN_STYLE.search(current.attributes.get("style") or "")
        value = style.group(1).lower() if style else _attr(current, "align")
        if value in ("left", "right"):
            return value
        if value in ("start", "end"):
            start = direction.align
            return start if value == "start" else ("left" if start == "right" else "right")
    return direction.align


def _language(node: LexborNode) -> str | None:
    for current in _ancestry(node):
        lang = _attr(current, "lang")
        if lang:
            return lang
    return None


class _Element:
    """An element of the stored copy with its depth and its text (modulo whitespace),
    computed once per read-back."""

    __slots__ = ("depth", "node", "text")

    def __init__(self, depth: int, node: LexborNode, text: str) -> None:
        self.depth = depth
        self.node = node
        self.text = text


def _elements(root: LexborNode) -> tuple[list[_Element], dict[int, str]]:
    """Every element under ``root`` in document order, and each one's text by node id."""
    out: list[_Element] = []
    texts: dict[int, str] = {}

    def walk(node: LexborNode, depth: int) -> None:
        child = node.child
        while child is not None:
            if child.tag and not child.tag.startswith(("-", "#")):
                element = _Element(depth, child, squash(_text(child)))
                out.append(element)
                texts[child.mem_id] = element.text
                walk(child, depth + 1)
            child = child.next

    walk(root, 0)
    return out, texts


_INLINE = frozenset(
    {"a", "abbr", "b", "bdi", "bdo", "code", "em", "font", "i", "s", "del", "small", "span",
     "strong", "sub", "sup", "u"}
)  # fmt: skip


def _innermost_with_text(elements: list[_Element], text: str) -> LexborNode | None:
    """The deepest block element whose whole text is ``text`` (modulo whitespace). Inline
    elements do not count: a block holding only a price is the block, not the price's
    isolate inside it."""
    want = squash(text)
    best: _Element | None = None
    for element in elements:
        if element.node.tag in _INLINE:
            continue
        if element.text == want and (best is None or element.depth > best.depth):
            best = element
    return None if best is None else best.node


def _addresses(addresses: tuple[Address, ...]) -> list[str]:
    return sorted(a.address.lower() for a in addresses)


def _message_id(value: str | None) -> str:
    return (value or "").strip().strip("<>").lower()


def verify_read_back(
    rendered: RenderedMessage,
    sent: OutgoingMessage,
    stored: StoredCopy,
    result: SendResult | None = None,
) -> ReadBackReport:
    """Compare the provider's stored copy with what was rendered and sent."""
    checks: list[Check] = []

    def check(name: str, ok: bool, detail: str = "") -> None:
        checks.append(Check(name=name, ok=ok, detail="" if ok else detail))

    check(
        "delivered",
        stored.delivered,
        "the stored copy is a local outbox copy: it reached no one (not a delivery)",
    )
    checks.extend(_recipients(sent, stored))
    check(
        "sender",
        stored.sender is not None and stored.sender.address == sent.sender.address,
        f"sent from {sent.sender.address}, stored from "
        + (stored.sender.address if stored.sender else "nobody"),
    )
    check(
        "subject",
        stored.subject == sent.subject == rendered.subject,
        f"rendered {rendered.subject!r}, sent {sent.subject!r}, stored {stored.subject!r}",
    )
    thread = result.provider_thread_id if result else sent.provider_thread_id
    check(
        "thread",
        stored.provider_thread_id == thread,
        f"sent in thread {thread!r}, stored in {stored.provider_thread_id!r}",
    )
    message_id = result.internet_message_id if result else sent.internet_message_id
    check(
        "message_id",
        _message_id(stored.internet_message_id) == _message_id(message_id),
        f"sent {message_id!r}, stored {stored.internet_message_id!r}",
    )
    if rendered.attachments or stored.attachments:
        want, got = _files(rendered.attachments), _files(stored.attachments)
        check("attachments", want == got, f"rendered {want}, stored {got}")
    if not stored.html:
        check("html", False, "the stored copy has no HTML part")
        return ReadBackReport(checks=tuple(checks))
    checks.extend(_verify_html(rendered, stored.html))
    return ReadBackReport(checks=tuple(checks))


def _recipients(sent: OutgoingMessage, stored: StoredCopy) -> list[Check]:
    """To and Cc exactly as sent; every other header that names mailboxes absent (a send sets
    none, so any is a recipient or a reply path nobody approved)."""
    checks: list[Check] = []
    for field, want, got in (
        ("to", _addresses(sent.to), _addresses(stored.to)),
        ("cc", _addresses(sent.cc), _addresses(stored.cc)),
    ):
        checks.append(Check.of(f"recipients.{field}", want == got, f"sent {want}, stored {got}"))
    for field, got in (("bcc", _addresses(stored.bcc)), ("reply_to", _addresses(stored.reply_to))):
        checks.append(Check.of(f"recipients.{field}", not got, f"sent none, stored {got}"))
    others = ", ".join(f"{name}: {value}" for name, value in stored.other_address_headers)
    checks.append(
        Check.of(
            "recipients.other",
            not stored.other_address_headers,
            f"the stored copy names mailboxes in headers the send never set: {others}",
        )
    )
    return checks


def _files(files: tuple[AttachmentRef, ...]) -> list[tuple[str, int, str]]:
    """Attachments as read-back compares them: name, size and sha256."""
    return sorted((a.name, a.size, a.sha256) for a in files)


def _verify_html(rendered: RenderedMessage, html: str) -> list[Check]:
    """The stored HTML displays as rendered: its wrapper, every block, every isolated
    fragment, and the text."""
    tree = LexborHTMLParser(html)
    root = tree.body or tree.root
    if root is None:
        return [Check(name="html", ok=False, detail="the stored HTML has no body")]
    elements, texts = _elements(root)
    expected_text = _rendered_text(rendered)
    wrapper = _wrapper(rendered, elements, expected_text)
    holder = wrapper or root
    checks = [
        *_wrapper_checks(rendered, wrapper, holder),
        _blocks_check(rendered, elements),
        _fragments_check(rendered, elements, texts),
        _body_text_check(expected_text, wrapper, holder, texts),
    ]
    # A passing check carries no detail: its detail text describes a failure.
    return [c if not c.ok else c.model_copy(update={"detail": ""}) for c in checks]


def _wrapper(
    rendered: RenderedMessage, elements: list[_Element], expected_text: str
) -> LexborNode | None:
    """The wrapper: the element that holds the whole message and sets its direction (the
    innermost such element: a provider's own wrapper around it may say anything)."""
    want_dir = rendered.direction.value
    holding = [e for e in elements if e.text == expected_text and _attr(e.node, "dir") == want_dir]
    return max(holding, key=lambda e: e.depth).node if holding else None


def _wrapper_checks(
    rendered: RenderedMessage, wrapper: LexborNode | None, holder: LexborNode
) -> list[Check]:
    """The wrapper sets the message's direction, language and alignment."""
    lang = _language(holder) or ""
    want_lang = rendered.language.lower()
    lang_ok = lang == want_lang or lang.split("-")[0] == want_lang.split("-")[0]
    return [
        Check(
            name="wrapper.direction",
            ok=wrapper is not None and displayed_direction(holder) is rendered.direction,
            detail=f"no element holding the message sets dir={rendered.direction.value!r}; "
            f"it displays {displayed_direction(holder).value}",
        ),
        Check(name="wrapper.lang", ok=lang_ok, detail=f"lang is {lang or 'missing'!r}"),
        Check(
            name="wrapper.alignment",
            ok=displayed_alignment(holder, rendered.direction) == rendered.direction.align,
            detail=f"aligned {displayed_alignment(holder, rendered.direction)}",
        ),
    ]


def _blocks_check(rendered: RenderedMessage, elements: list[_Element]) -> Check:
    """Every block displays in its own direction, aligned to its start."""
    wrong: list[str] = []
    for block in rendered.blocks:
        node = _innermost_with_text(elements, block.text)
        if node is None:
            wrong.append(f"{block.text[:40]!r} not found")
            continue
        shown = displayed_direction(node)
        aligned = displayed_alignment(node, shown)
        if shown is not block.direction or aligned != block.direction.align:
            wrong.append(f"{block.text[:40]!r} displays {shown.value}, aligned {aligned}")
    return Check(name="blocks", ok=not wrong, detail="; ".join(wrong))


def _fragments_check(
    rendered: RenderedMessage, elements: list[_Element], texts: dict[int, str]
) -> Check:
    """Every isolated fragment is present, whole, inside a left-to-right isolate."""
    want = Counter(f.text for f in rendered.fragments)
    found: Counter[str] = Counter()
    wanted = {squash(f): f for f in want}
    for element in elements:
        fragment = wanted.get(element.text)
        if fragment is None:
            continue
        node = element.node
        isolates = _attr(node, "dir") == "ltr" or _DIRECTION_STYLE.search(
            node.attributes.get("style") or ""
        )
        if (
            isolates
            and displayed_direction(node) is Direction.LTR
            and not _inside_isolate_of(node, element.text, texts)
        ):
            found[fragment] += 1
    missing = [f"{f!r} x{n - found[f]}" for f, n in want.items() if found[f] < n]
    return Check(
        name="fragments",
        ok=not missing,
        detail="missing, split or not isolated: " + ", ".join(missing),
    )


def _body_text_check(
    expected_text: str, wrapper: LexborNode | None, holder: LexborNode, texts: dict[int, str]
) -> Check:
    """The text the message displays is the rendered text, modulo whitespace."""
    got_text = texts.get(holder.mem_id) if wrapper is not None else None
    got_text = got_text if got_text is not None else squash(_text(holder))
    return Check(
        name="body_text",
        ok=got_text == expected_text,
        detail=_first_difference(expected_text, got_text),
    )


def _rendered_text(rendered: RenderedMessage) -> str:
    body = LexborHTMLParser(rendered.html).body
    return "" if body is None else squash(_text(body))


def _inside_isolate_of(node: LexborNode, text: str, texts: dict[int, str]) -> bool:
    """Whether an ancestor already isolates exactly this text (the span around the bdi):
    one fragment is counted once."""
    for current in list(_ancestry(node))[1:]:
        if texts.get(current.mem_id, "") != text:
            return False
        if _attr(current, "dir") == "ltr":
            return True
    return False


def _first_difference(want: str, got: str) -> str:
    at = next((i for i, (a, b) in enumerate(zip(want, got, strict=False)) if a != b), None)
    if at is None:
        at = min(len(want), len(got))
    return (
        f"the text differs at character {at}: expected {want[at : at + 30]!r}, "
        f"found {got[at : at + 30]!r}"
    )
