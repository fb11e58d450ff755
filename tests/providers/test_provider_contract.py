"""The MailProvider contract, run against every adapter (the in-memory fake and Maildir)."""

from __future__ import annotations

import mailbox
from collections.abc import Callable
from email.message import EmailMessage
from pathlib import Path

import pytest

from agent.domain.envelope import Address
from agent.domain.errors import ProviderError
from agent.domain.handover import check_handover
from agent.domain.mail import OutgoingMessage, ProviderHealth, ScannedMessage
from agent.ports import MailProvider
from agent.providers.maildir import MaildirProvider
from agent.testing import InMemoryProvider, make_envelope

MAILBOX = "Support@Fabrikam.test"
ADAPTERS = ["memory", "maildir"]

# deliver(message_no, text) puts one message into the mailbox and returns its Message-ID.
Deliver = Callable[[int, str], str]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def message_id(message_no: int) -> str:
    # the same Message-ID make_envelope gives message ``message_no``
    return f"<m{message_no}@example.test>"


@pytest.fixture(params=ADAPTERS)
def adapter(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[MailProvider, Deliver]:
    kind = str(request.param)
    if kind == "memory":
        memory = InMemoryProvider(MAILBOX)

        def deliver_memory(message_no: int, text: str) -> str:
            envelope = make_envelope(
                mailbox_id=memory.mailbox_id, message_no=message_no, thread_no=1
            )
            memory.deliver(envelope, text=text)
            assert envelope.internet_message_id is not None
            return envelope.internet_message_id

        return memory, deliver_memory

    assert kind == "maildir"
    path = tmp_path / "Maildir"
    box = mailbox.Maildir(str(path), create=True)

    def deliver_maildir(message_no: int, text: str) -> str:
        msg = EmailMessage()
        msg["From"] = "client@example.test"
        msg["To"] = MAILBOX
        msg["Subject"] = "Request 1"
        msg["Date"] = "Sun, 01 Nov 2026 00:00:00 +0000"
        msg["Message-ID"] = message_id(message_no)
        msg.set_content(text)
        box.add(msg.as_bytes())
        return message_id(message_no)

    return MaildirProvider(path, MAILBOX), deliver_maildir


async def scan_all(provider: MailProvider) -> list[ScannedMessage]:
    return [item async for item in provider.scan()]


def reply(provider_thread_id: str, mid: str = "<reply-1@fabrikam.test>") -> OutgoingMessage:
    return OutgoingMessage(
        provider_thread_id=provider_thread_id,
        in_reply_to=message_id(1),
        references=(message_id(1),),
        sender=Address(address="support@fabrikam.test", name="Fabrikam Support"),
        to=(Address(address="client@example.test", name="Client"),),
        cc=(Address(address="noa.bar@fabrikam.test"),),
        subject="Re: Request 1",
        text="We are on it.",
        html="<p>We are on it.</p>",
        internet_message_id=mid,
    )


def test_adapter_is_a_mail_provider(adapter: tuple[MailProvider, Deliver]) -> None:
    provider, _ = adapter

    assert isinstance(provider, MailProvider)


def test_adapter_reports_a_name_and_the_lowercased_mailbox_id(
    adapter: tuple[MailProvider, Deliver],
) -> None:
    provider, _ = adapter

    assert provider.provider
    assert provider.mailbox_id == "support@fabrikam.test"


@pytest.mark.anyio
async def test_empty_mailbox_scans_to_nothing(adapter: tuple[MailProvider, Deliver]) -> None:
    provider, _ = adapter

    assert await scan_all(provider) == []


@pytest.mark.anyio
async def test_delivered_message_is_scanned_exactly_once_with_provider_ids(
    adapter: tuple[MailProvider, Deliver],
) -> None:
    provider, deliver = adapter
    mid = deliver(1, "Please help.")

    items = await scan_all(provider)

    assert len(items) == 1
    [item] = items
    assert item.error is None
    envelope = item.envelope
    assert envelope is not None
    assert item.item_ref == envelope.provider_message_id
    assert envelope.internet_message_id == mid
    assert envelope.provider_message_id
    assert envelope.provider_thread_id
    assert envelope.provider == provider.provider
    assert envelope.mailbox_id == provider.mailbox_id
    assert envelope.received_at.tzinfo is not None
    assert envelope.content_digest


@pytest.mark.anyio
async def test_scanning_twice_yields_the_same_ids(adapter: tuple[MailProvider, Deliver]) -> None:
    provider, deliver = adapter
    deliver(1, "one")
    deliver(2, "two")

    first = await scan_all(provider)
    second = await scan_all(provider)

    assert len(first) == 2
    assert [i.item_ref for i in first] == [i.item_ref for i in second]
    assert [i.envelope for i in first] == [i.envelope for i in second]


@pytest.mark.anyio
async def test_fetch_body_returns_the_delivered_text(
    adapter: tuple[MailProvider, Deliver],
) -> None:
    provider, deliver = adapter
    deliver(1, "Please help with the invoice.")
    [item] = await scan_all(provider)
    assert item.envelope is not None

    body = await provider.fetch_body(item.envelope.body_ref)

    assert body.text.strip() == "Please help with the invoice."


@pytest.mark.anyio
async def test_send_then_read_back_round_trips_subject_recipients_and_message_id(
    adapter: tuple[MailProvider, Deliver],
) -> None:
    provider, deliver = adapter
    deliver(1, "Please help.")
    [item] = await scan_all(provider)
    assert item.envelope is not None
    outgoing = reply(item.envelope.provider_thread_id)

    result = await provider.send(await provider.prepare(outgoing))
    copy = await provider.read_back(outgoing.internet_message_id)

    assert result.internet_message_id == outgoing.internet_message_id
    assert result.provider_thread_id == item.envelope.provider_thread_id
    assert result.provider_message_id
    assert result.accepted_at.tzinfo is not None
    assert copy is not None
    assert copy.internet_message_id == outgoing.internet_message_id
    assert copy.subject == outgoing.subject
    assert [a.address for a in copy.to] == [a.address for a in outgoing.to]
    assert [a.address for a in copy.cc] == [a.address for a in outgoing.cc]
    assert copy.sender is not None
    assert copy.sender.address == outgoing.sender.address
    assert copy.provider_message_id == result.provider_message_id
    assert copy.provider_thread_id == item.envelope.provider_thread_id
    assert copy.text.strip() == outgoing.text
    assert copy.html is not None
    assert outgoing.html is not None
    assert copy.html.strip() == outgoing.html


@pytest.mark.anyio
async def test_read_back_of_an_unknown_message_id_is_none(
    adapter: tuple[MailProvider, Deliver],
) -> None:
    provider, deliver = adapter
    deliver(1, "Please help.")

    assert await provider.read_back("<never-sent@fabrikam.test>") is None
    await provider.send(await provider.prepare(reply("thread-1")))
    assert await provider.read_back("<never-sent@fabrikam.test>") is None


@pytest.mark.anyio
async def test_health_is_ok(adapter: tuple[MailProvider, Deliver]) -> None:
    provider, deliver = adapter
    deliver(1, "Please help.")

    health = await provider.health()

    assert isinstance(health, ProviderHealth)
    assert health.ok is True
    assert health.provider == provider.provider
    assert health.mailbox_id == provider.mailbox_id
    assert health.detail


@pytest.mark.anyio
async def test_what_a_channel_prepares_is_exactly_the_plan_and_is_what_it_stores(
    adapter: tuple[MailProvider, Deliver],
) -> None:
    provider, deliver = adapter
    deliver(1, "Please help.")
    outgoing = reply("thread-1")

    handover = await provider.prepare(outgoing)
    await provider.send(handover)
    copy = await provider.read_back(outgoing.internet_message_id)

    assert handover.message == outgoing
    assert check_handover(handover) == ()
    assert copy is not None
    assert (copy.bcc, copy.reply_to, copy.other_address_headers) == ((), (), ())


@pytest.mark.anyio
async def test_a_message_that_cannot_be_written_as_planned_is_refused_by_prepare(
    adapter: tuple[MailProvider, Deliver],
) -> None:
    provider, _ = adapter
    # An address that is no plain addr-spec: nothing may be written for it.
    odd = reply("thread-1").model_copy(update={"to": (Address(address="a@b>, m@evil.test"),)})

    with pytest.raises(ProviderError):
        await provider.prepare(odd)
