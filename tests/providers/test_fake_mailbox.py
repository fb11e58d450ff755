"""The fake mailbox beyond the contract: what tests drive it with (fault switches, channel
views, a state several processes share, clocks), and the old ways tests use it."""

from __future__ import annotations

import multiprocessing
import os
import random
import signal
import sqlite3
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from pathlib import Path

import pytest

from agent.domain.errors import CursorExpired, NotFound, OutcomeUnknown
from agent.domain.mail import Channel, Handover, Marker, MarkerKind, OutgoingMessage, SendResult
from agent.testing import (
    API,
    BROWSER,
    ChannelView,
    FileClock,
    FileMailbox,
    InMemoryProvider,
    MemoryMailbox,
    make_envelope,
)
from agent.testing.providers import MAILBOX, raw_message, read_all, reply

pytestmark = pytest.mark.anyio
BOUND = 60  # seconds any wait on another process may take at most


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


async def test_an_envelope_delivered_as_before_is_read_with_its_own_ids_and_body() -> None:
    box = InMemoryProvider(MAILBOX)
    box.deliver(make_envelope(mailbox_id=box.mailbox_id, message_no=1, thread_no=1), text="Hi")
    box.deliver_unreadable("pm-broken", "no header block could be read")

    page = await box.changes(None)

    assert [i.item_ref for i in page.items] == ["pm-1", "pm-broken"]
    envelope = page.items[0].envelope
    assert envelope == box.inbox[0].envelope
    assert page.items[1].error == "no header block could be read"
    assert (await box.fetch_body("pm-1")).text == "Hi"
    assert box.bodies["pm-1"].text == "Hi"


async def test_a_test_may_reorder_the_inbox_before_the_first_read() -> None:
    box = InMemoryProvider(MAILBOX, view=replace(API, page_size=2))
    for n in range(7):
        box.deliver(make_envelope(mailbox_id=box.mailbox_id, message_no=n, thread_no=n))
    random.Random(3).shuffle(box.inbox)
    wanted = [item.item_ref for item in box.inbox]

    items, _ = await read_all(box)

    assert [item.item_ref for item in items] == wanted


async def test_attachments_delivered_with_an_envelope_are_fetched_by_reference() -> None:
    box = InMemoryProvider(MAILBOX)
    envelope = make_envelope(mailbox_id=box.mailbox_id, message_no=1, thread_no=1)
    box.deliver(envelope, attachments=[("a.pdf", "application/pdf", b"%PDF-1.7")])

    [item] = (await box.changes(None)).items
    assert item.envelope is not None
    assert item.envelope.attachment_refs == ("pm-1/0",)
    fetched = await box.fetch_attachment("pm-1/0")

    assert (fetched.data, fetched.ref.name, fetched.ref.size) == (b"%PDF-1.7", "a.pdf", 8)


async def test_each_channel_shows_its_own_ids_and_takes_no_other_channel_s() -> None:
    state = MemoryMailbox(MAILBOX)
    api = InMemoryProvider.through(state, API)
    browser = InMemoryProvider.through(state, BROWSER)
    state.deliver_raw(raw_message(1))

    api_page, browser_page = await api.changes(None), await browser.changes(None)

    assert [i.item_ref for i in api_page.items] == ["raw-1"]
    assert [i.item_ref for i in browser_page.items] == ["web:raw-1"]
    with pytest.raises(NotFound):
        await browser.fetch_body("raw-1")
    with pytest.raises(CursorExpired):
        await browser.changes(api_page.cursor)
    with pytest.raises(CursorExpired):
        await InMemoryProvider.through(MemoryMailbox(MAILBOX), API).changes(api_page.cursor)


async def test_the_sent_list_holds_what_the_mailbox_accepted_through_any_channel() -> None:
    state = MemoryMailbox(MAILBOX)
    api = InMemoryProvider.through(state, API)
    browser = InMemoryProvider.through(state, BROWSER)
    state.deliver_raw(raw_message(1))
    [item] = (await api.changes(None)).items
    assert item.envelope is not None

    for n, channel in enumerate((api, browser)):
        message = reply(item.envelope, channel.capabilities, f"<r{n}@fabrikam.test>")
        await channel.send(await channel.prepare(message))

    assert [m.internet_message_id for m in api.sent] == ["<r0@fabrikam.test>", "<r1@fabrikam.test>"]
    assert len(browser.sent_mime) == 2
    assert [r.channel for r in state.sent_records()] == ["api", "browser"]


