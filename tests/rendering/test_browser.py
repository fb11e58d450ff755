"""Rendered replies opened in a real browser: headless Chromium computes the direction and
alignment every block displays with, the isolation of every left-to-right fragment, and, for
one Hebrew sentence, where the price actually lands on screen.

The checks read computed styles (``getComputedStyle``) and layout boxes, never the markup, so
they see what a reader's client would show. A negative control strips the direction from the
same HTML and shows the same checks catch it.

Chromium is the system one (``./scripts/setup`` installs it), or ``OUTLOOP_CHROMIUM``.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import TypedDict

import pytest
from playwright.async_api import Browser, Page, Playwright, async_playwright

from agent.rendering.bidi import Direction
from agent.rendering.render import RenderedMessage, render_message
from tests.browser import LAUNCH_ARGS, chromium_executable

HEBREW_REPLY = """\
תודה על הפנייה לגבי **Outloop Pro**.

המחיר ₪1,250.00 לחודש.

פרטים נוספים בכתובת https://fabrikam.test/pricing או במייל support@fabrikam.test.

מספר ההזמנה ORD-2026-0042, המשלוח יגיע ב-15/03/2026 בשעה 14:30.
"""

ENGLISH_REPLY = """\
Your order ORD-2026-0042 is confirmed: $1,250.00 per month, details at \
https://portal.contoso.test/orders/42.

- Licences: 25
- Renewal: 2026-12-01 at 10:30
"""

ARABIC_REPLY = """\
سعر Outloop Pro هو ₪1,250.00 شهرياً، ورقم الطلب ORD-2026-0042.

للمساعدة: support@fabrikam.test أو https://fabrikam.test/help
"""

HEBREW_MIXED = """\
## סיכום ההזמנה

The customer wrote: please send the invoice again.

| מוצר | מחיר |
| --- | --- |
| Outloop Pro | ₪1,250.00 |
| תמיכה | ₪300 |

- פריט ראשון
- Second item, in English
- פריט שלישי עם `api.v2`

1. שלב אחד
2. שלב שני

