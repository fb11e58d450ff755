"""What the intake benchmarks share (``bench/intake_imap.py``, ``bench/intake_api.py``): the
synthetic mailbox, the timers, one intake round into a fresh store and its judgement, the
alternating rounds, and the figures every provider reports.

A provider's bench supplies the mailbox (filled on its own server), the adapter an intake
round reads through, the bare fetch, and the timing of its wire (IMAP commands, HTTP
requests). ``duplicates`` and ``lost`` are counted here, from the store, alike for all.
"""

from __future__ import annotations

import itertools
import os
import statistics
import time
from collections import Counter, defaultdict
from collections.abc import Awaitable, Callable, Generator, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime
from pathlib import Path
from typing import Any

from agent.domain.context import MailboxBinding
from agent.domain.dispositions import COVERED
from agent.domain.execution import ClaimOutcome
from agent.ports import MailProvider
from agent.providers import rfc822
from agent.services import intake, workspaces
from agent.services.clock import SystemClock
from agent.storage.sqlite import SqliteStore, begin_immediate, connect
from bench import choices

WORKSPACE = "ws-bench-intake"
MAILBOX = "support@fabrikam.test"
CLIENT = "Dana Levi <dana.levi@contoso.test>"
"""A verified client contact of the workspace: every message becomes work."""
TARGET_RATIO = 0.5
ROUNDS = choices.INTAKE_ROUNDS
STARTED = datetime(2026, 11, 2, 6, 0, tzinfo=UTC)
COMMIT_PROBES = 200
"""Plain one-row transactions measured per round: the floor of one durable write."""


class BenchError(RuntimeError):
    """The benchmark cannot run here, or its mail server misbehaved."""


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


# -- timers -------------------------------------------------------------------------------


Label = Callable[[str, tuple[Any, ...]], str]
"""The name a wire call is counted under, from its name and arguments."""


@dataclass
class Timers:
    """Seconds and calls by name; store calls are counted at the outermost level only.

    Wire calls (``timed_async``) may overlap (HTTP requests in flight together), so beside
    each call's own seconds, ``wire_s`` is the wall time during which at least one was in
    flight and no timed synchronous section (normalization, the store) held the event loop:
    the wire's share of the wall time, disjoint from theirs."""

    seconds: defaultdict[str, float] = field(default_factory=lambda: defaultdict(float))
    calls: Counter[str] = field(default_factory=Counter[str])
    depth: int = 0
    wire_s: float = 0.0
    in_flight: int = 0
    blocked: int = 0
    since: float = 0.0

    def add(self, name: str, took: float) -> None:
        self.seconds[name] += took
        self.calls[name] += 1

    def _tick(self) -> float:
        now = time.perf_counter()
        if self.in_flight and not self.blocked:
            self.wire_s += now - self.since
        self.since = now
        return now

    def timed_async(
        self,
        name: str,
        original: Callable[..., Awaitable[Any]],
        label: Label = lambda name, _args: name,
    ) -> Callable[..., Awaitable[Any]]:
        async def timed(*args: Any, **kwargs: Any) -> Any:
            started = self._tick()
            self.in_flight += 1
            try:
                return await original(*args, **kwargs)
            finally:
                ended = self._tick()
                self.in_flight -= 1
                self.add(label(name, args), ended - started)

        return timed

    def timed_sync(self, name: str, original: Callable[..., Any]) -> Callable[..., Any]:
        def timed(*args: Any, **kwargs: Any) -> Any:
            started = self._tick()
            self.blocked += 1
            try:
                return original(*args, **kwargs)
            finally:
                ended = self._tick()
                self.blocked -= 1
                self.add(name, ended - started)

        return timed

    def outermost(self, name: str, original: Callable[..., Any]) -> Callable[..., Any]:
        timed = self.timed_sync(name, original)

        def outer(*args: Any, **kwargs: Any) -> Any:
            if self.depth:
                return original(*args, **kwargs)
            self.depth += 1
            try:
                return timed(*args, **kwargs)
            finally:
                self.depth -= 1

        return outer


WireCall = tuple[object, str, str, Label]
"""An async wire call to time: its owner (a class), its attribute, its timer name, and how
a call is labelled."""


