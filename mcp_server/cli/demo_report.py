"""The demo's run report: one self-contained HTML file (no script, no external asset) that
shows what the run did and how each promise was checked: the queue, the tasks, each send
with its verified read-back and what was checked, every reconciliation, the access path each
mailbox took and why, and the planted instruction that nothing obeyed."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from jinja2 import Environment, PackageLoader, select_autoescape

from agent.domain.untrusted import shown

REPORT_CSP = "default-src 'none'; style-src 'unsafe-inline'; img-src data:; frame-src 'self'"
"""The report loads nothing and runs nothing; the stored copy is framed without script."""


CHECKED = {
    "delivered": "the provider holds a stored copy of the message",
    "recipients.to": "To is exactly the approved recipients",
    "recipients.cc": "Cc is exactly as sent",
    "recipients.bcc": "no Bcc",
    "recipients.reply_to": "no Reply-To",
    "recipients.other": "no other header naming a mailbox",
    "sender": "From is the workspace's mailbox",
    "subject": "the subject, verbatim",
    "thread": "in the original thread",
    "message_id": "our Message-ID",
    "wrapper.direction": "the message wrapper sets the direction",
    "wrapper.lang": "the wrapper sets the language",
    "wrapper.alignment": "the wrapper aligns to the direction's start",
    "blocks": "every block displays in its own direction",
    "fragments": "every LTR fragment is whole inside a left-to-right isolate",
    "body_text": "the displayed text is the rendered text",
}
"""What each read-back check compares (agent/rendering/verify.py and the send ledger)."""


def _env() -> Environment:
    env = Environment(
        loader=PackageLoader("mcp_server.cli", "templates"),
        autoescape=select_autoescape(default=True, default_for_string=True),
    )
    # mail text: control and format characters written out (the stubs leave filters untyped)
    env.filters["shown"] = shown  # pyright: ignore[reportUnknownMemberType]
    env.globals["checked"] = CHECKED  # pyright: ignore[reportUnknownMemberType]
    return env


def render_report(facts: dict[str, Any]) -> str:
    """The report's HTML from what the demo saw (``facts``; see ``demo.report_facts``)."""
    return _env().get_template("demo-report.j2").render(csp=REPORT_CSP, **facts)


def write_report(path: Path, facts: dict[str, Any]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".html.tmp")
    tmp.write_text(render_report(facts), encoding="utf-8")
    tmp.replace(path)
    return path