> ציטוט מהלקוח: ההזמנה ORD-2026-0042
"""


@dataclass(frozen=True)
class Case:
    draft: str
    language: str
    greeting: str
    signature: str

    def render(self) -> RenderedMessage:
        return render_message(
            self.draft,
            subject="Re: הזמנה",
            language=self.language,
            greeting=self.greeting,
            signature=self.signature,
        )


CASES = {
    "hebrew-reply": Case(HEBREW_REPLY, "he", "שלום דנה,", "נועה בר\nFabrikam Support"),
    "english-reply": Case(ENGLISH_REPLY, "en", "Hi Dana,", "Noa Bar"),
    "arabic-reply": Case(ARABIC_REPLY, "ar", "مرحباً دانة،", "نوعا بار"),
    "hebrew-mixed": Case(HEBREW_MIXED, "he", "שלום,", "נועה"),
}

# ---------------------------------------------------------------------------------------------
# Browser


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    """Module-scoped here so one browser serves the whole module."""
    return "asyncio"


class Chromium:
    """One headless Chromium for the module, launched on first use: when it cannot be found,
    each test fails (in its own call, not as a fixture error) saying how to install it."""

    def __init__(self, playwright: Playwright) -> None:
        self._playwright = playwright
        self._browser: Browser | None = None

    @asynccontextmanager
    async def page(self) -> AsyncIterator[Page]:
        if self._browser is None:
            self._browser = await self._playwright.chromium.launch(
                executable_path=chromium_executable(), headless=True, args=LAUNCH_ARGS
            )
        context = await self._browser.new_context(
            viewport={"width": 700, "height": 900}, offline=True
        )
        try:
            yield await context.new_page()
        finally:
            await context.close()

    async def close(self) -> None:
        if self._browser is not None:
            await self._browser.close()


@pytest.fixture(scope="module")
async def chromium(anyio_backend: str) -> AsyncIterator[Chromium]:
    async with async_playwright() as playwright:
        browser = Chromium(playwright)
        try:
            yield browser
        finally:
            await browser.close()


# ---------------------------------------------------------------------------------------------
# What the browser computes


class BlockSeen(TypedDict):
    tag: str
    text: str
    has_dir: bool
    direction: str
    text_align: str
    leaf: bool


class FragmentSeen(TypedDict):
    text: str
    direction: str
    unicode_bidi: str
    bdi_direction: str | None
    bdi_unicode_bidi: str | None


class Snapshot(TypedDict):
    wrapper_found: bool
    wrapper_direction: str
    wrapper_text_align: str
    html_dir: str | None
    body_dir: str | None
    html_style_direction: str
    body_style_direction: str
    blocks: list[BlockSeen]
    fragments: list[FragmentSeen]


BLOCK_SELECTOR = "p,h1,h2,h3,h4,h5,h6,li,td,th,blockquote,ul,ol,table,pre"

# Whitespace and invisible formatting characters are dropped before texts are compared (as in
# agent.rendering.verify.squash): a softbreak is "\n" in a block's text, a <br> in the HTML.
_SQUASH_JS = r"(s) => s.replace(/[\s\u200b-\u200f\u202a-\u202e\u2066-\u2069\ufeff\u00ad]/g, '')"
_INVISIBLE = re.compile(r"[\s\u200b-\u200f\u202a-\u202e\u2066-\u2069\ufeff\u00ad]")

SNAPSHOT_JS = f"""
() => {{
  const squash = {_SQUASH_JS};
  const sel = {BLOCK_SELECTOR!r};
  const wrapper = document.querySelector('[data-outloop="message"]');
  const root = wrapper || document.body;
  const blocks = [...root.querySelectorAll(sel)].map((el) => {{
    const text = squash(el.textContent);
    const cs = getComputedStyle(el);
    return {{
      tag: el.tagName.toLowerCase(),
      text,
      has_dir: el.hasAttribute('dir'),
      direction: cs.direction,
      text_align: cs.textAlign,
      leaf: ![...el.querySelectorAll(sel)].some((d) => squash(d.textContent) !== ''),
    }};
  }});
  const fragments = [...document.querySelectorAll('[data-ltr]')].map((el) => {{
    const cs = getComputedStyle(el);
    const bdi = [...el.children].find((c) => c.tagName === 'BDI');
    const bs = bdi ? getComputedStyle(bdi) : null;
    return {{
      text: el.textContent,
      direction: cs.direction,
      unicode_bidi: cs.unicodeBidi,
      bdi_direction: bs ? bs.direction : null,
      bdi_unicode_bidi: bs ? bs.unicodeBidi : null,
    }};
  }});
  const ws = wrapper ? getComputedStyle(wrapper) : getComputedStyle(document.body);
  return {{
    wrapper_found: wrapper !== null,
    wrapper_direction: ws.direction,
    wrapper_text_align: ws.textAlign,
    html_dir: document.documentElement.getAttribute('dir'),
    body_dir: document.body.getAttribute('dir'),
    html_style_direction: document.documentElement.style.direction,
    body_style_direction: document.body.style.direction,
    blocks,
    fragments,
  }};
}}
"""


def squash(text: str) -> str:
    return _INVISIBLE.sub("", text)


def side(text_align: str, direction: str) -> str:
    """The side a computed ``text-align`` puts text on: ``start``/``end`` by direction."""
    value = text_align.removeprefix("-webkit-")
    start = "right" if direction == "rtl" else "left"
    if value == "start":
        return start
    if value == "end":
        return "left" if start == "right" else "right"
    return value


def expected_side(direction: Direction) -> str:
    return "right" if direction is Direction.RTL else "left"


async def snapshot(page: Page, html: str) -> Snapshot:
    await page.set_content(html)
    seen: Snapshot = await page.evaluate(SNAPSHOT_JS)
    return seen


def block_problems(seen: Snapshot, rendered: RenderedMessage) -> list[str]:
    """Every block element in the wrapper displays in its expected direction, aligned to its
    start. Each leaf block element (one holding no other block element with text) is matched
    by its text to a rendered block, in order; the containers around blocks (lists, list
    items, tables, quotes, the layout table) take the message's direction. A missing ``dir``
    attribute is reported too."""
    problems: list[str] = []
    pending = [(squash(b.text), b.direction) for b in rendered.blocks]
    for el in seen["blocks"]:
        label = f"<{el['tag']}> {el['text'][:40]!r}"
        if not el["has_dir"]:
            problems.append(f"{label} has no dir attribute")
        if el["leaf"] and el["text"]:
            match = next((i for i, (text, _) in enumerate(pending) if text == el["text"]), None)
            if match is None:
                problems.append(f"{label} matches no rendered block")
                continue
            want = pending.pop(match)[1]
        else:
            want = rendered.direction
        if el["direction"] != want.value:
            problems.append(f"{label} displays {el['direction']}, expected {want.value}")
        shown_side = side(el["text_align"], el["direction"])
        if shown_side != expected_side(want):
            problems.append(
                f"{label} is aligned {el['text_align']} ({shown_side}), "
                f"expected {expected_side(want)}"
            )
    problems.extend(f"block {text[:40]!r} not found" for text, _ in pending)
    return problems


def fragment_problems(seen: Snapshot, rendered: RenderedMessage) -> list[str]:
    """Every ``[data-ltr]`` element is a left-to-right isolate holding one whole fragment, and
    together they hold exactly the rendered fragments."""
    problems: list[str] = []
    wanted = Counter(f.text for f in rendered.fragments)
    for el in seen["fragments"]:
        span_isolates = el["direction"] == "ltr" and el["unicode_bidi"] == "isolate"
        bdi_isolates = el["bdi_direction"] == "ltr" and el["bdi_unicode_bidi"] == "isolate"
        if not (span_isolates or bdi_isolates):
            problems.append(
                f"{el['text']!r} is not a left-to-right isolate: direction {el['direction']}, "
                f"unicode-bidi {el['unicode_bidi']}, bdi {el['bdi_direction']}/"
                f"{el['bdi_unicode_bidi']}"
            )
        if el["text"] not in wanted:
            problems.append(f"{el['text']!r} is not one whole rendered fragment")
    found = Counter(el["text"] for el in seen["fragments"])
    if found != wanted:
        problems.append(f"isolated {dict(found)}, rendered {dict(wanted)}")
    return problems


# ---------------------------------------------------------------------------------------------
# Tests


@pytest.mark.anyio
@pytest.mark.parametrize("name", list(CASES))
async def test_every_block_and_fragment_displays_in_its_direction_in_chromium(
    chromium: Chromium, name: str
) -> None:
    rendered = CASES[name].render()
    async with chromium.page() as page:
        seen = await snapshot(page, rendered.html)

    assert seen["wrapper_found"], "no [data-outloop=message] wrapper"
    assert seen["wrapper_direction"] == rendered.direction.value
    assert side(seen["wrapper_text_align"], seen["wrapper_direction"]) == expected_side(
        rendered.direction
    )
    # The direction lives on the wrapper, never on the document.
    assert (seen["html_dir"], seen["body_dir"]) == (None, None)
    assert (seen["html_style_direction"], seen["body_style_direction"]) == ("", "")

    assert block_problems(seen, rendered) == []
    assert fragment_problems(seen, rendered) == []
    # Every rendered block was seen, and the drafts exercise what they are meant to.
    assert len([b for b in seen["blocks"] if b["leaf"] and b["text"]]) == len(rendered.blocks)
    if rendered.direction is Direction.RTL:
        assert rendered.fragments
    else:
        assert seen["fragments"] == []


def test_the_drafts_cover_every_fragment_kind_and_both_block_directions() -> None:
    """The premise of the browser checks: what they look for is in the rendered messages."""
    hebrew = CASES["hebrew-reply"].render()
    assert {f.kind for f in hebrew.fragments} >= {
        "latin",
        "price",
        "url",
        "email",
        "id",
        "date",
        "time",
    }
    mixed = CASES["hebrew-mixed"].render()
    directions = {(b.text, b.direction) for b in mixed.blocks}
    assert ("The customer wrote: please send the invoice again.", Direction.LTR) in directions
    assert ("Second item, in English", Direction.LTR) in directions
    assert ("Outloop Pro", Direction.LTR) in directions
    assert ("תמיכה", Direction.RTL) in directions
    assert CASES["english-reply"].render().direction is Direction.LTR
    assert CASES["arabic-reply"].render().direction is Direction.RTL


class Box(TypedDict):
    left: float
    right: float


class PriceLayout(TypedDict):
    direction: str
    price_text: str
    before: Box  # המחיר
    price: Box
    after: Box  # לחודש
    full_stop: Box  # the sentence's own full stop, outside the price
    first_char: Box
    last_char: Box


PRICE_LAYOUT_JS = """
() => {
  const box = (r) => ({ left: r.left, right: r.right });
  const p = [...document.querySelectorAll('[data-outloop="message"] p')]
    .find((el) => el.textContent.includes('המחיר'));
  const word = (w) => {
    const walker = document.createTreeWalker(p, NodeFilter.SHOW_TEXT);
    for (let node = walker.nextNode(); node; node = walker.nextNode()) {
      const at = node.data.indexOf(w);
      if (at >= 0 && !node.parentElement.closest('[data-ltr]')) {
        const range = document.createRange();
        range.setStart(node, at);
        range.setEnd(node, at + w.length);
        return box(range.getBoundingClientRect());
      }
    }
    throw new Error('no text node holds ' + w);
  };
  const price = p.querySelector('[data-ltr="price"]');
  const walker = document.createTreeWalker(price, NodeFilter.SHOW_TEXT);
  const text = walker.nextNode();
  const char = (i) => {
    const range = document.createRange();
    range.setStart(text, i);
    range.setEnd(text, i + 1);
    return box(range.getBoundingClientRect());
  };
  return {
    direction: getComputedStyle(p).direction,
    price_text: text.data,
    before: word('המחיר'),
    price: box(price.getBoundingClientRect()),
    after: word('לחודש'),
    full_stop: word('.'),
    first_char: char(0),
    last_char: char(text.data.length - 1),
  };
}
"""


async def price_layout(page: Page, html: str) -> PriceLayout:
    await page.set_content(html)
    layout: PriceLayout = await page.evaluate(PRICE_LAYOUT_JS)
    return layout


@pytest.mark.anyio
async def test_the_price_reads_after_the_hebrew_word_and_its_digits_run_left_to_right(
    chromium: Chromium,
) -> None:
    rendered = CASES["hebrew-reply"].render()
    async with chromium.page() as page:
        layout = await price_layout(page, rendered.html)

    assert layout["direction"] == "rtl"
    assert layout["price_text"] == "₪1,250.00"
    # Right to left: המחיר, then the price to its left, then לחודש to the price's left.
    assert layout["price"]["right"] <= layout["before"]["left"] + 0.5, layout
    assert layout["after"]["right"] <= layout["price"]["left"] + 0.5, layout
    assert layout["full_stop"]["right"] <= layout["after"]["left"] + 0.5, layout
    # Inside the isolate the price runs left to right: ₪ first (leftmost), the last 0 last.
    assert layout["first_char"]["left"] < layout["last_char"]["left"], layout


def strip_direction(html: str) -> str:
    """The HTML as a client that drops every dir attribute and CSS direction would keep it."""
    html = re.sub(r'\sdir="[^"]*"', "", html)
    return re.sub(r"direction\s*:\s*(?:ltr|rtl)\s*;?", "", html)


@pytest.mark.anyio
async def test_negative_control_a_copy_without_direction_is_caught(chromium: Chromium) -> None:
    rendered = CASES["hebrew-reply"].render()
    stripped = strip_direction(rendered.html)
    assert "dir=" not in stripped
    assert "direction:" not in stripped

    async with chromium.page() as page:
        seen = await snapshot(page, stripped)
        layout = await price_layout(page, stripped)
    hebrew_paragraph = squash("המחיר ₪1,250.00 לחודש.")
    (paragraph,) = [b for b in seen["blocks"] if b["tag"] == "p" and b["text"] == hebrew_paragraph]
    assert paragraph["direction"] == "ltr"
    assert seen["wrapper_direction"] == "ltr"
    # The same checks that pass on the rendered HTML fail on this copy, naming the paragraph.
    problems = block_problems(seen, rendered)
    assert any(
        hebrew_paragraph[:20] in p and "displays ltr, expected rtl" in p for p in problems
    ), problems
    # And on screen the sentence's full stop jumps to the right end, before המחיר (the
    # Hebrew words and the isolated price still form one right-to-left run).
    assert layout["full_stop"]["left"] >= layout["before"]["right"] - 0.5, layout
