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

import itertools
import os
import statistics
import time
from collections import Counter, defaultdict
from collections.abc import Awaitable, Callable, Generator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime
from pathlib import Path
from typing import Any, Protocol

import anyio

from agent.domain.context import Endpoint, MailServer, Security
from agent.domain.dispositions import COVERED
from agent.domain.execution import ClaimOutcome
from agent.domain.secrets import Secret
from agent.providers import rfc822
from agent.providers.imap_session import ImapSession
from agent.providers.imap_smtp import FETCH_ITEMS, INBOX, PAGE_SIZE, ImapSmtpProvider
from agent.services import intake, workspaces
from agent.services.clock import SystemClock
from agent.storage.sqlite import SqliteStore, begin_immediate, connect
from agent.testing.contexts import context_yaml

PROVIDERS = ("imap",)
"""The mail systems this bench can measure (only a standards IMAP server so far)."""
WORKSPACE = "ws-bench-intake"
MAILBOX = "support@fabrikam.test"
PASSWORD = "bench-intake"  # noqa: S105 - a throwaway server's throwaway user
CLIENT = "Dana Levi <dana.levi@contoso.test>"
"""A verified client contact of the workspace: every message becomes work."""
TARGET_RATIO = 0.5
ROUNDS = 2
BARE_REPEATS = 5
"""Bare fetches per round: each is short next to an intake cycle, so a few are averaged."""
IMAP_CALLS = ("open_folder", "uid_search", "uid_fetch", "uid_thread")
"""The ImapSession commands timed on both sides (each includes signing in when it opens
the connection)."""
STARTED = datetime(2026, 11, 2, 6, 0, tzinfo=UTC)
COMMIT_PROBES = 200
"""Plain one-row transactions measured per round: the floor of one durable write."""


class BenchError(RuntimeError):
    """The benchmark cannot run here (not root), or its mail server misbehaved."""


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


def message_id(number: int, per_thread: int) -> str:
    thread, position = divmod(number, per_thread)
    return f"<bench-{thread}-{position}@contoso.test>"


def raw_message(number: int, per_thread: int) -> bytes:
    """Synthetic client message ``number``: the first of its thread or a reply to the one
    before it, multipart text and HTML (Hebrew and English), as a mail client writes it."""
    thread, position = divmod(number, per_thread)
    threading = ""
    if position:
        refs = " ".join(message_id(thread * per_thread + j, per_thread) for j in range(position))
        threading = f"In-Reply-To: {message_id(number - 1, per_thread)}\nReferences: {refs}\n"
    subject = (
        f"Order {thread}: delivery date" if position == 0 else f"Re: Order {thread}: delivery date"
    )
    sent = format_datetime(STARTED + timedelta(minutes=number))
    boundary = f"=-bench-{number}"
    line = "Could you confirm the delivery date and the invoice for this order? "
    hebrew = "שלום, אפשר לאשר את מועד המשלוח של ההזמנה? "
    text = f"Hello,\n\n{line * 8}\n{hebrew * 4}\n\nThanks,\nDana\n"
    html = f"<html><body><p>Hello,</p><p>{line * 8}</p><p dir=rtl>{hebrew * 4}</p></body></html>\n"
    return (
        f"From: {CLIENT}\nTo: Support <{MAILBOX}>\nSubject: {subject}\nDate: {sent}\n"
        f"Message-ID: {message_id(number, per_thread)}\n{threading}MIME-Version: 1.0\n"
        f'Content-Type: multipart/alternative; boundary="{boundary}"\n\n'
        f'--{boundary}\nContent-Type: text/plain; charset="utf-8"\n'
        f"Content-Transfer-Encoding: 8bit\n\n{text}\n"
        f'--{boundary}\nContent-Type: text/html; charset="utf-8"\n'
        f"Content-Transfer-Encoding: 8bit\n\n{html}\n--{boundary}--\n"
    ).encode()


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


