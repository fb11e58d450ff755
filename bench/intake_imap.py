"""``outloop bench intake --provider imap``: messages per second from a Dovecot mailbox to
claimed, triaged tasks, against a bare fetch of the same messages in the same run.

The bench starts its own throwaway Dovecot (``fixtures/dovecot.py``: IMAP and LMTP on
127.0.0.1, so it must run as root) and fills one user's INBOX with ``messages`` synthetic
client messages, ``per_thread`` to a thread (a first message and its replies, each with
In-Reply-To and References; multipart text and HTML, about 2.3 KB). The files are written
straight into the user's Maildir and Dovecot indexes them at the next login, as it does
mail any delivery agent leaves there: measured side by side, 1.3 s for 2,000 messages where
LMTP over one connection took 15 s (each delivery a durable write and an index update). The
indexing is done, and timed, before anything is measured.

One side is the product: one whole intake cycle (``intake.run_cycle``: scan - read,
normalize, resolve, key and record each page with its cursor - then claim, triage and
report each item, then reconcile) of a workspace whose mailbox is that IMAP mailbox,
through ``ImapSmtpProvider`` into a fresh SQLite store in the scratch directory (WAL,
``synchronous=FULL``: every commit an fsync). The other, the baseline, fetches the same
messages with the same IMAP client (``ImapSession``: sign in, EXAMINE, ``UID SEARCH``, then
``UID FETCH (UID INTERNALDATE BODY.PEEK[])`` in pages of the adapter's size, the response
parsed into items) and does nothing with them. Both sign in afresh. After a warm-up
fetch, the two sides run ``rounds`` times, alternating which goes first; each intake round
has a fresh store (a second run over the same store would read nothing new), and each
round's baseline is ``BARE_REPEATS`` bare fetches in a row (one takes a second or less, so
one alone would be at the mercy of a moment's load). Each round also times plain one-row
commits with the store's settings (``store_commit_ms``): the floor of one durable write.

``duplicates``: occurrences claimed more than once in a round, items recorded more than
once for one message, and tasks beyond one per thread. ``lost``: messages of the mailbox
without a recorded item that has a covered disposition. Both are summed over the rounds.
``intake_breakdown`` says where intake's time goes, measured in the same rounds by timers
around the IMAP commands (by command), ``rfc822.normalize``, and the store's methods (the
outermost call only, with its write transactions counted); ``core_s`` is the rest (planning,
triage, the models).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from datetime import timedelta
from functools import partial
from pathlib import Path
from typing import Any, Protocol

import anyio

from agent.domain.context import Endpoint, MailboxBinding, MailServer, Security
from agent.domain.secrets import Secret
from agent.providers.imap_session import ImapSession
from agent.providers.imap_smtp import FETCH_ITEMS, INBOX, PAGE_SIZE, ImapSmtpProvider
from agent.testing.contexts import context_yaml
from bench import choices
from bench.intake_common import (
    MAILBOX,
    ROUNDS,
    STARTED,
    WORKSPACE,
    BenchError,
    Shape,
    Sides,
    Timers,
    Wire,
    checked,
    figures,
    measure,
    raw_message,
    timing,
)

PROVIDERS = choices.IMAP_PROVIDERS
PASSWORD = "bench-intake"  # noqa: S105 - a throwaway server's throwaway user
BARE_REPEATS = 5
"""Bare fetches per round: each is short next to an intake cycle, so a few are averaged."""
IMAP_CALLS = ("open_folder", "uid_search", "uid_fetch", "uid_thread")
"""The ImapSession commands timed on both sides (each includes signing in when it opens
the connection)."""
WIRE = Wire(prefix="imap", by="imap_by_command")


class Dovecot(Protocol):
    """What the bench uses of its throwaway mail server: ``fixtures.dovecot.Dovecot``, which
    the CLI hands in (the benchmarks import nothing of the fixtures; see the dependency rule
    in ARCHITECTURE.md)."""

    @property
    def host(self) -> str: ...
    @property
    def imap_port(self) -> int: ...
    @property
    def lmtp_port(self) -> int: ...
    def start(self) -> object: ...
    def destroy(self) -> None: ...
    def add_user(self, address: str, password: str) -> None: ...
    def maildir(self, address: str) -> Path: ...
    def uids(
        self, address: str, password: str | None = None, folder: str = "INBOX"
    ) -> list[int]: ...


DovecotFactory = Callable[[Path], Dovecot]
"""A stopped server whose files live in the given directory."""


# -- the mailbox ------------------------------------------------------------------------


def fill(dovecot: Dovecot, messages: int, per_thread: int) -> dict[str, Any]:
    """Write the messages into the user's Maildir (``cur``, unseen; the modification time is
    the Date, which Dovecot gives as INTERNALDATE), then let Dovecot index them."""
    started = time.perf_counter()
    dovecot.uids(MAILBOX)  # the first login creates the Maildir
    folder = dovecot.maildir(MAILBOX) / "cur"
    owner = folder.stat()
    written = 0
    for number in range(messages):
        raw = raw_message(number, per_thread)
        stamp = (STARTED + timedelta(minutes=number)).timestamp()
        path = folder / f"{int(stamp)}.M{number}P{os.getpid()}.outloop-bench:2,"
        with path.open("xb") as handle:
            handle.write(raw)
        os.chown(path, owner.st_uid, owner.st_gid)
        os.utime(path, (stamp, stamp))
        written += len(raw)
    wrote = time.perf_counter() - started
    uids = dovecot.uids(MAILBOX)
    if len(uids) != messages:
        raise BenchError(f"Dovecot indexed {len(uids)} of the {messages} messages written")
    return {
        "method": "maildir files, indexed by Dovecot",
        "write_s": round(wrote, 3),
        "index_s": round(time.perf_counter() - started - wrote, 3),
        "bytes": written,
    }


# -- timers -------------------------------------------------------------------------------


def _imap_label(name: str, args: tuple[Any, ...]) -> str:
    """A FETCH of the thread roots' Message-ID headers is told apart from the page's."""
    if name == "imap.uid_fetch" and len(args) > 2 and "HEADER.FIELDS" in str(args[2]):
        return "imap.uid_fetch_root_ids"
    return name


def timing_imap(timers: Timers) -> AbstractContextManager[None]:
    """Time the IMAP commands and the normalization (both sides run under it alike)."""
    return timing(timers, [(ImapSession, n, f"imap.{n}", _imap_label) for n in IMAP_CALLS])


# -- the two sides ------------------------------------------------------------------------


def mail_server(dovecot: Dovecot, timeout: float) -> MailServer:
    """The Dovecot's IMAP; the SMTP endpoint is never reached (intake sends nothing: the
    workspace sends no receipt acknowledgement)."""
    return MailServer(
        imap=Endpoint(host=dovecot.host, port=dovecot.imap_port, security=Security.NONE),
        smtp=Endpoint(host=dovecot.host, port=dovecot.lmtp_port, security=Security.NONE),
        username=MAILBOX,
        timeout_seconds=timeout,
    )


def context_text(dovecot: Dovecot) -> str:
    block = (
        f"server: {{imap: {{host: {dovecot.host}, port: {dovecot.imap_port}, security: none}}, "
        f"smtp: {{host: {dovecot.host}, port: {dovecot.lmtp_port}, security: none}}, "
        f"username: '{MAILBOX}', timeout_seconds: 120}}"
    )
    return context_yaml(WORKSPACE, mailbox=MAILBOX, provider="imap", mailbox_fields=block)


async def bare_fetch(server: MailServer, page_size: int) -> tuple[float, int]:
    """Sign in, EXAMINE the inbox, search every UID and fetch them all in pages with the
    adapter's FETCH items; the seconds it took and the messages fetched."""
    session = ImapSession(server, MAILBOX, Secret(PASSWORD))
    started = time.perf_counter()
    fetched = 0
    try:
        await session.open_folder(INBOX)
        uids = sorted(await session.uid_search("UID 1:*"))
        for lo in range(0, len(uids), page_size):
            items = await session.uid_fetch(uids[lo : lo + page_size], FETCH_ITEMS)
            fetched += sum(1 for item in items if item.get(b"BODY[]"))
    finally:
        await session.close()
    return time.perf_counter() - started, fetched


