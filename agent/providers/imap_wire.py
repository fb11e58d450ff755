"""Reading what an IMAP server answers (RFC 9051 / RFC 3501 response syntax).

The IMAP client hands us a command's untagged response lines, with each literal as the
item after the line that announced it (``... BODY[] {321}``). Here they are put back into
the byte stream the server sent and read with the protocol's own grammar: atoms, quoted
strings, literals, NIL and parenthesized lists. Anything that does not follow it raises
``ImapSyntaxError``: a server answering garbage is an error we name, never a crash and never
a message quietly skipped.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

Value = bytes | None | list["Value"]
"""A value in a response: an atom or string (bytes), NIL (None) or a list."""

_LITERAL_RE = re.compile(rb"\{(\d+)\+?\}$")
_CODE_RE = re.compile(rb"\[([A-Z0-9.=-]+)(?: ([^\]]*))?\]")
_MAX_DEPTH = 100
_SECTIONED = re.compile(rb"(?i)(BODY|BODY\.PEEK|BINARY|BINARY\.PEEK|BINARY\.SIZE)(\[[^\]]*\])?$")
"""What an atom holds before a section's ``[`` (RFC 9051 fetch items)."""


class ImapSyntaxError(ValueError):
    """The server's answer does not follow the IMAP grammar."""


def stream(lines: Sequence[bytes | bytearray]) -> bytes:
    """The bytes the server sent for these lines: each literal follows the CRLF of the line
    that announced its size, and the line goes on after it."""
    out = bytearray()
    literal_next = False
    for item in lines:
        if literal_next:
            out += item
            literal_next = False
            continue
        out += item
        if _LITERAL_RE.search(bytes(item)):
            out += b"\r\n"
            literal_next = True
        else:
            out += b"\r\n"
    return bytes(out)


@dataclass
class _Reader:
    data: bytes
    pos: int = 0

    def error(self, what: str) -> ImapSyntaxError:
        around = self.data[max(0, self.pos - 20) : self.pos + 20]
        return ImapSyntaxError(f"{what} at byte {self.pos} (near {around!r})")

    def peek(self) -> int | None:
        return self.data[self.pos] if self.pos < len(self.data) else None

    def skip_spaces(self) -> None:
        while self.peek() == 0x20:
            self.pos += 1

    def at_line_end(self) -> bool:
        return self.data.startswith(b"\r\n", self.pos) or self.pos >= len(self.data)

    def end_line(self) -> None:
        self.skip_spaces()
        if self.pos >= len(self.data):
            return
        if not self.data.startswith(b"\r\n", self.pos):
            raise self.error("expected the end of the response line")
        self.pos += 2

    def value(self, depth: int = 0) -> Value:
        self.skip_spaces()
        char = self.peek()
        if char is None:
            raise self.error("the response ended inside a value")
        if char == ord("("):
            return self.parenthesized(depth + 1)
        if char == ord('"'):
            return self.quoted()
        if char == ord("{"):
            return self.literal()
        atom = self.atom()
        return None if atom.upper() == b"NIL" else atom

    def parenthesized(self, depth: int) -> list[Value]:
        if depth > _MAX_DEPTH:
            raise self.error("lists nested too deep")
        self.pos += 1  # "("
        items: list[Value] = []
        while True:
            self.skip_spaces()
            char = self.peek()
            if char is None or (self.at_line_end() and char != ord(")")):
                raise self.error("a list was not closed")
            if char == ord(")"):
                self.pos += 1
                return items
            items.append(self.value(depth))

    def quoted(self) -> bytes:
        self.pos += 1
        out = bytearray()
        while True:
            char = self.peek()
            if char is None or char in (0x0D, 0x0A):
                raise self.error("a quoted string was not closed")
            self.pos += 1
            if char == ord('"'):
                return bytes(out)
            if char == ord("\\"):
                escaped = self.peek()
                if escaped is None:
                    raise self.error("a quoted string ended in an escape")
                out.append(escaped)
                self.pos += 1
            else:
                out.append(char)

    def literal(self) -> bytes:
        end = self.data.find(b"}", self.pos)
        size_text = self.data[self.pos + 1 : end].rstrip(b"+") if end > 0 else b""
        if not size_text.isdigit() or not self.data.startswith(b"\r\n", end + 1):
            raise self.error("a literal's size is not a number followed by CRLF")
        size = int(size_text)
        start = end + 3
        if start + size > len(self.data):
            raise self.error(f"a literal of {size} bytes was cut short")
        self.pos = start + size
        return self.data[start : self.pos]

    def atom(self) -> bytes:
        """An atom, where a section (``BODY[HEADER.FIELDS (A B)]``) and a partial
        (``<0.100>``) belong to it. Only a section opens brackets: a ``[`` or ``]`` in any
        other atom (a keyword, a folder name) is a character like another."""
        start = self.pos
        brackets = 0
        while self.pos < len(self.data):
            char = self.data[self.pos]
            if char == ord("[") and _SECTIONED.match(self.data, start, self.pos):
                brackets += 1
            elif char == ord("]") and brackets:
                brackets -= 1
            elif brackets == 0 and char in b" ()\r\n":
                break
            self.pos += 1
        if self.pos == start:
            raise self.error("expected a value")
        return self.data[start : self.pos]