@dataclass
class Timers:
    """Seconds and calls by name; store calls are counted at the outermost level only."""

    seconds: defaultdict[str, float] = field(default_factory=lambda: defaultdict(float))
    calls: Counter[str] = field(default_factory=Counter[str])
    depth: int = 0

    def add(self, name: str, took: float) -> None:
        self.seconds[name] += took
        self.calls[name] += 1

    def timed_async(
        self, name: str, original: Callable[..., Awaitable[Any]]
    ) -> Callable[..., Awaitable[Any]]:
        async def timed(*args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            try:
                return await original(*args, **kwargs)
            finally:
                self.add(_imap_label(name, args), time.perf_counter() - started)

        return timed

    def timed_sync(self, name: str, original: Callable[..., Any]) -> Callable[..., Any]:
        def timed(*args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                self.add(name, time.perf_counter() - started)

        return timed

    def outermost(self, name: str, original: Callable[..., Any]) -> Callable[..., Any]:
        def timed(*args: Any, **kwargs: Any) -> Any:
            if self.depth:
                return original(*args, **kwargs)
            self.depth += 1
            started = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                self.depth -= 1
                self.add(name, time.perf_counter() - started)

        return timed


def _imap_label(name: str, args: tuple[Any, ...]) -> str:
    """A FETCH of the thread roots' Message-ID headers is told apart from the page's."""
    if name == "imap.uid_fetch" and len(args) > 2 and "HEADER.FIELDS" in str(args[2]):
        return "imap.uid_fetch_root_ids"
    return name


@contextmanager
def timing_imap(timers: Timers) -> Generator[None]:
    """Time the IMAP commands and the normalization (both sides run under it alike)."""
    originals: dict[str, Any] = {name: getattr(ImapSession, name) for name in IMAP_CALLS}
    normalize = rfc822.normalize
    for name, original in originals.items():
        setattr(ImapSession, name, timers.timed_async(f"imap.{name}", original))
    setattr(rfc822, "normalize", timers.timed_sync("normalize", normalize))  # noqa: B010
    try:
        yield
    finally:
        for name, original in originals.items():
            setattr(ImapSession, name, original)
        setattr(rfc822, "normalize", normalize)  # noqa: B010


def time_store(store: SqliteStore, timers: Timers) -> list[str]:
    """Time every public method of this store instance (outermost calls) and count its
    write transactions; the names of what was wrapped, for ``untime_store``."""
    wrapped: list[str] = []
    for name in dir(store):
        if name.startswith("_") or name == "close":
            continue
        value = getattr(store, name)
        if callable(value):
            setattr(store, name, timers.outermost(f"store.{name}", value))
            wrapped.append(name)
    setattr(store, "_write", timers.timed_sync("write_transactions", getattr(store, "_write")))  # noqa: B009, B010
    return [*wrapped, "_write"]


def untime_store(store: SqliteStore, wrapped: list[str]) -> None:
    """The store's own methods again (what the bench reads afterwards is not timed)."""
    for name in wrapped:
        delattr(store, name)


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


@dataclass
class IntakeRound:
    seconds: float
    phases: dict[str, float]
    item_ms: list[float]
    dispositions: Counter[str]
    duplicates: int
    lost: int
    clean: bool
    errors: int


async def intake_round(
    scratch: Path, dovecot: Dovecot, timers: Timers, messages: int, per_thread: int
) -> IntakeRound:
    """One whole intake cycle of a fresh workspace over the mailbox, timed."""
    clock = SystemClock()
    data_dir = workspaces.DataDir(scratch)
    data_dir.root.mkdir(parents=True)
    source = scratch / "context.yaml"
    source.write_text(context_text(dovecot), encoding="utf-8")
    store = SqliteStore(data_dir.database)
    try:
        workspaces.add_workspace(store, data_dir, source, clock.now())
        context = workspaces.load_context(store, WORKSPACE)
        server = context.mailboxes[0].server
        if server is None:
            raise BenchError("the bench's Workspace Context lost its server block")
        adapter = ImapSmtpProvider(server, MAILBOX, Secret(PASSWORD))
        wrapped = time_store(store, timers)
        marks: list[float] = []
        started = time.perf_counter()
        result = await intake.run_cycle(
            store=store,
            data_dir=data_dir,
            workspace_id=WORKSPACE,
            provider_for=lambda _workspace, _binding: adapter,
            clock=clock,
            on_progress=lambda _progress: marks.append(time.perf_counter()),
        )
        ended = time.perf_counter()
        untime_store(store, wrapped)
        return _judged(store, result, (started, marks, ended), messages, per_thread)
    finally:
        store.close()


def _judged(
    store: SqliteStore,
    result: intake.RunResult,
    times: tuple[float, list[float], float],
    messages: int,
    per_thread: int,
) -> IntakeRound:
    """The round's timings and its correctness counters, from the store itself."""
    started, marks, ended = times
    first, last = (marks[0], marks[-1]) if marks else (ended, ended)
    entries = store.ledger(result.run_id)
    mids = {
        e.item_ref: e.scanned.envelope.internet_message_id
        for e in entries
        if e.scanned is not None and e.scanned.envelope is not None
    }
    claimed = Counter(
        mids[i.item_ref]
        for i in result.items
        if i.claim is ClaimOutcome.CLAIMED and mids.get(i.item_ref) is not None
    )
    recorded = Counter(mid for mid in mids.values() if mid is not None)
    covered = {
        mids.get(e.item_ref)
        for e in entries
        if e.disposition is not None and e.disposition in COVERED
    }
    expected = {message_id(n, per_thread) for n in range(messages)}
    threads = -(-messages // per_thread)
    tasks = store.counts()["tasks"]
    reconciliation = result.reconciliation
    return IntakeRound(
        seconds=ended - started,
        phases={
            "scan_s": first - started,
            "claim_triage_report_s": last - first,
            "reconcile_s": ended - last,
        },
        item_ms=[(b - a) * 1000 for a, b in itertools.pairwise(marks)],
        dispositions=Counter(e.disposition.value if e.disposition else "NONE" for e in entries),
        duplicates=sum(n - 1 for n in claimed.values() if n > 1)
        + sum(n - 1 for n in recorded.values() if n > 1)
        + max(0, tasks - threads),
        lost=len(expected - covered),
        clean=bool(reconciliation and reconciliation.clean),
        errors=len(result.item_errors) + len(result.access_errors),
    )


# -- the run ------------------------------------------------------------------------------


def commit_ms(path: Path) -> float:
    """One plain one-row transaction with the store's exact connection settings (WAL,
    synchronous=FULL: an fsync per commit, BEGIN IMMEDIATE), in milliseconds."""
    conn = connect(path)
    try:
        conn.execute("CREATE TABLE rows (k TEXT PRIMARY KEY, v TEXT NOT NULL)")
        started = time.perf_counter()
        for number in range(COMMIT_PROBES):
            begin_immediate(conn, path)
            conn.execute("INSERT INTO rows (k, v) VALUES (?, ?)", (f"k{number}", "x" * 64))
            conn.execute("COMMIT")
        return (time.perf_counter() - started) / COMMIT_PROBES * 1000
    finally:
        conn.close()


@dataclass
class Totals:
    commit_ms: list[float] = field(default_factory=list[float])
    intake_s: float = 0.0
    bare_s: float = 0.0
    bare_fetched: int = 0
    rounds: list[IntakeRound] = field(default_factory=list[IntakeRound])
    intake_timers: Timers = field(default_factory=Timers)
    bare_timers: Timers = field(default_factory=Timers)


async def measure(
    scratch: Path,
    dovecot: Dovecot,
    messages: int,
    per_thread: int,
    rounds: int,
    progress: Callable[[str], None],
) -> Totals:
    server = mail_server(dovecot, 120)
    await bare_fetch(server, PAGE_SIZE)  # warm-up: Dovecot's caches, the page cache, imports
    totals = Totals()
    for number in range(rounds):
        order = ("intake", "bare") if number % 2 == 0 else ("bare", "intake")
        for side in order:
            if side == "bare":
                for _ in range(BARE_REPEATS):
                    with timing_imap(totals.bare_timers):
                        took, fetched = await bare_fetch(server, PAGE_SIZE)
                    if fetched != messages:
                        raise BenchError(f"the bare fetch read {fetched} of {messages} messages")
                    totals.bare_s += took
                    totals.bare_fetched += fetched
            else:
                with timing_imap(totals.intake_timers):
                    done = await intake_round(
                        scratch / f"station-{number}",
                        dovecot,
                        totals.intake_timers,
                        messages,
                        per_thread,
                    )
                totals.intake_s += done.seconds
                totals.rounds.append(done)
        totals.commit_ms.append(commit_ms(scratch / f"commits-{number}.db"))
        progress(f"round {number + 1}/{rounds}: intake and bare fetch of {messages} messages")
    return totals


def _percentile(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _breakdown(totals: Totals, rounds: int) -> dict[str, Any]:
    """Where one intake round's time goes, on average (seconds)."""
    seconds, calls = totals.intake_timers.seconds, totals.intake_timers.calls
    imap = {k: v for k, v in seconds.items() if k.startswith("imap.")}
    store = {k: v for k, v in seconds.items() if k.startswith("store.")}
    total = totals.intake_s / rounds
    accounted = (sum(imap.values()) + seconds["normalize"] + sum(store.values())) / rounds
    top_store = sorted(store.items(), key=lambda kv: -kv[1])[:8]
    phases = Counter[str]()
    for done in totals.rounds:
        phases.update(done.phases)
    return {
        "total_s": round(total, 3),
        **{k: round(v / rounds, 3) for k, v in phases.items()},
        "imap_s": round(sum(imap.values()) / rounds, 3),
        "imap_by_command": {
            k.removeprefix("imap."): {"s": round(v / rounds, 3), "calls": calls[k] // rounds}
            for k, v in sorted(imap.items())
        },
        "normalize_s": round(seconds["normalize"] / rounds, 3),
        "store_s": round(sum(store.values()) / rounds, 3),
        "store_top": {
            k.removeprefix("store."): {"s": round(v / rounds, 3), "calls": calls[k] // rounds}
            for k, v in top_store
        },
        "write_transactions": calls["write_transactions"] // rounds,
        "write_transactions_s": round(seconds["write_transactions"] / rounds, 3),
        "core_s": round(total - accounted, 3),
    }


def _figures(
    totals: Totals, messages: int, per_thread: int, rounds: int, filled: dict[str, Any]
) -> dict[str, Any]:
    rate = messages * rounds / totals.intake_s
    baseline = totals.bare_fetched / totals.bare_s
    item_ms = [x for done in totals.rounds for x in done.item_ms]
    dispositions = Counter[str]()
    for done in totals.rounds:
        dispositions.update(done.dispositions)
    bare_imap = totals.bare_timers.seconds
    bare_runs = rounds * BARE_REPEATS
    return {
        "bench": "intake",
        "provider": "imap",
        "messages": messages,
        "threads": -(-messages // per_thread),
        "rounds": rounds,
        "page_size": PAGE_SIZE,
        "rate_per_s": round(rate, 1),
        "baseline_per_s": round(baseline, 1),
        "ratio": round(rate / baseline, 3),
        "target_ratio": TARGET_RATIO,
        "intake_ms_per_message": round(1000 / rate, 3),
        "bare_fetch_ms_per_message": round(1000 / baseline, 3),
        "p50_ms": round(statistics.median(item_ms), 3) if item_ms else 0.0,
        "p99_ms": round(_percentile(item_ms, 0.99), 3),
        "duplicates": sum(done.duplicates for done in totals.rounds),
        "lost": sum(done.lost for done in totals.rounds),
        "runs_clean": sum(1 for done in totals.rounds if done.clean),
        "item_errors": sum(done.errors for done in totals.rounds),
        "dispositions": dict(sorted(dispositions.items())),
        "write_transactions_per_message": round(
            totals.intake_timers.calls["write_transactions"] / (messages * rounds), 2
        ),
        "store_commit_ms": round(statistics.fmean(totals.commit_ms), 3),
        "intake_breakdown": _breakdown(totals, rounds),
        "bare_breakdown": {
            "fetches": bare_runs,
            "total_s": round(totals.bare_s / bare_runs, 3),
            "imap_by_command": {
                k.removeprefix("imap."): round(v / bare_runs, 3)
                for k, v in sorted(bare_imap.items())
            },
        },
        "fill": filled,
        "includes": {
            "intake": "intake.run_cycle through ImapSmtpProvider into a fresh SQLite store "
            "(WAL, synchronous=FULL): sign in, read every page (EXAMINE, UID SEARCH, THREAD "
            "REFS, FETCH), normalize, resolve, key, record; claim, triage, report each "
            "item; reconcile",
            "bare": "ImapSession: sign in, EXAMINE, UID SEARCH, UID FETCH "
            f"{FETCH_ITEMS} in pages of {PAGE_SIZE}, the answers parsed; nothing else",
        },
        "cpus": os.cpu_count(),
    }


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
    if provider not in PROVIDERS:
        raise ValueError(f"provider {provider!r} is not one of {', '.join(PROVIDERS)}")
    if messages < 1 or per_thread < 1 or rounds < 1:
        raise ValueError("messages, per_thread and rounds must be at least 1")
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
        totals = anyio.run(measure, scratch, server, messages, per_thread, rounds, progress)
    finally:
        server.destroy()
    return _figures(totals, messages, per_thread, rounds, filled)
