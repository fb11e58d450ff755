"""What providers do to the HTML they store, as a test helper until the mock providers land.

- Gmail keeps a message's HTML but drops the ``head`` (and every ``style`` element in it),
  renames classes and ids with a per-message prefix, and its own composer wraps content in
  ``<div dir="ltr">``.
- Outlook (Exchange, and Graph's ``body.content``) re-serializes the document: its own
  ``head`` with a ``style`` block, ``dir="ltr"`` on ``body`` by default, attributes
  reordered, style declarations re-spaced, ``data-*`` attributes and elements it does not
  know (``bdi``) removed, keeping their content.
"""

from __future__ import annotations

import re

from agent.domain.envelope import Address
from agent.domain.mail import OutgoingMessage, StoredCopy
from agent.rendering.render import RenderedMessage


def gmail(html: str) -> str:
    body = re.search(r"<body[^>]*>(.*)</body>", html, re.DOTALL)
    inner = body.group(1) if body else html
    inner = re.sub(r'class="([^"]*)"', lambda m: f'class="m_-4242{m.group(1)}"', inner)
    return f'<div dir="ltr" class="gmail_default">{inner}</div>'


def outlook(html: str) -> str:
    body = re.search(r"<body[^>]*>(.*)</body>", html, re.DOTALL)
    inner = body.group(1) if body else html
    inner = re.sub(r'\sdata-[a-z-]+="[^"]*"', "", inner)
    inner = re.sub(r"</?bdi[^>]*>", "", inner)

    def respace(match: re.Match[str]) -> str:
        decls = [d.strip() for d in match.group(1).split(";") if d.strip()]
        return 'style="' + "; ".join(d.replace(":", ": ", 1) for d in decls) + '"'

    inner = re.sub(r'style="([^"]*)"', respace, inner)
    # Attributes reordered: style first.
    inner = re.sub(r'<(\w+)((?:\s+(?!style)[\w-]+="[^"]*")*)\s+(style="[^"]*")', r"<\1 \3\2", inner)
    return (
        '<html><head><meta http-equiv="Content-Type" content="text/html; charset=utf-8">'
        '<style type="text/css" style="display:none">P {margin-top:0;margin-bottom:0;}</style>'
        f'</head><body dir="ltr">{inner}</body></html>'
    )


def sent_and_stored(
    rendered: RenderedMessage, **changes: object
) -> tuple[OutgoingMessage, StoredCopy]:
    """The message as sent, and a stored copy of it with ``changes`` (``html=...``, ...)."""
    sent = OutgoingMessage(
        provider_thread_id="thread-1",
        in_reply_to="<m1@contoso.test>",
        sender=Address(address="noa.bar@fabrikam.test"),
        to=(Address(address="dana.levi@contoso.test"),),
        cc=(Address(address="ops@fabrikam.test"),),
        subject=rendered.subject,
        text=rendered.text,
        html=rendered.html,
        internet_message_id="<reply-1@fabrikam.test>",
    )
    stored = StoredCopy(
        provider_message_id="pm-reply-1",
        provider_thread_id=sent.provider_thread_id,
        internet_message_id=sent.internet_message_id,
        sender=sent.sender,
        to=sent.to,
        cc=sent.cc,
        subject=sent.subject,
        text=sent.text,
        html=rendered.html,
        delivered=True,
    )
    return sent, stored.model_copy(update=changes)
