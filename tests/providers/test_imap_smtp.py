"""The IMAP/SMTP adapter against a real Dovecot and an SMTP submission server relaying into
it (fixtures/dovecot.py, fixtures/submission.py): the MailProvider contract, the lifecycle
core through it, and what only a real server shows - the SMTP envelope, BODY.PEEK, CONDSTORE,
UIDVALIDITY, restarts and connections that break.

Each test signs in as a Dovecot user of its own; the mailbox it works is always
``MAILBOX`` (the login name is the server's ``username``)."""

from __future__ import annotations

import asyncio
import base64
import itertools
import logging
import socket
from collections.abc import AsyncIterator, Mapping
from datetime import timedelta
from typing import ClassVar

import pytest
from aiosmtpd.controller import Controller
from aiosmtpd.smtp import AuthResult

from agent.domain.context import Endpoint, MailServer, Security
from agent.domain.errors import (
    AuthenticationExpired,
    CursorExpired,
    NotHandedOver,
    OutcomeUnknown,
    ProviderError,
    TransientFailure,
)
from agent.domain.mail import MarkerKind
from agent.domain.records import SendState
from agent.domain.secrets import Secret
from agent.providers.imap_smtp import MARKERS, ImapSmtpProvider
from agent.services import outbound
from agent.services.workspaces import DataDir, add_workspace
from agent.storage.backend import open_store
from agent.testing import FrozenClock
from agent.testing.channel_contract import ChannelLifecycleContract
from agent.testing.contexts import context_yaml
from agent.testing.providers import (
    CLIENT,
    COLLEAGUE,
    MAILBOX,
    Fault,
    MailboxHooks,
    MailProviderContract,
    envelopes,
    ids,
    raw_message,
    read_all,
    reply,
    sent,
)
from fixtures.dovecot import Dovecot
from fixtures.imap_proxy import ImapProxy
from fixtures.submission import SubmissionServer
from fixtures.tls import issue
from tests.conftest import session_dovecot

PASSWORD = 'pa"ss\\word'
"""Quoted and escaped on the wire (the test servers sign in with imaplib: ASCII only)."""
LATENCY = timedelta(seconds=60)
_users = itertools.count(1)


