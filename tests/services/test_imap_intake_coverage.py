"""Intake over a real IMAP server (Dovecot) records every message exactly once, whatever
happens to the server while it reads: mail arriving between pages, the inbox rebuilt
(UIDVALIDITY changed) between pages and between runs, the server restarted mid-scan.

Each test compares what the server shows (its inbox's Message-IDs) with what the runs
recorded (one claimed occurrence per message, clean reconciliations) and reports both."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from agent.domain.context import Endpoint, MailServer, Security
from agent.domain.execution import ClaimOutcome
from agent.domain.mail import ChangePage
from agent.domain.secrets import Secret
from agent.ports import EmbeddedStore
from agent.providers.imap_smtp import ImapSmtpProvider
from agent.services import intake, workspaces
from agent.testing import FrozenClock
from agent.testing.contexts import context_yaml
from agent.testing.providers import raw_message
from fixtures.dovecot import Dovecot
from fixtures.imap_proxy import ImapProxy
from tests.conftest import session_dovecot
from tests.services import coverage

MAILBOX = "support@fabrikam.test"
PASSWORD = "coverage-pw"
_users = itertools.count(1)


class Interrupting(ImapSmtpProvider):
    """The adapter, with something done to the server after each page it read."""

    def __init__(
        self, server: MailServer, password: Secret, after_page: Callable[[int], None]
    ) -> None:
        super().__init__(server, MAILBOX, password, page_size=4)
        self._after_page = after_page
        self._pages = 0

    async def changes(self, cursor: str | None) -> ChangePage:
        page = await super().changes(cursor)
        self._pages += 1
        self._after_page(self._pages)
        return page


class Mailbox:
    def __init__(self, dovecot: Dovecot, user: str) -> None:
        self.dovecot, self.user = dovecot, user
        self.delivered = 0

    def deliver(self, count: int) -> None:
        for _ in range(count):
            self.dovecot.deliver(self.user, raw_message(1000 + self.delivered))
            self.delivered += 1

    def shown(self) -> list[str]:
        return self.dovecot.message_ids(self.user, PASSWORD)

    def server(self) -> MailServer:
        host = self.dovecot.host
        return MailServer(
            imap=Endpoint(host=host, port=self.dovecot.imap_port, security=Security.NONE),
            smtp=Endpoint(host=host, port=1, security=Security.NONE),  # nothing is sent
            username=self.user,
        )

    def channel(self, after_page: Callable[[int], None] = lambda _: None) -> ImapSmtpProvider:
        return Interrupting(self.server(), Secret(PASSWORD), after_page)


@pytest.fixture
def box(tmp_path: Path) -> Mailbox:
    dovecot = session_dovecot()
    user = f"coverage{next(_users)}-{tmp_path.name[-10:]}@fabrikam.test".lower()
    dovecot.add_user(user, PASSWORD)
    return Mailbox(dovecot, user)


@pytest.fixture
def workspace(
    station_store: EmbeddedStore, data_dir: workspaces.DataDir, box: Mailbox, tmp_path: Path
) -> Iterator[str]:
    server = (
        f"server: {{imap: {{host: {box.dovecot.host}, port: {box.dovecot.imap_port}, "
        f"security: none}}, smtp: {{host: {box.dovecot.host}, port: 1, security: none}}, "
        f"username: '{box.user}'}}"
    )
    text = context_yaml("ws-imap-0001", mailbox=MAILBOX, provider="imap", mailbox_fields=server)
    source = tmp_path / "context.yaml"
    source.write_text(text, encoding="utf-8")
    yield workspaces.add_workspace(
        station_store, data_dir, source, FrozenClock().now()
    ).workspace_id


def _check(name: str, box: Mailbox, results: list[intake.RunResult], gaps: int = 0) -> None:
    coverage.check(
        f"imap intake coverage {name}",
        box.shown(),
        box.delivered,
        results,
        gaps,
        shows="server_shows",
    )


@pytest.mark.anyio
async def test_mail_arriving_between_pages_of_a_scan_is_recorded_exactly_once(
    station_store: EmbeddedStore, data_dir: workspaces.DataDir, workspace: str, box: Mailbox
) -> None:
    box.deliver(9)
    arriving = box.channel(after_page=lambda n: box.deliver(2) if n <= 2 else None)
    results = await coverage.runs(station_store, data_dir, workspace, [arriving, box.channel()])
    _check("mail arriving mid-scan", box, results)


@pytest.mark.anyio
async def test_an_inbox_rebuilt_mid_scan_and_between_runs_is_recorded_exactly_once(
    station_store: EmbeddedStore, data_dir: workspaces.DataDir, workspace: str, box: Mailbox
) -> None:
    box.deliver(10)

    def rebuild(page: int) -> None:
        if page == 1:
            box.dovecot.change_uidvalidity(box.user)

    first = box.channel(after_page=rebuild)
    results = await coverage.runs(station_store, data_dir, workspace, [first])
    box.dovecot.change_uidvalidity(box.user)
    box.deliver(3)
    results += await coverage.runs(station_store, data_dir, workspace, [box.channel()])
    _check("UIDVALIDITY changed", box, results)


@pytest.mark.anyio
async def test_a_server_restarted_mid_scan_leaves_every_message_recorded_exactly_once(
    station_store: EmbeddedStore, data_dir: workspaces.DataDir, workspace: str, box: Mailbox
) -> None:
    box.deliver(10)

    def restart(page: int) -> None:
        if page == 1:
            box.dovecot.restart()
            box.deliver(2)

    results = await coverage.runs(
        station_store, data_dir, workspace, [box.channel(after_page=restart), box.channel()]
    )
    _check("server restarted mid-scan", box, results)


@pytest.mark.anyio
async def test_a_refused_login_a_cut_fetch_and_garbage_are_access_gaps_that_lose_nothing(
    station_store: EmbeddedStore, data_dir: workspaces.DataDir, workspace: str, box: Mailbox
) -> None:
    box.deliver(10)
    wrong = ImapSmtpProvider(box.server(), MAILBOX, Secret("not-the-password"), page_size=4)
    results = await coverage.runs(station_store, data_dir, workspace, [wrong])
    [refused] = results[0].access_errors
    assert MAILBOX in refused and "outloop vault set" in refused
    assert "not-the-password" not in refused
    health = [h.detail for h in station_store.list_health()]
    assert any("refused the login" in detail for detail in health)
    with ImapProxy(box.dovecot.imap_port) as proxy:
        through = MailServer.model_validate(
            {
                **box.server().model_dump(),
                "imap": {"host": box.dovecot.host, "port": proxy.port, "security": "none"},
            }
        )

        def channel() -> ImapSmtpProvider:
            return ImapSmtpProvider(through, MAILBOX, Secret(PASSWORD), page_size=4)

        def cut_second_page(page: int) -> None:
            if page == 1:
                proxy.cut_fetch(after=500)

        cut = Interrupting(through, Secret(PASSWORD), cut_second_page)
        results += await coverage.runs(station_store, data_dir, workspace, [cut])
        assert len(results[-1].access_errors) == 1 and "dropped" in results[-1].access_errors[0]
        proxy.garble_fetch()
        results += await coverage.runs(station_store, data_dir, workspace, [channel()])
        assert "not IMAP" in results[-1].access_errors[0]
        results += await coverage.runs(station_store, data_dir, workspace, [channel()])
        assert results[-1].access_errors == []
    assert proxy.fired == ["cut a FETCH after 500 bytes", "garbled a FETCH"]
    _check("refused login, cut FETCH, garbage", box, results, gaps=3)


@pytest.mark.anyio
async def test_messages_stamped_in_the_same_second_are_taken_in_uid_order(
    station_store: EmbeddedStore, data_dir: workspaces.DataDir, workspace: str, box: Mailbox
) -> None:
    """A server stamps arrivals to the second: a request (UID 9) and its follow-up (UID 10)
    arriving in one second are taken in that order, so the request starts the task."""
    stamp = b"Received: from mx.contoso.test; Mon, 02 Nov 2026 10:00:05 +0000\r\n"
    for n in range(8):
        box.dovecot.append_raw(box.user, PASSWORD, "INBOX", stamp + raw_message(200 + n))
    box.dovecot.append_raw(box.user, PASSWORD, "INBOX", stamp + raw_message(1))
    follow_up = raw_message(2, in_reply_to="<c1@contoso.test>")
    box.dovecot.append_raw(box.user, PASSWORD, "INBOX", stamp + follow_up)
    box.delivered = 10
    [result] = await coverage.runs(station_store, data_dir, workspace, [box.channel()])
    assert [i.claim for i in result.items] == [ClaimOutcome.CLAIMED] * 10
    assert result.reconciliation is not None and result.reconciliation.clean
    subjects = sorted(t.original_subject for t in station_store.list_tasks(workspace))
    assert len(subjects) == 9  # the follow-up joined the request's task
    assert "Invoice 1" in subjects and "Re: Invoice" not in subjects
