"""The send ledger, scanned items with their cursor, and thread aliases on PostgreSQL when a
commit's outcome is unknown: the connection is cut just after the server answered COMMIT
(it committed, the client never heard) or just before it got it (it never committed). Each
write's own check reads which, so nothing is recorded twice and no write is lost."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from agent.domain.mail import Marker, MarkerKind
from agent.domain.records import SendAttempt, SendState
from agent.domain.run import LedgerEntry, MailboxCursor
from agent.storage.postgres import PostgresStore
from agent.testing import FrozenClock
from agent.testing.storage.base import ALIVE, DEAD, MAILBOX, WS, intent, register
from agent.testing.storage.thread_aliases import link
from tests.conftest import pg_cluster, pg_url_at
from tests.storage.test_postgres import CommitCutProxy

ATTEMPT = SendAttempt(
    channel="api",
    marker=Marker(kind=MarkerKind.HEADER, value="x-outloop-send-1"),
    keeps_sent_copy=True,
    sent_copy_latency=timedelta(minutes=1),
)


class Stores:
    """A store straight to the server, and one through the cutting proxy."""

    def __init__(self, url: str, proxy: CommitCutProxy, port: int) -> None:
        self.proxy = proxy
        self.direct = PostgresStore(url)
        self.proxied = PostgresStore(
            url.replace(f"@127.0.0.1:{port}/", f"@127.0.0.1:{proxy.port}/")
        )

    def cut(self, mode: str, write: Callable[[PostgresStore], Any], checked: bool = True) -> Any:
        """Run ``write`` on the proxied store with its COMMIT cut. A ``checked`` write reads
        whether it committed; the others are safe to run again as they are."""
        checks = self.proxied.commit_checks
        self.proxy.arm(mode)
        result = write(self.proxied)
        assert self.proxy.fired.is_set(), "the proxy never saw the commit"
        assert self.proxy.commit_acknowledged is (mode == "after")
        assert (self.proxied.commit_checks > checks) is checked
        return result


@pytest.fixture(params=["after", "before"])
def stores(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[Stores, str]]:
    cluster = pg_cluster()
    proxy = CommitCutProxy(cluster.port)
    opened: Stores | None = None
    try:
        opened = Stores(pg_url_at(tmp_path), proxy, cluster.port)
        yield opened, str(request.param)
    finally:
        if opened is not None:
            opened.proxied.close()
            opened.direct.close()
        proxy.stop()


def test_each_send_ledger_change_is_recorded_once_whatever_became_of_its_commit(
    stores: tuple[Stores, str],
) -> None:
    s, mode = stores
    clock = FrozenClock()
    register(s.direct, WS)
    s.direct.begin_send(intent("send-1").model_copy(update={"holder": ALIVE}), clock.now())

    tried = s.cut(
        mode, lambda st: st.attempt_send("send-1", ALIVE, ATTEMPT, clock.advance(seconds=1))
    )
    assert tried is not None and tried.attempts == 1 and tried.state is SendState.ATTEMPTING
    lost = s.cut(
        mode, lambda st: st.mark_uncertain("send-1", ALIVE, "lost", clock.advance(seconds=1))
    )
    assert lost.state is SendState.UNCERTAIN
    again = s.cut(
        mode, lambda st: st.attempt_send("send-1", ALIVE, ATTEMPT, clock.advance(seconds=1))
    )
    assert again is not None and again.attempts == 2
    person = s.cut(
        mode,
        lambda st: st.hand_to_person("send-1", "no copy", clock.advance(seconds=1)),
        checked=False,
    )
    assert person.state is SendState.WITH_PERSON
    unsent = s.cut(
        mode,
        lambda st: st.settle_send(
            "send-1", False, "nothing arrived", "noa", clock.advance(seconds=1)
        ),
    )
    assert unsent.state is SendState.PREPARED and unsent.resend_allowed
    third = s.cut(
        mode, lambda st: st.attempt_send("send-1", ALIVE, ATTEMPT, clock.advance(seconds=1))
    )
    assert third is not None and third.attempts == 3
    done = s.cut(
        mode,
        lambda st: st.complete_send("send-1", "provider-1", "accepted", clock.advance(seconds=1)),
        checked=False,
    )
    assert done.state is SendState.CONFIRMED

    assert s.direct.get_send("send-1") == done
    assert [e.state for e in s.direct.send_events("send-1")] == [
        SendState.PREPARED, SendState.ATTEMPTING, SendState.UNCERTAIN, SendState.ATTEMPTING,
        SendState.WITH_PERSON, SendState.PREPARED, SendState.ATTEMPTING, SendState.CONFIRMED,
    ]  # fmt: skip

    s.direct.begin_send(intent("send-2").model_copy(update={"holder": ALIVE}), clock.now())
    s.direct.attempt_send("send-2", ALIVE, ATTEMPT, clock.now())
    s.direct.mark_uncertain("send-2", ALIVE, "lost", clock.now())
    sent = s.cut(
        mode,
        lambda st: st.settle_send(
            "send-2", True, "copy found by hand", "noa", clock.advance(seconds=1)
        ),
    )
    assert sent.state is SendState.CONFIRMED
    assert len(s.direct.send_events("send-2")) == 4

    s.direct.begin_send(intent("send-3").model_copy(update={"holder": DEAD}), clock.now())
    assert s.cut(
        mode, lambda st: st.take_over_send("send-3", DEAD, ALIVE, clock.advance(seconds=1))
    )
    taken = s.direct.get_send("send-3")
    assert taken is not None and taken.holder == ALIVE
    assert [e.actor for e in s.direct.send_events("send-3")] == [DEAD, ALIVE]


def test_scanned_items_their_cursor_and_thread_aliases_are_recorded_once(
    stores: tuple[Stores, str],
) -> None:
    s, mode = stores
    clock = FrozenClock()
    s.direct.start_run("run-1", WS, ALIVE, clock.now())
    cursor = MailboxCursor(
        scope=WS, provider="imap", mailbox_id=MAILBOX, channel="imap", cursor="c-1"
    )
    entries = [LedgerEntry(run_id="run-1", item_ref=f"i-{n}", owner=WS) for n in range(3)]
    s.cut(mode, lambda st: st.record_scanned(entries, clock.now(), cursor))
    assert s.direct.ledger("run-1") == entries
    moved = cursor.model_copy(update={"cursor": "c-2"})
    s.cut(mode, lambda st: st.record_scanned([], clock.advance(seconds=1), moved))
    assert s.direct.get_cursor(WS, "imap", MAILBOX, "imap") == "c-2"
    s.cut(mode, lambda st: st.clear_cursor(WS, "imap", MAILBOX, "imap"), checked=False)
    assert s.direct.get_cursor(WS, "imap", MAILBOX, "imap") is None

    alias = s.cut(
        mode,
        lambda st: st.resolve_thread("imap", MAILBOX, link("<r@x>", ("<p@x>",), "a-1")),
        checked=False,
    )
    assert alias == "a-1"
    assert s.direct.resolve_thread("imap", MAILBOX, link("<p@x>", (), "other")) == "a-1"
