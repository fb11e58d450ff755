"""Opt-in: the Gmail API and Microsoft Graph adapters against real mailboxes
(docs/api-channels.md, "Live tests").

Each provider's tests are skipped, saying which variables to set, unless its variables are:

- Gmail: ``OUTLOOP_LIVE_GMAIL_ADDRESS``, ``OUTLOOP_LIVE_GMAIL_CLIENT_ID``,
  ``OUTLOOP_LIVE_GMAIL_CLIENT_SECRET``, ``OUTLOOP_LIVE_GMAIL_REFRESH_TOKEN``;
- Microsoft 365: ``OUTLOOP_LIVE_GRAPH_ADDRESS``, ``OUTLOOP_LIVE_GRAPH_CLIENT_ID``,
  ``OUTLOOP_LIVE_GRAPH_CLIENT_SECRET``, ``OUTLOOP_LIVE_GRAPH_REFRESH_TOKEN`` and optionally
  ``OUTLOOP_LIVE_GRAPH_TENANT`` (``common``).

``OUTLOOP_LIVE_WAIT_SECONDS`` (120) bounds how long mail is looked for.

What they do to the mailbox: read the inbox (nothing is marked read, labelled or moved) and
send one message to the mailbox itself, with a unique subject, which stays in its inbox and
sent mail. A refresh token Microsoft rotates during the run is kept in memory only: the one
in the environment stays valid. No test prints a secret.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator
from typing import TypeVar

import pytest

from agent.domain.context import ApiAccess, MailboxBinding
from agent.domain.envelope import Address
from agent.domain.mail import Marker, OutgoingMessage, StoredCopy
from agent.domain.secrets import Secret
from agent.ports import MailProvider
from agent.providers import gmail_api, msgraph
from agent.testing.providers import read_all
from tests.providers.live import poll

T = TypeVar("T")
PREFIX = {"google": "OUTLOOP_LIVE_GMAIL_", "microsoft": "OUTLOOP_LIVE_GRAPH_"}
REQUIRED = ("ADDRESS", "CLIENT_ID", "CLIENT_SECRET", "REFRESH_TOKEN")


def _missing(provider: str) -> list[str]:
    names = [PREFIX[provider] + name for name in REQUIRED]
    return [name for name in names if not os.environ.get(name)]


def _channel(provider: str) -> MailProvider:
    env, prefix = os.environ, PREFIX[provider]
    secrets = {
        "oauth_client_id": env[prefix + "CLIENT_ID"],
        "oauth_client_secret": env[prefix + "CLIENT_SECRET"],
        "oauth_refresh_token": env[prefix + "REFRESH_TOKEN"],
    }
    binding = MailboxBinding(
        mailbox_id=env[prefix + "ADDRESS"],
        provider=provider,
        api=ApiAccess(tenant=env.get(prefix + "TENANT") or "common"),
    )
    opener = gmail_api.open_gmail if provider == "google" else msgraph.open_graph
    return opener(
        binding,
        read=lambda name: Secret(secrets[name]),
        write=lambda name, value: secrets.__setitem__(name, value.reveal()),
        reconnect="a new refresh token in the OUTLOOP_LIVE_* variables",
    )


@pytest.fixture(
    params=[
        pytest.param(
            provider,
            marks=pytest.mark.skipif(
                bool(_missing(provider)),
                reason=f"live {provider} API tests run against a real mailbox: set "
                f"{', '.join(_missing(provider))} (docs/api-channels.md, 'Live tests')",
            ),
        )
        for provider in ("google", "microsoft")
    ]
)
async def live(request: pytest.FixtureRequest) -> AsyncIterator[MailProvider]:
    channel = _channel(str(request.param))
    yield channel
    await channel.aclose()


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.mark.anyio
async def test_a_real_inbox_is_read_to_its_end_with_every_item_normalized_or_explained(
    live: MailProvider,
) -> None:
    health = await live.health()
    assert health.ok, health.detail
    items, cursor = await read_all(live)
    assert all(item.envelope is not None or item.error for item in items)
    again, _ = await read_all(live, cursor)
    assert {i.item_ref for i in again}.isdisjoint(i.item_ref for i in items)


@pytest.mark.anyio
async def test_a_message_sent_to_the_mailbox_itself_reads_back_and_arrives_once(
    live: MailProvider,
) -> None:
    _, cursor = await read_all(live)
    me = Address(address=live.mailbox_id)
    token = uuid.uuid4().hex
    message = OutgoingMessage(
        provider_thread_id="",
        sender=me,
        to=(me,),
        subject=f"Outloop live test {token}",
        text=f"A live test of the {live.provider} API adapter ({token}).",
        html=f"<p dir='ltr'>A live test of the {live.provider} API adapter ({token}).</p>",
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
