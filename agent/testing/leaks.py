"""Leak scanning: is a secret anywhere it must not be?

A test plants a secret where one sits (a vault), runs, and then scans texts (log records,
exception texts, tool results) and every file under a scan root for it, in each form a leak
takes. What is looked for (a ``Needle``):

- ``Canary``: a random value planted on purpose (it can be a password too). Its forms are
  plain, JSON-escaped (ASCII and UTF-8), URL-encoded (path and form style) and
  quoted-printable (body and header style, also across soft line breaks). The value holds a
  random token between characters those encodings change (space, quote, slash, backslash,
  non-ASCII unless it is made ``ascii_only``, ``+&%=``), and every one of them keeps the
  token whole: a text holding the token is a finding even in an escaping not listed ("its
  random part");
- ``Value``: any other secret text (not canary-shaped: no random part to rely on), in each
  of those forms and also URL-encoded keeping ``/`` and as a Python repr; ``TotpSeed``: an
  authenticator's base32 secret, also in lower case, in groups of four, and its key's bytes
  in hex and base64;
- ``TotpCodes``: six-digit authenticator codes, found only where a code stands alone - a
  whole token or a form value (``otc=123456``, ``"123456"``, ``code: 123456``), also right
  after an escape (``otc%3D123456``, ``otc=3D123456``, ``\\u0022123456``) or split by a
  quoted-printable soft line break - never inside a longer run of letters and digits or a
  decimal number (a timestamp ``1800000001.123456`` holds no code);
- each of them in base64 of its UTF-8 bytes, standard and URL-safe, at each of the three
  byte offsets it can start at inside a longer base64 run, also when the run is wrapped
  over lines (MIME, PEM, the plain keyring file); a code's base64 is decoded around it to
  tell a whole token from chance digits.

A file that cannot be read fails the scan: it is never taken as clean. Nothing here shows a
secret: reprs are redacted, and a finding names where, what and in which form only.
"""

from __future__ import annotations

import base64
import binascii
import email.quoprimime
import json
import os
import quopri
import re
import secrets
import stat
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import IO
from urllib.parse import quote, quote_plus

__all__ = [
    "Canary",
    "Finding",
    "Needle",
    "ScanReport",
    "TotpCodes",
    "TotpSeed",
    "Value",
    "scan_file",
    "scan_text",
    "scan_tree",
]

RANDOM_PART = "its random part"
CHUNK = 1 << 22
WHITESPACE = b" \t\r\n"
SOFT_BREAK = re.compile(rb"=[ \t]*\r?\n")
"""A quoted-printable soft line break (``=`` ending a line, transport padding allowed)."""
EDGE, CONTEXT = 16, 64
"""A match starting in the first ``EDGE`` bytes of a chunk that lies, with ``CONTEXT`` bytes
of what follows it, in the overlap with the chunk before was seen there with its context."""

Opener = Callable[[Path], IO[bytes]]
Forms = tuple[tuple[str, bytes], ...]


class Needle(ABC):
    """Something secret a scan looks for, and the forms it takes."""

    what: str = "the secret"
    """How a finding names it (never the value)."""

    @property
    @abstractmethod
    def longest(self) -> int:
        """The longest stretch of bytes one finding spans (chunks overlap by more)."""

    @abstractmethod
    def forms_in(self, data: bytes, *, start: int = 0) -> list[str]:
        """The names of the forms ``data`` holds it in. ``start``: the bytes before it were
        the end of the chunk scanned before (context only, for a match that needs it)."""

    @abstractmethod
    def hidden(self, text: str) -> str:
        """``text`` with the secret written out of it (a where that would show it)."""


def _joined(data: bytes) -> bytes:
    """``data`` with quoted-printable soft line breaks taken out."""
    return SOFT_BREAK.sub(b"", data) if b"=" in data else data


def _text_forms(value: str) -> list[tuple[str, bytes]]:
    return [
        ("plain", value.encode()),
        ("JSON-escaped", json.dumps(value)[1:-1].encode()),
        ("JSON-escaped (UTF-8)", json.dumps(value, ensure_ascii=False)[1:-1].encode()),
        ("URL-encoded", quote(value, safe="").encode()),
        ("URL-encoded (form)", quote_plus(value, safe="").encode()),
    ]