def _adapter(binding: MailboxBinding) -> ImapSmtpProvider:
    if binding.server is None:
        raise BenchError("the bench's Workspace Context lost its server block")
    return ImapSmtpProvider(binding.server, MAILBOX, Secret(PASSWORD))


# -- the run ------------------------------------------------------------------------------


def run(
    scratch: Path,
    dovecot: DovecotFactory,
    *,
    provider: str = "imap",
    messages: int = 2000,
    per_thread: int = 4,
    rounds: int = ROUNDS,
    progress: Callable[[str], None] = lambda _line: None,
) -> dict[str, Any]:
    """Measure intake against the bare fetch in ``scratch`` (a fresh directory), on a
    throwaway server ``dovecot(scratch / "dovecot")`` started, and destroyed, here."""
    checked(provider, PROVIDERS, messages, per_thread, rounds)
    if os.geteuid() != 0:
        raise BenchError(
            "outloop bench intake --provider imap starts a private Dovecot, which must be "
            "started as root (it drops to the 'mail' user to read the mail): run it as root, "
            "as the tests are"
        )
    scratch.mkdir(parents=True, exist_ok=True)
    server = dovecot(scratch / "dovecot")
    try:
        progress("starting a throwaway Dovecot on 127.0.0.1")
        server.start()
        server.add_user(MAILBOX, PASSWORD)
        progress(f"filling the INBOX with {messages} messages, {per_thread} to a thread")
        filled = fill(server, messages, per_thread)
        sides = Sides(
            bare=partial(bare_fetch, mail_server(server, 120), PAGE_SIZE),
            context_text=context_text(server),
            adapter_for=_adapter,
            timing=timing_imap,
            bare_repeats=BARE_REPEATS,
        )
        totals = anyio.run(measure, scratch, sides, messages, per_thread, rounds, progress)
    finally:
        server.destroy()
    shape = Shape("imap", messages, per_thread, rounds, PAGE_SIZE, BARE_REPEATS, WIRE)
    return figures(
        totals,
        shape,
        filled,
        {
            "intake": "intake.run_cycle through ImapSmtpProvider into a fresh SQLite store "
            "(WAL, synchronous=FULL): sign in, read every page (EXAMINE, UID SEARCH, THREAD "
            "REFS, FETCH), normalize, resolve, key, record; claim, triage, report each "
            "item; reconcile",
            "bare": "ImapSession: sign in, EXAMINE, UID SEARCH, UID FETCH "
            f"{FETCH_ITEMS} in pages of {PAGE_SIZE}, the answers parsed; nothing else",
        },
    )
