"""The Gmail API adapter against the local mock Gmail API (fixtures/gmail.py, docs/fixtures.md):
the MailProvider contract, the lifecycle core through it, and what only Gmail's API shows -
history ids that expire, Message-IDs Gmail rewrites, threads joined by threadId, 429s with
Retry-After, access tokens that expire or are revoked.

Each test reads an account of its own on the session's mock server (a unique address); the
mailbox it works is always ``MAILBOX``. Fault switches are the server's, so each test clears
the ones it set."""

from __future__ import annotations

import base64
import hashlib
import json
import logging
import time
from collections.abc import AsyncIterator, Iterator, Mapping
from datetime import timedelta
from typing import Any, ClassVar

import anyio.lowlevel
import httpx
import pytest
import stamina

from agent.domain.context import ApiAccess, MailboxBinding
from agent.domain.envelope import Envelope
from agent.domain.errors import (
    AuthenticationExpired,
    CursorExpired,
    NotHandedOver,
    OutcomeUnknown,
    ProviderError,
    Throttled,
)
from agent.domain.execution import ClaimOutcome
from agent.domain.mail import Marker, MarkerKind
from agent.domain.secrets import Secret
from agent.providers import gmail_api, mime
from agent.providers.api_http import oauth_api_client
from agent.providers.gmail_api import MARKERS, GmailApiProvider, open_gmail, read_error
from agent.testing.channel_contract import ChannelLifecycleContract
from agent.testing.providers import (
    FILES,
    MAILBOX,
    Fault,
    MailboxHooks,
    MailProviderContract,
    envelopes,
    ids,
    is_copy_of,
    raw_message,
    read_all,
    reply,
    sent,
)
from fixtures.app import build_app
from fixtures.mailstore import MailStore, Stored
from tests.providers.private_mock import PrivateMock

LATENCY = timedelta(seconds=120)
HELD = LATENCY * 3 / 4
"""How long the mock holds a sent copy back once a test makes copies late."""
RECONNECT = "outloop connect --workspace ws-channels-0001 --mailbox support@fabrikam.test"
SECRET_NAMES = {
    "oauth_client_id": "client_id",
    "oauth_client_secret": "client_secret",
    "oauth_refresh_token": "refresh_token",
}


_private = PrivateMock("gmail")


@pytest.fixture(scope="module", autouse=True)
def _stop_private_mock() -> Iterator[None]:
    yield
    _private.stop()


