"""The renderer's decisions that are not about one draft's markup (the golden set covers those)."""

from __future__ import annotations

import pytest
from selectolax.lexbor import LexborHTMLParser

from agent.domain.context import parse_context
from agent.rendering.bidi import Direction, paragraph_direction, segments
from agent.rendering.render import render_message, reply_subject
from tests.conftest import context_yaml


@pytest.mark.parametrize(
    ("original", "expected"),
    [
        ("הזמנת רישיונות", "Re: הזמנת רישיונות"),
        ("Re: הזמנת רישיונות", "Re: הזמנת רישיונות"),
        ("RE:  Licence order [#12345]", "RE:  Licence order [#12345]"),
        ("AW: Bestellung", "AW: Bestellung"),
        ("رد: طلب", "رد: طلب"),
    ],
)
def test_the_reply_subject_keeps_every_character_and_adds_a_prefix_only_when_missing(
    original: str, expected: str
) -> None:
    assert reply_subject(original) == expected
    assert reply_subject(original, add_prefix=False) == original


def test_the_subject_is_passed_through_verbatim_whatever_the_direction() -> None:
    subject = "Re: הזמנה ORD-2026-0042 — ₪1,250.00"
    assert render_message("שלום", subject=subject, language="he").subject == subject


def test_greeting_signature_and_language_come_from_the_workspace_context() -> None:
    context = parse_context(
        context_yaml(
            extra='communication: {greeting: "שלום רב,", signature: "נועה בר\\nFabrikam"}\n'
        )
    )
    m = render_message("ההזמנה אושרה.", subject="Re: x", context=context)
    assert (m.language, m.direction) == ("he", Direction.RTL)
    assert [b.text for b in m.blocks] == ["שלום רב,", "ההזמנה אושרה.", "נועה בר\nFabrikam"]
    # An explicit language wins over the context's.
    assert (
        render_message("Confirmed.", subject="x", context=context, language="en").language == "en"
    )


def test_a_draft_plainly_in_the_other_script_is_rendered_in_its_own_direction() -> None:
    m = render_message("Your order is confirmed.", subject="x", language=None)
    assert m.direction is Direction.LTR
    context = parse_context(context_yaml())  # a Hebrew workspace
    english = render_message("Your order is confirmed.", subject="x", context=context)
    assert (english.language, english.direction) == ("en", Direction.LTR)
    assert english.warnings  # the renderer says what it decided


def test_raw_html_in_a_draft_is_shown_as_text_and_never_passed_through() -> None:
    m = render_message(
        "שלום <script>alert(1)</script> <b>x</b> [קישור](javascript:alert(1))",
        subject="x",
        language="he",
    )
    assert "<script" not in m.html and "<b>" not in m.html
    body = LexborHTMLParser(m.html).css_first("[data-outloop=message]")
    assert body is not None
    shown = body.text(separator="")
    assert "<script>alert(1)</script>" in shown and "<b>x</b>" in shown  # shown, as typed
    assert "href" not in m.html  # a javascript: link is never made a link


def test_markdown_never_reaches_the_provider() -> None:
    m = render_message("**שלום** _דנה_\n\n- אחד\n- שניים", subject="x", language="he")
    assert "**" not in m.html and "**" not in m.text
    assert "<strong>" in m.html and "<em>" in m.html and "<ul" in m.html


@pytest.mark.parametrize(
    ("text", "message", "expected"),
    [
        ("הזמנתי Microsoft Teams Premium אתמול", Direction.RTL, Direction.RTL),
        ("Microsoft Teams לא עובד", Direction.RTL, Direction.RTL),
        ("Please confirm by email.", Direction.RTL, Direction.LTR),
        ("Please see the file הסכם today", Direction.LTR, Direction.LTR),
        ("הסכם חתום", Direction.LTR, Direction.RTL),
        ("12345 - ₪", Direction.RTL, Direction.RTL),
    ],
)
def test_a_paragraph_turns_only_when_it_has_no_letter_of_the_message_direction(
    text: str, message: Direction, expected: Direction
) -> None:
    assert paragraph_direction(text, message) is expected


def test_segments_give_the_text_back_exactly_and_never_split_a_fragment() -> None:
    text = "נא לפנות ל-dana.levi@contoso.test או https://x.test/a?b=1. בסך ₪ 1,250 עד 30.11.2026."
    parts = segments(text)
    assert "".join(p.text for p in parts) == text
    assert [(p.text, p.kind) for p in parts if p.kind] == [
        ("dana.levi@contoso.test", "email"),
        ("https://x.test/a?b=1", "url"),
        ("₪ 1,250", "price"),
        ("30.11.2026", "date"),
    ]
