"""Untrusted display text: what could deceive a reader is flagged and shown written out.

Display names, subjects and attachment names are data. A bidi override that turns
``invoice\\u202egpj.exe`` into what reads as ``invoiceexe.jpg``, an invisible joiner, a line
break in a single-line field, a Cyrillic letter inside a Latin word or a lookalike of a known
domain must reach the reader flagged, with the hidden characters made visible.
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agent.domain.untrusted import (
    BIDI_CONTROLS,
    INVISIBLE,
    flag,
    lookalike_of,
    shown,
    skeleton,
    text_flags,
)

WARNING = "⚠"
KNOWN = frozenset({"fabrikam.test", "contoso.test"})


# -- bidi controls -------------------------------------------------------------------------------


def test_an_rlo_in_a_display_name_is_flagged_and_shown_with_its_code_point() -> None:
    result = flag("Dana \u202eiveL")
    assert result.flagged
    assert any("bidi" in f and "[U+202E]" in f for f in result.flags)
    assert result.shown.startswith(WARNING)
    assert "[U+202E]" in result.shown
    assert "\u202e" not in result.shown
    assert result.text == "Dana \u202eiveL"  # the original is kept unchanged beside it


def test_an_rlo_in_an_attachment_name_is_flagged_and_shown_written_out() -> None:
    result = flag("invoice\u202egpj.exe")
    assert result.flagged
    assert result.shown == f"{WARNING} invoice[U+202E]gpj.exe"
    # The real extension stays readable at the end of what the reader sees.
    assert result.shown.endswith(".exe")


@pytest.mark.parametrize(
    ("text", "code_point"),
    [
        ("a\u2066b\u2069c", "[U+2066]"),  # LRI ... PDI
        ("a\u2066b\u2069c", "[U+2069]"),
        ("report\u202d.pdf", "[U+202D]"),  # LRO
        ("name\u200f", "[U+200F]"),  # RLM
        ("\u061cname", "[U+061C]"),  # ALM
    ],
)
def test_bidi_isolates_embeddings_and_marks_are_flagged(text: str, code_point: str) -> None:
    result = flag(text)
    assert result.flagged
    assert any(f.startswith("bidi control characters") and code_point in f for f in result.flags)
    assert code_point in result.shown
    assert result.shown.startswith(WARNING)


# -- invisible characters and line breaks -----------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "code_point"),
    [
        ("No\u200da Bar", "[U+200D]"),  # zero-width joiner
        ("No\u200ca Bar", "[U+200C]"),  # zero-width non-joiner
        ("No\u200ba Bar", "[U+200B]"),  # zero-width space
        ("\ufeffNoa Bar", "[U+FEFF]"),  # byte order mark / zero-width no-break space
        ("Noa\u2060Bar", "[U+2060]"),  # word joiner
    ],
)
def test_zero_width_characters_are_flagged_and_made_visible(text: str, code_point: str) -> None:
    result = flag(text)
    assert any(f.startswith("invisible characters") and code_point in f for f in result.flags)
    assert code_point in result.shown
    assert result.shown.startswith(WARNING)


@pytest.mark.parametrize("text", ["Invoice\r\nBcc: x@evil.test", "Invoice\nline two", "a\rb"])
def test_line_breaks_in_a_single_line_field_are_flagged_and_written_out(text: str) -> None:
    result = flag(text)
    assert "line breaks inside a single-line field" in result.flags
    assert "\r" not in result.shown and "\n" not in result.shown
    assert result.shown.startswith(WARNING)


def test_other_control_characters_are_flagged() -> None:
    result = flag("Invoice\x07\x1b[31m")
    assert any(f.startswith("control characters") for f in result.flags)
    assert "[U+0007]" in result.shown and "[U+001B]" in result.shown


# -- mixed scripts -------------------------------------------------------------------------------


def test_latin_and_cyrillic_letters_in_one_word_are_flagged() -> None:
    result = flag("P\u0430yPal invoice")  # CYRILLIC SMALL LETTER A inside a Latin word
    assert any("mixed-script" in f for f in result.flags)
    assert any("CYRILLIC" in f and "LATIN" in f for f in result.flags)
    assert result.shown.startswith(WARNING)


def test_latin_and_greek_letters_in_one_word_are_flagged() -> None:
    assert any("mixed-script" in f for f in text_flags("Micr\u03bfsoft"))  # GREEK SMALL OMICRON


def test_a_latin_word_beside_a_cyrillic_word_is_not_flagged() -> None:
    assert text_flags("Dana Иван") == ()


@pytest.mark.parametrize(
    "text",
    [
        "שלום דנה, ההזמנה נשלחה",  # plain Hebrew
        "مرحبا، تم شحن الطلب",  # plain Arabic
        "Invoice for order 42 (final).pdf",  # plain Latin
        "José Müller-Øster",  # Latin with diacritics
        "שלום Dana, ההזמנה ORD-42 נשלחה",  # Hebrew and Latin in different words
        "Привет мир",  # plain Cyrillic
        "",
    ],
)
def test_ordinary_text_in_any_script_is_not_flagged(text: str) -> None:
    result = flag(text)
    assert result.flags == ()
    assert not result.flagged
    assert result.shown == text  # shown exactly, without a warning sign


# -- skeleton and lookalike_of -------------------------------------------------------------------


def test_skeleton_folds_lookalike_characters_together() -> None:
    assert skeleton("f\u0430brikam.test") == "fabrikam.test"  # CYRILLIC SMALL LETTER A
    assert skeleton("fabrikarn.test") == "fabrikam.test"  # rn reads as m
    assert skeleton("fabr1kam.test") == skeleton("fabrlkam.test")  # 1 reads as l
    assert skeleton("c0ntoso.test") == "contoso.test"  # 0 reads as o
    assert skeleton("FABRIKAM.TEST") == "fabrikam.test"
    assert skeleton("\uff46abrikam.test") == "fabrikam.test"  # fullwidth f (NFKC)
    assert skeleton("vvidget") == skeleton("widget")


def test_skeleton_keeps_different_names_different() -> None:
    assert skeleton("contoso.test") != skeleton("fabrikam.test")


@pytest.mark.parametrize(
    "domain",
    [
        "f\u0430brikam.test",  # CYRILLIC SMALL LETTER A
        "fabr1kam.test",  # digit one
        "fabrikarn.test",  # rn for m
        "fabirkam.test",  # one transposition
        "fabrikam.tes",  # one deletion
        "fabrikamm.test",  # one insertion
        "fabrikan.test",  # one substitution
        "FABR1KAM.TEST",  # case does not hide it
    ],
)
def test_a_lookalike_of_a_known_domain_names_the_domain_it_imitates(domain: str) -> None:
    assert lookalike_of(domain, KNOWN) == "fabrikam.test"


@pytest.mark.parametrize("domain", ["fabrikam.test", "FABRIKAM.TEST", " contoso.test "])
def test_a_known_domain_imitates_nothing(domain: str) -> None:
    assert lookalike_of(domain, KNOWN) is None


def test_a_known_domain_imitates_nothing_even_when_it_resembles_another_known_one() -> None:
    known = {"fabrikam.test", "fabrikan.test"}
    assert lookalike_of("fabrikan.test", known) is None
    assert lookalike_of("fabrikam.test", known) is None


@pytest.mark.parametrize("domain", ["northwind.test", "fabrikam-ops.test", "fbrkm.test", ""])
def test_an_unrelated_domain_imitates_nothing(domain: str) -> None:
    assert lookalike_of(domain, KNOWN) is None


def test_nothing_imitates_anything_when_no_domain_is_known() -> None:
    assert lookalike_of("fabr1kam.test", ()) is None


# -- the property: what is shown can never reorder or hide text ---------------------------------

_HIDDEN = sorted(BIDI_CONTROLS | INVISIBLE)


@given(
    st.text(
        alphabet=st.one_of(st.characters(), st.sampled_from(_HIDDEN)),
        max_size=60,
    )
)
def test_shown_text_never_contains_a_bidi_control_or_invisible_character(text: str) -> None:
    for display in (shown(text), flag(text).shown):
        assert not set(display) & BIDI_CONTROLS
        assert not set(display) & INVISIBLE
    if set(text) & (BIDI_CONTROLS | INVISIBLE):
        assert flag(text).flagged