class OnGmailMock(MailboxHooks):
    """An account of the session's mock Gmail API, read and sent through the adapter."""

    faults: ClassVar[frozenset[Fault]] = frozenset(
        {
            Fault.LOST_ACK,
            Fault.LATE_SENT_COPY,
            Fault.EXPIRED_CURSOR,
            Fault.DROPPED_MESSAGE_ID,
        }
    )
    cannot: ClassVar[Mapping[Fault, str]] = {
        Fault.NO_SENT_COPY: "Gmail files a copy of every message users.messages.send takes, "
        "labelled SENT, as part of sending: no Gmail API channel keeps none",
    }
    channels: ClassVar[tuple[str, ...]] = ("api",)

    def setup_mailbox(self) -> None:
        # The contract's mailbox is the account itself (its health names who signed in), on
        # this module's own server, reset for each test.
        self.admin = _private.admin()
        self.admin.reset()
        self.address = MAILBOX.lower()
        account = self.admin.account(self.address, "google")
        self.secrets = {name: str(account[key]) for name, key in SECRET_NAMES.items()}
        self.markers = MARKERS
        self.held_for = timedelta(0)

    def teardown_mailbox(self) -> None:
        self.admin.clear_faults()

    @pytest.fixture(autouse=True)
    async def _close_channels(self, anyio_backend: str) -> AsyncIterator[None]:
        """Every channel a test built closes its connections when the test ends."""
        del anyio_backend
        self.built: list[GmailApiProvider] = []
        yield
        for provider in self.built:
            await provider.aclose()

    def access(self, **fields: Any) -> ApiAccess:
        fields.setdefault("sent_copy_latency_seconds", int(LATENCY.total_seconds()))
        return ApiAccess(
            base_url=self.admin.base_url + "/gmail/v1",
            token_url=self.admin.base_url + "/oauth2/google/token",
            **fields,
        )

    def channel(
        self,
        *,
        markers: tuple[MarkerKind, ...] | None = None,
        page_size: int = 3,
        sent_scan: int = gmail_api.SENT_SCAN,
    ) -> GmailApiProvider:
        api = oauth_api_client(
            self.access(),
            MAILBOX.lower(),
            base_url=gmail_api.BASE_URL,
            token_url=gmail_api.TOKEN_URL,
            read_error=read_error,
            read=lambda name: Secret(self.secrets[name]),
            write=lambda name, value: self.secrets.__setitem__(name, value.reveal()),
            reconnect=RECONNECT,
        )
        provider = GmailApiProvider(
            api,
            MAILBOX,
            sent_copy_latency=LATENCY,
            page_size=page_size,
            markers=markers or self.markers,
            sent_scan=sent_scan,
        )
        self.built.append(provider)
        return provider

    def build(
        self, *, channel: str | None = None, markers: tuple[MarkerKind, ...] | None = None
    ) -> GmailApiProvider:
        del channel
        return self.channel(markers=markers)

    def deliver(self, raw: bytes) -> None:
        self.admin.deliver(self.address, raw)

    def flip(self, fault: Fault) -> None:
        if fault is Fault.LOST_ACK:
            self.admin.faults(drop_send_ack=1)
        elif fault is Fault.LATE_SENT_COPY:
            self.admin.faults(delay_sent_copy_seconds=HELD.total_seconds())
            self.held_for = timedelta(0)
        elif fault is Fault.EXPIRED_CURSOR:
            self.save_draft()  # Gmail forgets history of a mailbox that changed since
            self.admin.faults(expire_history=self.address)
        elif fault is Fault.DROPPED_MESSAGE_ID:
            self.admin.faults(rewrite_message_id=True)
            self.markers = (MarkerKind.HEADER,)
        else:
            raise AssertionError(f"{fault} is declared impossible")

    def save_draft(self) -> None:
        """A draft saved in the mailbox by another client (no inbox or sent message): the
        mailbox's history moves on past every cursor given out, as real use moves it."""
        base = self.admin.base_url
        with httpx.Client(timeout=30) as client:
            token = client.post(
                base + "/oauth2/google/token",
                data={
                    "grant_type": "refresh_token",
                    **{k.removeprefix("oauth_"): v for k, v in self.secrets.items()},
                },
            ).json()["access_token"]
            raw = b"To: someone@contoso.test\r\nSubject: a draft\r\n\r\nnot sent\r\n"
            client.post(
                base + "/gmail/v1/users/me/drafts",
                json={"message": {"raw": base64.urlsafe_b64encode(raw).decode()}},
                headers={"Authorization": f"Bearer {token}"},
            ).raise_for_status()

    def advance(self, delta: timedelta) -> None:
        """Held copies show once they were held for ``HELD`` (the test releases them:
        nothing is waited for)."""
        self.held_for += delta
        if self.held_for >= HELD:
            self.admin.faults(release_delayed=True)

    def stored(self, folder: str | None = None) -> list[dict[str, Any]]:
        return self.admin.stored(self.address, folder)

    def snapshot(self) -> Mapping[str, str]:
        return {
            f"{m['folder']}/{m['id']}": hashlib.sha256(
                json.dumps(m, sort_keys=True).encode()
            ).hexdigest()
            for m in self.stored()
        }

    def sent_copies(self, message_id: str) -> int:
        """Sent copies carrying the Message-ID or its send token, and the copies the mock
        still holds back for this account (a held copy cannot be read before its time)."""
        token = mime.send_token(message_id)
        marks = {("message-id", message_id), (mime.MARKER_HEADER.lower(), token)}
        shown = sum(
            1
            for m in self.stored("sent")
            if any((k.lower(), v.strip()) in marks for k, v in m["headers"])
        )
        delayed = self.admin.call("GET", "/_admin/faults")["delayed"]
        return shown + sum(1 for d in delayed if d["account"] == self.address)

    def context_fields(self) -> str:
        access = self.access()
        return f"api: {{base_url: '{access.base_url}', token_url: '{access.token_url}'}}"


