"""Malformed RFC 822 input is normalized, or refused with UnparseableMessage saying why.

No input, however broken, may escape ``rfc822.normalize`` with any other exception.
"""

from __future__ import annotations

import base64
from datetime import UTC, datetime

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agent.domain.envelope import Envelope, occurrence_key
from agent.providers import rfc822

FALLBACK = datetime(2026, 11, 30, 9, 0, tzinfo=UTC)
MAILBOX = "support@fabrikam.test"


def normalize(raw: bytes, provider_message_id: str = "pm-1") -> Envelope:
    return rfc822.normalize(
        raw,
        provider="test",
        mailbox_id=MAILBOX,
        provider_message_id=provider_message_id,
        thread_id_for=lambda mid, _irt, _refs: f"thread:{mid}",
        fallback_received_at=FALLBACK,
    )


def message(*headers: str | bytes, body: bytes = b"Hello, world.\r\n") -> bytes:
    lines = [h if isinstance(h, bytes) else h.encode("utf-8") for h in headers]
    return b"\r\n".join(lines) + b"\r\n\r\n" + body


BASIC = (
    "From: Dana Levi <dana.levi@contoso.test>",
    "To: support@fabrikam.test",
    "Date: Mon, 02 Nov 2026 10:00:00 +0200",
)


# --- Message-ID and content digest -------------------------------------------------------


def test_message_without_message_id_has_no_internet_id_and_a_note_saying_so() -> None:
    envelope = normalize(message(*BASIC, "Subject: no id here"))

    assert envelope.internet_message_id is None
    assert any("no Message-ID" in note for note in envelope.normalization_notes)
    assert envelope.subject == "no id here"
    assert envelope.sender.address == "dana.levi@contoso.test"


def test_two_different_messages_sharing_a_message_id_get_different_keys() -> None:
    first = normalize(
        message(*BASIC, "Subject: Invoice", "Message-ID: <dup@contoso.test>", body=b"one\r\n"),
        provider_message_id="pm-1",
    )
    second = normalize(
        message(*BASIC, "Subject: Receipt", "Message-ID: <dup@contoso.test>", body=b"two\r\n"),
        provider_message_id="pm-2",
    )

    assert first.internet_message_id == second.internet_message_id == "<dup@contoso.test>"
    assert first.content_digest != second.content_digest
    assert occurrence_key("ws-1", first) != occurrence_key("ws-1", second)


def test_a_message_keys_by_its_headers_never_by_its_body() -> None:
    # Each channel renders a body differently (MIME, a JSON resource, a web page): the key
    # rests on the headers every channel shows alike.
    first = normalize(
        message(*BASIC, "Subject: Invoice", "Message-ID: <one@contoso.test>", body=b"one\r\n"),
        provider_message_id="pm-1",
    )
    second = normalize(
        message(*BASIC, "Subject:  Invoice ", "Message-ID: <one@contoso.test>", body=b"two\r\n"),
        provider_message_id="uid:7",
    )

    assert occurrence_key("ws-1", first) == occurrence_key("ws-1", second)


def test_same_message_delivered_twice_with_different_received_headers_gets_the_same_key() -> None:
    common = (*BASIC, "Subject: Invoice", "Message-ID: <once@contoso.test>")
    first = normalize(
        message(
            "Received: from mx1.fabrikam.test by mail.fabrikam.test; Mon, 02 Nov 2026 10:00:05 +0200",
            *common,
        ),
        provider_message_id="pm-1",
    )
    second = normalize(
        message(
            "Received: from mx2.fabrikam.test by mail.fabrikam.test; Mon, 02 Nov 2026 11:30:00 +0200",
            "Received: from relay.contoso.test by mx2.fabrikam.test; Mon, 02 Nov 2026 11:29:00 +0200",
            *common,
        ),
        provider_message_id="pm-2",
    )

    assert first.received_at != second.received_at
    assert first.content_digest == second.content_digest
    assert occurrence_key("ws-1", first) == occurrence_key("ws-1", second)


# --- broken charsets and encoded words --------------------------------------------------


def test_body_with_an_unknown_declared_charset_normalizes_and_decodes_as_utf8() -> None:
    raw = message(
        *BASIC,
        "Subject: unknown charset",
        "Content-Type: text/plain; charset=x-unknown-charset",
        "Content-Transfer-Encoding: 8bit",
        body="café\r\n".encode(),
    )

    envelope = normalize(raw)
    body = rfc822.body(raw)

    assert envelope.subject == "unknown charset"
    assert body.text == "café\r\n"


