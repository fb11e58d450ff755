"""Seed 000 scenario 7 and its failures: the provider's stored copy is read back and checked."""

from __future__ import annotations

import re
from collections.abc import Callable

import pytest

from agent.domain.envelope import Address
from agent.rendering.render import RenderedMessage, render_message
from agent.rendering.verify import verify_read_back
from tests.rendering.stored import gmail, outlook, sent_and_stored

HEBREW = """שלום דנה,

הזמנתי את **Microsoft Teams Premium** עבורכם. המחיר הוא ₪1,250.00 לחודש (או $340), \
וההזמנה ORD-2026-0042 זמינה בכתובת https://portal.contoso.test/orders/42.

לשאלות: support@fabrikam.test או 03-555-1234, עד 30/11/2026 בשעה 10:30.
"""
ENGLISH = """Hi Dana,

Your order ORD-2026-0042 is confirmed: $1,250.00 per month, details at \
https://portal.contoso.test/orders/42.
"""


@pytest.fixture(params=["hebrew", "english"])
def rendered(request: pytest.FixtureRequest) -> RenderedMessage:
    if request.param == "hebrew":
        return render_message(
            HEBREW, subject="Re: הזמנת רישיונות", language="he", signature="נועה בר"
        )
    return render_message(ENGLISH, subject="Re: Licence order", language="en", signature="Noa")


TRANSFORMS: dict[str, Callable[[str], str]] = {
    "as-sent": lambda html: html,
    "gmail": gmail,
    "outlook": outlook,
}


@pytest.mark.parametrize("provider", sorted(TRANSFORMS))
def test_scenario_7_hebrew_rtl_and_english_ltr_survive_stored_copy_read_back(
    rendered: RenderedMessage, provider: str
) -> None:
    sent, stored = sent_and_stored(rendered, html=TRANSFORMS[provider](rendered.html))
    report = verify_read_back(rendered, sent, stored)
    assert report.ok, report.failed
    names = {c.name for c in report.checks}
    assert {"recipients.to", "recipients.cc", "subject", "thread", "message_id"} <= names
    assert {"wrapper.direction", "wrapper.lang", "blocks", "fragments", "body_text"} <= names


def test_the_hebrew_reply_isolates_its_urls_prices_ids_and_runs_right_to_left() -> None:
    m = render_message(HEBREW, subject="Re: x", language="he")
    assert (m.direction.value, m.language) == ("rtl", "he")
    kinds = {(f.text, f.kind) for f in m.fragments}
    assert {
        ("Microsoft Teams Premium", "latin"),
        ("₪1,250.00", "price"),
        ("$340", "price"),
        ("ORD-2026-0042", "id"),
        ("https://portal.contoso.test/orders/42", "url"),
        ("support@fabrikam.test", "email"),
        ("03-555-1234", "phone"),
        ("30/11/2026", "date"),
        ("10:30", "time"),
    } <= kinds
    # The product name stays inside its Hebrew paragraph, which keeps running right to left.
    assert all(b.direction.value == "rtl" for b in m.blocks)
    assert '<bdi dir="ltr">₪1,250.00</bdi>' in m.html


def _strip_direction(html: str) -> str:
    html = re.sub(r'\sdir="(rtl|ltr)"', "", html)
    return re.sub(r"direction:\s*(rtl|ltr);?", "", html)


NEGATIVE: dict[str, tuple[Callable[[RenderedMessage], dict[str, object]], set[str]]] = {
    "direction stripped": (
        lambda m: {"html": _strip_direction(m.html)},
        {"wrapper.direction", "blocks"},
    ),
    "fragment split": (
        lambda m: {
            "html": m.html.replace(
                "ORD-2026-0042</bdi>", "ORD-2026</bdi></span> <span dir=\"ltr\"><bdi>-0042</bdi>"
            )
        },
        {"fragments"},
    ),
    "fragment no longer isolated": (
        lambda m: {
            "html": re.sub(
                r'<span dir="ltr" data-ltr="price"[^>]*><bdi dir="ltr">(₪1,250.00)</bdi></span>',
                r"\1",
                m.html,
            )
        },
        {"fragments"},
    ),
    "recipient added": (
        lambda m: {
            "cc": (Address(address="ops@fabrikam.test"), Address(address="x@elsewhere.test"))
        },
        {"recipients.cc"},
    ),
    "subject changed": (lambda m: {"subject": "RE: " + m.subject}, {"subject"}),
    "another thread": (lambda m: {"provider_thread_id": "thread-2"}, {"thread"}),
    "another message id": (lambda m: {"internet_message_id": "<other@x>"}, {"message_id"}),
    "language changed": (lambda m: {"html": m.html.replace('lang="he"', 'lang="en"')}, {"wrapper.lang"}),
    "aligned left": (
        lambda m: {"html": m.html.replace("text-align:right", "text-align:left").replace(
            'align="right"', 'align="left"')},
        {"wrapper.alignment", "blocks"},
    ),
    "text changed": (lambda m: {"html": m.html.replace("שלום דנה", "שלום דן")}, {"body_text"}),
    "no html": (lambda m: {"html": None}, {"html"}),
}  # fmt: skip


@pytest.mark.parametrize("case", sorted(NEGATIVE))
def test_a_stored_copy_that_lost_something_fails_and_names_the_check(case: str) -> None:
    m = render_message(HEBREW, subject="Re: הזמנת רישיונות", language="he")
    change, expected = NEGATIVE[case]
    sent, stored = sent_and_stored(m, **change(m))
    report = verify_read_back(m, sent, stored)
    assert not report.ok
    assert expected <= {c.name for c in report.failed}, report.failed
    assert all(c.detail for c in report.failed)  # every failure says what was found


def test_an_rtl_message_stored_so_that_it_displays_ltr_fails() -> None:
    m = render_message(HEBREW, subject="Re: x", language="he")
    # Outlook's own body dir="ltr" is harmless while the wrapper keeps dir="rtl"; once the
    # wrapper's direction is gone the message displays left to right, and fails.
    without = m.html.replace(
        '<div dir="rtl" lang="he" data-outloop="message" style="direction:rtl;',
        '<div lang="he" data-outloop="message" style="',
    )
    without = re.sub(r'(<(?:table|td)[^>]*?) dir="rtl"', r"\1", without)
    without = without.replace("direction:rtl;border-collapse", "border-collapse")
    without = without.replace('align="right" style="direction:rtl;', 'align="right" style="')
    sent, stored = sent_and_stored(m, html=outlook(without))
    report = verify_read_back(m, sent, stored)
    assert "wrapper.direction" in {c.name for c in report.failed}