class TestGmailApi(OnGmailMock, MailProviderContract): ...


class TestCoreOnGmailApi(OnGmailMock, ChannelLifecycleContract):
    @pytest.mark.anyio
    async def test_a_history_id_gmail_no_longer_keeps_resyncs_and_records_nothing_twice(
        self,
    ) -> None:
        for n in (1, 2, 3):
            self.deliver(raw_message(n))
        first = self.by_message(await self.cycle(self.first))
        assert {o.claim for o in first.values()} == {ClaimOutcome.CLAIMED}
        _, cursor = await read_all(self.build())
        self.flip(Fault.EXPIRED_CURSOR)
        with pytest.raises(CursorExpired):
            await self.build().changes(cursor)
        self.deliver(raw_message(4))
        again = self.by_message(await self.cycle(self.first))
        assert again["<c4@contoso.test>"].claim is ClaimOutcome.CLAIMED
        for n in (1, 2, 3):
            assert again[f"<c{n}@contoso.test>"].claim is ClaimOutcome.EXECUTION_ALREADY_DONE
        assert len(self.core_store.list_executions()) == 4
        assert len(self.tasks()) == 4


# -- what only Gmail's API shows -----------------------------------------------------------


class TestGmailApiAdapter(OnGmailMock):
    @pytest.mark.anyio
    async def test_mail_arriving_while_the_history_is_paged_is_read_once(self) -> None:
        provider = self.channel()
        _, cursor = await read_all(provider)
        for n in range(5):
            self.deliver(raw_message(n))
        first = await provider.changes(cursor)
        assert len(first.items) == 3 and first.more
        self.deliver(raw_message(50))
        self.deliver(raw_message(51))
        rest, cursor = await read_all(provider, first.cursor)
        seen = ids([*first.items, *rest])
        assert sorted(map(str, seen)) == sorted(
            f"<c{n}@contoso.test>" for n in (0, 1, 2, 3, 4, 50, 51)
        )
        assert (await read_all(self.channel(), cursor))[0] == []

    @pytest.mark.anyio
    async def test_mail_arriving_while_the_inbox_is_listed_is_read_once_by_the_history_after(
        self,
    ) -> None:
        provider = self.channel()
        for n in range(7):
            self.deliver(raw_message(n))
        pages = [await provider.changes(None)]
        while pages[-1].more:
            self.deliver(raw_message(100 + len(pages)))  # after every page
            pages.append(await provider.changes(pages[-1].cursor))
            assert len(pages) < 20
        seen = sorted(map(str, ids([i for p in pages for i in p.items])))
        arrived = [f"<c{100 + n}@contoso.test>" for n in range(1, len(pages))]
        assert seen == sorted([*(f"<c{n}@contoso.test>" for n in range(7)), *arrived])

    @pytest.mark.anyio
    async def test_a_5xx_is_tried_again_and_a_429_waits_the_retry_after_gmail_names(
        self,
    ) -> None:
        for n in range(4):
            self.deliver(raw_message(n))
        provider = self.channel()
        await provider.health()  # signed in: the token endpoint is not what is tested
        messages = "/gmail/v1/users/me/messages/"
        self.admin.faults(errors=[{"status": 503, "count": 2, "path_prefix": messages}])
        with stamina.set_testing(True, attempts=3):
            items, _ = await read_all(provider)
        assert len(items) == 4
        assert self.admin.call("GET", "/_admin/faults")["errors"][0]["count"] == 0

        profile = "/gmail/v1/users/me/profile"
        self.admin.faults(errors=[{"status": 429, "count": 1, "retry_after": 7, "path_prefix": profile}])  # fmt: skip
        with pytest.raises(Throttled) as throttled:  # one attempt: the wait is reported
            await provider.changes(None)
        assert throttled.value.retry_after == 7
        self.admin.faults(errors=[{"status": 429, "count": 1, "retry_after": 1, "path_prefix": profile}])  # fmt: skip
        started = time.monotonic()
        with stamina.set_testing(False):  # real waits: the one Gmail named
            page = await provider.changes(None)
        waited = time.monotonic() - started
        assert 1.0 <= waited < 10, waited
        assert page.items

    def test_google_s_error_body_is_read_and_a_rate_limit_reason_is_a_throttle(self) -> None:
        body = {
            "error": {
                "code": 403,
                "message": "User-rate limit exceeded.",
                "errors": [{"domain": "usageLimits", "reason": "userRateLimitExceeded"}],
                "status": "PERMISSION_DENIED",
            }
        }
        limited = read_error(httpx.Response(403, json=body))
        assert (limited.message, limited.reason, limited.rate_limited) == (
            "User-rate limit exceeded.",
            "userRateLimitExceeded",
            True,
        )
        body["error"]["errors"] = [{"message": "x", "reason": "insufficientPermissions"}]
        assert not read_error(httpx.Response(403, json=body)).rate_limited
        garbled = read_error(httpx.Response(502, text="<html>bad gateway</html>"))
        assert garbled.message == "HTTP 502 Bad Gateway" and not garbled.rate_limited

    @pytest.mark.anyio
    async def test_a_send_answered_500_is_uncertain_and_its_copy_is_found_by_its_marker(
        self,
    ) -> None:
        provider = self.channel()
        parent = await self.parent(provider)
        message = reply(parent, provider.capabilities)
        handover = await provider.prepare(message)
        assert handover.marker is not None and handover.marker.kind is MarkerKind.HEADER
        self.admin.faults(drop_send_ack=1)
        with pytest.raises(OutcomeUnknown):
            await provider.send(handover)
        [stored] = self.stored("sent")  # taken once, never sent again
        copy = await provider.find_sent(handover.marker)
        assert copy is not None and copy.provider_message_id == stored["id"]
        assert copy.internet_message_id == message.internet_message_id
        assert copy.html is None and copy.text.strip() == "We are on it."

    @pytest.mark.anyio
    async def test_a_message_id_gmail_rewrote_is_found_by_the_header_marker_only(self) -> None:
        provider = self.channel()
        message = reply(await self.parent(provider), provider.capabilities)
        self.admin.faults(rewrite_message_id=True)
        handover, result = await sent(provider, message)
        assert handover.marker is not None
        copy = await provider.find_sent(handover.marker)
        assert copy is not None and is_copy_of(copy, result)
        assert copy.internet_message_id is not None
        assert copy.internet_message_id.endswith("@mail.gmail.com>")
        by_message_id = self.channel(markers=(MarkerKind.MESSAGE_ID,))
        ours = Marker(kind=MarkerKind.MESSAGE_ID, value=message.internet_message_id)
        assert await by_message_id.find_sent(ours) is None

    @pytest.mark.anyio
    async def test_a_header_search_past_its_bound_says_the_copy_cannot_be_proven_absent(
        self,
    ) -> None:
        provider = self.channel(sent_scan=2)
        parent = await self.parent(provider)
        handovers = [
            (await sent(provider, reply(parent, provider.capabilities, f"<r{n}@fabrikam.test>")))[0]
            for n in range(3)
        ]
        newest = handovers[-1].marker
        assert newest is not None
        assert await provider.find_sent(newest) is not None
        never = Marker(kind=MarkerKind.HEADER, value=mime.send_token("<never@fabrikam.test>"))
        with pytest.raises(ProviderError, match="neither found nor proven absent"):
            await provider.find_sent(never)
        assert await self.channel().find_sent(never) is None  # the whole sent mail: absent

    @pytest.mark.anyio
    async def test_reading_fetching_and_searching_change_no_label_and_mark_nothing_read(
        self,
    ) -> None:
        provider = self.channel()
        self.deliver(raw_message(1, attachments=FILES))
        self.deliver(raw_message(2, in_reply_to="<c1@contoso.test>"))
        before = dict(self.snapshot())
        items, _ = await read_all(provider)
        for envelope in envelopes(items):
            await provider.fetch_body(envelope.body_ref)
            for ref in envelope.attachment_refs:
                await provider.fetch_attachment(ref)
        never = Marker(kind=MarkerKind.HEADER, value=mime.send_token("<never@fabrikam.test>"))
        assert await provider.find_sent(never) is None
        assert (await provider.health()).ok
        assert dict(self.snapshot()) == before
        assert all("UNREAD" in m["labels"] and not m["is_read"] for m in self.stored())

    @pytest.mark.anyio
    async def test_a_reply_lands_in_the_parent_s_gmail_thread_and_a_new_message_in_its_own(
        self,
    ) -> None:
        provider = self.channel()
        delivered = self.admin.deliver(self.address, raw_message(1))
        parent = await self.parent_read(provider)
        assert parent.provider_thread_id == delivered["thread_id"]
        # The core names the thread by its own alias; Gmail's threadId is looked up.
        message = reply(parent, provider.capabilities).model_copy(
            update={"provider_thread_id": "mt-0123456789abcdef0123"}
        )
        _, result = await sent(provider, message)
        [copy] = self.stored("sent")
        assert copy["id"] == result.provider_message_id
        assert copy["thread_id"] == delivered["thread_id"]
        assert result.provider_thread_id == "mt-0123456789abcdef0123"
        fresh = message.model_copy(
            update={
                "provider_thread_id": "",
                "in_reply_to": None,
                "references": (),
                "subject": "A new matter",
                "internet_message_id": "<new-1@fabrikam.test>",
            }
        )
        _, started = await sent(provider, fresh)
        [new] = [m for m in self.stored("sent") if m["id"] == started.provider_message_id]
        assert new["thread_id"] == new["id"] != delivered["thread_id"]

    async def parent_read(self, provider: GmailApiProvider) -> Envelope:
        items, _ = await read_all(provider)
        [envelope] = envelopes(items)
        return envelope

    @pytest.mark.anyio
    async def test_an_access_token_expiring_mid_run_is_invisible_to_the_reader(self) -> None:
        provider = self.channel()
        for n in range(5):
            self.deliver(raw_message(n))
        first = await provider.changes(None)
        self.admin.faults(expire_tokens=True)
        rest, _ = await read_all(provider, first.cursor)
        assert sorted(map(str, ids([*first.items, *rest]))) == [
            f"<c{n}@contoso.test>" for n in range(5)
        ]

    @pytest.mark.anyio
    async def test_a_revoked_grant_names_outloop_connect_and_shows_no_secret(
        self, caplog: pytest.LogCaptureFixture
    ) -> None:
        caplog.set_level(logging.DEBUG)
        provider = self.channel()
        parent = await self.parent(provider)  # signed in, with an access token in memory
        handover = await provider.prepare(reply(parent, provider.capabilities))
        self.admin.faults(revoke_tokens=self.address)
        with pytest.raises(AuthenticationExpired) as read:
            await provider.changes(None)
        with pytest.raises(NotHandedOver) as send:
            await provider.send(handover)
        assert isinstance(send.value, AuthenticationExpired)
        health = await provider.health()
        assert not health.ok
        shown = [str(read.value), repr(read.value), str(send.value), health.detail]
        assert all("outloop connect --workspace" in text for text in shown[::2])
        everything = " ".join([*shown, repr(provider), caplog.text])
        for value in self.secrets.values():
            assert value not in everything
        assert self.stored("sent") == []

    @pytest.mark.anyio
    async def test_open_gmail_builds_the_channel_from_the_binding(self) -> None:
        binding = MailboxBinding(
            mailbox_id=MAILBOX,
            provider="google",
            api=self.access(sent_copy_latency_seconds=30, parallel=2),
        )
        provider = open_gmail(
            binding,
            read=lambda name: Secret(self.secrets[name]),
            write=lambda name, value: None,
            reconnect=RECONNECT,
        )
        try:
            capabilities = provider.capabilities
            assert capabilities.sent_copy_latency == timedelta(seconds=30)
            assert capabilities.markers == MARKERS and not capabilities.native_threads
            health = await provider.health()
            assert health.ok and self.address in health.detail
            assert provider.mailbox_id == MAILBOX.lower()
        finally:
            await provider.aclose()


