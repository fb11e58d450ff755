"""The MailProvider contract (agent/testing/providers.py), run on every adapter: the fake
through each of its channels (in memory, and kept in a file several processes share), and
the Maildir. A new adapter is done when a class of a few lines here passes."""

from __future__ import annotations

import mailbox
import shutil
from collections.abc import Mapping
from dataclasses import replace
from datetime import timedelta
from hashlib import sha256
from pathlib import Path
from typing import ClassVar

from agent.domain.mail import MarkerKind
from agent.ports import MailProvider
from agent.providers.maildir import MaildirProvider
from agent.testing import (
    API,
    BROWSER,
    IMAP,
    ChannelView,
    FileClock,
    FileMailbox,
    FrozenClock,
    InMemoryProvider,
    MailboxState,
    MemoryMailbox,
)
from agent.testing.providers import MAILBOX, Fault, MailboxHooks, MailProviderContract

VIEWS = {
    "api": replace(API, page_size=3, sent_copy_latency=timedelta(seconds=10)),
    "browser": replace(BROWSER, page_size=3),
    "imap": replace(IMAP, page_size=3),
}


class OnFake(MailboxHooks):
    """The fake mailbox, shown through its api, browser and imap channels; ``channels[0]``
    is the one a test builds unless it names another."""

    faults: ClassVar[frozenset[Fault]] = frozenset(Fault)
    cannot: ClassVar[Mapping[Fault, str]] = {}
    channels: ClassVar[tuple[str, ...]] = ("api", "browser", "imap")
    state: MailboxState
    clock: FrozenClock | FileClock
    dropped: bool
    no_copy: bool

    def setup_mailbox(self) -> None:
        self.clock = FrozenClock()
        self.state = MemoryMailbox(MAILBOX, "memory", self.clock)
        self.dropped = self.no_copy = False

    def view(self, channel: str | None) -> ChannelView:
        view = VIEWS[channel or self.channels[0]]
        if self.dropped and not view.replaces_message_id:
            kept = tuple(k for k in view.markers if k is not MarkerKind.MESSAGE_ID)
            view = replace(view, replaces_message_id=True, markers=kept)
        if self.no_copy:
            view = replace(view, keeps_sent_copy=False, markers=())
        return view

    def build(
        self, *, channel: str | None = None, markers: tuple[MarkerKind, ...] | None = None
    ) -> MailProvider:
        view = self.view(channel)
        if markers is not None:
            assert set(markers) <= set(view.markers)
            view = replace(view, markers=markers)
        return InMemoryProvider.through(self.state, view)

    def deliver(self, raw: bytes) -> None:
        self.state.deliver_raw(raw)

    def flip(self, fault: Fault) -> None:
        view = self.view(None)
        if fault is Fault.LOST_ACK:
            self.state.lose_acks(1)
        elif fault is Fault.LATE_SENT_COPY:
            self.state.delay_sent_copies(view.sent_copy_latency, channel=view.name)
        elif fault is Fault.EXPIRED_CURSOR:
            self.state.expire_cursors()
        elif fault is Fault.DROPPED_MESSAGE_ID:
            self.dropped = True
        else:
            self.no_copy = True

    def advance(self, delta: timedelta) -> None:
        self.clock.advance(seconds=delta.total_seconds())

    def snapshot(self) -> Mapping[str, str]:
        return self.state.snapshot()

    def sent_copies(self, message_id: str) -> int:
        # What the channel handed over (a provider that replaces our Message-ID on its copy,
        # or keeps no copy, still took the message).
        sent = self.state.sent_records()
        return sum(1 for record in sent if record.message.internet_message_id == message_id)


class TestFakeThroughItsApi(OnFake, MailProviderContract): ...


class TestFakeThroughItsBrowser(OnFake, MailProviderContract):
    channels: ClassVar[tuple[str, ...]] = ("browser", "api", "imap")


class TestFakeThroughImapWithoutNativeThreads(OnFake, MailProviderContract):
    channels: ClassVar[tuple[str, ...]] = ("imap", "api", "browser")
    faults: ClassVar[frozenset[Fault]] = frozenset(Fault) - {Fault.LATE_SENT_COPY}
    cannot: ClassVar[Mapping[Fault, str]] = {
        Fault.LATE_SENT_COPY: "an IMAP client appends its own sent copy: searchable at once",
    }


class OnFakeInAFile(OnFake):
    """The fake mailbox kept in a SQLite file, with a clock in a file (what several
    processes share)."""

    def setup_mailbox(self) -> None:
        self.clock = FileClock(self.where / "clock")
        self.state = FileMailbox(self.where / "mailbox.db", MAILBOX, "memory", self.clock)
        self.dropped = self.no_copy = False

    def teardown_mailbox(self) -> None:
        assert isinstance(self.state, FileMailbox)
        self.state.close()


class TestFakeInAFileThroughItsApi(OnFakeInAFile, MailProviderContract): ...


class TestFakeInAFileThroughItsBrowser(OnFakeInAFile, MailProviderContract):
    channels: ClassVar[tuple[str, ...]] = ("browser", "api", "imap")


class OnMaildir(MailboxHooks):
    """A Maildir in the test's directory."""

    faults: ClassVar[frozenset[Fault]] = frozenset({Fault.EXPIRED_CURSOR})
    cannot: ClassVar[Mapping[Fault, str]] = {
        Fault.LOST_ACK: "writing a local file returns or fails: there is no answer to lose",
        Fault.LATE_SENT_COPY: "a copy written to .Sent is searchable at once (latency 0)",
        Fault.DROPPED_MESSAGE_ID: "the Maildir keeps every header we write",
        Fault.NO_SENT_COPY: "a Maildir send is the writing of its sent copy",
    }

    @property
    def path(self) -> Path:
        return self.where / "Maildir"

    def setup_mailbox(self) -> None:
        mailbox.Maildir(str(self.path), create=True).add_folder("Sent")  # as a mail client makes it

    def build(
        self, *, channel: str | None = None, markers: tuple[MarkerKind, ...] | None = None
    ) -> MailProvider:
        assert channel in (None, self.channels[0])
        if markers is None:
            return MaildirProvider(self.path, MAILBOX, page_size=3)
        return MaildirProvider(self.path, MAILBOX, page_size=3, markers=markers)

    def deliver(self, raw: bytes) -> None:
        mailbox.Maildir(str(self.path), create=False).add(raw)

    def flip(self, fault: Fault) -> None:
        assert fault is Fault.EXPIRED_CURSOR
        old = self.path.with_name("Maildir.old")
        self.path.rename(old)  # the folder is rebuilt: the same messages in new files
        shutil.copytree(old, self.path)
        shutil.rmtree(old)

    def advance(self, delta: timedelta) -> None:
        raise AssertionError("a Maildir's copies are searchable at once")

    def snapshot(self) -> Mapping[str, str]:
        return {
            str(p.relative_to(self.path)): sha256(p.read_bytes()).hexdigest()
            for p in sorted(self.path.rglob("*"))
            if p.is_file() and "tmp" not in p.relative_to(self.path).parts
        }

    def sent_copies(self, message_id: str) -> int:
        sent = mailbox.Maildir(str(self.path), create=False).get_folder("Sent")
        return sum(1 for message in sent if message["Message-ID"] == message_id)

    def context_path(self) -> str | None:
        return str(self.path)


class TestMaildir(OnMaildir, MailProviderContract): ...
