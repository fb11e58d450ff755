"""The MailProvider contract suite, shipped as a base class (as keyring ships
``keyring/testing/backend.py``): every adapter, real or fake, runs it unchanged.

An adapter's tests supply only how to reach one mailbox, and subclass the suite::

    class OnMyAdapter(MailboxHooks):
        faults = frozenset({Fault.EXPIRED_CURSOR})
        cannot = {Fault.LOST_ACK: "why this adapter cannot produce it", ...}

        def build(self, *, channel=None, markers=None) -> MailProvider: ...
        def deliver(self, raw: bytes) -> None: ...
        def flip(self, fault: Fault) -> None: ...
        def advance(self, delta: timedelta) -> None: ...  # for a late sent copy
        def snapshot(self) -> Mapping[str, str]: ...
        def sent_copies(self, message_id: str) -> int: ...  # for the core's suite
        def context_path(self) -> str | None: ...  # a Maildir's directory, else None

    class TestMyAdapter(OnMyAdapter, MailProviderContract): ...

Every fault is either producible (``faults``) or declared impossible with the reason
(``cannot``); a test that needs an impossible one is skipped with that reason, never
silently. ``self.where`` is a fresh directory for the test's mailbox, set before any hook
is called.

Extension point: suites that drive the core through several channels of one mailbox (one
task across two channels, a send settled through another channel) are further base classes
over the same ``MailboxHooks``: ``channels`` names the channels ``build(channel=...)``
reaches, all showing the same mailbox. An adapter's test module then adds one line per
suite: ``class TestCoreOnMyAdapter(OnMyAdapter, ThatSuite): ...``. One ships:
``agent.testing.channel_contract.ChannelLifecycleContract`` (occurrences, tasks and sends
of the real core through the adapter's channels).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator, Mapping, Sequence
from datetime import timedelta
from email.message import EmailMessage
from enum import StrEnum
from pathlib import Path
from typing import ClassVar

import pytest

from agent.domain.envelope import Address, Envelope, occurrence_key
from agent.domain.errors import CursorExpired, NotFound, OutcomeUnknown, ProviderError, Unsupported
from agent.domain.handover import check_handover
from agent.domain.mail import (
    AttachmentData,
    AttachmentRef,
    Capabilities,
    Channel,
    Handover,
    Marker,
    MarkerKind,
    OutgoingMessage,
    ScannedMessage,
    SendResult,
    StoredCopy,
)
from agent.ports import MailProvider
from agent.providers import mime, rfc822

MAILBOX = "Support@Fabrikam.test"
CLIENT = "dana.levi@contoso.test"
COLLEAGUE = "noa.bar@fabrikam.test"
DATE = "Mon, 02 Nov 2026 10:00:00 +0000"
MAX_PAGES = 1000
"""Reading a mailbox to its end takes fewer pages than this (else the cursor is stuck)."""


class Fault(StrEnum):
    """What a test may make a mailbox do (each adapter says which it can produce)."""

    LOST_ACK = "lost_ack"
    """The next send is accepted and its copy kept, and its answer is lost
    (``OutcomeUnknown``)."""
    LATE_SENT_COPY = "late_sent_copy"
    """Copies of sends from now on become searchable only after a delay within the declared
    ``sent_copy_latency`` (``advance`` makes it pass)."""
    EXPIRED_CURSOR = "expired_cursor"
    """Every cursor given out so far expires (a rebuilt folder, a provider's expiry)."""
    DROPPED_MESSAGE_ID = "dropped_message_id"
    """Channels built from now on store our sent copy under a Message-ID of the provider's."""
    NO_SENT_COPY = "no_sent_copy"
    """Channels built from now on keep no sent copy."""


def raw_message(
    n: int,
    *,
    text: str = "Please send the invoice.",
    in_reply_to: str | None = None,
    attachments: Sequence[tuple[str, str, bytes]] = (),
) -> bytes:
    """Message ``n`` from the client (Message-ID ``<c<n>@contoso.test>``), as bytes."""
    msg = EmailMessage()
    msg["From"] = f"Dana Levi <{CLIENT}>"
    msg["To"] = MAILBOX.lower()
    msg["Subject"] = f"Invoice {n}" if in_reply_to is None else "Re: Invoice"
    msg["Date"] = DATE
    msg["Message-ID"] = f"<c{n}@contoso.test>"
    if in_reply_to is not None:
        msg["In-Reply-To"] = in_reply_to
        msg["References"] = in_reply_to
    msg.set_content(text)
    for name, kind, data in attachments:
        maintype, _, subtype = kind.partition("/")
        msg.add_attachment(data, maintype=maintype, subtype=subtype, filename=name)
    return msg.as_bytes()


def attachment(name: str, content_type: str, data: bytes) -> AttachmentData:
    digest = hashlib.sha256(data).hexdigest()
    ref = AttachmentRef(
        ref=f"file:{name}", name=name, content_type=content_type, size=len(data), sha256=digest
    )
    return AttachmentData(ref=ref, data=data)


BINARY = bytes(range(256)) * 4
"""Attachment bytes that are no text in any charset."""
FILES = (("invoice.pdf", "application/pdf", BINARY), ("lines.csv", "text/csv", b"a,b\r\n1,2\r\n"))


def reply(
    parent: Envelope,
    capabilities: Capabilities,
    mid: str = "<reply-1@fabrikam.test>",
    files: Sequence[AttachmentData] = (),
) -> OutgoingMessage:
    """Our reply to ``parent``, to its sender and a colleague, carrying the send's body
    token when the channel marks copies by one (the core renders it in)."""
    text = "We are on it."
    if MarkerKind.BODY_TOKEN in capabilities.markers:
        text += f"\n\nReference: {mime.send_token(mid)}"
    assert parent.internet_message_id is not None
    return OutgoingMessage(
        provider_thread_id=parent.provider_thread_id,
        in_reply_to=parent.internet_message_id,
        references=(*parent.references, parent.internet_message_id),
        sender=Address(address=MAILBOX.lower(), name="Fabrikam Support"),
        to=(parent.sender,),
        cc=(Address(address=COLLEAGUE),),
        subject=f"Re: {parent.subject}",
        text=text,
        html=None,
        internet_message_id=mid,
        attachments=tuple(files),
    )


async def read_all(
    provider: MailProvider, cursor: str | None = None
) -> tuple[list[ScannedMessage], str]:
    """Every change after ``cursor``, page by page, and the cursor after the last."""
    items: list[ScannedMessage] = []
    for _ in range(MAX_PAGES):
        page = await provider.changes(cursor)
        items.extend(page.items)
        cursor = page.cursor
        if not page.more:
            return items, cursor
    raise AssertionError(f"the changes did not end within {MAX_PAGES} pages")


def envelopes(items: Sequence[ScannedMessage]) -> list[Envelope]:
    found = [item.envelope for item in items]
    assert all(e is not None for e in found), [item.error for item in items]
    return [e for e in found if e is not None]


def ids(items: Sequence[ScannedMessage]) -> list[str | None]:
    return [e.internet_message_id for e in envelopes(items)]


class MailboxHooks:
    """How a suite reaches one adapter's mailbox: what an adapter's tests supply."""

    faults: ClassVar[frozenset[Fault]] = frozenset()
    """The faults this adapter's tests can produce."""
    cannot: ClassVar[Mapping[Fault, str]] = {}
    """Every other fault, with why it cannot be produced here."""
    channels: ClassVar[tuple[str, ...]] = ("default",)
    """The channels ``build`` reaches of the one mailbox (the first when none is named)."""
    where: Path

    @pytest.fixture(autouse=True)
    def _mailbox_directory(self, tmp_path: Path) -> Iterator[None]:
        self.where = tmp_path
        self.setup_mailbox()
        yield
        self.teardown_mailbox()

    @pytest.fixture
    def anyio_backend(self) -> str:
        return "asyncio"

    def setup_mailbox(self) -> None:
        """Create the test's mailbox under ``self.where`` (an empty inbox)."""

    def teardown_mailbox(self) -> None:
        """Release what ``setup_mailbox`` opened."""

    def build(
        self, *, channel: str | None = None, markers: tuple[MarkerKind, ...] | None = None
    ) -> MailProvider:
        """A channel to the test's mailbox (another instance each call, the same mailbox);
        ``markers`` narrows the markers it sets to those, in that order. Its page size is
        small enough for a test to page (a handful)."""
        raise NotImplementedError

    def deliver(self, raw: bytes) -> None:
        """Deliver RFC 822 bytes into the mailbox's inbox, as its mail system would."""
        raise NotImplementedError

    def flip(self, fault: Fault) -> None:
        """Make the mailbox (or the channels built from now on) produce ``fault``."""
        raise NotImplementedError

    def advance(self, delta: timedelta) -> None:
        """Let ``delta`` pass for the mailbox (a fake's clock moves; a real one may wait)."""
        raise NotImplementedError

    def snapshot(self) -> Mapping[str, str]:
        """Everything the mailbox holds - each message, its flags, labels and keywords, and
        each folder - as keys and digests: where two snapshots differ, something changed."""
        raise NotImplementedError

    def sent_copies(self, message_id: str) -> int:
        """How many messages carrying our Message-ID ``message_id`` the mailbox's mail system
        took for sending through any of its channels, counted where the test can see them
        (its sent copies; a send through a channel that keeps no searchable copy counts
        too). A suite that proves a send went out exactly once asks it."""
        raise NotImplementedError

    def context_path(self) -> str | None:
        """The mailbox's ``path`` as a Workspace Context binding it names it (a Maildir's
        directory); None for a mailbox reached without one."""
        return None

    def context_fields(self) -> str:
        """More fields of the mailbox's Workspace Context binding, as YAML flow mapping
        entries (``server: {...}`` for a mailbox reached over IMAP); empty when none."""
        return ""

    def needs(self, fault: Fault) -> None:
        """Skip the test, saying why, when the adapter declared it cannot produce ``fault``."""
        if fault not in self.faults:
            pytest.skip(f"{type(self).__name__} cannot produce {fault}: {self.cannot[fault]}")

    async def parent(
        self, provider: MailProvider, attachments: Sequence[tuple[str, str, bytes]] = ()
    ) -> Envelope:
        """Deliver the client's message 1 and read it back through ``provider``."""
        self.deliver(raw_message(1, attachments=attachments))
        items, _ = await read_all(provider)
        [envelope] = envelopes(items)
        return envelope

    async def copy_of(self, provider: MailProvider, marker: Marker) -> StoredCopy | None:
        """The sent copy ``marker`` finds once the channel's declared latency has passed."""
        copy = await provider.find_sent(marker)
        latency = provider.capabilities.sent_copy_latency
        if copy is None and latency > timedelta(0):
            self.advance(latency)
            copy = await provider.find_sent(marker)
        return copy


def is_copy_of(copy: StoredCopy, result: SendResult) -> bool:
    """The stored copy is the sent message: the provider id the send returned, or - where
    the mail system files the copy after the send and the channel cannot know its id then
    (a submission server's own sent copy) - the same Message-ID."""
    return copy.provider_message_id == result.provider_message_id or (
        copy.internet_message_id == result.internet_message_id
    )


async def sent(provider: MailProvider, message: OutgoingMessage) -> tuple[Handover, SendResult]:
    handover = await provider.prepare(message)
    return handover, await provider.send(handover)


class MailProviderContract(MailboxHooks):
    """The MailProvider port's contract: reading changes, fetching by reference, preparing
    and sending, finding our sent copies by their markers, and changing nothing else."""

    @pytest.mark.anyio
    async def test_the_faults_it_cannot_produce_agree_with_its_capabilities(self) -> None:
        """What an adapter says it cannot do is checked against what it declares and does:
        no late copy means a copy searchable at once; no dropped Message-ID means it is a
        marker; no missing copy means one is kept. (The tests that need those faults do not
        run on it; this one stands in for them.)"""
        provider = self.build()
        caps = provider.capabilities
        if Fault.DROPPED_MESSAGE_ID in self.cannot:
            assert MarkerKind.MESSAGE_ID in caps.markers
        if Fault.NO_SENT_COPY in self.cannot:
            assert caps.keeps_sent_copy
        if Fault.LATE_SENT_COPY in self.cannot and caps.keeps_sent_copy:
            assert caps.sent_copy_latency == timedelta(0)
            message = reply(await self.parent(provider), caps)
            handover, result = await sent(provider, message)
            assert handover.marker is not None
            found = await provider.find_sent(handover.marker)  # at once: nothing advanced
            assert found is not None and is_copy_of(found, result)

    def test_every_fault_is_declared_producible_or_impossible_with_a_reason(self) -> None:
        assert not self.faults & set(self.cannot)
        assert self.faults | set(self.cannot) == set(Fault)
        assert all(reason.strip() for reason in self.cannot.values())

    def test_it_is_a_mail_provider_naming_its_mail_system_and_lowercased_mailbox(self) -> None:
        provider = self.build()
        assert isinstance(provider, MailProvider)
        # The mail system is not a way of reaching it; only a standards server is named
        # after the protocol it is reached by.
        assert provider.provider
        assert provider.provider not in {c.value for c in Channel} - {Channel.IMAP.value}
        assert provider.mailbox_id == MAILBOX.lower()
        capabilities = provider.capabilities
        assert capabilities.markers or not capabilities.keeps_sent_copy
        assert len(set(capabilities.markers)) == len(capabilities.markers)

    @pytest.mark.anyio
    async def test_an_empty_mailbox_has_no_changes(self) -> None:
        provider = self.build()
        page = await provider.changes(None)
        assert (page.items, page.more) == ((), False)
        again = await provider.changes(page.cursor)
        assert (again.items, again.more) == ((), False)

    @pytest.mark.anyio
    async def test_changes_page_through_the_inbox_and_see_mail_delivered_while_paging_once(
        self,
    ) -> None:
        provider = self.build()
        size = provider.capabilities.page_size
        assert size <= 10, "the tests' adapter pages by a handful"
        for n in range(size + 1):
            self.deliver(raw_message(n))
        first = await provider.changes(None)
        assert len(first.items) == size and first.more
        self.deliver(raw_message(100))  # arrives while the reader pages
        rest, cursor = await read_all(provider, first.cursor)
        seen = ids([*first.items, *rest])
        assert sorted(seen, key=str) == sorted(
            [f"<c{n}@contoso.test>" for n in (*range(size + 1), 100)], key=str
        )
        self.deliver(raw_message(101))
        later, cursor = await read_all(provider, cursor)
        assert ids(later) == ["<c101@contoso.test>"]
        assert ids((await read_all(provider, cursor))[0]) == []
        self.deliver(raw_message(102))  # the next run: another instance, the saved cursor
        next_run, _ = await read_all(self.build(), cursor)
        assert ids(next_run) == ["<c102@contoso.test>"]

    @pytest.mark.anyio
    async def test_a_cursor_that_is_not_one_of_the_channel_s_expires(self) -> None:
        provider = self.build()
        self.deliver(raw_message(1))
        for cursor in ("not-a-cursor", "", "x" * 300):
            with pytest.raises(CursorExpired):
                await provider.changes(cursor)

    @pytest.mark.anyio
    async def test_an_expired_cursor_raises_and_a_read_from_the_start_resyncs_in_full(
        self,
    ) -> None:
        self.needs(Fault.EXPIRED_CURSOR)
        provider = self.build()
        for n in range(3):
            self.deliver(raw_message(n))
        before, cursor = await read_all(provider)
        self.flip(Fault.EXPIRED_CURSOR)
        with pytest.raises(CursorExpired):
            await provider.changes(cursor)
        after, _ = await read_all(self.build())
        keys = [occurrence_key("ws", e) for e in envelopes(after)]
        assert sorted(keys) == sorted(occurrence_key("ws", e) for e in envelopes(before))
        assert len(set(keys)) == 3

    @pytest.mark.anyio
    async def test_the_same_message_delivered_twice_is_two_items_of_one_occurrence(
        self,
    ) -> None:
        provider = self.build()
        self.deliver(raw_message(1))
        self.deliver(raw_message(1))
        first, second = envelopes((await read_all(provider))[0])
        assert first.provider_message_id != second.provider_message_id
        assert first.internet_message_id == second.internet_message_id == "<c1@contoso.test>"
        assert (first.sender, first.sent_at) == (second.sender, second.sent_at)
        assert first.content_digest == second.content_digest
        assert occurrence_key("ws", first) == occurrence_key("ws", second)

    @pytest.mark.anyio
    async def test_an_item_carries_the_fields_every_channel_gives_and_its_body(self) -> None:
        provider = self.build()
        envelope = await self.parent(provider)
        assert (envelope.provider, envelope.mailbox_id) == (provider.provider, MAILBOX.lower())
        assert envelope.internet_message_id == "<c1@contoso.test>"
        assert envelope.sender == Address(address=CLIENT, name="Dana Levi")
        assert envelope.sent_at is not None and envelope.sent_at.isoformat().startswith(
            "2026-11-02T10:00:00"
        )
        assert envelope.received_at.tzinfo is not None
        assert envelope.provider_message_id and envelope.provider_thread_id
        assert envelope.content_digest
        body = await provider.fetch_body(envelope.body_ref)
        assert body.text.strip() == "Please send the invoice."

    @pytest.mark.anyio
    async def test_an_unknown_body_or_attachment_reference_is_not_found(self) -> None:
        provider = self.build()
        envelope = await self.parent(provider)
        with pytest.raises(NotFound):
            await provider.fetch_body(envelope.body_ref + "-gone")
        with pytest.raises(NotFound):
            await provider.fetch_attachment(envelope.provider_message_id + "/0")

    @pytest.mark.anyio
    async def test_a_reply_is_prepared_in_the_parent_s_thread_to_exactly_its_recipients(
        self,
    ) -> None:
        provider = self.build()
        parent = await self.parent(provider)
        message = reply(parent, provider.capabilities)
        handover = await provider.prepare(message)
        assert handover.message == message
        assert check_handover(handover) == ()
        assert handover.channel == provider.capabilities.channel.value
        if handover.mime is not None:
            parsed = rfc822.parse(handover.mime)
            assert rfc822.header_ids(parsed, "In-Reply-To") == ("<c1@contoso.test>",)
            assert rfc822.header_ids(parsed, "References") == ("<c1@contoso.test>",)
        capabilities = provider.capabilities
        if capabilities.keeps_sent_copy or capabilities.files_sent_copy:
            assert handover.marker is not None
            assert handover.marker.kind is capabilities.markers[0]
        else:
            assert handover.marker is None

    @pytest.mark.anyio
    async def test_a_message_that_cannot_be_written_as_planned_is_refused_by_prepare(
        self,
    ) -> None:
        provider = self.build()
        parent = await self.parent(provider)
        odd = reply(parent, provider.capabilities).model_copy(
            update={"to": (Address(address="a@b>, m@evil.test"),)}
        )
        with pytest.raises(ProviderError):
            await provider.prepare(odd)

    @pytest.mark.anyio
    async def test_attachments_come_by_reference_and_fetch_gives_their_bytes_and_digest(
        self,
    ) -> None:
        provider = self.build()
        envelope = await self.parent(provider, attachments=FILES)
        assert envelope.attachment_names == ("invoice.pdf", "lines.csv")
        assert len(envelope.attachment_refs) == 2
        shown = envelope.model_dump_json()
        assert "AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8g" not in shown  # no base64 bytes
        for ref, (name, kind, data) in zip(envelope.attachment_refs, FILES, strict=True):
            fetched = await provider.fetch_attachment(ref)
            assert fetched.data == data
            assert fetched.ref.ref == ref
            assert (fetched.ref.name, fetched.ref.content_type) == (name, kind)
            assert fetched.ref.size == len(data)
            assert fetched.ref.sha256 == hashlib.sha256(data).hexdigest()

    @pytest.mark.anyio
    async def test_each_declared_marker_finds_exactly_its_own_copy(self) -> None:
        parent = await self.parent(self.build())
        for n, kind in enumerate(self.build().capabilities.markers):
            provider = self.build(markers=(kind,))
            assert provider.capabilities.markers == (kind,)
            ours = reply(parent, provider.capabilities, f"<ours-{n}@fabrikam.test>")
            other = reply(parent, provider.capabilities, f"<other-{n}@fabrikam.test>")
            handover, result = await sent(provider, ours)
            other_handover, other_result = await sent(provider, other)
            assert handover.marker is not None and handover.marker.kind is kind
            assert other_handover.marker is not None
            assert handover.marker.value != other_handover.marker.value
            found = await self.copy_of(provider, handover.marker)
            assert found is not None
            assert is_copy_of(found, result)
            found_other = await self.copy_of(provider, other_handover.marker)
            assert found_other is not None
            assert is_copy_of(found_other, other_result)
            never = "<never-sent@fabrikam.test>"
            value = never if kind is MarkerKind.MESSAGE_ID else mime.send_token(never)
            assert await provider.find_sent(Marker(kind=kind, value=value)) is None

    @pytest.mark.anyio
    async def test_each_declared_marker_s_handover_passes_the_handover_check(self) -> None:
        parent = await self.parent(self.build())
        for kind in self.build().capabilities.markers:
            provider = self.build(markers=(kind,))
            handover = await provider.prepare(reply(parent, provider.capabilities))
            assert handover.marker is not None and handover.marker.kind is kind
            assert check_handover(handover) == (), kind
            if kind is MarkerKind.HEADER and handover.mime is not None:
                parsed = rfc822.parse(handover.mime)
                assert parsed.raw_values(mime.MARKER_HEADER) == [handover.marker.value]

    @pytest.mark.anyio
    async def test_find_sent_refuses_a_marker_kind_the_channel_does_not_declare(self) -> None:
        provider = self.build()
        for kind in MarkerKind:
            if not provider.capabilities.finds(kind):
                with pytest.raises(Unsupported):
                    await provider.find_sent(Marker(kind=kind, value="outloop-x"))

    @pytest.mark.anyio
    async def test_a_marker_kind_it_only_searches_finds_no_copy_that_is_not_there(
        self,
    ) -> None:
        """A kind another channel of the mailbox sets (``searches``) is searched here: a
        copy that was never sent is not found."""
        provider = self.build()
        for kind in provider.capabilities.searches:
            assert kind not in provider.capabilities.markers
            value = "<never-sent@fabrikam.test>" if kind is MarkerKind.MESSAGE_ID else "x"
            assert await provider.find_sent(Marker(kind=kind, value=value)) is None

    @pytest.mark.anyio
    async def test_a_lost_acknowledgement_leaves_a_copy_its_marker_finds(self) -> None:
        self.needs(Fault.LOST_ACK)
        provider = self.build()
        message = reply(await self.parent(provider), provider.capabilities)
        handover = await provider.prepare(message)
        self.flip(Fault.LOST_ACK)
        with pytest.raises(OutcomeUnknown):
            await provider.send(handover)
        assert handover.marker is not None
        found = await self.copy_of(provider, handover.marker)
        assert found is not None
        assert found.subject == message.subject
        assert [a.address for a in found.to] == [CLIENT]

    @pytest.mark.anyio
    async def test_a_late_sent_copy_is_absent_at_first_and_found_within_the_latency(
        self,
    ) -> None:
        self.needs(Fault.LATE_SENT_COPY)
        provider = self.build()
        latency = provider.capabilities.sent_copy_latency
        assert latency > timedelta(0), "a channel whose copies may be late declares how late"
        message = reply(await self.parent(provider), provider.capabilities)
        self.flip(Fault.LATE_SENT_COPY)
        handover, result = await sent(provider, message)
        assert handover.marker is not None
        assert await provider.find_sent(handover.marker) is None
        self.advance(latency)
        found = await provider.find_sent(handover.marker)
        assert found is not None and is_copy_of(found, result)

    @pytest.mark.anyio
    async def test_a_sent_message_reads_back_with_its_attachments_names_sizes_and_digests(
        self,
    ) -> None:
        provider = self.build()
        files = [attachment(*f) for f in FILES]
        message = reply(await self.parent(provider), provider.capabilities, files=files)
        handover, result = await sent(provider, message)
        assert handover.marker is not None
        copy = await self.copy_of(provider, handover.marker)
        assert copy is not None
        assert is_copy_of(copy, result)
        assert [(a.name, a.size, a.sha256) for a in copy.attachments] == [
            (f.ref.name, f.ref.size, f.ref.sha256) for f in files
        ]
        assert copy.subject == message.subject
        assert copy.text.strip().splitlines() == message.text.splitlines()
        assert copy.sender is not None and copy.sender.address == MAILBOX.lower()
        assert [a.address for a in copy.to] == [CLIENT]
        assert [a.address for a in copy.cc] == [COLLEAGUE]
        assert (copy.bcc, copy.reply_to, copy.other_address_headers) == ((), (), ())
        assert copy.delivered is provider.capabilities.delivers
        assert result.delivered is provider.capabilities.delivers

    @pytest.mark.anyio
    async def test_reading_and_sending_change_nothing_but_leave_the_sent_copy(self) -> None:
        provider = self.build()
        parent = await self.parent(provider, attachments=FILES)
        self.deliver(raw_message(2, in_reply_to="<c1@contoso.test>"))
        before = dict(self.snapshot())
        items, _ = await read_all(provider)
        for envelope in envelopes(items):
            await provider.fetch_body(envelope.body_ref)
            for ref in envelope.attachment_refs:
                await provider.fetch_attachment(ref)
        await provider.health()
        handover, _ = await sent(provider, reply(parent, provider.capabilities))
        if handover.marker is not None:
            assert await self.copy_of(provider, handover.marker) is not None
        await read_all(provider)
        after = dict(self.snapshot())
        assert {key: after.get(key) for key in before} == before
        assert len(set(after) - set(before)) <= 1, sorted(set(after) - set(before))

    @pytest.mark.anyio
    async def test_a_channel_that_drops_our_message_id_finds_its_copy_by_what_survives(
        self,
    ) -> None:
        self.needs(Fault.DROPPED_MESSAGE_ID)
        self.flip(Fault.DROPPED_MESSAGE_ID)
        provider = self.build()
        capabilities = provider.capabilities
        assert MarkerKind.MESSAGE_ID not in capabilities.markers
        assert capabilities.markers, "another marker survives where the Message-ID does not"
        message = reply(await self.parent(provider), capabilities)
        handover, result = await sent(provider, message)
        assert handover.marker is not None and handover.marker.kind in capabilities.markers
        copy = await self.copy_of(provider, handover.marker)
        assert copy is not None and copy.provider_message_id == result.provider_message_id
        assert copy.internet_message_id != message.internet_message_id

    @pytest.mark.anyio
    async def test_a_channel_that_keeps_no_sent_copy_says_so_and_cannot_search(self) -> None:
        """Without a copy kept by the mail system, nothing settles a lost answer. A channel
        that files its own copy after an accepted send (``files_sent_copy``) still reads
        that copy back by its marker; any other searches nothing."""
        self.needs(Fault.NO_SENT_COPY)
        self.flip(Fault.NO_SENT_COPY)
        provider = self.build()
        capabilities = provider.capabilities
        assert not capabilities.keeps_sent_copy
        message = reply(await self.parent(provider), capabilities)
        handover, result = await sent(provider, message)
        assert result.internet_message_id
        if capabilities.files_sent_copy:
            assert handover.marker is not None and capabilities.markers
            copy = await provider.find_sent(handover.marker)
            assert copy is not None and copy.subject == message.subject
            return
        assert capabilities.markers == () and handover.marker is None
        with pytest.raises(Unsupported):
            await provider.find_sent(Marker(kind=MarkerKind.MESSAGE_ID, value="<x@y.test>"))

    @pytest.mark.anyio
    async def test_every_channel_shows_the_same_messages_and_native_thread_ids(self) -> None:
        if len(self.channels) < 2:
            pytest.skip(f"{type(self).__name__} reaches its mailbox through one channel")
        self.deliver(raw_message(1))
        self.deliver(raw_message(2, in_reply_to="<c1@contoso.test>"))
        seen: dict[str, list[Envelope]] = {}
        for channel in self.channels:
            items, _ = await read_all(self.build(channel=channel))
            seen[channel] = sorted(envelopes(items), key=lambda e: str(e.internet_message_id))
        shown = {
            channel: [(e.internet_message_id, e.sender, e.sent_at) for e in found]
            for channel, found in seen.items()
        }
        assert len({tuple(v) for v in shown.values()}) == 1, shown
        natives = [c for c in self.channels if self.build(channel=c).capabilities.native_threads]
        threads = {c: [e.provider_thread_id for e in seen[c]] for c in natives}
        assert len({tuple(v) for v in threads.values()}) <= 1, threads
        for found in seen.values():
            assert len({e.provider_thread_id for e in found}) == 1  # one conversation

    @pytest.mark.anyio
    async def test_health_is_ok_and_names_the_mailbox(self) -> None:
        provider = self.build()
        health = await provider.health()
        assert health.ok is True and health.detail
        assert (health.provider, health.mailbox_id) == (provider.provider, MAILBOX.lower())

    @pytest.mark.anyio
    async def test_aclose_twice_is_harmless(self) -> None:
        provider = self.build()
        await provider.aclose()
        await provider.aclose()