def fetch_items(lines: Sequence[bytes | bytearray]) -> list[dict[bytes, Value]]:
    """Each ``n FETCH (...)`` response among the untagged lines, as its data items by upper
    case name (``UID``, ``BODY[]``, ``INTERNALDATE``...). Other untagged responses (an
    ``EXISTS`` the server sends in passing) are skipped."""
    reader = _Reader(stream(lines))
    found: list[dict[bytes, Value]] = []
    while reader.pos < len(reader.data):
        reader.skip_spaces()
        if reader.at_line_end():
            reader.end_line()
            continue
        first = reader.atom()
        reader.skip_spaces()
        kind = reader.atom() if not reader.at_line_end() else b""
        if first.isdigit() and kind.upper() == b"FETCH":
            reader.skip_spaces()
            if reader.peek() != ord("("):
                raise reader.error("a FETCH response without its list of data items")
            found.append(_pairs(reader.parenthesized(1), reader))
            reader.end_line()
        else:
            _skip_line(reader)
    return found


def _pairs(items: list[Value], reader: _Reader) -> dict[bytes, Value]:
    if len(items) % 2:
        raise reader.error("a FETCH response's data items do not come in name/value pairs")
    pairs: dict[bytes, Value] = {}
    for name, value in zip(items[::2], items[1::2], strict=True):
        if not isinstance(name, bytes):
            raise reader.error("a FETCH data item without a name")
        pairs[name.upper()] = value
    return pairs


def _skip_line(reader: _Reader) -> None:
    """Skip the rest of a response line this parser has no use for (its literals too)."""
    while not reader.at_line_end():
        reader.value()
    reader.end_line()


def number(value: Value, what: str) -> int:
    if isinstance(value, bytes) and value.isdigit():
        return int(value)
    raise ImapSyntaxError(f"{what} is {value!r}, not a number")


def text(value: Value) -> bytes:
    """An atom, string or literal as bytes (NIL: empty)."""
    if value is None:
        return b""
    if isinstance(value, bytes):
        return value
    raise ImapSyntaxError(f"expected a string, got a list {value!r:.60}")


def search_uids(lines: Sequence[bytes | bytearray]) -> list[int]:
    """The numbers a ``SEARCH`` answered (an ESEARCH-less server's plain list; a trailing
    ``(MODSEQ n)`` is left out)."""
    uids: list[int] = []
    for line in lines:
        raw = bytes(line)
        body = raw.split(b"(", 1)[0]
        if raw.upper().startswith(b"SEARCH"):
            body = body[len(b"SEARCH") :]
        for word in body.split():
            if not word.isdigit():
                raise ImapSyntaxError(f"the SEARCH answer holds {word!r:.40}, not a number")
            uids.append(int(word))
    return uids


def threads(line: bytes) -> list[list[int]]:
    """A ``THREAD`` answer as its threads, each the message numbers of one tree in the
    order the server listed them (the root first)."""
    reader = _Reader(line.strip())
    found: list[list[int]] = []
    while reader.pos < len(reader.data):
        reader.skip_spaces()
        if reader.peek() != ord("("):
            raise reader.error("a THREAD answer is a sequence of lists")
        tree = reader.parenthesized(1)
        found.append(_flatten(tree))
    return found


def _flatten(tree: list[Value]) -> list[int]:
    numbers: list[int] = []
    for node in tree:
        if isinstance(node, list):
            numbers.extend(_flatten(node))
        else:
            numbers.append(number(node, "a THREAD member"))
    return numbers


def response_codes(lines: Sequence[bytes | bytearray]) -> dict[str, str]:
    """The response codes among a command's lines (``[UIDVALIDITY 7]``, ``[HIGHESTMODSEQ
    9]``, ``[UIDNEXT 4]``, ``[NOMODSEQ]``...) by upper case name."""
    codes: dict[str, str] = {}
    for line in lines:
        for match in _CODE_RE.finditer(bytes(line)):
            name = match.group(1).decode("ascii").upper()
            codes[name] = (match.group(2) or b"").decode("ascii", "replace")
    return codes


def list_entries(lines: Sequence[bytes | bytearray]) -> list[tuple[tuple[str, ...], bytes]]:
    """A ``LIST`` answer as (attributes, mailbox name as the server writes it); each line is
    ``(attributes) delimiter name``, with or without the ``LIST`` word before it."""
    entries: list[tuple[tuple[str, ...], bytes]] = []
    reader = _Reader(stream(lines))
    while reader.pos < len(reader.data):
        reader.skip_spaces()
        if reader.at_line_end():
            reader.end_line()
            continue
        if reader.peek() != ord("("):
            word = reader.atom()
            if word.upper() != b"LIST":
                _skip_line(reader)
                continue
        attributes = reader.value()
        reader.value()  # the hierarchy delimiter
        name = text(reader.value())
        reader.end_line()
        if not isinstance(attributes, list):
            raise ImapSyntaxError("a LIST answer without its attributes")
        shown = tuple(text(a).decode("ascii", "replace").lower() for a in attributes)
        entries.append((shown, name))
    return entries
