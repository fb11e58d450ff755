"""Direction and bidi isolation: which way a paragraph runs, and which fragments inside
right-to-left text must keep running left to right.

Pure functions on text; the HTML and plain-text renderers build on them.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum


class Direction(StrEnum):
    LTR = "ltr"
    RTL = "rtl"

    @property
    def align(self) -> str:
        return "right" if self is Direction.RTL else "left"


RTL_LANGUAGES = frozenset({"he", "iw", "yi", "ji", "ar", "fa", "ur", "ps", "sd", "ug", "dv", "ckb"})
"""Languages written right to left (ISO 639-1 where there is a code)."""


def language_direction(language: str) -> Direction:
    """The direction of a language tag such as ``he``, ``ar-EG`` or ``en-GB``."""
    primary = language.replace("_", "-").split("-")[0].lower()
    return Direction.RTL if primary in RTL_LANGUAGES else Direction.LTR


def strong_direction(ch: str) -> Direction | None:
    """The character's strong direction (Unicode bidi classes L, R and AL), else None."""
    kind = unicodedata.bidirectional(ch)
    if kind == "L":
        return Direction.LTR
    if kind in ("R", "AL"):
        return Direction.RTL
    return None


def strong_counts(text: str) -> tuple[int, int]:
    """(left-to-right, right-to-left) strong characters in ``text``."""
    ltr = rtl = 0
    for ch in text:
        found = strong_direction(ch)
        if found is Direction.LTR:
            ltr += 1
        elif found is Direction.RTL:
            rtl += 1
    return ltr, rtl


def paragraph_direction(text: str, message: Direction) -> Direction:
    """A paragraph runs in the message's direction whenever it has any letter of that
    direction: a Latin product name inside a Hebrew sentence never flips the sentence. Only a
    paragraph wholly in the other script (an English quote in a Hebrew reply) turns."""
    ltr, rtl = strong_counts(text)
    own = rtl if message is Direction.RTL else ltr
    other = ltr if message is Direction.RTL else rtl
    if own or not other:
        return message
    return Direction.LTR if message is Direction.RTL else Direction.RTL


def script_language(text: str, message_language: str) -> str:
    """The language tag for a paragraph: the message's own when the paragraph runs in the
    message's direction, else the most likely language of the other script."""
    message = language_direction(message_language)
    ltr, rtl = strong_counts(text)
    if not ltr and not rtl:  # no letters at all (a price, a time): the message's language
        return message_language
    if (rtl and message is Direction.RTL) or (ltr and message is Direction.LTR):
        return message_language
    if rtl:
        arabic = sum(1 for ch in text if "\u0600" <= ch <= "\u08ff")
        return "ar" if arabic * 2 > rtl else "he"
    return "en"


class FragmentKind(StrEnum):
    URL = "url"
    EMAIL = "email"
    PRICE = "price"
    DATE = "date"
    TIME = "time"
    PHONE = "phone"
    ID = "id"
    LATIN = "latin"


_CURRENCY = r"[₪$€£¥]"
_CODES = r"(?:NIS|ILS|USD|EUR|GBP|AED|SAR|JOD|EGP)"
# 1,250.00 and 1.250,00 (thousands grouped either way), 1250.00, 1250,00 and 1250.
_AMOUNT = r"\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d{1,3}(?:\.\d{3})+(?:,\d+)?|\d+(?:[.,]\d{1,2})?(?!\d)"
# Sentence punctuation (Latin, Hebrew gershayim/geresh, Arabic comma/semicolon/question mark,
# ellipsis) that ends a sentence rather than a URL or a Latin run.
_TRAILING = ".,;:!?)]}'\"\u05f4\u05f3\u060c\u061b\u061f\u2026"

