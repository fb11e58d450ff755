"""A reply answers the latest message of its thread from its own recipients, and its
References keep the thread's root (RFC 5322 section 3.6.4): a message that someone else - an
unknown or lookalike sender - slipped into a client's thread is never what the reply answers."""

from __future__ import annotations

import re
from email.message import EmailMessage

import pytest

from tests.mcp.conftest import (
    CLIENT,
    OperatorStation,
    approve_by_reply,
    call,
    intake_and_claim,
    sent_messages,
    to_draft_ready,
)

pytestmark = pytest.mark.anyio

LOOKALIKE = "dana.levi@c0ntoso.test"


async def test_a_client_reply_answers_the_clients_message_not_a_strangers_in_the_thread(
    station: OperatorStation,
) -> None:
    root = station.deliver(sender=CLIENT, subject="Quote request")
    station.clock.advance(minutes=1)
    follow_up = station.deliver(sender=CLIENT, subject="Re: Quote request", in_reply_to=root)
    station.clock.advance(minutes=1)
    # A lookalike sender answers inside the thread, after the client's latest message.
    intruder = station.deliver(sender=LOOKALIKE, subject="Re: Quote request", in_reply_to=follow_up)
    async with station.client() as client:
        scanned, claims = await intake_and_claim(client)
        task_ids = {c["task_id"] for c in claims}
        assert len(task_ids) == 1, claims  # one thread, one task
        [task_id] = task_ids
        await call(client, "reconcile", run_id=scanned["run_id"])
        await to_draft_ready(client, task_id)
        draft = await call(client, "render", task_id=task_id, body_markdown="The quote: $1,200.")
        request = await call(
            client, "request_approval", task_id=task_id, draft_id=draft["draft_id"]
        )
        await approve_by_reply(station, client, [request])
        await call(client, "send", task_id=task_id, draft_id=draft["draft_id"], to=[CLIENT])
    [reply] = [m for m in sent_messages(station.maildir) if CLIENT in str(m["To"])]
    assert reply["In-Reply-To"] == follow_up
    references = _ids(reply)
    assert references[0] == root and references[-1] == follow_up
    assert intruder not in references


def _ids(message: EmailMessage) -> list[str]:
    return re.findall(r"<[^<>\s]+>", str(message["References"]))
