# pyright: strict
"""Golden drafts for the renderer, checked by what they must mean, not by their bytes.

Each case in ``golden/cases.yaml`` is a draft (with its language, and optionally a greeting
and a signature) and what rendering it must give:

- ``direction`` and ``message_language``: the message's, on the result and on the wrapper;
- ``blocks``: every block in order, ``[direction, text]`` as the reader sees the text
  (Markdown interpreted), or ``[direction, text, lang]`` when the block's own ``lang``
  attribute is not the default one (the message's language when the block runs in the
  message's direction, else ``en`` for ltr and ``he`` for rtl); ``null`` means the element
  carries no ``lang`` of its own (a code block);
- ``fragments``: every isolated left-to-right fragment in order, ``[kind, text]``, whole
  (``code`` is inline code, which the HTML marks ``data-ltr="code"``);
- ``absent``: strings that must not occur in the HTML source; ``absent_text``: strings the
  reader must not see in the HTML part's text (Markdown syntax); ``contains``: exact HTML
  snippets that must occur;
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import cast

import pytest
import yaml
from selectolax.lexbor import LexborHTMLParser, LexborNode

from agent.rendering.render import RenderedMessage, render_message
from agent.rendering.verify import verify_read_back
from tests.rendering.stored import sent_and_stored

CASES_FILE = Path(__file__).parent / "golden" / "cases.yaml"
SUBJECT = "Re: ההזמנה ORD-2026-0042"
KINDS = frozenset({"url", "email", "price", "date", "time", "phone", "id", "latin", "code"})
BLOCK_TAGS = "p, h1, h2, h3, h4, h5, h6, th, td, pre"
SAFE_HREF = re.compile(r"^(?:https?://|mailto:|tel:|#$)", re.IGNORECASE)
LRI, PDI = "\u2066", "\u2069"
_FIELDS = frozenset(
    {
        "id",
        "covers",
        "language",
        "draft",
        "greeting",
        "signature",
        "direction",
        "message_language",
        "blocks",
        "fragments",
        "absent",
        "absent_text",
        "contains",
    }
)


@dataclass(frozen=True)
class ExpectedBlock:
    direction: str
    text: str
    lang: str | None  # None: the element has no lang attribute of its own


@dataclass(frozen=True)
class GoldenCase:
    id: str
    covers: str
    draft: str
    language: str | None
    greeting: str | None
    signature: str | None
    direction: str
    message_language: str
    blocks: tuple[ExpectedBlock, ...]
    fragments: tuple[tuple[str, str], ...]
    absent: tuple[str, ...]
    absent_text: tuple[str, ...]
    contains: tuple[str, ...]

    def render(self) -> RenderedMessage:
        return render_message(
            self.draft,
            subject=SUBJECT,
            language=self.language,
            greeting=self.greeting,
            signature=self.signature,
        )

    def param(self) -> object:
        return pytest.param(self, id=self.id)


def _str(raw: dict[str, object], key: str, *, required: bool = True) -> str | None:
    value = raw.get(key)
    if value is None and not required:
        return None
    if not isinstance(value, str):
        raise TypeError(f"{raw.get('id')!r}: {key} must be a string, got {value!r}")
    return value


def _list(raw: dict[str, object], key: str) -> list[object]:
    value = raw.get(key, [])
    if not isinstance(value, list):
        raise TypeError(f"{raw.get('id')!r}: {key} must be a list, got {value!r}")
    return cast(list[object], value)


def _strings(raw: dict[str, object], key: str) -> tuple[str, ...]:
    items = _list(raw, key)
    if not all(isinstance(item, str) for item in items):
        raise TypeError(f"{raw.get('id')!r}: {key} must list strings")
    return tuple(cast(list[str], items))


def _default_lang(direction: str, message_direction: str, message_language: str) -> str:
    if direction == message_direction:
        return message_language
    return "en" if direction == "ltr" else "he"


def _parse_case(raw: dict[str, object]) -> GoldenCase:
    unknown = set(raw) - _FIELDS
    if unknown:
        raise ValueError(f"{raw.get('id')!r}: unknown fields {sorted(unknown)}")
    case_id = _str(raw, "id") or ""
    direction = _str(raw, "direction") or ""
    message_language = _str(raw, "message_language") or ""
    if direction not in ("ltr", "rtl"):
        raise ValueError(f"{case_id}: direction must be ltr or rtl")
    blocks: list[ExpectedBlock] = []
    for item in _list(raw, "blocks"):
        entry = cast(list[object], item) if isinstance(item, list) else []
        if len(entry) not in (2, 3) or entry[0] not in ("ltr", "rtl"):
            raise ValueError(f"{case_id}: a block is [direction, text] or [.., lang]: {item!r}")
        block_dir, text = str(entry[0]), entry[1]
        if not isinstance(text, str):
            raise TypeError(f"{case_id}: block text must be a string: {item!r}")
        if len(entry) == 3:
            lang = entry[2]
            if lang is not None and not isinstance(lang, str):
                raise TypeError(f"{case_id}: block lang must be a string or null: {item!r}")
        else:
            lang = _default_lang(block_dir, direction, message_language)
        blocks.append(ExpectedBlock(block_dir, text, lang))
    fragments: list[tuple[str, str]] = []
    for item in _list(raw, "fragments"):
        entry = cast(list[object], item) if isinstance(item, list) else []
        if len(entry) != 2 or entry[0] not in KINDS or not isinstance(entry[1], str):
            raise ValueError(f"{case_id}: a fragment is [kind, text]: {item!r}")
        fragments.append((str(entry[0]), entry[1]))
    return GoldenCase(
        id=case_id,
        covers=_str(raw, "covers") or "",
        draft=_str(raw, "draft") or "",
        language=_str(raw, "language", required=False),
        greeting=_str(raw, "greeting", required=False),
        signature=_str(raw, "signature", required=False),
        direction=direction,
        message_language=message_language,
        blocks=tuple(blocks),
        fragments=tuple(fragments),
        absent=_strings(raw, "absent"),
        absent_text=_strings(raw, "absent_text"),
        contains=_strings(raw, "contains"),
    )


def load_cases() -> list[GoldenCase]:
    loaded: object = yaml.safe_load(CASES_FILE.read_text(encoding="utf-8"))
    if not isinstance(loaded, list):
        raise TypeError(f"{CASES_FILE} must hold a list of cases")
    out: list[GoldenCase] = []
    for raw in cast(list[object], loaded):
        if not isinstance(raw, dict):
            raise TypeError(f"every case must be a mapping: {raw!r}")
        out.append(_parse_case(cast(dict[str, object], raw)))
    return out


CASES = load_cases()


# --- reading the HTML -------------------------------------------------------------------


def squash(text: str) -> str:
    return re.sub(r"\s+", "", text)


def node_text(node: LexborNode) -> str:
    return node.text(deep=True, separator="")


def style_value(node: LexborNode, prop: str) -> str | None:
    found = re.search(rf"(?:^|;)\s*{prop}\s*:\s*([a-z-]+)", node.attributes.get("style") or "")
    return found.group(1) if found else None


def wrapper_of(html: str) -> LexborNode:
    wrapper = LexborHTMLParser(html).css_first("div[data-outloop=message]")
    assert wrapper is not None, "no message wrapper div[data-outloop=message]"
    return wrapper


def html_blocks(wrapper: LexborNode) -> list[LexborNode]:
    """The text blocks inside the layout cell, in document order, empty ones left out."""
    cell = wrapper.css_first("td")
    assert cell is not None, "no layout cell in the wrapper"
    return [n for n in cell.css(BLOCK_TAGS) if n != cell and node_text(n).strip()]


def html_fragments(wrapper: LexborNode) -> list[tuple[str, str]]:
    return [(n.attributes.get("data-ltr") or "", node_text(n)) for n in wrapper.css("[data-ltr]")]


def isolate_problems(wrapper: LexborNode) -> list[str]:
    """Every isolate is ``span dir=ltr`` holding exactly one ltr ``bdi`` (``code`` for
    inline code) with all of the span's text."""
    problems: list[str] = []
    for span in wrapper.css("[data-ltr]"):
        kind = span.attributes.get("data-ltr")
        inner_tag = "code" if kind == "code" else "bdi"
        children = [c for c in span.iter(include_text=True)]
        inner = children[0] if len(children) == 1 else None
        if (
            span.tag != "span"
            or span.attributes.get("dir") != "ltr"
            or style_value(span, "unicode-bidi") != "isolate"
            or inner is None
            or inner.tag != inner_tag
            or inner.attributes.get("dir") != "ltr"
            or node_text(inner) != node_text(span)
        ):
            problems.append(f"malformed isolate: {span.html}")
    return problems


