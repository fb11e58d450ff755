"""``outloop bench render``: render plus read-back verification of a typical Hebrew reply.

One process (one core): each iteration renders the reply (Markdown, per-block direction,
isolates, the Jinja2 template) and verifies a stored copy of it as Outlook re-serializes it
(its own head, ``dir="ltr"`` on body, restyled declarations). The baseline, in the same run:
the bare Jinja2 render of the same template with fixed strings. ``rate_per_s`` is render +
verify per second; ``ratio`` is rate / baseline.
"""

from __future__ import annotations

import os
import re
import statistics
import time
from collections.abc import Callable
from typing import Any

from markupsafe import Markup

from agent.domain.envelope import Address
from agent.domain.mail import OutgoingMessage, StoredCopy
from agent.rendering.render import environment, render_message
from agent.rendering.verify import verify_read_back

DRAFT = """שלום דנה,

הזמנתי את **Microsoft Teams Premium** עבורכם. המחיר הוא ₪1,250.00 לחודש, \
וההזמנה ORD-2026-0042 זמינה בכתובת https://portal.contoso.test/orders/42.

- ההתקנה תתבצע ב-30/11/2026 בשעה 10:30.
- לשאלות: support@fabrikam.test או 03-555-1234.
"""


def _stored_like_outlook(html: str) -> str:
    body = re.search(r"<body[^>]*>(.*)</body>", html, re.DOTALL)
    inner = (body.group(1) if body else html).replace(";", "; ")
    return (
        '<html><head><style type="text/css">P {margin:0;}</style></head>'
        f'<body dir="ltr">{inner}</body></html>'
    )


def _one() -> bool:
    rendered = render_message(
        DRAFT, subject="Re: הזמנת רישיונות", language="he", signature="נועה בר"
    )
    sent = OutgoingMessage(
        provider_thread_id="thread-1",
        sender=Address(address="noa.bar@fabrikam.test"),
        to=(Address(address="dana.levi@contoso.test"),),
        subject=rendered.subject,
        text=rendered.text,
        html=rendered.html,
        internet_message_id="<reply-1@fabrikam.test>",
    )
    stored = StoredCopy(
        provider_message_id="pm-1",
        provider_thread_id="thread-1",
        internet_message_id=sent.internet_message_id,
        sender=sent.sender,
        to=sent.to,
        cc=(),
        subject=sent.subject,
        text=sent.text,
        html=_stored_like_outlook(rendered.html),
        delivered=True,
    )
    return verify_read_back(rendered, sent, stored).ok


def _bare() -> bool:
    html = (
        environment()
        .get_template("message.html.j2")
        .render(
            direction="rtl",
            align="right",
            lang="he",
            greeting=Markup("<p>שלום דנה,</p>"),
            body=Markup("<p>ההזמנה אושרה.</p>"),
            signature=Markup("<p>נועה בר</p>"),
        )
    )
    return bool(html)


def _timed(step: Callable[[], bool], seconds: float) -> tuple[float, list[float], bool]:
    latencies: list[float] = []
    ok = True
    started = time.perf_counter()
    while time.perf_counter() - started < seconds:
        t0 = time.perf_counter()
        ok = step() and ok
        latencies.append(time.perf_counter() - t0)
    return len(latencies) / (time.perf_counter() - started), latencies, ok


def run(seconds: float = 3.0) -> dict[str, Any]:
    """Measure for about ``seconds`` each (after a warm-up) and return the figures."""
    for _ in range(20):
        _one()
        _bare()
    rate, latencies, ok = _timed(_one, seconds)
    baseline, _, _ = _timed(_bare, seconds)
    ordered = sorted(latencies)
    return {
        "bench": "render",
        "rate_per_s": round(rate, 1),
        "baseline_per_s": round(baseline, 1),
        "ratio": round(rate / baseline, 4),
        "p50_ms": round(statistics.median(ordered) * 1000, 3),
        "p99_ms": round(ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))] * 1000, 3),
        "iterations": len(latencies),
        "all_verified": ok,
        "processes": 1,
        "cpus": os.cpu_count(),
    }
