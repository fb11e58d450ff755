"""Reading IMAP answers (agent/providers/imap_wire.py): literals, sections, lists, and what
breaks the grammar."""

from __future__ import annotations

import pytest

from agent.providers import imap_wire
from agent.providers.imap_wire import ImapSyntaxError


def test_a_fetch_answer_with_literals_and_sections_is_read_item_by_item() -> None:
    lines: list[bytes | bytearray] = [
        b"1 FETCH (UID 5 BODY[HEADER.FIELDS (MESSAGE-ID)] {3}",
        bytearray(b"a)c"),
        b' FLAGS (\\Seen $x[1) INTERNALDATE "02-Nov-2026 10:00:00 +0000")',
        b"2 EXISTS",
        b"2 FETCH (UID 6 BODY[] NIL)",
    ]
    assert imap_wire.fetch_items(lines) == [
        {
            b"UID": b"5",
            b"BODY[HEADER.FIELDS (MESSAGE-ID)]": b"a)c",
            b"FLAGS": [b"\\Seen", b"$x[1"],
            b"INTERNALDATE": b"02-Nov-2026 10:00:00 +0000",
        },
        {b"UID": b"6", b"BODY[]": None},
    ]


def test_a_bracket_outside_a_section_is_a_character_like_another() -> None:
    entries = imap_wire.list_entries(
        [b'(\\HasNoChildren) "/" Arch]ive', b'(\\HasNoChildren \\Sent) "/" Sent']
    )
    assert entries == [
        (("\\hasnochildren",), b"Arch]ive"),
        (("\\hasnochildren", "\\sent"), b"Sent"),
    ]


@pytest.mark.parametrize(
    "lines",
    [
        [b'1 FETCH (UID 1 BODY[] "never closed)'],
        [b"1 FETCH (UID 1 BODY[] {99}", bytearray(b"short")],
        [b"1 FETCH (UID 1 BODY[])"],
        [b"1 FETCH UID 1"],
    ],
    ids=["open string", "short literal", "odd items", "no list"],
)
def test_an_answer_that_breaks_the_grammar_is_refused_saying_where(
    lines: list[bytes | bytearray],
) -> None:
    with pytest.raises(ImapSyntaxError, match="at byte"):
        imap_wire.fetch_items(lines)


def test_threads_searches_and_response_codes_are_read() -> None:
    assert imap_wire.threads(b"(1 2)(3 (4)(5 6))") == [[1, 2], [3, 4, 5, 6]]
    assert imap_wire.search_uids([b"1 2 3 (MODSEQ 5)"]) == [1, 2, 3]
    codes = imap_wire.response_codes([b"OK [UIDVALIDITY 17] x", b"OK [HIGHESTMODSEQ 9] y"])
    assert codes == {"UIDVALIDITY": "17", "HIGHESTMODSEQ": "9"}
    with pytest.raises(ImapSyntaxError):
        imap_wire.search_uids([b"1 two 3"])
