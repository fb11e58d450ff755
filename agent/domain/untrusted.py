"""Untrusted text shown to people: flags for characters that can deceive a reader.

Email content (subject, body, quoted history, signatures, display names, attachment names
and contents) is data. Nothing here decides anything: it marks text that could mislead a
human who reads it (a bidi override that reverses ``gpj.exe`` into ``exe.jpg``, a Cyrillic
letter inside a Latin name, a lookalike of a known domain), so every place that shows the text
shows the flag with it.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterable

from pydantic import BaseModel, ConfigDict

#: Explicit directional formatting characters (Unicode Bidirectional Algorithm, UAX #9).
BIDI_CONTROLS = frozenset(
    "\u202a\u202b\u202c\u202d\u202e"  # LRE RLE PDF LRO RLO
    "\u2066\u2067\u2068\u2069"  # LRI RLI FSI PDI
    "\u200e\u200f\u061c"  # LRM RLM ALM
)
#: Invisible characters that can hide text or split a word.
INVISIBLE = frozenset("\u200b\u200c\u200d\u2060\ufeff\u00ad\u180e")

# Scripts whose letters look like Latin ones (the usual homoglyph sources).
_LOOKALIKE_SCRIPTS = frozenset({"LATIN", "CYRILLIC", "GREEK", "ARMENIAN", "CHEROKEE"})

# A skeleton maps characters that render alike to one form (a small subset of Unicode's
# confusables data: the Cyrillic and Greek letters that look Latin, and common digit swaps).
_SKELETON = str.maketrans(
    {
        # Cyrillic
        "\u0430": "a",
        "\u0435": "e",
        "\u043e": "o",
        "\u0440": "p",
        "\u0441": "c",
        "\u0443": "y",
        "\u0445": "x",
        "\u0456": "i",
        "\u0458": "j",
        "\u0455": "s",
        "\u0501": "d",
        "\u04bb": "h",
        "\u04cf": "l",
        "\u051b": "q",
        "\u051d": "w",
        "\u043a": "k",
        "\u043c": "m",
        "\u0442": "t",
        "\u0432": "b",
        "\u043d": "h",
        # Greek
        "\u03bd": "v",
        "\u03bf": "o",
        "\u03b1": "a",
        "\u03b9": "i",
        "\u03ba": "k",
        "\u03c1": "p",
        "\u03c4": "t",
        "\u03c5": "u",
        "\u03c7": "x",
        "\u03b5": "e",
        # digits and punctuation
        "0": "o",
        "1": "l",
        "3": "e",
        "5": "s",
        "|": "l",
    }
)


class Flagged(BaseModel):
    """Untrusted text as it may be shown: control characters made visible, with its flags."""

    model_config = ConfigDict(frozen=True)

    text: str
    shown: str
    flags: tuple[str, ...] = ()

    @property
    def flagged(self) -> bool:
        return bool(self.flags)


def _script(ch: str) -> str | None:
    if not ch.isalpha():
        return None
    try:
        return unicodedata.name(ch).split(" ", 1)[0]
    except ValueError:
        return None


def _codepoint(ch: str) -> str:
    return f"[U+{ord(ch):04X}]"


def text_flags(text: str) -> tuple[str, ...]:
    """What in ``text`` could mislead a reader (empty when nothing)."""
    flags: list[str] = []
    controls = sorted({ch for ch in text if ch in BIDI_CONTROLS})
    if controls:
        flags.append("bidi control characters " + " ".join(_codepoint(c) for c in controls))
    hidden = sorted({ch for ch in text if ch in INVISIBLE})
    if hidden:
        flags.append("invisible characters " + " ".join(_codepoint(c) for c in hidden))
    if any(ch in "\r\n\v\f\x1c\x1d\x1e\x85\u2028\u2029" for ch in text):
        flags.append("line breaks inside a single-line field")
    others = sorted(
        {_codepoint(ch) for ch in text if unicodedata.category(ch) in {"Cc", "Cf", "Zl", "Zp"}}
        - {_codepoint(c) for c in (*controls, *hidden, *"\r\n\v\f\x1c\x1d\x1e\x85\u2028\u2029")}
    )
    if others:
        flags.append("control characters " + " ".join(others))
    for word in text.split():
        scripts = {s for s in (_script(ch) for ch in word) if s in _LOOKALIKE_SCRIPTS}
        if len(scripts) > 1:
            flags.append(f"mixed-script lookalike letters ({' + '.join(sorted(scripts))})")
            break
    return tuple(flags)


def shown(text: str) -> str:
    """The text as it is safe to display: every format and control character written out
    as its code point, so it neither reorders nor hides what follows it."""
    if text.isprintable():
        return text  # no control, format or line/paragraph separator: nothing to write out
    return "".join(
        _codepoint(ch)
        if ch in BIDI_CONTROLS
        or ch in INVISIBLE
        or unicodedata.category(ch) in {"Cc", "Cf", "Zl", "Zp"}
        else ch
        for ch in text
    )


def flag(text: str) -> Flagged:
    flags = text_flags(text)
    display = shown(text)
    return Flagged(text=text, shown=f"⚠ {display}" if flags else display, flags=flags)


#: Unicode's Default_Ignorable_Code_Point ranges (DerivedCoreProperties.txt): characters a
#: reader never sees, which can split a word or an address without changing how it looks.
_IGNORABLE_RANGES = (
    (0x00AD, 0x00AD),
    (0x034F, 0x034F),
    (0x061C, 0x061C),
    (0x115F, 0x1160),
    (0x17B4, 0x17B5),
    (0x180B, 0x180F),
    (0x200B, 0x200F),
    (0x202A, 0x202E),
    (0x2060, 0x206F),
    (0x3164, 0x3164),
    (0xFE00, 0xFE0F),
    (0xFEFF, 0xFEFF),
    (0xFFA0, 0xFFA0),
    (0xFFF0, 0xFFF8),
    (0x1BCA0, 0x1BCA3),
    (0x1D173, 0x1D17A),
    (0xE0000, 0xE0FFF),
)


def _ignorable(ch: str) -> bool:
    code = ord(ch)
    return any(low <= code <= high for low, high in _IGNORABLE_RANGES)


def seen_form(text: str) -> str:
    """Text as it looks: default-ignorable code points removed, then NFKC-folded (fullwidth
    and compatibility forms become their plain characters)."""
    return unicodedata.normalize("NFKC", "".join(ch for ch in text if not _ignorable(ch)))


_PUNYCODE_LABEL = re.compile(r"(?i)(?<![\w-])xn--([a-z0-9-]+)")


def _unicode_label(match: re.Match[str]) -> str:
    try:
        return match.group(1).encode("ascii").decode("punycode")
    except UnicodeError:
        return match.group(0)


def reader_form(text: str) -> str:
    """Text as a reader sees it, for matching: domain labels in punycode (``xn--``) shown as
    the Unicode they stand for, then ``seen_form``, case-folded."""
    return seen_form(_PUNYCODE_LABEL.sub(_unicode_label, text)).casefold()


def skeleton(text: str) -> str:
    """The text with lookalike characters folded together (for comparing domains)."""
    folded = unicodedata.normalize("NFKC", text).lower().translate(_SKELETON)
    return folded.replace("rn", "m").replace("vv", "w")


def _one_edit_apart(a: str, b: str) -> bool:
    if a == b or abs(len(a) - len(b)) > 1:
        return False
    if len(a) == len(b):
        diffs = [i for i, (x, y) in enumerate(zip(a, b, strict=True)) if x != y]
        if len(diffs) == 1:
            return True
        i = diffs[0]
        return len(diffs) == 2 and diffs[1] == i + 1 and a[i] == b[i + 1] and a[i + 1] == b[i]
    short, long = (a, b) if len(a) < len(b) else (b, a)
    return any(long[:i] + long[i + 1 :] == short for i in range(len(long)))


def lookalike_of(domain: str, known: Iterable[str]) -> str | None:
    """The known domain that ``domain`` imitates (same skeleton, or one edit away), or None.
    A domain that is itself known imitates nothing."""
    domain = domain.strip().lower()
    known_set = {k.strip().lower() for k in known}
    if not domain or domain in known_set:
        return None
    mine = skeleton(domain)
    for candidate in sorted(known_set):
        theirs = skeleton(candidate)
        if mine == theirs or _one_edit_apart(mine, theirs):
            return candidate
    return None