def text_isolates(text: str) -> list[str]:
    return re.findall(f"{LRI}(.*?){PDI}", text, flags=re.DOTALL)


# --- the tests --------------------------------------------------------------------------


def test_cases_cover_what_the_renderer_must_handle() -> None:
    assert len(CASES) >= 30
    ids = [c.id for c in CASES]
    assert len(ids) == len(set(ids)), "case ids must be unique"
    drafts = "\n".join(f"{c.draft}\n{c.greeting or ''}\n{c.signature or ''}" for c in CASES)
    must = [
        "₪", "$", "€", "NIS", "USD", "2026-11-30", "30/11/2026", "30.11.2026", "14:30",
        "+972-3-555-1234", "03-555-1234", "ORD-2026-0042", "#12345", "INC0012345",
        "@contoso.test", "](https://", "https://", "```", "`npm", "|---", "\n- ", "\n3. ",
        "> ", "<script>", "<b>", "](javascript:",
    ]  # fmt: skip
    assert [m for m in must if m not in drafts] == []
    languages = {c.language for c in CASES}
    assert {"he", "en", "ar", None} <= languages
    assert sum(1 for c in CASES if c.contains) >= 5


def _expectation_failures(case: GoldenCase, rendered: RenderedMessage) -> list[str]:
    failures: list[str] = []

    def expect(ok: bool, what: str) -> None:
        if not ok:
            failures.append(what)

    expect(
        (rendered.direction.value, rendered.language) == (case.direction, case.message_language),
        f"message is {rendered.direction.value}/{rendered.language}, "
        f"want {case.direction}/{case.message_language}",
    )
    wrapper = wrapper_of(rendered.html)
    align = "right" if case.direction == "rtl" else "left"
    got_wrapper = (
        wrapper.attributes.get("dir"),
        wrapper.attributes.get("lang"),
        style_value(wrapper, "direction"),
        style_value(wrapper, "text-align"),
    )
    want_wrapper = (case.direction, case.message_language, case.direction, align)
    expect(got_wrapper == want_wrapper, f"wrapper is {got_wrapper}, want {want_wrapper}")

    want_blocks = [(b.direction, b.text) for b in case.blocks]
    got_blocks = [(b.direction.value, b.text) for b in rendered.blocks]
    expect(got_blocks == want_blocks, f"blocks are {got_blocks}, want {want_blocks}")

    elements = html_blocks(wrapper)
    got_html = [
        (
            squash(node_text(n)),
            n.attributes.get("dir"),
            n.attributes.get("lang"),
            style_value(n, "direction"),
            style_value(n, "text-align"),
        )
        for n in elements
    ]
    want_html = [
        (
            squash(b.text),
            b.direction,
            b.lang,
            b.direction,
            "right" if b.direction == "rtl" else "left",
        )
        for b in case.blocks
    ]
    expect(
        got_html == want_html,
        f"HTML blocks (text, dir, lang, css direction, align) are {got_html}, want {want_html}",
    )
    expect(
        squash(node_text(wrapper)) == "".join(squash(b.text) for b in case.blocks),
        f"the wrapper's text {node_text(wrapper)!r} is not exactly its blocks' text",
    )

    want_fragments = list(case.fragments)
    api_fragments = [(f.kind, f.text) for f in rendered.fragments]
    want_api = [("latin" if k == "code" else k, t) for k, t in want_fragments]
    expect(api_fragments == want_api, f"fragments are {api_fragments}, want {want_api}")
    got_spans = html_fragments(wrapper)
    expect(
        got_spans == want_fragments,
        f"HTML isolates are {got_spans}, want {want_fragments}",
    )
    failures.extend(isolate_problems(wrapper))
    got_text = text_isolates(rendered.text)
    want_text = [t for _, t in want_fragments]
    expect(
        got_text == want_text,
        f"the plain-text alternative isolates {got_text}, want {want_text}",
    )

    for needle in case.absent:
        expect(needle not in rendered.html, f"HTML must not contain {needle!r}")
    shown = node_text(wrapper)
    for needle in case.absent_text:
        expect(needle not in shown, f"the reader must not see {needle!r} in {shown.strip()!r}")
    for snippet in case.contains:
        expect(snippet in rendered.html, f"HTML lacks the snippet {snippet!r}")
    return failures