class _Counting(httpx.AsyncBaseTransport):
    """A transport that counts the requests in flight at once."""

    def __init__(self, inner: httpx.AsyncBaseTransport) -> None:
        self.inner = inner
        self.now = self.most = self.requests = 0

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        self.now += 1
        self.requests += 1
        self.most = max(self.most, self.now)
        try:
            response = await self.inner.handle_async_request(request)
            await anyio.lowlevel.checkpoint()  # the others run meanwhile, as on a network
            return response
        finally:
            self.now -= 1


def _bulk_mock(address: str, count: int) -> tuple[MailStore, dict[str, str]]:
    """A mock tenant of one account whose inbox holds ``count`` messages, and the account's
    OAuth secrets. Filled through the store: the admin API's delivery reads every stored
    message's headers to thread each new one (2,000 deliveries take minutes), and these
    messages, answering none, start threads of their own as Gmail would give them."""
    store = MailStore()
    account, _, refresh = store.add_account(
        address, "google", "pw", "JBSWY3DPEHPK3PXPJBSWY3DPEHPK3PXP"
    )
    template = raw_message(0)
    for n in range(count):
        raw = template.replace(b"<c0@", f"<c{n}@".encode())
        raw = raw.replace(b"Invoice 0", f"Invoice {n}".encode())
        gmail_id = f"{0x18F00000000 + n:011x}{n:05x}"
        ms = int(time.time() * 1000) + n
        store.record(Stored(address, gmail_id, gmail_id, raw, {"INBOX", "UNREAD"}, 0, ms))
    secrets = {
        "oauth_client_id": account.client_id,
        "oauth_client_secret": account.client_secret,
        "oauth_refresh_token": refresh.value,
    }
    return store, secrets


