"""The Microsoft Graph adapter against the mock Graph API (fixtures/graph.py): the
MailProvider contract, the lifecycle core through it, and what only Graph shows - immutable
ids, createReply's recipients and conversation, throttling, a send answered 503 after it was
stored, stripped x- headers, and a token that expires, is revoked or rotates.

The contract suites run on a mock server of this module's own, reset before each test: the
contract's mailbox is ``support@fabrikam.test`` and the mock writes the sending account's
address as the From of every sent copy, so each test needs an account of exactly that
address, which the session's shared server can hold once. Every other test uses the
session's server with an account of its own."""

from __future__ import annotations

import base64
import json
import uuid
from collections.abc import AsyncIterator, Iterator, Mapping
from datetime import timedelta
from typing import Any, ClassVar

import httpx
import pytest
import stamina

from agent.domain.context import ApiAccess, MailboxBinding
from agent.domain.envelope import Address
from agent.domain.errors import (
    AuthenticationExpired,
    CursorExpired,
    NotHandedOver,
    OutcomeUnknown,
    ProviderError,
    Throttled,
)
from agent.domain.handover import check_handover
from agent.domain.mail import Handover, Marker, MarkerKind, OutgoingMessage
from agent.domain.secrets import Secret
from agent.providers.api_http import ApiClient, oauth_api_client
from agent.providers.msgraph import (
    BASE_URL,
    GraphMailProvider,
    open_graph,
    read_error,
    token_url,
)
from agent.providers.shapes import GraphDraft
from agent.testing.channel_contract import ChannelLifecycleContract
from agent.testing.providers import (
    CLIENT,
    COLLEAGUE,
    DATE,
    FILES,
    MAILBOX,
    Fault,
    MailboxHooks,
    MailProviderContract,
    attachment,
    envelopes,
    ids,
    raw_message,
    read_all,
    reply,
    sent,
)
from fixtures.admin import MockAdmin
from tests.conftest import session_mock
from tests.providers.private_mock import PrivateMock

LATENCY = timedelta(seconds=60)
TOKEN_PATH = "/oauth2/microsoft/common/oauth2/v2.0/token"
RECONNECT = "outloop connect --workspace ws-graph-0001 --mailbox {}"