def test_invalid_utf8_bytes_in_a_utf8_part_still_give_a_text_body() -> None:
    raw = message(
        *BASIC,
        "Subject: bad bytes",
        "Content-Type: text/plain; charset=utf-8",
        "Content-Transfer-Encoding: 8bit",
        body=b"before \xff\xfe\xc3 after\r\n",
    )

    envelope = normalize(raw)
    body = rfc822.body(raw)

    assert envelope.subject == "bad bytes"
    assert isinstance(body.text, str)
    assert body.text.startswith("before ")
    assert body.text.rstrip().endswith("after")


@pytest.mark.parametrize(
    "encoded",
    [
        "=?utf-8?B?####?=",
        "=?bogus?Q?x?=",
        "=?x-unknown-charset?Q?caf=E9?=",
        "=?utf-8?Q?=FF=FEok?=",
        "=?utf-8?B?",
        "prefix =?utf-8?B?####?= suffix",
    ],
)
def test_broken_encoded_word_in_subject_gives_a_str_subject(encoded: str) -> None:
    envelope = normalize(message(*BASIC, f"Subject: {encoded}"))

    assert isinstance(envelope.subject, str)
    assert "\r" not in envelope.subject
    assert "\n" not in envelope.subject
    assert envelope.sender.address == "dana.levi@contoso.test"


@pytest.mark.parametrize("encoded", ["=?utf-8?B?####?=", "=?bogus?Q?x?=", "=?utf-8?Q?=FF?="])
def test_broken_encoded_word_in_from_keeps_the_sender_address(encoded: str) -> None:
    envelope = normalize(
        message(f"From: {encoded} <dana.levi@contoso.test>", "Subject: =?bogus?Q?x?=")
    )

    assert envelope.sender.address == "dana.levi@contoso.test"
    assert isinstance(envelope.sender.name, str)
    assert isinstance(envelope.subject, str)


def test_hebrew_subject_in_a_base64_encoded_word_decodes() -> None:
    hebrew = "בקשה לחשבונית חודש נובמבר"
    encoded = base64.b64encode(hebrew.encode("utf-8")).decode("ascii")

    envelope = normalize(message(*BASIC, f"Subject: =?utf-8?B?{encoded}?="))

    assert envelope.subject == hebrew


def test_hebrew_subject_in_a_windows_1255_q_encoded_word_decodes() -> None:
    hebrew = "שלום"
    encoded = "".join(f"={b:02X}" for b in hebrew.encode("windows-1255"))

    envelope = normalize(message(*BASIC, f"Subject: =?windows-1255?Q?{encoded}?="))

    assert envelope.subject == hebrew


# --- CR / LF inside header values -------------------------------------------------------


def test_bare_cr_inside_subject_is_folded_and_later_headers_survive() -> None:
    raw = message(
        b"Subject: before\rafter",
        b"From: Dana Levi <dana.levi@contoso.test>",
        b"Message-ID: <cr@contoso.test>",
    )

    envelope = normalize(raw)

    assert "\r" not in envelope.subject
    assert "\n" not in envelope.subject
    assert envelope.subject == "before after"
    assert envelope.sender.address == "dana.levi@contoso.test"
    assert envelope.internet_message_id == "<cr@contoso.test>"
    assert any("bare CR" in note for note in envelope.normalization_notes)


def test_message_using_cr_alone_as_line_ending_keeps_its_headers() -> None:
    raw = b"From: dana.levi@contoso.test\rSubject: old mac\rMessage-ID: <mac@contoso.test>\r\rhi\n"

    envelope = normalize(raw)

    assert envelope.subject == "old mac"
    assert envelope.sender.address == "dana.levi@contoso.test"
    assert envelope.internet_message_id == "<mac@contoso.test>"


def test_bare_cr_inside_the_body_is_left_alone() -> None:
    raw = message(*BASIC, "Subject: plain", body=b"line one\rline two\r\n")

    envelope = normalize(raw)

    assert envelope.subject == "plain"
    assert not any("bare CR" in note for note in envelope.normalization_notes)


def test_encoded_crlf_inside_subject_is_folded_to_a_single_line() -> None:
    envelope = normalize(message(*BASIC, "Subject: =?utf-8?Q?a=0D=0Ab?="))

    assert "\r" not in envelope.subject
    assert "\n" not in envelope.subject
    assert envelope.subject == "a b"
    assert any("line breaks" in note for note in envelope.normalization_notes)


def test_bare_lf_inside_subject_of_a_crlf_message_leaves_no_line_break_in_subject() -> None:
    envelope = normalize(message(*BASIC, b"Subject: before\nafter"))

    assert "\r" not in envelope.subject
    assert "\n" not in envelope.subject


# --- empty and missing parts ------------------------------------------------------------


def test_message_with_headers_and_an_empty_body_normalizes_with_empty_text() -> None:
    raw = message(*BASIC, "Subject: nothing to say", "Message-ID: <empty@contoso.test>", body=b"")

    envelope = normalize(raw)

    assert envelope.subject == "nothing to say"
    assert envelope.internet_message_id == "<empty@contoso.test>"
    assert rfc822.body(raw).text == ""