@contextmanager
def timing(timers: Timers, calls: Sequence[WireCall]) -> Generator[None]:
    """Time the wire ``calls`` and the normalization (``rfc822.normalize``) while inside:
    both sides of a bench run under it alike."""
    originals = [(owner, attribute, getattr(owner, attribute)) for owner, attribute, *_ in calls]
    normalize = rfc822.normalize
    for (owner, attribute, original), (*_, name, label) in zip(originals, calls, strict=True):
        setattr(owner, attribute, timers.timed_async(name, original, label))
    setattr(rfc822, "normalize", timers.timed_sync("normalize", normalize))  # noqa: B010
    try:
        yield
    finally:
        for owner, attribute, original in originals:
            setattr(owner, attribute, original)
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


# -- one intake round ---------------------------------------------------------------------


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


AdapterFor = Callable[[MailboxBinding], MailProvider]
"""The channel an intake round reads the workspace's mailbox through, built from its binding
in the registered Workspace Context."""


async def intake_round(
    scratch: Path,
    context_text: str,
    adapter_for: AdapterFor,
    timers: Timers,
    messages: int,
    per_thread: int,
) -> IntakeRound:
    """One whole intake cycle of a fresh workspace (``context_text``) over the mailbox, into
    a fresh store in ``scratch``, timed."""
    clock = SystemClock()
    data_dir = workspaces.DataDir(scratch)
    data_dir.root.mkdir(parents=True)
    source = scratch / "context.yaml"
    source.write_text(context_text, encoding="utf-8")
    store = SqliteStore(data_dir.database)
    try:
        workspaces.add_workspace(store, data_dir, source, clock.now())
        context = workspaces.load_context(store, WORKSPACE)
        adapter = adapter_for(context.mailboxes[0])
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
        return judged(store, result, (started, marks, ended), messages, per_thread)
    finally:
        store.close()