class GraphAccount:
    """One Microsoft account of a mock server, its OAuth secrets in a vault of its own, and
    the channels built to its mailbox."""

    def __init__(self, admin: MockAdmin, address: str) -> None:
        self.admin = admin
        self.address = address.lower()
        made = admin.account(self.address, provider="microsoft")
        self.vault = {
            "oauth_client_id": made["client_id"],
            "oauth_client_secret": made["client_secret"],
            "oauth_refresh_token": made["refresh_token"],
        }
        self.first_refresh_token = made["refresh_token"]
        self.writes: list[str] = []
        self.drafts: dict[str, list[str]] = {}
        """The drafts prepared for each of our Message-IDs (what a sent copy is known by)."""

    def read(self, name: str) -> Secret:
        return Secret(self.vault[name])

    def write(self, name: str, value: Secret) -> None:
        self.writes.append(name)
        self.vault[name] = value.reveal()

    def access(self) -> ApiAccess:
        return ApiAccess(
            base_url=self.admin.base_url + "/graph/v1.0",
            token_url=self.admin.base_url + TOKEN_PATH,
            timeout_seconds=20,
        )

    def client(self, transport: httpx.AsyncBaseTransport | None = None) -> ApiClient:
        return oauth_api_client(
            self.access(),
            self.address,
            base_url=BASE_URL,
            token_url=token_url("common"),
            read_error=read_error,
            read=self.read,
            write=self.write,
            reconnect=RECONNECT.format(self.address),
            transport=transport,
        )

    def build(
        self,
        *,
        mailbox_id: str | None = None,
        markers: tuple[MarkerKind, ...] | None = None,
        page_size: int = 3,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> GraphMailProvider:
        return _Recording(
            self.drafts,
            self.client(transport),
            mailbox_id or self.address,
            sent_copy_latency=LATENCY,
            page_size=page_size,
            markers=markers,
        )

    def deliver(self, raw: bytes) -> dict[str, Any]:
        return self.admin.deliver(self.address, raw)

    def stored(self, folder: str | None = None) -> list[dict[str, Any]]:
        return self.admin.stored(self.address, folder)

    def snapshot(self) -> dict[str, str]:
        return self.admin.snapshot(self.address)

    def sent_copies(self, message_id: str) -> int:
        """Sends of ours that Graph took: the drafts prepared for ``message_id`` that are
        now copies in Sent Items, or copies still on their way there."""
        drafts = set(self.drafts.get(message_id, []))
        filed = sum(1 for m in self.stored("sent") if m["id"] in drafts)
        pending = self.admin.call("GET", "/_admin/faults")["delayed"]
        return filed + sum(1 for p in pending if p["id"] in drafts)


class _Recording(GraphMailProvider):
    """The adapter, noting the draft each send made for a Message-ID (the tests count sent
    copies by them, the delayed ones too, which the mock lists by id only)."""

    def __init__(self, drafts: dict[str, list[str]], *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._drafts = drafts

    async def _draft_for(self, message: OutgoingMessage, handover: Handover) -> GraphDraft:
        draft = await super()._draft_for(message, handover)
        self._drafts.setdefault(message.internet_message_id, []).append(draft.id)
        return draft


_private = PrivateMock("graph")
private_mock = _private.admin


@pytest.fixture(scope="module", autouse=True)
def _stop_private_mock() -> Iterator[None]:
    yield
    _private.stop()


class OnGraphMock(MailboxHooks):
    """The contract's mailbox as a Microsoft account of this module's mock server."""

    faults: ClassVar[frozenset[Fault]] = frozenset({Fault.LOST_ACK, Fault.LATE_SENT_COPY})
    cannot: ClassVar[Mapping[Fault, str]] = {
        Fault.EXPIRED_CURSOR: "a Graph cursor is a position in the inbox's receivedDateTime "
        "order with the ids read at that second; Graph keeps a message's receivedDateTime for "
        "as long as it exists, and nothing in Graph or the mock invalidates a position in time "
        "(a cursor that is not this channel's is refused as expired: tested)",
        Fault.NO_SENT_COPY: "this channel sends a draft with /send, which files the copy in "
        "Sent Items as Graph documents; it never uses sendMail with saveToSentItems false",
        Fault.DROPPED_MESSAGE_ID: "the draft is given our Message-ID as its internetMessageId, "
        "which Graph lets a draft set (message-update: 'Updatable only if isDraft = true') and "
        "keeps through the send",
    }
    channels: ClassVar[tuple[str, ...]] = ("api",)
    account: GraphAccount
    built: list[GraphMailProvider]

    def setup_mailbox(self) -> None:
        admin = private_mock()
        admin.reset()  # this module's own server: no other test uses it
        self.account = GraphAccount(admin, MAILBOX)
        self.held_for = timedelta(0)

    @pytest.fixture(autouse=True)
    async def _close_channels(self, anyio_backend: str) -> AsyncIterator[None]:
        del anyio_backend
        self.built = []
        yield
        for provider in self.built:
            await provider.aclose()

    def build(
        self, *, channel: str | None = None, markers: tuple[MarkerKind, ...] | None = None
    ) -> GraphMailProvider:
        del channel
        provider = self.account.build(markers=markers)
        self.built.append(provider)
        return provider

    def deliver(self, raw: bytes) -> None:
        self.account.deliver(raw)

    def flip(self, fault: Fault) -> None:
        if fault is Fault.LOST_ACK:
            self.account.admin.faults(drop_send_ack=1)
        elif fault is Fault.LATE_SENT_COPY:
            self.account.admin.faults(delay_sent_copy_seconds=3600)
            self.held_for = timedelta(0)
        else:
            raise AssertionError(f"{fault} is declared impossible")

    def advance(self, delta: timedelta) -> None:
        """Delayed copies show once three quarters of the declared latency passed (the test
        releases them: nothing is waited for)."""
        self.held_for += delta
        if self.held_for >= LATENCY * 3 / 4:
            self.account.admin.faults(release_delayed=True)

    def snapshot(self) -> Mapping[str, str]:
        return self.account.snapshot()

    def sent_copies(self, message_id: str) -> int:
        return self.account.sent_copies(message_id)

    def context_fields(self) -> str:
        access = self.account.access()
        return f"api: {{base_url: '{access.base_url}', token_url: '{access.token_url}'}}"


class TestGraph(OnGraphMock, MailProviderContract): ...


class TestCoreOnGraph(OnGraphMock, ChannelLifecycleContract): ...


# -- what only Graph shows (the session's mock server, an account per test) ----------------


class _Recorder(httpx.AsyncBaseTransport):
    """The real transport, noting each request and answer; ``before`` runs before a request
    is passed on (mail that arrives at that moment)."""

    def __init__(self) -> None:
        self.inner = httpx.AsyncHTTPTransport()
        self.requests: list[httpx.Request] = []
        self.answers: list[tuple[httpx.Request, bytes]] = []
        self.before: list[Any] = []

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        for hook in list(self.before):
            hook(request)
        self.requests.append(request)
        response = await self.inner.handle_async_request(request)
        body = await response.aread()
        self.answers.append((request, body))
        return httpx.Response(
            response.status_code, headers=response.headers, content=body, request=request
        )

    async def aclose(self) -> None:
        await self.inner.aclose()

    def graph(self) -> list[httpx.Request]:
        return [r for r in self.requests if "/graph/" in r.url.path]


def _parent_with_reply_to() -> bytes:
    """The client's message 1, asking for replies to go to another address (createReply
    addresses its draft there)."""
    raw = raw_message(1)
    return raw.replace(b"Subject:", b"Reply-To: billing@contoso.test\nSubject:", 1)


class TestGraphOnly:
    @pytest.fixture(autouse=True)
    def _account(self) -> Iterator[None]:
        self.admin = session_mock()
        self.account = GraphAccount(self.admin, f"support-{uuid.uuid4().hex[:12]}@fabrikam.test")
        self.opened: list[GraphMailProvider] = []
        yield
        self.admin.clear_faults()

    @pytest.fixture(autouse=True)
    async def _close(self, anyio_backend: str) -> AsyncIterator[None]:
        del anyio_backend
        yield
        for provider in self.opened:
            await provider.aclose()

    @pytest.fixture
    def anyio_backend(self) -> str:
        return "asyncio"

    def build(self, **kwargs: Any) -> GraphMailProvider:
        provider = self.account.build(**kwargs)
        self.opened.append(provider)
        return provider

    def ours(self, message: OutgoingMessage) -> OutgoingMessage:
        """``message`` from this test's own mailbox."""
        return message.model_copy(update={"sender": Address(address=self.account.address)})

    def new_message(self, n: int, **fields: Any) -> OutgoingMessage:
        """Our message ``n`` to the client, starting a thread of its own."""
        return OutgoingMessage(
            provider_thread_id="",
            sender=Address(address=self.account.address),
            to=(Address(address=CLIENT, name="Dana Levi"),),
            subject="Your invoice",
            text="Attached.",
            internet_message_id=f"<new-{n}@fabrikam.test>",
            **fields,
        )

    async def parent_and_reply(
        self, provider: GraphMailProvider, raw: bytes | None = None
    ) -> tuple[str, OutgoingMessage]:
        """The client's message delivered and read: its mock id and our reply to it."""
        delivered = self.account.deliver(raw or raw_message(1))
        [parent] = envelopes((await read_all(provider))[0])
        return delivered["thread_id"], self.ours(reply(parent, provider.capabilities))

    # -- reading ---------------------------------------------------------------------------

    @pytest.mark.anyio
    async def test_mail_arriving_between_the_pages_of_one_read_is_read_once(self) -> None:
        recorder = _Recorder()
        provider = self.build(page_size=3, transport=recorder)
        for n in range(5):
            self.account.deliver(raw_message(n))
        first = await provider.changes(None)
        assert len(first.items) == 3 and first.more
        arrived: list[int] = []

        def arrive(request: httpx.Request) -> None:
            # The next page of a listing that began with messages read before: mail arrives
            # between the two pages.
            if "$skip" in request.url.params and not arrived:
                arrived.extend((10, 11))
                for n in arrived:
                    self.account.deliver(raw_message(n))

        recorder.before.append(arrive)
        items, cursor = await read_all(provider, first.cursor)
        recorder.before.clear()
        assert arrived, "a next page was followed"
        assert sorted(map(str, ids([*first.items, *items]))) == sorted(
            f"<c{n}@contoso.test>" for n in (*range(5), *arrived)
        )
        again, _ = await read_all(self.build(page_size=3), cursor)
        assert again == []

    @pytest.mark.anyio
    async def test_messages_sharing_the_boundary_second_are_neither_read_twice_nor_lost(
        self,
    ) -> None:
        for n in range(7):
            self.account.deliver(raw_message(n))  # within a second or two: they share seconds
        seen: list[str | None] = []
        cursors: list[str] = []
        cursor: str | None = None
        for round_ in range(20):
            page = await self.build(page_size=2).changes(cursor)  # a new run each page
            seen += ids(page.items)
            cursor = page.cursor
            cursors.append(cursor)
            if round_ == 1:
                self.account.deliver(raw_message(50))
            if not page.more:
                break
        assert sorted(map(str, seen)) == sorted(f"<c{n}@contoso.test>" for n in (*range(7), 50))
        read_at_boundary = [len(c.split(":")[2].split(",")) for c in cursors]
        assert max(read_at_boundary) > 1, "pages ended inside a second shared by several"

    @pytest.mark.anyio
    async def test_reading_changes_nothing_in_the_mailbox(self) -> None:
        provider = self.build()
        self.account.deliver(raw_message(1, attachments=FILES))
        self.account.deliver(raw_message(2, in_reply_to="<c1@contoso.test>"))
        before = self.account.snapshot()
        for envelope in envelopes((await read_all(provider))[0]):
            await provider.fetch_body(envelope.body_ref)
            for ref in envelope.attachment_refs:
                await provider.fetch_attachment(ref)
        await provider.health()
        assert self.account.snapshot() == before
        assert {m["is_read"] for m in self.account.stored()} == {False}

    @pytest.mark.anyio
    async def test_a_cursor_of_another_channel_or_version_expires(self) -> None:
        provider = self.build()
        for cursor in (
            "imap-v1.1.2.3",
            "graph-v0:-:",
            "graph-v1:20261399T000000Z:",
            "graph-v1:-:0123456789abcdef",
            "graph-v1:20261102T100000Z:XYZ",
        ):
            with pytest.raises(CursorExpired):
                await provider.changes(cursor)

    @pytest.mark.anyio
    async def test_the_envelope_is_the_one_the_mime_gives_with_the_conversation_as_thread(
        self,
    ) -> None:
        provider = self.build()
        delivered = self.account.deliver(raw_message(1))
        self.account.deliver(raw_message(2, in_reply_to="<c1@contoso.test>"))
        first, second = envelopes((await read_all(provider))[0])
        assert first.provider_message_id == delivered["id"]  # the immutable id
        assert first.provider_thread_id == second.provider_thread_id == delivered["thread_id"]
        assert first.sent_at is not None and first.sent_at.isoformat().startswith(
            "2026-11-02T10:00:00"
        )
        assert DATE in base64.b64decode(self.account.stored("inbox")[0]["raw_base64"]).decode()
        assert second.in_reply_to == "<c1@contoso.test>"

    # -- sending ---------------------------------------------------------------------------

    @pytest.mark.anyio
    async def test_every_request_asks_for_immutable_ids_and_the_sent_copy_keeps_the_draft_s(
        self,
    ) -> None:
        recorder = _Recorder()
        provider = self.build(transport=recorder)
        _, message = await self.parent_and_reply(provider)
        handover, result = await sent(provider, message)
        assert recorder.graph()
        assert all(r.headers.get("prefer") == 'IdType="ImmutableId"' for r in recorder.graph())
        assert handover.marker == Marker(
            kind=MarkerKind.MESSAGE_ID, value=message.internet_message_id
        )
        [copy] = self.account.stored("sent")
        assert copy["id"] == result.provider_message_id  # the draft's id, kept in Sent Items
        assert self.account.stored("drafts") == []

    @pytest.mark.anyio
    async def test_createreply_s_own_recipients_are_replaced_by_exactly_the_plan(self) -> None:
        recorder = _Recorder()
        provider = self.build(transport=recorder)
        _, message = await self.parent_and_reply(provider, _parent_with_reply_to())
        handover = await provider.prepare(message)
        assert handover.recipients == (
            ("to", (CLIENT,)),
            ("cc", (COLLEAGUE,)),
            ("bcc", ()),
            ("reply-to", ()),
        )
        assert check_handover(handover) == ()
        await provider.send(handover)
        [(_, made)] = [(r, b) for r, b in recorder.answers if r.url.path.endswith("/createReply")]
        prefilled = [p["emailAddress"]["address"] for p in json.loads(made)["toRecipients"]]
        assert prefilled == ["billing@contoso.test"]  # what createReply addressed it to
        [copy] = self.account.stored("sent")
        headers = {name.lower(): value for name, value in copy["headers"]}
        assert (headers["to"], headers["cc"]) == (CLIENT, COLLEAGUE)
        assert "bcc" not in headers and "reply-to" not in headers

    @pytest.mark.anyio
    async def test_a_reply_lands_in_the_parent_s_conversation_with_its_threading_headers(
        self,
    ) -> None:
        provider = self.build()
        thread, message = await self.parent_and_reply(provider)
        _, result = await sent(provider, message)
        [copy] = self.account.stored("sent")
        headers = {name.lower(): value for name, value in copy["headers"]}
        assert copy["thread_id"] == thread == message.provider_thread_id  # the conversation
        assert result.provider_thread_id == message.provider_thread_id
        assert headers["in-reply-to"] == "<c1@contoso.test>"
        assert headers["references"] == "<c1@contoso.test>"
        # The draft was given our Message-ID, and the sent copy keeps it.
        assert result.internet_message_id == headers["message-id"] == message.internet_message_id

    @pytest.mark.anyio
    async def test_a_reply_to_a_message_not_in_the_mailbox_is_refused_before_a_draft(
        self,
    ) -> None:
        provider = self.build()
        _, message = await self.parent_and_reply(provider)
        elsewhere = message.model_copy(update={"in_reply_to": "<not-here@contoso.test>"})
        with pytest.raises(ProviderError) as refused:
            await provider.prepare(elsewhere)
        assert "<not-here@contoso.test>" in str(refused.value)
        assert self.account.stored("drafts") == []

    @pytest.mark.anyio
    async def test_a_new_message_is_a_draft_of_its_own_sent_with_its_files(self) -> None:
        provider = self.build()
        files = tuple(attachment(*f) for f in FILES)
        message = self.new_message(1, html="<p dir='ltr'>Attached.</p>", attachments=files)
        handover, result = await sent(provider, message)
        assert check_handover(handover) == ()
        assert handover.marker is not None
        copy = await provider.find_sent(handover.marker)
        assert copy is not None and copy.provider_message_id == result.provider_message_id
        assert [(a.name, a.sha256) for a in copy.attachments] == [
            (f.ref.name, f.ref.sha256) for f in files
        ]
        assert copy.html is not None and "<html><head>" in copy.html  # as Exchange keeps it
        assert "Attached." in copy.text

    @pytest.mark.anyio
    async def test_a_draft_whose_lists_are_not_the_checked_ones_is_not_sent(self) -> None:
        provider = self.build()
        _, message = await self.parent_and_reply(provider)
        handover = await provider.prepare(message)
        assert handover.recipients is not None
        other = tuple(
            (name, (*found, "eve@contoso.test") if name == "bcc" else found)
            for name, found in handover.recipients
        )
        with pytest.raises(NotHandedOver, match="recipients are not the ones checked"):
            await provider.send(handover.model_copy(update={"recipients": other}))
        assert self.account.stored("sent") == []

    @pytest.mark.anyio
    async def test_a_send_answered_503_after_it_was_stored_is_found_by_its_marker(
        self,
    ) -> None:
        provider = self.build()
        _, message = await self.parent_and_reply(provider)
        handover = await provider.prepare(message)
        self.admin.faults(drop_send_ack=1)
        with pytest.raises(OutcomeUnknown):
            await provider.send(handover)
        assert handover.marker is not None
        copy = await self.build().find_sent(handover.marker)
        assert copy is not None and copy.subject == message.subject
        with pytest.raises(OutcomeUnknown):  # the same draft is never sent again
            await provider.send(handover)
        assert len(self.account.stored("sent")) == 1

    @pytest.mark.anyio
    async def test_a_copy_stripped_of_x_headers_is_still_found_by_its_id(self) -> None:
        provider = self.build()
        _, message = await self.parent_and_reply(provider)
        self.admin.faults(strip_x_headers=True)
        handover, result = await sent(provider, message)
        assert handover.marker is not None
        copy = await provider.find_sent(handover.marker)
        assert copy is not None and copy.provider_message_id == result.provider_message_id
        unknown = handover.marker.model_copy(update={"value": "AAMkAGnothing"})
        assert await provider.find_sent(unknown) is None

    @pytest.mark.anyio
    async def test_a_send_throttled_before_it_was_taken_is_not_handed_over(self) -> None:
        provider = self.build()
        _, message = await self.parent_and_reply(provider)
        handover = await provider.prepare(message)
        path = "/graph/v1.0/me/messages"  # the send's first request: is a copy of it there?
        self.admin.faults(
            errors=[{"status": 429, "count": 1, "retry_after": 5, "path_prefix": path}]
        )
        with pytest.raises(NotHandedOver) as refused:
            await provider.send(handover)
        assert isinstance(refused.value, Throttled) and refused.value.retry_after == 5
        assert self.account.stored("sent") == []
        await provider.send(handover)  # nothing went out: it goes now, once
        assert len(self.account.stored("sent")) == 1
        assert self.account.stored("drafts") == []

    @pytest.mark.anyio
    async def test_a_file_whose_attaching_failed_is_sent_once_in_a_new_draft(self) -> None:
        provider = self.build()
        message = self.new_message(2, attachments=(attachment(*FILES[0]),))
        handover = await provider.prepare(message)
        files = "/graph/v1.0/me/messages/"  # the draft's own paths: its attachments
        self.admin.faults(errors=[{"status": 503, "count": 1, "path_prefix": files}])
        with pytest.raises(NotHandedOver, match="left unsent"):
            await provider.send(handover)
        assert self.account.stored("sent") == []
        await provider.send(handover)
        [copy] = self.account.stored("sent")
        stored = base64.b64decode(copy["raw_base64"])
        assert stored.count(b'filename="invoice.pdf"') == 1

    # -- throttling and failures -----------------------------------------------------------

    @pytest.mark.anyio
    async def test_a_429_names_its_wait_and_a_retried_read_honours_it_and_a_503(self) -> None:
        provider = self.build()
        self.account.deliver(raw_message(1))
        self.admin.faults(
            errors=[{"status": 429, "count": 1, "retry_after": 7, "path_prefix": "/graph"}]
        )
        with pytest.raises(Throttled) as throttled:
            await provider.changes(None)
        assert throttled.value.retry_after == 7
        stamina.set_testing(True, attempts=3)
        try:
            self.admin.faults(
                errors=[
                    {"status": 429, "count": 1, "retry_after": 1, "path_prefix": "/graph"},
                    {"status": 503, "count": 1, "path_prefix": "/graph"},
                ]
            )
            items, _ = await read_all(provider)
            assert ids(items) == ["<c1@contoso.test>"]
            assert all(e["count"] == 0 for e in self.admin.call("GET", "/_admin/faults")["errors"])
            self.admin.faults(
                errors=[{"status": 429, "count": 1, "retry_after": 3600, "path_prefix": "/graph"}]
            )
            with pytest.raises(Throttled):  # longer than a run waits: it comes back later
                await provider.changes(None)
        finally:
            stamina.set_testing(True)

    @pytest.mark.anyio
    async def test_a_token_that_expires_mid_run_is_refreshed_unseen_and_the_new_refresh_token_kept(
        self,
    ) -> None:
        recorder = _Recorder()
        provider = self.build(transport=recorder)
        self.account.deliver(raw_message(1))
        first, cursor = await read_all(provider)
        assert self.account.writes == ["oauth_refresh_token"]  # Microsoft rotated it
        assert self.account.vault["oauth_refresh_token"] != self.account.first_refresh_token
        self.admin.faults(expire_tokens=True)
        self.account.deliver(raw_message(2))
        later, _ = await read_all(provider, cursor)
        assert ids([*first, *later]) == ["<c1@contoso.test>", "<c2@contoso.test>"]
        refreshes = [r for r in recorder.requests if r.url.path == TOKEN_PATH]
        assert len(refreshes) == 2  # the first token, and one after the expiry

    @pytest.mark.anyio
    async def test_a_revoked_grant_names_outloop_connect_and_never_a_token(self) -> None:
        provider = self.build()
        await provider.health()
        refresh = self.account.vault["oauth_refresh_token"]
        self.admin.faults(revoke_tokens=self.account.address)
        with pytest.raises(AuthenticationExpired) as revoked:
            await provider.changes(None)
        text = f"{revoked.value} {revoked.value!r} {provider!r}"
        assert RECONNECT.format(self.account.address) in str(revoked.value)
        assert refresh not in text and self.account.first_refresh_token not in text
        assert self.account.vault["oauth_client_secret"] not in text
        health = await provider.health()
        assert not health.ok and "outloop connect" in health.detail and refresh not in health.detail

    @pytest.mark.anyio
    async def test_a_next_page_link_to_another_host_is_not_followed(self) -> None:
        asked: list[str] = []

        def answer(request: httpx.Request) -> httpx.Response:
            asked.append(request.url.host)
            if request.url.path.endswith("/token"):
                return httpx.Response(200, json={"access_token": "a", "expires_in": 3600})
            page = {
                "value": [],
                "@odata.nextLink": "https://graph.attacker.test/v1.0/me/messages?$skip=3",
            }
            return httpx.Response(200, json=page)

        provider = self.build(transport=httpx.MockTransport(answer))
        with pytest.raises(ProviderError) as refused:
            await provider.changes(None)
        assert "graph.attacker.test" in str(refused.value)
        assert "graph.attacker.test" not in asked

    @pytest.mark.anyio
    async def test_a_graph_that_does_not_apply_immutable_ids_gets_no_draft_sent(self) -> None:
        sent_posts: list[str] = []

        def answer(request: httpx.Request) -> httpx.Response:
            if request.url.path.endswith("/token"):
                return httpx.Response(200, json={"access_token": "a", "expires_in": 3600})
            if request.method == "GET":
                return httpx.Response(200, json={"value": []})  # no message of ours yet
            if request.url.path.endswith("/send"):
                sent_posts.append(request.url.path)
            draft = {
                "id": "AAMkAGrest",
                "isDraft": True,
                "subject": "Your invoice",
                "toRecipients": [{"emailAddress": {"address": CLIENT}}],
            }
            return httpx.Response(201, json=draft)  # no Preference-Applied

        provider = self.build(transport=httpx.MockTransport(answer))
        handover = await provider.prepare(self.new_message(3))
        with pytest.raises(NotHandedOver) as refused:
            await provider.send(handover)
        assert "immutable ids" in str(refused.value) and sent_posts == []

    @pytest.mark.anyio
    async def test_preparing_writes_nothing_and_a_message_in_sent_items_is_not_sent_again(
        self,
    ) -> None:
        provider = self.build()
        message = self.new_message(4)
        first = await provider.prepare(message)
        again = await provider.prepare(message)
        assert first == again and self.account.stored("drafts") == []
        await provider.send(again)
        with pytest.raises(OutcomeUnknown, match="was sent already"):
            await provider.send(first)
        assert self.account.stored("drafts") == []
        assert len(self.account.stored("sent")) == 1

    @pytest.mark.anyio
    async def test_a_draft_graph_gave_another_message_id_is_not_sent(self) -> None:
        """Its copy could not be found by our Message-ID, so a lost answer would go twice."""
        posted: list[str] = []

        def answer(request: httpx.Request) -> httpx.Response:
            if request.url.path.endswith("/token"):
                return httpx.Response(200, json={"access_token": "a", "expires_in": 3600})
            if request.method == "GET":
                return httpx.Response(200, json={"value": []})
            posted.append(request.url.path)
            draft = {
                "id": "AAMkAGdraft",
                "isDraft": True,
                "subject": "Your invoice",
                "internetMessageId": "<EXCHANGE-OWN@mock.prod.outlook.com>",
                "toRecipients": [{"emailAddress": {"address": CLIENT}}],
            }
            headers = {"Preference-Applied": 'IdType="ImmutableId"'}
            return httpx.Response(201, json=draft, headers=headers)

        provider = self.build(transport=httpx.MockTransport(answer))
        handover = await provider.prepare(self.new_message(5))
        with pytest.raises(NotHandedOver, match="gave it the Message-ID"):
            await provider.send(handover)
        assert not any(path.endswith("/send") for path in posted)

    # -- composition -----------------------------------------------------------------------

    @pytest.mark.anyio
    async def test_open_graph_reads_the_binding_s_endpoints_user_and_latency(self) -> None:
        recorder = _Recorder()
        access = self.account.access().model_copy(
            update={"user": self.account.address, "sent_copy_latency_seconds": 45}
        )
        binding = MailboxBinding(
            mailbox_id=self.account.address.upper(), provider="microsoft", api=access
        )
        provider = open_graph(
            binding,
            read=self.account.read,
            write=self.account.write,
            reconnect="outloop connect",
            transport=recorder,
        )
        self.opened.append(provider)
        assert provider.mailbox_id == self.account.address
        assert provider.capabilities.sent_copy_latency == timedelta(seconds=45)
        health = await provider.health()
        assert health.ok and self.account.address in health.detail
        assert recorder.graph()[0].url.path == f"/graph/v1.0/users/{self.account.address}"
        assert token_url("fabrikam.com") == (
            "https://login.microsoftonline.com/fabrikam.com/oauth2/v2.0/token"
        )