class OnDovecot(MailboxHooks):
    """A user of the session's Dovecot, sending through a submission server that files
    sent copies itself (as Gmail's and Microsoft 365's SMTP do) until a test says it keeps
    none; then the adapter appends its own copy."""

    faults: ClassVar[frozenset[Fault]] = frozenset(
        {Fault.LOST_ACK, Fault.LATE_SENT_COPY, Fault.EXPIRED_CURSOR, Fault.NO_SENT_COPY}
    )
    cannot: ClassVar[Mapping[Fault, str]] = {
        Fault.DROPPED_MESSAGE_ID: "a standards IMAP server and its submission server keep "
        "every header we write, our Message-ID included",
    }
    channels: ClassVar[tuple[str, ...]] = ("imap",)
    server_copy: ClassVar[bool] = True
    dovecot: Dovecot
    user: str
    submission: SubmissionServer
    servers: list[SubmissionServer]

    def setup_mailbox(self) -> None:
        self.dovecot = session_dovecot()
        self.user = f"user{next(_users)}-{self.where.name[-12:]}@fabrikam.test".lower()
        self.dovecot.add_user(self.user, PASSWORD)
        self.keeps_copy = self.server_copy
        self.servers = []
        self._start_submission()

    def _start_submission(self) -> None:
        self.submission = SubmissionServer.for_dovecot(
            self.dovecot, keeps_sent_copy=self.keeps_copy
        ).start()
        self.servers.append(self.submission)

    def teardown_mailbox(self) -> None:
        for server in self.servers:
            server.stop()

    @pytest.fixture(autouse=True)
    async def _close_channels(self, anyio_backend: str) -> AsyncIterator[None]:
        """Every channel a test built signs out when it ends (the suite builds many)."""
        del anyio_backend
        self.built: list[ImapSmtpProvider] = []
        yield
        for provider in self.built:
            await provider.aclose()

    def server(self, imap_port: int | None = None) -> MailServer:
        return MailServer(
            imap=Endpoint(
                host=self.dovecot.host,
                port=imap_port or self.dovecot.imap_port,
                security=Security.NONE,
            ),
            smtp=Endpoint(
                host=self.dovecot.host, port=self.submission.port, security=Security.NONE
            ),
            username=self.user,
            submission_keeps_sent_copy=self.keeps_copy,
            sent_copy_latency_seconds=int(LATENCY.total_seconds()),
            timeout_seconds=20,
        )

    def build(
        self,
        *,
        channel: str | None = None,
        markers: tuple[MarkerKind, ...] | None = None,
        imap_port: int | None = None,
        password: str = PASSWORD,
    ) -> ImapSmtpProvider:
        del channel
        provider = ImapSmtpProvider(
            self.server(imap_port),
            MAILBOX,
            Secret(password),
            markers=markers or MARKERS,
            page_size=3,
        )
        self.built.append(provider)
        return provider

    def deliver(self, raw: bytes) -> None:
        self.dovecot.deliver(self.user, raw)

    def flip(self, fault: Fault) -> None:
        if fault is Fault.LOST_ACK:
            self.submission.drop_next(1)
        elif fault is Fault.LATE_SENT_COPY:
            self.submission.hold_copies()
            self.held_for = timedelta(0)
        elif fault is Fault.EXPIRED_CURSOR:
            self.dovecot.change_uidvalidity(self.user)
        elif fault is Fault.NO_SENT_COPY:
            self.keeps_copy = False
            self.submission.stop()
            self._start_submission()
        else:
            raise AssertionError(f"{fault} is declared impossible")

    def advance(self, delta: timedelta) -> None:
        """Held copies show once three quarters of the declared latency passed (the test
        releases them: nothing is waited for)."""
        self.held_for = getattr(self, "held_for", timedelta(0)) + delta
        if self.held_for >= LATENCY * 3 / 4:
            self.submission.release_copies(keep_holding=True)

    def snapshot(self) -> Mapping[str, str]:
        return self.dovecot.snapshot(self.user, PASSWORD)

    def sent_copies(self, message_id: str) -> int:
        return sum(
            1 for server in self.servers for e in server.envelopes if e.message_id == message_id
        )

    def context_fields(self) -> str:
        return (
            f"server: {{imap: {{host: {self.dovecot.host}, port: {self.dovecot.imap_port}, "
            f"security: none}}, smtp: {{host: {self.dovecot.host}, port: {self.submission.port}, "
            f"security: none}}, username: '{self.user}', "
            f"submission_keeps_sent_copy: {str(self.keeps_copy).lower()}}}"
        )


class TestDovecot(OnDovecot, MailProviderContract): ...


class TestCoreOnDovecot(OnDovecot, ChannelLifecycleContract): ...


class OnDovecotAppendingItsCopy(OnDovecot):
    """A submission server that keeps no copy: the adapter appends its own to Sent."""

    server_copy: ClassVar[bool] = False
    faults: ClassVar[frozenset[Fault]] = frozenset({Fault.EXPIRED_CURSOR, Fault.NO_SENT_COPY})
    cannot: ClassVar[Mapping[Fault, str]] = {
        **OnDovecot.cannot,
        Fault.LOST_ACK: "the copy is appended only after the server's answer: with the answer "
        "lost there is no copy, and the send goes to a person (tested below)",
        Fault.LATE_SENT_COPY: "the copy is appended by the adapter itself: searchable at once",
    }


class TestDovecotAppendingItsCopy(OnDovecotAppendingItsCopy, MailProviderContract): ...


class TestCoreOnDovecotAppendingItsCopy(OnDovecotAppendingItsCopy, ChannelLifecycleContract): ...


# -- what only a real server shows ---------------------------------------------------------