def test_a_channel_view_that_would_break_its_declarations_is_refused() -> None:
    with pytest.raises(ValueError, match="Message-ID does not survive"):
        replace(API, replaces_message_id=True)
    with pytest.raises(ValueError, match="without a sent copy"):
        replace(API, keeps_sent_copy=False)
    with pytest.raises(ValueError, match="compose form"):
        ChannelView("web", Channel.BROWSER, hands_mime=False, markers=())


async def test_a_copy_delay_beyond_the_channel_s_declared_latency_is_refused() -> None:
    state = MemoryMailbox(MAILBOX)
    api = InMemoryProvider.through(state, API)
    state.deliver_raw(raw_message(1))
    [item] = (await api.changes(None)).items
    assert item.envelope is not None
    state.delay_sent_copies(timedelta(seconds=1))

    with pytest.raises(ValueError, match="declared sent_copy_latency"):
        await api.send(await api.prepare(reply(item.envelope, api.capabilities)))
    assert state.sent_records() == []


async def _reply_parent(state: MemoryMailbox | FileMailbox) -> InMemoryProvider:
    api = InMemoryProvider.through(state, API)
    state.deliver_raw(raw_message(1))
    return api


async def test_the_next_n_answers_are_lost_and_their_copies_are_kept() -> None:
    state = MemoryMailbox(MAILBOX)
    api = await _reply_parent(state)
    [item] = (await api.changes(None)).items
    assert item.envelope is not None
    state.lose_acks(2)

    outcomes: list[bool] = []
    for n in range(3):
        handover = await api.prepare(reply(item.envelope, api.capabilities, f"<r{n}@x.test>"))
        try:
            await api.send(handover)
        except OutcomeUnknown:
            outcomes.append(False)
        else:
            outcomes.append(True)
        assert handover.marker is not None and await api.find_sent(handover.marker)

    assert outcomes == [False, False, True]
    assert [r.answer_lost for r in state.sent_records()] == [True, True, False]


async def test_lost_answers_by_probability_follow_the_seed_in_every_process() -> None:
    def pattern(seed: int) -> list[bool]:
        state = MemoryMailbox(MAILBOX)
        state.lose_acks(0, probability=0.3, seed=seed)
        faults = state.faults()
        return [faults.lose(number, "api")[0] for number in range(1, 201)]

    assert pattern(7) == pattern(7)
    assert pattern(7) != pattern(8)
    assert 30 < sum(pattern(7)) < 90


async def test_lost_answers_on_one_channel_leave_the_others_alone() -> None:
    state = MemoryMailbox(MAILBOX)
    api = await _reply_parent(state)
    browser = InMemoryProvider.through(state, BROWSER)
    [item] = (await api.changes(None)).items
    assert item.envelope is not None
    state.lose_acks(1, channel="browser")

    await api.send(await api.prepare(reply(item.envelope, api.capabilities, "<a@x.test>")))
    with pytest.raises(OutcomeUnknown):
        message = reply(item.envelope, browser.capabilities, "<b@x.test>")
        await browser.send(await browser.prepare(message))


async def test_a_late_copy_in_a_shared_mailbox_appears_when_the_shared_clock_reaches_it(
    tmp_path: Path,
) -> None:
    here, there = FileClock(tmp_path / "clock"), FileClock(tmp_path / "clock")
    mine = FileMailbox(tmp_path / "box.db", MAILBOX, clock=here)
    theirs = FileMailbox(tmp_path / "box.db", clock=there)  # another process's opening
    browser = InMemoryProvider.through(mine, BROWSER)
    watcher = InMemoryProvider.through(theirs, BROWSER)
    mine.deliver_raw(raw_message(1))
    [item] = (await watcher.changes(None)).items
    assert item.envelope is not None
    theirs.delay_sent_copies(timedelta(seconds=20), channel="browser")

    handover, _ = await _send(browser, reply(item.envelope, browser.capabilities))
    assert handover.marker is not None
    assert await watcher.find_sent(handover.marker) is None
    there.advance(seconds=19)
    assert await watcher.find_sent(handover.marker) is None
    there.advance(seconds=1)

    assert here.now() == datetime(2026, 11, 30, 9, 0, 20, tzinfo=UTC)
    assert await watcher.find_sent(handover.marker) is not None
    assert theirs.mailbox_id == MAILBOX.lower() and theirs.uid == mine.uid
    mine.close()
    theirs.close()