def _qp_forms(raw: bytes) -> list[tuple[str, bytes]]:
    """Quoted-printable of ``raw`` as body and header (RFC 2047 ``Q``) encoders write it,
    soft line breaks taken out, with upper and lower case hex."""
    header = email.quoprimime.header_encode(raw, "utf-8")
    inner = header.removeprefix("=?utf-8?q?").removesuffix("?=").encode()
    forms = [
        ("quoted-printable", _joined(quopri.encodestring(raw))),
        ("quoted-printable", _joined(quopri.encodestring(raw, quotetabs=True))),
        ("quoted-printable (header)", _joined(binascii.b2a_qp(raw, header=True))),
        ("quoted-printable (header)", inner),
    ]
    lower = [
        (name, re.sub(rb"=[0-9A-F]{2}", lambda m: m.group().lower(), form)) for name, form in forms
    ]
    return forms + lower


def _base64_forms(raw: bytes, name: str = "base64") -> list[tuple[str, bytes]]:
    """The base64 characters that encode only ``raw``, at each offset in a longer run."""
    forms: list[tuple[str, bytes]] = []
    for offset in range(3):
        start, end = -(-8 * offset // 6), 8 * (offset + len(raw)) // 6
        padded = b"\0" * offset + raw
        forms.append((name, base64.b64encode(padded)[start:end]))
        forms.append((f"{name} (URL-safe)", base64.urlsafe_b64encode(padded)[start:end]))
    return forms


def _unique(forms: Iterable[tuple[str, bytes]], seen: Iterable[bytes] = ()) -> Forms:
    """Each pattern once, under the first name given it (none already in ``seen``)."""
    found: dict[bytes, str] = dict.fromkeys(seen, "")
    for name, pattern in forms:
        found.setdefault(pattern, name)
    return tuple((name, pattern) for pattern, name in found.items() if name)


class Canary(Needle):
    """A random secret value to plant, and the byte patterns of its forms."""

    what = "the canary"

    def __init__(self, token: str, *, ascii_only: bool = False) -> None:
        if len(token) < 16 or not token.isalnum():
            raise ValueError("a canary's token is 16 or more letters and digits")
        self._token = token
        self._accent = "" if ascii_only else "é"

    @classmethod
    def plant(cls, *, ascii_only: bool = False) -> Canary:
        """A new canary with a 128-bit random token (``ascii_only``: without its non-ASCII
        character, for a system that takes ASCII only)."""
        return cls(secrets.token_hex(16), ascii_only=ascii_only)

    @property
    def value(self) -> str:
        """The secret value itself: plant it, never print it."""
        return f'canary {self._token} "q"/\\{self._accent}+&%='

    def __repr__(self) -> str:
        return "Canary([redacted])"

    @cached_property
    def token(self) -> bytes:
        return self._token.encode()

    @cached_property
    def text_forms(self) -> Forms:
        """Each form that keeps the token whole, by name."""
        return _unique(_text_forms(self.value))

    @cached_property
    def qp_forms(self) -> Forms:
        """Its quoted-printable forms (looked for with soft line breaks taken out)."""
        return _unique(_qp_forms(self.value.encode()), (p for _, p in self.text_forms))

    @cached_property
    def base64_forms(self) -> Forms:
        """The base64 characters that encode only the canary's bytes, at each offset."""
        return _unique(_base64_forms(self.value.encode()))

    @property
    def longest(self) -> int:
        return max(len(p) for _, p in (*self.text_forms, *self.qp_forms, *self.base64_forms))

    def forms_in(self, data: bytes, *, start: int = 0) -> list[str]:
        """The names of the forms ``data`` holds the canary in."""
        del start  # a canary's forms need no context
        found: list[str] = []
        joined = _joined(data)
        if self.token in data or self.token in joined:
            found = [name for name, pattern in self.text_forms if pattern in data]
            found += [name for name, pattern in self.qp_forms if pattern in joined]
            found = found or [RANDOM_PART]
        squeezed = data.translate(None, WHITESPACE)
        found += [name for name, pattern in self.base64_forms if pattern in squeezed]
        return list(dict.fromkeys(found))

    def hidden(self, text: str) -> str:
        """``text`` with the token written out of it (a where that would show it)."""
        return text.replace(self._token, "[canary]")


class Value(Needle):
    """Any secret text (a password, a key), looked for in every form: plain, JSON-escaped,
    URL-encoded (also keeping ``/``), as a Python repr, quoted-printable and base64. It has
    no random part to fall back on, so each form is a pattern of its own."""

    def __init__(self, value: str, what: str = "the secret") -> None:
        if len(value) < 8:
            raise ValueError("a value shorter than 8 characters would be found by chance")
        self._value = value
        self.what = what

    def __repr__(self) -> str:
        return f"Value({self.what!r}, [redacted])"

    def spellings(self) -> list[tuple[str, str]]:
        """The texts the secret is written as, each with a suffix for its forms' names."""
        return [("", self._value)]

    def raw_forms(self) -> list[tuple[str, bytes]]:
        """More patterns of the secret that are not a text of it (none here)."""
        return []

    @cached_property
    def text_forms(self) -> Forms:
        forms: list[tuple[str, bytes]] = []
        for suffix, text in self.spellings():
            named = [
                *_text_forms(text),
                ("URL-encoded (keeping /)", quote(text).encode()),
                ("Python repr", repr(text)[1:-1].encode()),
            ]
            forms += [(name + suffix, pattern) for name, pattern in named]
        return _unique([*forms, *self.raw_forms()])

    @cached_property
    def qp_forms(self) -> Forms:
        """Quoted-printable, looked for with soft line breaks taken out (a pattern that is a
        text form too is reported as quoted-printable where only a soft break split it)."""
        forms = [
            (name + suffix, pattern)
            for suffix, text in self.spellings()
            for name, pattern in _qp_forms(text.encode())
        ]
        return _unique(forms)

    @cached_property
    def base64_forms(self) -> Forms:
        forms = [
            (name + suffix, pattern)
            for suffix, text in self.spellings()
            for name, pattern in _base64_forms(text.encode())
        ]
        return _unique(forms, (p for _, p in self.text_forms))

    @cached_property
    def _text_patterns(self) -> frozenset[bytes]:
        return frozenset(p for _, p in self.text_forms)

    @property
    def longest(self) -> int:
        return max(len(p) for _, p in (*self.text_forms, *self.qp_forms, *self.base64_forms))

    def forms_in(self, data: bytes, *, start: int = 0) -> list[str]:
        del start  # a value's forms need no context
        found = [name for name, pattern in self.text_forms if pattern in data]
        joined = _joined(data)
        found += [
            name
            for name, pattern in self.qp_forms
            if pattern in joined and (pattern not in self._text_patterns or pattern not in data)
        ]
        squeezed = data.translate(None, WHITESPACE)
        found += [name for name, pattern in self.base64_forms if pattern in squeezed]
        return list(dict.fromkeys(found))

    def hidden(self, text: str) -> str:
        for _, spelling in self.spellings():
            text = text.replace(spelling, f"[{self.what}]")
        return text


class TotpSeed(Value):
    """An authenticator's secret (base32): as given, in lower case and in groups of four
    (as setup pages show it), and its key's bytes in hex and base64."""

    def __init__(self, seed: str, what: str = "the TOTP seed") -> None:
        compact = "".join(seed.split()).upper()
        self.key = base64.b32decode(compact + "=" * (-len(compact) % 8))
        super().__init__(compact.rstrip("="), what)

    def __repr__(self) -> str:
        return f"TotpSeed({self.what!r}, [redacted])"

    def spellings(self) -> list[tuple[str, str]]:
        upper = self._value
        grouped = " ".join(upper[i : i + 4] for i in range(0, len(upper), 4))
        return [
            ("", upper),
            (" (lower case)", upper.lower()),
            (" (in groups)", grouped),
            (" (in groups, lower case)", grouped.lower()),
        ]

    def raw_forms(self) -> list[tuple[str, bytes]]:
        hexed = self.key.hex().encode()
        return [
            ("its key in hex", hexed),
            ("its key in hex", hexed.upper()),
            *_base64_forms(self.key, "its key in base64"),
        ]


CODE = re.compile(rb"[0-9]{6}")
ESCAPE_BEFORE = re.compile(
    rb"(?:%[0-9A-Fa-f]{2}|=[0-9A-F]{2}|\\u[0-9A-Fa-f]{4}|\\x[0-9A-Fa-f]{2}|\\[nrt\"'/])\Z"
)
ESCAPES = {ord("%"): "URL-encoded", ord("="): "quoted-printable", ord("\\"): "JSON-escaped"}
FORM_VALUE = (b"=", b":", b'"', b"'")


def _word(byte: bytes) -> bool:
    return bool(byte) and (byte.isalnum() or byte == b"_")


def code_at(data: bytes, pos: int) -> str | None:
    """How the six digits at ``pos`` stand: a whole token, a form value, right after an
    escape (URL-encoded, quoted-printable, JSON-escaped), or ``None`` - part of a longer run
    of letters and digits, or of a decimal number (a timestamp's fraction)."""
    before, after = data[max(0, pos - 8) : pos], data[pos + 6 : pos + 8]
    if _word(after[:1]) or (after[:1] == b"." and after[1:2].isdigit()):
        return None
    escape = ESCAPE_BEFORE.search(before)
    if escape is not None:
        return ESCAPES[escape.group()[0]]
    if _word(before[-1:]) or (before[-1:] == b"." and before[-2:-1].isdigit()):
        return None
    return "form value" if before.rstrip(b" \t")[-1:] in FORM_VALUE else "whole token"


def _b64(chunk: bytes, urlsafe: bool) -> bytes | None:
    """Four base64 characters (one group) decoded, or ``None`` when they are not one."""
    if len(chunk) != 4:
        return None
    if urlsafe:
        if b"+" in chunk or b"/" in chunk:
            return None
        chunk = chunk.replace(b"-", b"+").replace(b"_", b"/")
    try:
        return base64.b64decode(chunk, validate=True)
    except binascii.Error:
        return None


class TotpCodes(Needle):
    """Six-digit authenticator codes, each found only where it stands alone."""

    what = "a TOTP code"

    def __init__(self, codes: Iterable[str]) -> None:
        self.codes = tuple(dict.fromkeys(codes))
        if not all(len(c) == 6 and c.isdigit() and c.isascii() for c in self.codes):
            raise ValueError("a TOTP code here is six digits")

    def __repr__(self) -> str:
        return f"TotpCodes([{len(self.codes)} redacted])"

    @property
    def longest(self) -> int:
        return CONTEXT

    def forms_in(self, data: bytes, *, start: int = 0) -> list[str]:
        found: list[str] = []
        joined = _joined(data) if SOFT_BREAK.search(data) else None
        squeezed = data.translate(None, WHITESPACE)
        squeezed_start = len(data[:start].translate(None, WHITESPACE))
        for index, code in enumerate(self.codes):
            which = f" (code {index + 1} of {len(self.codes)})"
            plain = self._plain(data, code.encode(), start)
            found += [kind + which for kind in plain]
            if joined is not None:
                split = self._plain(joined, code.encode(), len(_joined(data[:start])))
                if sum(split.values()) > sum(plain.values()):
                    found.append("quoted-printable" + which)
            found += [kind + which for kind in self._base64(squeezed, code, squeezed_start)]
        return list(dict.fromkeys(found))

    @staticmethod
    def _plain(data: bytes, code: bytes, start: int) -> dict[str, int]:
        """How often the code stands alone in ``data``, by how it stands."""
        kinds: dict[str, int] = {}
        pos = data.find(code)
        while pos != -1:
            kind = code_at(data, pos)
            if kind is not None and not _seen_before(pos, start):
                kinds[kind] = kinds.get(kind, 0) + 1
            pos = data.find(code, pos + 1)
        return kinds

    @staticmethod
    @staticmethod
    def _base64(squeezed: bytes, code: str, start: int) -> list[str]:
        """The base64 forms the code stands alone in: the run decoded around each place its
        pattern is (a code's digits encode to the same characters in both alphabets; the
        run around them tells them apart)."""
        found: list[str] = []
        for offset in range(3):
            first = -(-8 * offset // 6)
            pattern = base64.b64encode(b"\0" * offset + code.encode())[
                first : 8 * (offset + 6) // 6
            ]
            pos = squeezed.find(pattern)
            while pos != -1:
                group = pos - first
                if group >= 0 and not _seen_before(pos, start):
                    around = squeezed[max(0, group - 8) : group + 20]
                    urlsafe = (b"-" in around or b"_" in around) and not (
                        b"+" in around or b"/" in around
                    )
                    decoded = _decoded_around(squeezed, group, offset, urlsafe)
                    if decoded is not None and code_at(*decoded) is not None:
                        found.append("base64 (URL-safe)" if urlsafe else "base64")
                pos = squeezed.find(pattern, pos + 1)
        return list(dict.fromkeys(found))

    def hidden(self, text: str) -> str:
        for code in self.codes:
            text = text.replace(code, "[code]")
        return text


def _seen_before(pos: int, start: int) -> bool:
    """Whether a match at ``pos`` lies, with its context, in the overlap with the chunk
    scanned before (``start`` bytes of it): it was seen there, with what stood before it."""
    return start > 0 and pos < EDGE and pos + CONTEXT <= start


def _decoded_around(
    squeezed: bytes, group: int, offset: int, urlsafe: bool
) -> tuple[bytes, int] | None:
    """The bytes a base64 run holds around a code whose first byte is ``offset`` bytes into
    the group at ``group``: up to two groups before and after it, and where the code starts
    in them; ``None`` when the code's own groups are not base64."""
    groups = (offset + 6 + 2) // 3
    middle = b""
    for i in range(groups):
        part = _b64(squeezed[group + 4 * i : group + 4 * i + 4], urlsafe)
        if part is None or (i < groups - 1 and len(part) < 3):
            return None
        middle += part
    before = b""
    for i in (1, 2):
        at = group - 4 * i
        part = _b64(squeezed[at : at + 4], urlsafe) if at >= 0 else None
        if part is None or len(part) < 3:
            break
        before = part + before
    after = b""
    if len(middle) == 3 * groups:  # no padding: the run may go on
        at = group + 4 * groups
        for i in (0, 1):
            part = _b64(squeezed[at + 4 * i : at + 4 * i + 4], urlsafe)
            if part is None:
                break
            after += part
            if len(part) < 3:
                break
    return before + middle + after, len(before) + offset


@dataclass(frozen=True)
class Finding:
    """A secret, in one form, somewhere."""

    where: str
    form: str
    what: str = Canary.what

    def __str__(self) -> str:
        return f"{self.where}: {self.what}, {self.form}"


@dataclass
class ScanReport:
    """What a scan found, and what it could not read (either one fails it)."""

    findings: list[Finding] = field(default_factory=list[Finding])
    unreadable: list[str] = field(default_factory=list[str])

    @property
    def clean(self) -> bool:
        return not self.findings and not self.unreadable

    def lines(self) -> list[str]:
        """One line per finding and per unreadable path; none shows a secret."""
        return [str(f) for f in self.findings] + [f"{u}: unreadable" for u in self.unreadable]


Sought = Needle | Sequence[Needle]
"""One secret to look for, or several at once."""


def _needles(sought: Sought) -> tuple[Needle, ...]:
    return (sought,) if isinstance(sought, Needle) else tuple(sought)


def _hidden(needles: Sequence[Needle], text: str) -> str:
    for needle in needles:
        text = needle.hidden(text)
    return text


def scan_text(sought: Sought, text: str | bytes, where: str) -> list[Finding]:
    """Each form of each secret in ``text`` (a log record, an exception, a tool result)."""
    needles = _needles(sought)
    data = text if isinstance(text, bytes) else text.encode("utf-8", "backslashreplace")
    shown = _hidden(needles, where)
    return [Finding(shown, form, n.what) for n in needles for form in n.forms_in(data)]


def scan_file(sought: Sought, path: Path, opener: Opener | None = None) -> list[Finding]:
    """Each form of each secret in the file, read in chunks that overlap by more than any
    form is long. Raises ``OSError`` when the file cannot be read."""
    needles = _needles(sought)
    forms: dict[tuple[str, str], None] = {}
    overlap = 4 * max(n.longest for n in needles)
    with (opener or _open)(path) as stream:
        tail = b""
        while chunk := stream.read(CHUNK):
            data = tail + chunk
            for needle in needles:
                found = needle.forms_in(data, start=len(tail))
                forms.update(dict.fromkeys((needle.what, form) for form in found))
            tail = data[-overlap:]
    shown = _hidden(needles, str(path))
    return [Finding(shown, form, what) for what, form in forms]


def scan_tree(
    sought: Sought, root: Path, *, skip: Iterable[Path] = (), opener: Opener | None = None
) -> ScanReport:
    """Scan every regular file under ``root`` (symbolic links are not followed), and each
    path's name, except the files in ``skip``. A file that vanishes while the scan runs is
    passed over; one that cannot be read, or a directory that cannot be listed, is
    reported as unreadable. ``opener`` opens a file for reading (a test makes one fail)."""
    needles = _needles(sought)
    report = ScanReport()
    skipped = {p.resolve() for p in skip}

    def unlisted(error: OSError) -> None:
        report.unreadable.append(_hidden(needles, f"{error.filename} ({error.strerror})"))

    for directory, _, names in os.walk(root, onerror=unlisted):
        for name in names:
            path = Path(directory, name)
            report.findings += scan_text(needles, str(path), f"{path} (its name)")
            if path.resolve() not in skipped:
                _scan_one(needles, path, opener, report)
    return report


def _scan_one(
    needles: Sequence[Needle], path: Path, opener: Opener | None, report: ScanReport
) -> None:
    try:
        if not stat.S_ISREG(path.lstat().st_mode):
            return  # a link (its target is scanned where it lies), a socket, a pipe
        report.findings += scan_file(needles, path, opener)
    except FileNotFoundError:
        return  # removed while the scan ran: nothing left to leak
    except OSError as exc:
        shown = _hidden(needles, f"{path} ({exc.strerror or type(exc).__name__})")
        report.unreadable.append(shown)


def _open(path: Path) -> IO[bytes]:
    return path.open("rb")