class TestImapAndSmtp(OnDovecot):
    @pytest.mark.anyio
    async def test_the_smtp_envelope_is_the_plan_and_reading_marks_nothing_seen(self) -> None:
        provider = self.build()
        self.deliver(raw_message(1))
        before = self.snapshot()
        [parent] = envelopes((await read_all(provider))[0])
        await provider.fetch_body(parent.body_ref)
        assert self.snapshot() == before  # BODY.PEEK: no \\Seen, nothing written
        message = reply(parent, provider.capabilities)
        await sent(provider, message)
        [envelope] = self.submission.envelopes
        assert envelope.mail_from == MAILBOX.lower()
        assert sorted(envelope.rcpt_tos) == sorted([CLIENT, COLLEAGUE])
        await provider.aclose()

    @pytest.mark.anyio
    async def test_an_unchanged_inbox_is_answered_from_its_modseq_and_new_mail_is_read(
        self,
    ) -> None:
        provider = self.build()
        self.deliver(raw_message(1))
        _, cursor = await read_all(provider)
        assert cursor.split(".")[-1].isdigit(), "a cursor at the end holds HIGHESTMODSEQ"
        assert (await provider.changes(cursor)).items == ()
        self.deliver(raw_message(2))
        assert ids((await read_all(provider, cursor))[0]) == ["<c2@contoso.test>"]
        await provider.aclose()

    @pytest.mark.anyio
    async def test_a_rebuilt_inbox_expires_the_cursor_and_a_resync_reads_the_same_messages(
        self,
    ) -> None:
        provider = self.build()
        for n in range(4):
            self.deliver(raw_message(n))
        first, cursor = await read_all(provider)
        self.dovecot.change_uidvalidity(self.user)
        with pytest.raises(CursorExpired):
            await provider.changes(cursor)
        again, _ = await read_all(self.build())
        assert sorted(map(str, ids(again))) == sorted(map(str, ids(first)))
        assert {e.provider_message_id for e in envelopes(again)}.isdisjoint(
            e.provider_message_id for e in envelopes(first)
        )
        await provider.aclose()

    @pytest.mark.anyio
    async def test_a_server_restart_or_stop_mid_scan_loses_and_doubles_nothing(self) -> None:
        provider = self.build()
        for n in range(7):
            self.deliver(raw_message(n))
        first = await provider.changes(None)
        self.dovecot.restart()  # the connection is gone: the next page opens another
        second = await provider.changes(first.cursor)
        self.dovecot.stop()
        try:
            with pytest.raises(TransientFailure) as down:
                await self.build().changes(second.cursor)  # a new connection cannot open
        finally:
            self.dovecot.start()
        assert MAILBOX.lower() in str(down.value) and "could not be opened" in str(down.value)
        rest, _ = await read_all(provider, second.cursor)
        assert sorted(map(str, ids([*first.items, *second.items, *rest]))) == sorted(
            f"<c{n}@contoso.test>" for n in range(7)
        )

    @pytest.mark.anyio
    async def test_a_connection_cut_mid_fetch_or_answered_with_garbage_fails_clearly(
        self,
    ) -> None:
        for n in range(3):
            self.deliver(raw_message(n))
        with ImapProxy(self.dovecot.imap_port) as proxy:
            provider = self.build(imap_port=proxy.port)
            proxy.cut_fetch(after=300)
            with pytest.raises(TransientFailure) as cut:
                await provider.changes(None)
            assert MAILBOX.lower() in str(cut.value) and "dropped" in str(cut.value)
            proxy.garble_fetch()
            with pytest.raises(ProviderError) as garbled:
                await provider.changes(None)
            assert not isinstance(garbled.value, TransientFailure)
            assert "not IMAP" in str(garbled.value) and MAILBOX.lower() in str(garbled.value)
            items, _ = await read_all(provider)  # the next connection reads everything once
            assert sorted(map(str, ids(items))) == [f"<c{n}@contoso.test>" for n in range(3)]
            assert proxy.fired == ["cut a FETCH after 300 bytes", "garbled a FETCH"]
            await provider.aclose()

    @pytest.mark.anyio
    async def test_a_refused_login_names_the_mailbox_and_the_vault_entry_to_fix(self) -> None:
        provider = self.build(password="not the password")
        with pytest.raises(AuthenticationExpired) as refused:
            await provider.changes(None)
        text = str(refused.value)
        assert MAILBOX.lower() in text and "outloop vault set" in text
        assert "not the password" not in text
        health = await provider.health()
        assert not health.ok and "refused the login" in health.detail
        await provider.aclose()

    @pytest.mark.anyio
    async def test_a_password_with_quotes_and_letters_beyond_ascii_signs_in(self) -> None:
        self.dovecot.add_user(self.user, 'pässwörd "quoted" \\ é')
        provider = self.build(password='pässwörd "quoted" \\ é')
        health = await provider.health()
        assert health.ok, health.detail

    @pytest.mark.anyio
    async def test_a_send_the_server_refuses_before_data_is_not_handed_over(self) -> None:
        provider = self.build()
        self.deliver(raw_message(1))
        [parent] = envelopes((await read_all(provider))[0])
        message = reply(parent, provider.capabilities)
        handover = await provider.prepare(message)
        wrong = self.build(password="wrong")
        with pytest.raises(AuthenticationExpired):
            await wrong.send(handover)
        self.submission.stop()
        with pytest.raises(NotHandedOver):
            await provider.send(handover)
        assert self.submission.envelopes == []
        await provider.aclose()


