"""Leak scanning: is a planted canary secret anywhere it must not be?

A test plants a ``Canary`` where a secret sits (a vault), runs, and then scans texts (log
records, exception texts, tool results) and every file under a scan root for it, in each
form a leak takes:

- plain, JSON-escaped (ASCII and UTF-8) and URL-encoded (path and form style). The value
  holds a random token between characters those encodings change (space, quote, slash,
  backslash, non-ASCII, ``+&%=``), and every one of them keeps the token whole: a text
  holding the token is a finding even in an escaping not listed ("its random part");
- base64 of the UTF-8 bytes, standard and URL-safe, at each of the three byte offsets it
  can start at inside a longer base64 run, also when the run is wrapped over lines (MIME,
  PEM, the plain keyring file).

A file that cannot be read fails the scan: it is never taken as clean. Nothing here shows
the canary: its repr is redacted, and a finding names where and in which form only.
"""

from __future__ import annotations

import base64
import json
import os
import secrets
import stat
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import IO
from urllib.parse import quote, quote_plus

__all__ = ["Canary", "Finding", "ScanReport", "scan_file", "scan_text", "scan_tree"]

RANDOM_PART = "its random part"
CHUNK = 1 << 22
WHITESPACE = b" \t\r\n"

Opener = Callable[[Path], IO[bytes]]


class Canary:
    """A random secret value to plant, and the byte patterns of its forms."""

    def __init__(self, token: str) -> None:
        if len(token) < 16 or not token.isalnum():
            raise ValueError("a canary's token is 16 or more letters and digits")
        self._token = token

    @classmethod
    def plant(cls) -> Canary:
        """A new canary with a 128-bit random token."""
        return cls(secrets.token_hex(16))

    @property
    def value(self) -> str:
        """The secret value itself: plant it, never print it."""
        return f'canary {self._token} "q"/\\é+&%='

    def __repr__(self) -> str:
        return "Canary([redacted])"

    @cached_property
    def token(self) -> bytes:
        return self._token.encode()

    @cached_property
    def text_forms(self) -> tuple[tuple[str, bytes], ...]:
        """Each form that keeps the token whole, by name."""
        value = self.value
        return (
            ("plain", value.encode()),
            ("JSON-escaped", json.dumps(value)[1:-1].encode()),
            ("JSON-escaped (UTF-8)", json.dumps(value, ensure_ascii=False)[1:-1].encode()),
            ("URL-encoded", quote(value, safe="").encode()),
            ("URL-encoded (form)", quote_plus(value, safe="").encode()),
        )

    @cached_property
    def base64_forms(self) -> tuple[tuple[str, bytes], ...]:
        """The base64 characters that encode only the canary's bytes, at each offset."""
        raw = self.value.encode()
        forms: dict[bytes, str] = {}
        for offset in range(3):
            start, end = -(-8 * offset // 6), 8 * (offset + len(raw)) // 6
            padded = b"\0" * offset + raw
            forms.setdefault(base64.b64encode(padded)[start:end], "base64")
            forms.setdefault(base64.urlsafe_b64encode(padded)[start:end], "base64 (URL-safe)")
        return tuple((name, pattern) for pattern, name in forms.items())

    @cached_property
    def longest(self) -> int:
        return max(len(p) for _, p in (*self.text_forms, *self.base64_forms))

    def forms_in(self, data: bytes) -> list[str]:
        """The names of the forms ``data`` holds the canary in."""
        found: list[str] = []
        if self.token in data:
            found = [name for name, pattern in self.text_forms if pattern in data]
            found = found or [RANDOM_PART]
        squeezed = data.translate(None, WHITESPACE)
        found += [name for name, pattern in self.base64_forms if pattern in squeezed]
        return list(dict.fromkeys(found))

    def hidden(self, text: str) -> str:
        """``text`` with the token written out of it (a where that would show it)."""
        return text.replace(self._token, "[canary]")


@dataclass(frozen=True)
class Finding:
    """The canary, in one form, somewhere."""

    where: str
    form: str

    def __str__(self) -> str:
        return f"{self.where}: the canary, {self.form}"


@dataclass
class ScanReport:
    """What a scan found, and what it could not read (either one fails it)."""

    findings: list[Finding] = field(default_factory=list[Finding])
    unreadable: list[str] = field(default_factory=list[str])

    @property
    def clean(self) -> bool:
        return not self.findings and not self.unreadable

    def lines(self) -> list[str]:
        """One line per finding and per unreadable path; none shows the canary."""
        return [str(f) for f in self.findings] + [f"{u}: unreadable" for u in self.unreadable]


def scan_text(canary: Canary, text: str | bytes, where: str) -> list[Finding]:
    """Each form of the canary in ``text`` (a log record, an exception, a tool result)."""
    data = text if isinstance(text, bytes) else text.encode("utf-8", "backslashreplace")
    return [Finding(canary.hidden(where), form) for form in canary.forms_in(data)]


def scan_file(canary: Canary, path: Path, opener: Opener | None = None) -> list[Finding]:
    """Each form of the canary in the file, read in chunks that overlap by more than any
    form is long. Raises ``OSError`` when the file cannot be read."""
    forms: dict[str, None] = {}
    overlap = 4 * canary.longest
    with (opener or _open)(path) as stream:
        tail = b""
        while chunk := stream.read(CHUNK):
            data = tail + chunk
            forms.update(dict.fromkeys(canary.forms_in(data)))
            tail = data[-overlap:]
    return [Finding(canary.hidden(str(path)), form) for form in forms]


def scan_tree(
    canary: Canary, root: Path, *, skip: Iterable[Path] = (), opener: Opener | None = None
) -> ScanReport:
    """Scan every regular file under ``root`` (symbolic links are not followed), and each
    path's name, except the files in ``skip``. A file that vanishes while the scan runs is
    passed over; one that cannot be read, or a directory that cannot be listed, is
    reported as unreadable. ``opener`` opens a file for reading (a test makes one fail)."""
    report = ScanReport()
    skipped = {p.resolve() for p in skip}

    def unlisted(error: OSError) -> None:
        report.unreadable.append(canary.hidden(f"{error.filename} ({error.strerror})"))

    for directory, _, names in os.walk(root, onerror=unlisted):
        for name in names:
            path = Path(directory, name)
            report.findings += scan_text(canary, str(path), f"{path} (its name)")
            if path.resolve() not in skipped:
                _scan_one(canary, path, opener, report)
    return report


def _scan_one(canary: Canary, path: Path, opener: Opener | None, report: ScanReport) -> None:
    try:
        if not stat.S_ISREG(path.lstat().st_mode):
            return  # a link (its target is scanned where it lies), a socket, a pipe
        report.findings += scan_file(canary, path, opener)
    except FileNotFoundError:
        return  # removed while the scan ran: nothing left to leak
    except OSError as exc:
        report.unreadable.append(canary.hidden(f"{path} ({exc.strerror or type(exc).__name__})"))


def _open(path: Path) -> IO[bytes]:
    return path.open("rb")