# Order matters: earlier kinds win where patterns overlap (a price before a bare number, a
# date before a phone number, an email before a Latin word).
_PATTERNS: tuple[tuple[FragmentKind, str], ...] = (
    (FragmentKind.URL, r"(?:https?://|ftp://|www\.)[^\s<>\"]+"),
    (
        FragmentKind.EMAIL,
        r"[A-Za-z0-9][A-Za-z0-9._%+-]*@[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*\.[A-Za-z]{2,}",
    ),
    (
        FragmentKind.PRICE,
        rf"(?:{_CURRENCY}\s?(?:{_AMOUNT})|(?:{_AMOUNT})\s?{_CURRENCY}"
        rf"|{_CODES}\s?(?:{_AMOUNT})|(?:{_AMOUNT})\s?{_CODES}\b)",
    ),
    (
        FragmentKind.DATE,
        r"\b(?:\d{4}-\d{2}-\d{2}(?:[T ]\d{2}:\d{2}(?::\d{2})?)?|\d{1,2}[./-]\d{1,2}[./-]\d{2,4})\b",
    ),
    (FragmentKind.TIME, r"\b\d{1,2}:\d{2}(?::\d{2})?(?:\s?[AaPp][Mm])?\b"),
    (FragmentKind.PHONE, r"(?<![\w+(])(?:\(\d{1,4}\)\s?)?\+?\d[\d\-. ()]{6,}\d\b"),
    (FragmentKind.ID, r"#\d+\b|\b[A-Z]{2,}[-_]?\d[A-Za-z0-9_-]*\b|\b\d+-\d+(?:-\d+)+\b"),
    (FragmentKind.LATIN, r"[A-Za-z][A-Za-z0-9_.+#&'\u2019/-]*"),
)
# A Latin run goes on over spaces from word to word, but never into a fragment of another
# kind: "Contoso support@contoso.test" is a name and an address, not one run.
_OTHERS = "|".join(rx for kind, rx in _PATTERNS if kind is not FragmentKind.LATIN)
_LATIN_WORD = r"[A-Za-z0-9_.+#&'\u2019/-]+"
_LATIN_RUN = _PATTERNS[-1][1] + rf"(?:[ \t]+(?!{_OTHERS})(?=[A-Za-z0-9]){_LATIN_WORD})*"
_FRAGMENT_RE = re.compile(
    "|".join(
        f"(?P<{kind.value}>{_LATIN_RUN if kind is FragmentKind.LATIN else rx})"
        for kind, rx in _PATTERNS
    )
)


@dataclass(frozen=True)
class Segment:
    """A piece of a text: plain, or a fragment to isolate left to right."""

    text: str
    kind: FragmentKind | None = None


def segments(text: str) -> list[Segment]:
    """Split right-to-left paragraph text into plain runs and left-to-right fragments.
    Joining the segments' texts gives ``text`` back exactly."""
    out: list[Segment] = []
    at = 0
    for match in _FRAGMENT_RE.finditer(text):
        kind = FragmentKind(match.lastgroup or "")
        start, end = match.span()
        fragment = match.group()
        # Sentence punctuation after a URL or a Latin run belongs to the sentence.
        trims = kind in (FragmentKind.URL, FragmentKind.LATIN)
        stripped = trim_trailing(fragment) if trims else fragment
        if not stripped:
            continue
        if start > at:
            out.append(Segment(text[at:start]))
        out.append(Segment(stripped, kind))
        at = start + len(stripped)
        if at < end:
            out.append(Segment(text[at:end]))
            at = end
    if at < len(text):
        out.append(Segment(text[at:]))
    return _merge_plain(out)


def trim_trailing(fragment: str) -> str:
    """Drop sentence punctuation from the end, but keep a closing parenthesis that closes
    one opened inside the fragment (https://en.wikipedia.org/wiki/Widget_(software))."""
    while fragment and fragment[-1] in _TRAILING:
        if fragment[-1] == ")" and fragment.count("(") >= fragment.count(")"):
            break
        fragment = fragment[:-1]
    return fragment


def _merge_plain(parts: list[Segment]) -> list[Segment]:
    merged: list[Segment] = []
    for part in parts:
        if merged and part.kind is None and merged[-1].kind is None:
            merged[-1] = Segment(merged[-1].text + part.text)
        else:
            merged.append(part)
    return merged


# Unicode isolates for plain text (UAX #9): LRI ... PDI around a left-to-right fragment; a
# right-to-left mark (RLM) or left-to-right mark (LRM) opens a paragraph to fix its direction.
LRI, RLI, PDI = "\u2066", "\u2067", "\u2069"
LRM, RLM = "\u200e", "\u200f"


def isolate_plain(text: str, direction: Direction, whole: Sequence[tuple[int, int]] = ()) -> str:
    """One block of plain text that displays in ``direction`` (a mark opens every line),
    with its left-to-right fragments isolated; the ``whole`` spans (inline code) are each
    one isolate, never re-read as text."""
    if direction is Direction.LTR:
        return "\n".join(LRM + line for line in text.split("\n"))
    out: list[str] = []
    at = 0
    for start, end in sorted(whole):
        out.extend(_isolated(text[at:start]))
        out.append(LRI + text[start:end] + PDI)
        at = end
    out.extend(_isolated(text[at:]))
    return "\n".join(RLM + line for line in "".join(out).split("\n"))


def _isolated(text: str) -> list[str]:
    return [LRI + s.text + PDI if s.kind is not None else s.text for s in segments(text)]
