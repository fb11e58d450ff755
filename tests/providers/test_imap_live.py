"""Opt-in: the IMAP/SMTP adapter against a real account (docs/imap.md, "Live tests").

Skipped, saying which variables to set, unless ``OUTLOOP_LIVE_IMAP_HOST``,
``OUTLOOP_LIVE_SMTP_HOST``, ``OUTLOOP_LIVE_USER`` and ``OUTLOOP_LIVE_PASSWORD`` are set.
Optional: ``OUTLOOP_LIVE_IMAP_PORT`` (993), ``OUTLOOP_LIVE_IMAP_SECURITY`` (``tls``; ``none``
only for a server on this machine), ``OUTLOOP_LIVE_SMTP_PORT`` (587),
``OUTLOOP_LIVE_SMTP_SECURITY`` (``starttls``; or ``tls``), ``OUTLOOP_LIVE_KEEPS_SENT_COPY``
(``true`` for Gmail and Microsoft 365, whose SMTP files the sent copy itself) and
``OUTLOOP_LIVE_WAIT_SECONDS`` (how long to look for mail to arrive, 120).

What they do to the account: read the inbox (BODY.PEEK: nothing is marked seen) and send
one message to the account itself, with a unique subject, which stays in its inbox and Sent
folder. The password is used for signing in only; no test prints it.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator
from typing import TypeVar

import pytest

from agent.domain.context import Endpoint, MailServer, Security
from agent.domain.envelope import Address
from agent.domain.mail import Marker, OutgoingMessage, StoredCopy
from agent.domain.secrets import Secret
from agent.providers.imap_smtp import ImapSmtpProvider
from agent.testing.providers import read_all
from tests.providers.live import poll

REQUIRED = (
    "OUTLOOP_LIVE_IMAP_HOST",
    "OUTLOOP_LIVE_SMTP_HOST",
    "OUTLOOP_LIVE_USER",
    "OUTLOOP_LIVE_PASSWORD",
)
T = TypeVar("T")
MISSING = [name for name in REQUIRED if not os.environ.get(name)]

pytestmark = pytest.mark.skipif(
    bool(MISSING),
    reason=f"live IMAP/SMTP tests run against a real account: set {', '.join(MISSING)} "
    "(docs/imap.md, 'Live tests')",
)


def _server() -> MailServer:
    env = os.environ
    return MailServer(
        imap=Endpoint(
            host=env["OUTLOOP_LIVE_IMAP_HOST"],
            port=int(env.get("OUTLOOP_LIVE_IMAP_PORT") or 993),
            security=Security(env.get("OUTLOOP_LIVE_IMAP_SECURITY") or "tls"),
        ),
        smtp=Endpoint(
            host=env["OUTLOOP_LIVE_SMTP_HOST"],
            port=int(env.get("OUTLOOP_LIVE_SMTP_PORT") or 587),
            security=Security(env.get("OUTLOOP_LIVE_SMTP_SECURITY") or "starttls"),
        ),
        username=env["OUTLOOP_LIVE_USER"],
        submission_keeps_sent_copy=env.get("OUTLOOP_LIVE_KEEPS_SENT_COPY", "").lower() == "true",
    )


@pytest.fixture
async def live() -> AsyncIterator[ImapSmtpProvider]:
    provider = ImapSmtpProvider(
        _server(), os.environ["OUTLOOP_LIVE_USER"], Secret(os.environ["OUTLOOP_LIVE_PASSWORD"])
    )
    yield provider
    await provider.aclose()


@pytest.mark.anyio
async def test_a_real_inbox_is_read_to_its_end_with_every_item_normalized_or_explained(
    live: ImapSmtpProvider,
) -> None:
    health = await live.health()
    assert health.ok, health.detail
    items, cursor = await read_all(live)
    assert all(item.envelope is not None or item.error for item in items)
    again, _ = await read_all(live, cursor)
    assert {i.item_ref for i in again}.isdisjoint(i.item_ref for i in items)


@pytest.mark.anyio
async def test_a_message_sent_to_the_account_itself_reads_back_and_arrives_once(
    live: ImapSmtpProvider,
) -> None:
    _, cursor = await read_all(live)
    me = Address(address=live.mailbox_id)
    token = uuid.uuid4().hex
    message = OutgoingMessage(
        provider_thread_id="",
        in_reply_to=None,
        references=(),
        sender=me,
        to=(me,),
        cc=(),
        subject=f"Outloop live test {token}",
        text=f"A live test of the IMAP/SMTP adapter ({token}).",
        html=None,
        internet_message_id=f"<live-{token}@outloop.test>",
    )
    handover = await live.prepare(message)
    result = await live.send(handover)
    assert result.refused == ()
    marker: Marker | None = handover.marker
    assert marker is not None

    async def filed() -> StoredCopy | None:
        return await live.find_sent(marker)

    copy = await poll(filed)
    assert copy.subject == message.subject and [a.address for a in copy.to] == [me.address]

    async def arrived() -> str | None:
        items, _ = await read_all(live, cursor)
        found = [i for i in items if i.envelope and i.envelope.subject == message.subject]
        return found[0].item_ref if len(found) == 1 else None

    assert await poll(arrived)
