# pyright: strict
"""Rendering never loses, adds or reorders a character of a plain draft.

Drafts are plain paragraphs (no Markdown syntax) mixing Hebrew, Arabic and English words,
numbers, prices, dates, times, phone numbers, IDs, URLs, email addresses, punctuation and
line breaks. Every line starts with a word, so no line can read as a list item, a heading or
a quote; free text avoids every character Markdown gives a meaning to (and ``&``, ``=`` and
``~``: entities, setext headings, strikethrough).
"""

from __future__ import annotations

import re

from hypothesis import given, settings
from hypothesis import strategies as st
from selectolax.lexbor import LexborHTMLParser

from agent.rendering.render import render_message

HEBREW_WORDS = ["שלום", "דנה", "ההזמנה", "נשלחה", "בשעה", "תודה", "בברכה", "ל-", "מחיר", "כן"]
ARABIC_WORDS = ["مرحبا", "الطلب", "شكرا", "بسعر"]
ENGLISH_WORDS = ["Contoso", "Widget", "Pro", "order", "shipped", "iPhone", "Node.js", "v2.1"]
FRAGMENTS = [
    "₪120", "₪ 1,250.50", "35$", "$35.99", "€30", "30 €", "120 NIS", "USD 35", "1.250,00 €",
    "2026-11-30", "30/11/2026", "30.11.2026", "14:30", "9:05 AM", "02:00:00",
    "+972-3-555-1234", "03-555-1234", "(03) 555-1234", "ORD-2026-0042", "#12345", "INC0012345",
    "https://contoso.test/orders/42", "https://contoso.test/a?b=1&c=2", "www.contoso.test/help",
    "https://en.wikipedia.org/wiki/Widget_(software)", "dana@contoso.test",
    "dana.levi+orders@contoso.co.il",
]  # fmt: skip
PUNCTUATION = [".", ",", ":", ";", "?", "״", "׳", "،", "؟", "…", "'", '"', "/", "%", "(", ")"]
FREE_ALPHABET = (
    "אבגדהוזחטיכךלמםנןסעפףצץקרשת"
    "ابتثجحخدرسشصعفقلمنهوي"
    "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
    "0123456789"
    " .,:;?'\"/%@₪$€״׳،؟…"
)
BIDI_CONTROLS = re.compile("[\u200e\u200f\u2066-\u2069]")

words = st.sampled_from(HEBREW_WORDS + ARABIC_WORDS + ENGLISH_WORDS)
tokens = st.one_of(
    words,
    st.sampled_from(FRAGMENTS),
    st.sampled_from(PUNCTUATION),
    st.integers(min_value=0, max_value=10**7).map(str),
    st.text(alphabet=FREE_ALPHABET, min_size=1, max_size=12),
)


@st.composite
def lines(draw: st.DrawFn) -> str:
    """A line that starts with a word, then tokens joined by nothing, spaces or a hard break."""
    out = draw(words)
    for token in draw(st.lists(tokens, max_size=12)):
        out += draw(st.sampled_from(["", " ", " ", "  "])) + token
    return out


@st.composite
def drafts(draw: st.DrawFn) -> str:
    """Lines joined by soft line breaks (one paragraph) or blank lines (a new paragraph)."""
    parts = draw(st.lists(lines(), min_size=1, max_size=6))
    out = parts[0]
    for line in parts[1:]:
        out += draw(st.sampled_from(["\n", "\n\n", "  \n", "\n\n\n"])) + line
    return out + draw(st.sampled_from(["", "\n"]))


languages = st.sampled_from(["he", "ar", "en"])


def squash(text: str) -> str:
    return re.sub(r"\s+", "", text)


@settings(max_examples=200, deadline=None)
@given(draft=drafts(), language=languages)
def test_html_text_is_the_draft_text(draft: str, language: str) -> None:
    rendered = render_message(draft, subject="s", language=language)
    wrapper = LexborHTMLParser(rendered.html).css_first("[data-outloop=message]")
    assert wrapper is not None
    assert squash(wrapper.text(deep=True, separator="")) == squash(draft)


@settings(max_examples=200, deadline=None)
@given(draft=drafts(), language=languages)
def test_plain_text_alternative_is_the_draft_text(draft: str, language: str) -> None:
    rendered = render_message(draft, subject="s", language=language)
    assert squash(BIDI_CONTROLS.sub("", rendered.text)) == squash(draft)