@pytest.mark.slow
@pytest.mark.anyio
async def test_a_2000_message_inbox_syncs_each_message_once_bounded_through_429s_and_503s(
    anyio_backend: str,
) -> None:
    """The mock app served in this process (its answers cost the same as over a socket,
    without one): every message is read once, at most ``parallel`` requests at once, and the
    429s and 503s met on the way are waited out."""
    del anyio_backend
    address, count, parallel = "bulk@fabrikam.test", 2000, 8
    store, secrets = _bulk_mock(address, count)
    messages = "/gmail/v1/users/me/messages/"
    store.faults.errors = [
        {"status": 429, "count": 5, "retry_after": 0, "path_prefix": messages},
        {"status": 503, "count": 5, "path_prefix": messages},
    ]
    counting = _Counting(httpx.ASGITransport(app=build_app(store)))
    access = ApiAccess(
        base_url="http://127.0.0.1/gmail/v1",
        token_url="http://127.0.0.1/oauth2/google/token",
        parallel=parallel,
    )
    provider = open_gmail(
        MailboxBinding(mailbox_id=address, provider="google", api=access),
        read=lambda name: Secret(secrets[name]),
        write=lambda name, value: None,
        reconnect=RECONNECT,
        transport=counting,
    )
    started = time.monotonic()
    try:
        with stamina.set_testing(True, attempts=4):
            items, cursor = await read_all(provider)
            again, _ = await read_all(provider, cursor)
    finally:
        await provider.aclose()
    took = time.monotonic() - started
    seen = ids(items)
    assert len(seen) == count == len(set(seen))
    assert set(seen) == {f"<c{n}@contoso.test>" for n in range(count)}
    assert again == []
    assert [e["count"] for e in store.faults.errors] == [0, 0], "every injected error was met"
    assert counting.most == parallel, counting.most
    assert counting.requests < count + count // 50, "one read per message, and a few lists"
    assert took < 60, took
    print(f"synced {count} messages in {took:.1f} s, at most {counting.most} requests at once")
