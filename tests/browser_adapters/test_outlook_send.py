"""What Outlook on the web answers to Send, and what a search of Sent Items may conclude:
an answer that may hide a sent message is an unknown outcome (settled from the copies,
never sent again blind), a refusal sent nothing, and a copy not found where the search did
not read is not proven absent."""

from __future__ import annotations

import pytest
from playwright.async_api import Route

from agent.domain.errors import AccessRefused, NotHandedOver, OutcomeUnknown, TransientFailure
from agent.domain.mail import Marker, MarkerKind
from agent.testing.providers import envelopes, raw_message, read_all, reply
from browser_adapters import outlook, webmail
from tests.browser_adapters.outlook_mock import Insert, OutlookAccount, on_insert, prepared_reply

pytestmark = pytest.mark.anyio
MAILBOX = "support@fabrikam.test"


def _answering_send(
    monkeypatch: pytest.MonkeyPatch, *, goes_through: bool, status: int, body: str
) -> None:
    """Outlook's answer to Send replaced by ``status`` and ``body``, after the message
    really went (``goes_through``) or without it reaching the app."""

    async def answer(route: Route) -> None:
        if goes_through:
            await route.fetch()
        await route.fulfill(status=status, body=body, content_type="application/json")

    async def then_answered(inserted: Insert, composer: webmail.Composer, markup: str) -> None:
        await composer.root.page.route("**/_api/send", answer)
        await inserted(composer, markup)

    on_insert(monkeypatch, then_answered)


async def test_send_answered_that_its_draft_is_gone_is_an_unknown_outcome_settled_from_the_copy(
    account: OutlookAccount, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The message went out and the app answered 404 "That draft was sent or discarded"
    (as it does to a second press): never "nothing was sent"."""
    channel = account.build()
    message, handover = await prepared_reply(account, channel)
    gone = '{"error": "That draft was sent or discarded."}'
    _answering_send(monkeypatch, goes_through=True, status=404, body=gone)
    with pytest.raises(OutcomeUnknown):
        await channel.send(handover)
    assert account.sent_copies(message.internet_message_id) == 1
    assert handover.marker is not None
    assert await channel.find_sent(handover.marker) is not None  # settled from the copy


async def test_a_send_outlook_refuses_sent_nothing_and_may_be_tried_again(
    account: OutlookAccount, monkeypatch: pytest.MonkeyPatch
) -> None:
    channel = account.build()
    message, handover = await prepared_reply(account, channel)
    refusal = '{"error": "Please specify at least one recipient."}'
    _answering_send(monkeypatch, goes_through=False, status=400, body=refusal)
    with pytest.raises(NotHandedOver, match="HTTP 400"):
        await channel.send(handover)
    assert account.sent_copies(message.internet_message_id) == 0


@pytest.mark.parametrize(
    ("status", "answer", "error"),
    [
        (400, None, NotHandedOver),
        (413, None, NotHandedOver),
        (415, None, NotHandedOver),
        (422, None, NotHandedOver),
        (403, None, AccessRefused),
        (404, None, OutcomeUnknown),
        (409, None, OutcomeUnknown),
        (429, None, OutcomeUnknown),
        (500, None, OutcomeUnknown),
        (503, None, OutcomeUnknown),
        (204, None, OutcomeUnknown),
        (200, None, OutcomeUnknown),  # not JSON
        (200, ["sent"], OutcomeUnknown),
        (200, {"error": "?"}, OutcomeUnknown),
    ],
)
def test_an_answer_to_send_is_a_refusal_only_when_it_says_nothing_went_out(
    status: int, answer: object, error: type[Exception]
) -> None:
    """Refusals the app gives a message as it is sent nothing and may be tried again; 403
    is a refusal of the account (never routed around); any other answer - a draft gone, a
    throttled or failed one, one that cannot be read - leaves the outcome unknown."""
    with pytest.raises(error):
        outlook.sent_answer(status, answer)
    assert outlook.sent_answer(200, {"sent": "AAMk1", "thread": "t"})["sent"] == "AAMk1"


async def test_a_copy_not_among_the_conversations_searched_is_not_proven_absent(
    account: OutlookAccount, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A copy is looked for in the conversation its marker names, then in the newest
    conversations; it is proven absent only when the search read every conversation Sent
    Items lists (fewer than it reads at most, and none more drawn on scrolling). Otherwise
    a copy not found is a transient failure, so an uncertain send is never taken as not
    sent."""
    monkeypatch.setattr(outlook, "SENT_SCAN", 2)
    channel = account.build()
    for n in (1, 2):
        account.deliver(raw_message(n))
    parents = envelopes((await read_all(channel))[0])
    markers: list[Marker] = []
    for n, parent in enumerate(parents):
        handover = await channel.prepare(reply(parent, channel.capabilities, f"<r-{n}@f.test>"))
        await channel.send(handover)
        assert handover.marker is not None
        markers.append(handover.marker)
    named, _, _ = markers[0].value.removeprefix(outlook.MARKER_PREFIX).rpartition(":")
    _, _, second = markers[1].value.rpartition(":")

    def native(conversation: str, token: str) -> Marker:
        return Marker(
            kind=MarkerKind.NATIVE, value=f"{outlook.MARKER_PREFIX}{conversation}:{token}"
        )

    assert await channel.find_sent(markers[0]) is not None
    moved = await channel.find_sent(native(named, second))  # filed in another conversation
    assert moved is not None and moved.internet_message_id is not None
    for absent in (native(named, "no-such"), native("", "no-such")):
        with pytest.raises(TransientFailure, match="absence is not proven"):
            await channel.find_sent(absent)
    with pytest.raises(TransientFailure, match="absence is not proven"):
        await channel.find_sent(Marker(kind=MarkerKind.MESSAGE_ID, value="<gone@f.test>"))
    monkeypatch.setattr(outlook, "SENT_SCAN", 3)  # now every listed conversation is read
    assert await channel.find_sent(native(named, "no-such")) is None
    assert (
        await channel.find_sent(Marker(kind=MarkerKind.MESSAGE_ID, value="<gone@f.test>")) is None
    )


async def test_a_reply_to_our_own_sent_message_is_written_on_it_from_sent_items(
    account: OutlookAccount,
) -> None:
    """A reminder answers our own message: a channel that has not read it finds it among
    Sent Items by the Message-ID Exchange gave it, and replies in its conversation."""
    channel = account.build()
    account.deliver(raw_message(1))
    [parent] = envelopes((await read_all(channel))[0])
    first = await channel.send(await channel.prepare(reply(parent, channel.capabilities)))
    reminder = reply(parent, channel.capabilities, "<reminder-1@fabrikam.test>").model_copy(
        update={
            "in_reply_to": first.internet_message_id,
            "references": (*parent.references, first.internet_message_id),
        }
    )
    fresh = account.build()  # knows nothing of what the first instance read or sent
    handover = await fresh.prepare(reminder)
    sent = await fresh.send(handover)
    assert handover.marker is not None
    copy = await fresh.find_sent(handover.marker)
    assert copy is not None and copy.provider_message_id == sent.provider_message_id
    assert account.sent_copies(reminder.internet_message_id) == 1
    assert len({m["thread_id"] for m in account.stored("sent")}) == 1  # one conversation