@pytest.mark.parametrize("case", [c.param() for c in CASES])
def test_golden_expectations(case: GoldenCase) -> None:
    rendered = case.render()
    failures = _expectation_failures(case, rendered)
    assert not failures, f"{case.id} ({case.covers}):\n  " + "\n  ".join(failures)


@pytest.mark.parametrize("case", [c.param() for c in CASES])
def test_golden_read_back_of_an_unmodified_copy_passes(case: GoldenCase) -> None:
    rendered = case.render()
    sent, stored = sent_and_stored(rendered)
    report = verify_read_back(rendered, sent, stored)
    assert report.ok, [(c.name, c.detail) for c in report.failed]
    assert {c.name for c in report.checks} >= {"wrapper.direction", "blocks", "fragments"}


@pytest.mark.parametrize("case", [c.param() for c in CASES])
def test_golden_html_is_safe(case: GoldenCase) -> None:
    """Whatever else is wrong, a draft never injects markup or a dangerous link."""
    rendered = case.render()
    body = LexborHTMLParser(rendered.html).body
    assert body is not None
    banned = body.css("script, style, img, iframe, object, embed, form, input, link, meta, svg")
    assert [n.tag for n in banned] == []
    for node in body.css("*"):
        handlers = [name for name in node.attributes if name.lower().startswith("on")]
        assert handlers == [], f"event handler attributes on <{node.tag}>: {handlers}"
    hrefs = [a.attributes.get("href") or "" for a in body.css("a")]
    assert [h for h in hrefs if not SAFE_HREF.match(h)] == []