class TestImapAppendingItsCopy(OnDovecotAppendingItsCopy):
    @pytest.mark.anyio
    async def test_a_lost_answer_leaves_no_copy_of_ours_and_is_outcome_unknown(self) -> None:
        provider = self.build()
        capabilities = provider.capabilities
        assert not capabilities.keeps_sent_copy and capabilities.files_sent_copy
        self.deliver(raw_message(1))
        [parent] = envelopes((await read_all(provider))[0])
        handover = await provider.prepare(reply(parent, capabilities))
        self.submission.drop_next(1)
        with pytest.raises(OutcomeUnknown):
            await provider.send(handover)
        assert len(self.submission.envelopes) == 1  # the server took it
        assert handover.marker is not None
        assert await provider.find_sent(handover.marker) is None  # but no copy proves it
        await provider.aclose()


class TestTls(OnDovecot):
    """TLS on both sides, with certificates from an authority of the test's own: trusted
    through ``server.ca_file``, refused (never downgraded) without it."""

    def tls_server(
        self, imap_port: int, smtp_port: int, implicit: bool, ca: str | None
    ) -> MailServer:
        return MailServer(
            imap=Endpoint(host="127.0.0.1", port=imap_port, security=Security.TLS),
            smtp=Endpoint(
                host="127.0.0.1",
                port=smtp_port,
                security=Security.TLS if implicit else Security.STARTTLS,
            ),
            username=self.user,
            ca_file=ca,
            timeout_seconds=20,
        )

    @pytest.mark.anyio
    @pytest.mark.parametrize("implicit", [False, True], ids=["starttls", "implicit-tls"])
    async def test_reading_and_sending_over_tls_verify_the_servers_against_the_ca_file(
        self, implicit: bool
    ) -> None:
        issued = issue(self.where / "tls")
        context = issued.server_context()
        submission = SubmissionServer.for_dovecot(
            self.dovecot, tls=context, implicit_tls=implicit
        ).start()
        self.servers.append(submission)
        self.deliver(raw_message(1))
        with ImapProxy(self.dovecot.imap_port, tls=context) as proxy:
            trusted = self.tls_server(proxy.port, submission.port, implicit, str(issued.ca_file))
            provider = ImapSmtpProvider(trusted, MAILBOX, Secret(PASSWORD))
            [parent] = envelopes((await read_all(provider))[0])
            await sent(provider, reply(parent, provider.capabilities))
            assert [e.message_id for e in submission.envelopes] == ["<reply-1@fabrikam.test>"]
            await provider.aclose()

            untrusted = self.tls_server(proxy.port, submission.port, implicit, None)
            stranger = ImapSmtpProvider(untrusted, MAILBOX, Secret(PASSWORD))
            with pytest.raises(ProviderError) as imap_refused:
                await stranger.changes(None)
            assert not isinstance(imap_refused.value, TransientFailure)
            assert "server.ca_file" in str(imap_refused.value)
            handover = await stranger.prepare(reply(parent, provider.capabilities))
            with pytest.raises(NotHandedOver) as smtp_refused:
                await stranger.send(handover)
            assert "server.ca_file" in str(smtp_refused.value)
            assert len(submission.envelopes) == 1  # nothing more was sent
            await stranger.aclose()