def judged(
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


# -- the rounds ---------------------------------------------------------------------------


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


BareFetch = Callable[[], Awaitable[tuple[float, int]]]
"""One bare fetch of the whole mailbox: the seconds it took and the messages it fetched."""
Timing = Callable[[Timers], AbstractContextManager[None]]
"""The wire (and normalization) timed into the given timers while a side runs."""


@dataclass(frozen=True)
class Sides:
    """What one provider's bench measures: its bare fetch; the Workspace Context and the
    adapter of its intake rounds; how both sides' wire is timed; bare fetches per round."""

    bare: BareFetch
    context_text: str
    adapter_for: AdapterFor
    timing: Timing
    bare_repeats: int


async def measure(
    scratch: Path,
    sides: Sides,
    messages: int,
    per_thread: int,
    rounds: int,
    progress: Callable[[str], None],
) -> Totals:
    """A warm-up bare fetch, then ``rounds`` rounds alternating which side goes first: one
    intake round in a fresh store, ``bare_repeats`` bare fetches in a row, and the plain
    commit probe."""
    await sides.bare()  # warm-up: the server's caches, the page cache, imports
    totals = Totals()
    for number in range(rounds):
        order = ("intake", "bare") if number % 2 == 0 else ("bare", "intake")
        for side in order:
            if side == "bare":
                for _ in range(sides.bare_repeats):
                    with sides.timing(totals.bare_timers):
                        took, fetched = await sides.bare()
                    if fetched != messages:
                        raise BenchError(f"the bare fetch read {fetched} of {messages} messages")
                    totals.bare_s += took
                    totals.bare_fetched += fetched
            else:
                with sides.timing(totals.intake_timers):
                    done = await intake_round(
                        scratch / f"station-{number}",
                        sides.context_text,
                        sides.adapter_for,
                        totals.intake_timers,
                        messages,
                        per_thread,
                    )
                totals.intake_s += done.seconds
                totals.rounds.append(done)
        totals.commit_ms.append(commit_ms(scratch / f"commits-{number}.db"))
        progress(f"round {number + 1}/{rounds}: intake and bare fetch of {messages} messages")
    return totals


# -- the figures --------------------------------------------------------------------------


@dataclass(frozen=True)
class Wire:
    """How a provider's wire calls are named in the figures: the timers' prefix (``imap``,
    ``http``) and the key of the per-call table (``imap_by_command``, ``http_by_request``)."""

    prefix: str
    by: str


def percentile(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def breakdown(totals: Totals, rounds: int, wire: Wire) -> dict[str, Any]:
    """Where one intake round's time goes, on average (seconds)."""
    seconds, calls = totals.intake_timers.seconds, totals.intake_timers.calls
    on_wire = {k: v for k, v in seconds.items() if k.startswith(wire.prefix + ".")}
    store = {k: v for k, v in seconds.items() if k.startswith("store.")}
    total = totals.intake_s / rounds
    wire_s = totals.intake_timers.wire_s / rounds
    accounted = wire_s + (seconds["normalize"] + sum(store.values())) / rounds
    top_store = sorted(store.items(), key=lambda kv: -kv[1])[:8]
    phases = Counter[str]()
    for done in totals.rounds:
        phases.update(done.phases)
    return {
        "total_s": round(total, 3),
        **{k: round(v / rounds, 3) for k, v in phases.items()},
        f"{wire.prefix}_s": round(wire_s, 3),
        wire.by: {
            k.removeprefix(wire.prefix + "."): {
                "s": round(v / rounds, 3),
                "calls": calls[k] // rounds,
            }
            for k, v in sorted(on_wire.items())
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


def bare_breakdown(totals: Totals, runs: int, wire: Wire) -> dict[str, Any]:
    """One bare fetch, on average: its seconds and its wire calls' own seconds."""
    on_wire = totals.bare_timers.seconds
    return {
        "fetches": runs,
        "total_s": round(totals.bare_s / runs, 3),
        wire.by: {
            k.removeprefix(wire.prefix + "."): round(v / runs, 3)
            for k, v in sorted(on_wire.items())
            if k.startswith(wire.prefix + ".")
        },
    }


@dataclass(frozen=True)
class Shape:
    """What a run measured, as its figures name it."""

    provider: str
    messages: int
    per_thread: int
    rounds: int
    page_size: int
    bare_repeats: int
    wire: Wire


def figures(
    totals: Totals, shape: Shape, filled: dict[str, Any], includes: dict[str, str]
) -> dict[str, Any]:
    """The bench's JSON: the two rates and their ratio, latency, the correctness counters,
    and where the time went."""
    messages, rounds = shape.messages, shape.rounds
    rate = messages * rounds / totals.intake_s
    baseline = totals.bare_fetched / totals.bare_s
    item_ms = [x for done in totals.rounds for x in done.item_ms]
    dispositions = Counter[str]()
    for done in totals.rounds:
        dispositions.update(done.dispositions)
    return {
        "bench": "intake",
        "provider": shape.provider,
        "messages": messages,
        "threads": -(-messages // shape.per_thread),
        "rounds": rounds,
        "page_size": shape.page_size,
        "rate_per_s": round(rate, 1),
        "baseline_per_s": round(baseline, 1),
        "ratio": round(rate / baseline, 3),
        "target_ratio": TARGET_RATIO,
        "intake_ms_per_message": round(1000 / rate, 3),
        "bare_fetch_ms_per_message": round(1000 / baseline, 3),
        "p50_ms": round(statistics.median(item_ms), 3) if item_ms else 0.0,
        "p99_ms": round(percentile(item_ms, 0.99), 3),
        "duplicates": sum(done.duplicates for done in totals.rounds),
        "lost": sum(done.lost for done in totals.rounds),
        "runs_clean": sum(1 for done in totals.rounds if done.clean),
        "item_errors": sum(done.errors for done in totals.rounds),
        "dispositions": dict(sorted(dispositions.items())),
        "write_transactions_per_message": round(
            totals.intake_timers.calls["write_transactions"] / (messages * rounds), 2
        ),
        "store_commit_ms": round(statistics.fmean(totals.commit_ms), 3),
        "intake_breakdown": breakdown(totals, rounds, shape.wire),
        "bare_breakdown": bare_breakdown(totals, rounds * shape.bare_repeats, shape.wire),
        "fill": filled,
        "includes": includes,
        "cpus": os.cpu_count(),
    }


def checked(
    provider: str, providers: tuple[str, ...], messages: int, per_thread: int, rounds: int
) -> None:
    """A run's arguments, before anything is started: a provider the bench measures, and
    sizes of at least 1."""
    if provider not in providers:
        raise ValueError(f"provider {provider!r} is not one of {', '.join(providers)}")
    if messages < 1 or per_thread < 1 or rounds < 1:
        raise ValueError("messages, per_thread and rounds must be at least 1")