def test_headers_only_without_a_separating_blank_line_normalize() -> None:
    envelope = normalize(b"From: dana.levi@contoso.test\r\nSubject: just headers\r\n")

    assert envelope.subject == "just headers"
    assert envelope.sender.address == "dana.levi@contoso.test"


@pytest.mark.parametrize("raw", [b"", b" ", b"\r\n", b"\n\n\n", b" \t\r\n \n"])
def test_zero_bytes_or_whitespace_only_is_refused_as_empty(raw: bytes) -> None:
    with pytest.raises(rfc822.UnparseableMessage, match="empty"):
        normalize(raw)


def test_text_without_any_header_line_is_refused_naming_the_header_block() -> None:
    with pytest.raises(rfc822.UnparseableMessage, match="header"):
        normalize(b"hello there, this is not an email\njust some text\n")


def test_message_without_from_gets_the_unknown_sender_and_a_note() -> None:
    envelope = normalize(message("To: support@fabrikam.test", "Subject: anonymous"))

    assert envelope.sender.address == "unknown-sender@invalid"
    assert any("no readable sender" in note for note in envelope.normalization_notes)
    assert envelope.subject == "anonymous"


def test_message_with_sender_but_no_from_uses_the_sender_header() -> None:
    envelope = normalize(message("Sender: noa.bar@fabrikam.test", "Subject: on behalf"))

    assert envelope.sender.address == "noa.bar@fabrikam.test"


def test_from_without_any_address_gets_the_unknown_sender() -> None:
    envelope = normalize(message("From: just a name", "Subject: x"))

    assert envelope.sender.address == "unknown-sender@invalid"


@pytest.mark.parametrize(
    "date",
    ["not a date at all", "Mon, 99 Foo 2026 99:99:99 +9999", "", "32/13/2026", "0"],
)
def test_garbage_date_falls_back_to_the_given_delivery_time(date: str) -> None:
    envelope = normalize(message("From: dana.levi@contoso.test", f"Date: {date}", "Subject: x"))

    assert envelope.received_at == FALLBACK
    assert any("delivery time is used" in note for note in envelope.normalization_notes)


def test_valid_date_is_used_and_converted_to_utc() -> None:
    envelope = normalize(message(*BASIC, "Subject: x"))

    assert envelope.received_at == datetime(2026, 11, 2, 8, 0, tzinfo=UTC)


def test_date_without_timezone_is_read_as_utc() -> None:
    envelope = normalize(
        message("From: dana.levi@contoso.test", "Date: Mon, 02 Nov 2026 10:00:00 -0000")
    )

    assert envelope.received_at == datetime(2026, 11, 2, 10, 0, tzinfo=UTC)
    assert envelope.received_at.tzinfo is not None


# --- absurd MIME nesting ----------------------------------------------------------------


def nested_multipart(depth: int, innermost: str) -> bytes:
    out = [b"From: dana.levi@contoso.test", b"Subject: deep", b"MIME-Version: 1.0"]
    for level in range(depth):
        out.append(f'Content-Type: multipart/mixed; boundary="b{level}"'.encode())
        out.append(b"")
        out.append(f"--b{level}".encode())
    out.append(b"Content-Type: text/plain; charset=utf-8")
    out.append(b"")
    out.append(innermost.encode("utf-8"))
    out.extend(f"--b{level}--".encode() for level in reversed(range(depth)))
    return b"\r\n".join(out) + b"\r\n"


def test_hundred_level_nested_multipart_normalizes_and_body_finds_innermost_text() -> None:
    raw = nested_multipart(100, "the innermost text")

    envelope = normalize(raw)
    body = rfc822.body(raw)

    assert rfc822.mime_depth(rfc822.parse(raw).message) == 101
    assert envelope.subject == "deep"
    assert any("MIME nesting" in note for note in envelope.normalization_notes)
    assert body.text == "the innermost text"


def test_nesting_deeper_than_the_parser_can_follow_is_refused_not_crashed() -> None:
    raw = nested_multipart(2000, "unreachable")

    with pytest.raises(rfc822.UnparseableMessage, match="nested too deeply"):
        normalize(raw)
    with pytest.raises(rfc822.UnparseableMessage, match="nested too deeply"):
        rfc822.body(raw)


def test_multipart_without_its_boundary_normalizes() -> None:
    raw = message(
        *BASIC,
        "Subject: no boundary",
        "Content-Type: multipart/mixed",
        body=b"--x\r\nContent-Type: text/plain\r\n\r\nhi\r\n--x--\r\n",
    )

    envelope = normalize(raw)

    assert envelope.subject == "no boundary"
    assert isinstance(rfc822.body(raw).text, str)