class TestServersThatMisbehave(OnDovecot):
    @pytest.mark.anyio
    async def test_a_flag_change_another_client_makes_mid_fetch_loses_no_message(self) -> None:
        for n in range(3):
            self.deliver(raw_message(n))
        with ImapProxy(self.dovecot.imap_port) as proxy:
            provider = self.build(imap_port=proxy.port)
            proxy.interject_flag_changes()
            items, _ = await read_all(provider)
            assert sorted(map(str, ids(items))) == [f"<c{n}@contoso.test>" for n in range(3)]
            assert proxy.fired == ["interjected a flag change"]
            await provider.aclose()

    @pytest.mark.anyio
    async def test_a_login_answered_out_of_turn_shows_the_password_nowhere(
        self, caplog: pytest.LogCaptureFixture
    ) -> None:
        secret = 'out-of-turn "pw" \\ 9f3'
        shown = [secret, base64.b64encode(f"\0{self.user}\0{secret}".encode()).decode()]

        async def wrong_tags(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            writer.write(b"* OK ready\r\n")
            try:
                while line := await reader.readline():
                    tag = line.split(b" ", 1)[0]
                    if b"CAPABILITY" in line.upper():
                        writer.write(b"* CAPABILITY IMAP4rev1 AUTH=PLAIN SASL-IR\r\n")
                        writer.write(tag + b" OK\r\n")
                    else:
                        writer.write(b"ZZZ9 OK not your tag\r\n")
                    await writer.drain()
            except ConnectionError:
                pass  # the client hung up
            finally:
                writer.close()

        caplog.set_level(logging.DEBUG)
        server = await asyncio.start_server(wrong_tags, "127.0.0.1", 0)
        port = int(server.sockets[0].getsockname()[1])
        provider = self.build(imap_port=port, password=secret)
        with pytest.raises(ProviderError) as failed:
            await provider.changes(None)
        await provider.aclose()
        server.close()
        await server.wait_closed()
        text = f"{failed.value!r} {failed.value} " + caplog.text
        assert all(form not in text for form in shown)
        assert MAILBOX.lower() in str(failed.value)

    @pytest.mark.anyio
    async def test_an_answer_to_data_that_is_not_smtp_leaves_the_outcome_unknown(self) -> None:
        class Garbling:
            async def handle_DATA(self, *_: object) -> str:
                return "this is not an SMTP reply"

        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            free = int(probe.getsockname()[1])
        controller = Controller(
            Garbling(),
            hostname="127.0.0.1",
            port=free,
            authenticator=lambda *_: AuthResult(success=True),
            auth_require_tls=False,
        )
        controller.start()
        try:
            self.deliver(raw_message(1))
            server = self.server().model_copy(
                update={
                    "smtp": Endpoint(host="127.0.0.1", port=controller.port, security=Security.NONE)
                }
            )
            reader = self.build()
            [parent] = envelopes((await read_all(reader))[0])
            await reader.aclose()
            provider = ImapSmtpProvider(server, MAILBOX, Secret("unused: no AUTH offered"))
            handover = await provider.prepare(reply(parent, provider.capabilities))
            with pytest.raises(OutcomeUnknown):
                await provider.send(handover)
            await provider.aclose()
        finally:
            controller.stop()


class TestSendLedgerOnImap(OnDovecot):
    @pytest.mark.anyio
    async def test_a_send_refused_before_data_goes_back_to_prepared_and_then_goes_once(
        self,
    ) -> None:
        root = self.where / "core"
        root.mkdir()
        data_dir = DataDir(root)
        store = open_store(None, data_dir.database)
        clock = FrozenClock()
        source = self.where / "context.yaml"
        context = context_yaml(
            "ws-imap-0001",
            mailbox=MAILBOX.lower(),
            provider="imap",
            mailbox_fields=self.context_fields(),
        )
        source.write_text(context, encoding="utf-8")
        add_workspace(store, data_dir, source, clock.now())
        intent, message = outbound.outgoing(
            key="reply|refused-first",
            kind="client_reply",
            workspace_id="ws-imap-0001",
            task_id=None,
            mailbox_id=MAILBOX.lower(),
            to=(CLIENT,),
            subject="Re: Invoice 1",
            text="We are on it.",
        )
        provider = self.build()
        self.submission.stop()  # nothing listens: the message cannot be handed over
        with pytest.raises(NotHandedOver):
            await outbound.send_once(store, provider, intent, message, clock)
        record = store.get_send(intent.key)
        assert record is not None and record.state is SendState.PREPARED
        events = store.send_events(intent.key)
        assert events[-1].state is SendState.PREPARED and "NotHandedOver" in events[-1].detail
        self.submission.start()
        outcome = await outbound.send_once(store, provider, intent, message, clock)
        assert outcome.status is outbound.SendStatus.SENT
        assert [e.message_id for e in self.submission.envelopes] == [message.internet_message_id]
        await provider.aclose()
        store.close()