async def _send(
    provider: InMemoryProvider, message: OutgoingMessage
) -> tuple[Handover, SendResult]:
    handover = await provider.prepare(message)
    return handover, await provider.send(handover)


def test_a_file_clock_moves_only_when_told_and_refuses_a_naive_time(tmp_path: Path) -> None:
    clock = FileClock(tmp_path / "clock", start=datetime(2027, 1, 1, tzinfo=UTC))
    assert FileClock(tmp_path / "clock").now() == datetime(2027, 1, 1, tzinfo=UTC)
    clock.advance(minutes=5)
    assert FileClock(tmp_path / "clock").now() == datetime(2027, 1, 1, 0, 5, tzinfo=UTC)
    with pytest.raises(ValueError, match="timezone-aware"):
        clock.set(datetime(2027, 1, 1))  # a naive time: the point of the test


def test_a_file_holding_no_mailbox_needs_its_id_and_one_holding_another_is_refused(
    tmp_path: Path,
) -> None:
    with pytest.raises(ValueError, match="give its mailbox_id"):
        FileMailbox(tmp_path / "box.db")
    FileMailbox(tmp_path / "box.db", MAILBOX).close()
    with pytest.raises(ValueError, match=r"not other@fabrikam\.test"):
        FileMailbox(tmp_path / "box.db", "other@fabrikam.test")


def _sender(db: str, clock: str, start: int, out: Connection) -> None:
    """Another process: send replies through its own opening of the shared mailbox, telling
    the parent each accepted number, until it is killed."""
    import anyio  # noqa: PLC0415 - the child process's own event loop

    async def main() -> None:
        state = FileMailbox(Path(db), clock=FileClock(Path(clock)))
        api = InMemoryProvider.through(state, API)
        [item] = (await api.changes(None)).items
        assert item.envelope is not None
        out.send(("clock", state.clock.now()))
        for n in range(start, start + 100_000):
            message = reply(item.envelope, api.capabilities, f"<r{n}@fabrikam.test>")
            try:
                result = await api.send(await api.prepare(message))
            except OutcomeUnknown:
                out.send(("lost", n))
            else:
                out.send(("sent", result.provider_message_id))

    anyio.run(main)


@pytest.mark.slow
async def test_processes_share_one_file_mailbox_and_a_kill_loses_no_accepted_copy(
    tmp_path: Path,
) -> None:
    db, clock_path = tmp_path / "box.db", tmp_path / "clock"
    clock = FileClock(clock_path)
    state = FileMailbox(db, MAILBOX, clock=clock)
    state.deliver_raw(raw_message(1))
    state.lose_acks(0, probability=0.2, seed=11)
    clock.advance(hours=1)  # the children read the moved clock
    context = multiprocessing.get_context("spawn")
    children: list[tuple[BaseProcess, Connection]] = []
    for start in (0, 1_000_000):
        mine, theirs = context.Pipe(duplex=False)
        child = context.Process(target=_sender, args=(str(db), str(clock_path), start, theirs))
        child.start()
        children.append((child, mine))
    answered: list[tuple[str, object]] = []
    for child, pipe in children:
        assert pipe.poll(BOUND) and pipe.recv() == ("clock", clock.now())
        for _ in range(40):  # forty answers from this process, then it is killed mid-send
            assert pipe.poll(BOUND), "a sending process stopped answering"
            answered.append(pipe.recv())
        assert child.pid is not None
        os.kill(child.pid, signal.SIGKILL)
        child.join(BOUND)
        assert child.exitcode == -signal.SIGKILL

    records = state.sent_records()
    with sqlite3.connect(db) as check:
        assert check.execute("PRAGMA integrity_check").fetchone() == ("ok",)
    assert [r.number for r in records] == list(range(1, len(records) + 1))
    assert len(records) >= len(answered)
    sent_ids = {f"sent-{r.number}" for r in records}
    assert {v for kind, v in answered if kind == "sent"} <= sent_ids
    lost = {f"<r{n}@fabrikam.test>" for kind, n in answered if kind == "lost"}
    assert lost <= {r.message.internet_message_id for r in records if r.answer_lost}
    assert 0 < len(lost) < len(answered)
    api = InMemoryProvider.through(state, API)
    for record in records:
        marker = Marker(kind=MarkerKind.MESSAGE_ID, value=record.message.internet_message_id)
        copy = await api.find_sent(marker)
        assert copy is not None and copy.provider_message_id == f"sent-{record.number}"
    state.close()