def test_bad_base64_body_still_gives_a_text_body() -> None:
    raw = message(
        *BASIC,
        "Subject: b64",
        "Content-Type: text/plain; charset=utf-8",
        "Content-Transfer-Encoding: base64",
        body=b"!!!! not base64 @@@\r\n",
    )

    normalize(raw)

    assert isinstance(rfc822.body(raw).text, str)


# --- property: normalize returns an Envelope or raises UnparseableMessage ---------------


def normalize_or_refuse(raw: bytes) -> None:
    try:
        envelope = normalize(raw)
    except rfc822.UnparseableMessage as exc:
        assert str(exc)
        return
    assert isinstance(envelope, Envelope)
    assert isinstance(envelope.subject, str)
    assert "\r" not in envelope.subject
    assert "\n" not in envelope.subject
    assert envelope.received_at.tzinfo is not None
    body = rfc822.body(raw)
    assert isinstance(body.text, str)


HEADER_NAMES = st.sampled_from(
    [
        "From",
        "To",
        "Cc",
        "Sender",
        "Subject",
        "Date",
        "Message-ID",
        "In-Reply-To",
        "References",
        "Received",
        "MIME-Version",
        "Content-Type",
        "Content-Transfer-Encoding",
        "Content-Disposition",
        "Auto-Submitted",
        "List-Id",
        "X-Whatever",
    ]
)
NASTY_VALUES = st.sampled_from(
    [
        "=?utf-8?B?####?=",
        "=?bogus?Q?x?=",
        "=?utf-8?Q?a=0D=0Ab?=",
        "=?utf-8?B?",
        "multipart/mixed; boundary=x",
        "multipart/alternative",
        "text/plain; charset=x-unknown-charset",
        "base64",
        "quoted-printable",
        '"" <@>',
        "a@b.test, ,<>, <<x>>",
        "<a@b.test> <a@b.test>",
        "Mon, 99 Foo 2026 99:99:99 +9999",
        "from x by y; garbage",
        'attachment; filename="=?utf-8?q?x?="',
        "",
    ]
)
HEADER_VALUES = NASTY_VALUES | st.text(
    alphabet=st.characters(exclude_categories=("Cs",)), max_size=40
)
HEADER_LINES = st.builds(lambda name, value: f"{name}: {value}", HEADER_NAMES, HEADER_VALUES)
HEADERISH_MESSAGES = st.builds(
    lambda lines, eol, body: (eol.join(lines) + eol + eol + body).encode("utf-8"),
    st.lists(HEADER_LINES, max_size=8),
    st.sampled_from(["\r\n", "\n", "\r"]),
    st.text(alphabet=st.characters(exclude_categories=("Cs",)), max_size=60),
)

PROPERTY_SETTINGS = settings(
    max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)


@PROPERTY_SETTINGS
@given(st.binary(max_size=300))
def test_arbitrary_bytes_normalize_or_are_refused_as_unparseable(raw: bytes) -> None:
    normalize_or_refuse(raw)


@PROPERTY_SETTINGS
@given(HEADERISH_MESSAGES)
def test_header_like_text_normalizes_or_is_refused_as_unparseable(raw: bytes) -> None:
    normalize_or_refuse(raw)


@PROPERTY_SETTINGS
@given(st.lists(HEADER_LINES, min_size=1, max_size=6), st.binary(max_size=80))
def test_headers_with_a_binary_body_normalize_or_are_refused(lines: list[str], body: bytes) -> None:
    normalize_or_refuse(message(*lines, body=body))


@pytest.mark.parametrize(
    "header",
    ["Date: Fri, 31 Dec 9999 23:59:59 -0100",
     "Received: from a by b; Fri, 31 Dec 9999 23:59:59 -0100"],
)  # fmt: skip
def test_a_valid_date_at_the_edge_of_the_calendar_falls_back_instead_of_crashing(
    header: str,
) -> None:
    envelope = normalize(f"From: a@b.test\n{header}\nMessage-ID: <edge@x>\n\nbody\n".encode())
    assert envelope.received_at == FALLBACK


def test_the_same_message_stored_with_crlf_and_with_lf_is_one_occurrence() -> None:
    lf = b"From: a@b.test\nMessage-ID: <same@x>\nDate: Mon, 30 Nov 2026 09:00:00 +0000\nSubject: s\n\nline one\nline two\n"
    crlf = lf.replace(b"\n", b"\r\n")
    first, second = normalize(lf, "pm-1"), normalize(crlf, "pm-2")
    assert first.content_digest == second.content_digest
    assert occurrence_key("ws", first) == occurrence_key("ws", second)
    changed = normalize(lf.replace(b"line two", b"line 2"), "pm-3")
    assert changed.content_digest != first.content_digest
