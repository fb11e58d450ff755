"""``outloop bench send``: ledgered exactly-once sends per second, against bare sends through
the same fake mailbox in the same run.

One process (one core). Each of ``sends`` distinct messages goes out through
``outbound.send_once`` (prepare; the handover checked against the plan; ledgered PREPARED,
ATTEMPTING and CONFIRMED, each in its own durable transaction of the SQLite store in the
scratch directory - WAL, ``synchronous=FULL``, so every commit is an fsync; the channel's
send in between). The baseline, in the same run and through the same channel of the same
mailbox: ``provider.prepare`` + ``provider.send`` of as many other messages, nothing
ledgered and nothing checked. The two are measured in alternating blocks, so a machine that
slows down part way slows both.

The mailbox is the fake's file-backed one by default (``FileMailbox``: every accepted send
is one committed SQLite transaction, WAL, ``synchronous=NORMAL``) - the fairer comparison:
a bare send then pays for keeping the message, as every real channel does (a provider's
acceptance costs a network round trip and a durable write on its side, far more than this),
instead of a Python list append. ``mailbox="memory"`` measures against that list append.

Besides the rates the figures say what a bare send costs and what the ledger adds: the
milliseconds of each and, measured in the same run, the ledger's three writes of one send
alone (no channel), one plain durable commit with the store's exact connection settings,
and one check of a handover against its plan. ``duplicates`` and
``lost`` are counted from the fake's own copies: a ledgered send with more than one copy,
or confirmed with none.
"""

from __future__ import annotations

import os
import statistics
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import anyio

from agent.domain.handover import check_handover
from agent.domain.mail import Handover, OutgoingMessage
from agent.domain.records import SendAttempt, SendIntent, SendState
from agent.ports import EmbeddedStore, MailProvider
from agent.services import outbound, workspaces
from agent.services.clock import SystemClock
from agent.services.holder import current_holder
from agent.storage.backend import open_store
from agent.storage.sqlite import begin_immediate, connect
from agent.testing import API, FileMailbox, InMemoryProvider, MailboxState, MemoryMailbox
from agent.testing.contexts import context_yaml
from bench import choices

MAILBOXES = choices.SEND_MAILBOXES
WORKSPACE = "ws-bench-send"
MAILBOX = "support@fabrikam.test"
BLOCKS = 5
"""Each side is measured in this many blocks, the two sides alternating."""
PROBES = 200
"""Commits and handover checks measured to say what the ledger adds."""
LEDGER_WRITES = ("begin_send", "attempt_send", "complete_send")


Planned = tuple[SendIntent, OutgoingMessage]


def _planned(side: str, n: int) -> Planned:
    return outbound.outgoing(
        key=f"bench|{side}|{n}",
        kind="internal_note",
        workspace_id=WORKSPACE,
        task_id=None,
        mailbox_id=MAILBOX,
        to=("dana.levi@contoso.test",),
        cc=("noa.bar@fabrikam.test",),
        subject=f"Order {n}: the quote you asked for",
        text=f"Hello Dana,\n\nThe quote for order {n} is attached below.\n\nNoa\n",
    )


def _station(scratch: Path) -> EmbeddedStore:
    data_dir = workspaces.DataDir(scratch / "station")
    data_dir.root.mkdir(parents=True, exist_ok=True)
    source = scratch / "context.yaml"
    source.write_text(context_yaml(WORKSPACE, mailbox=MAILBOX), encoding="utf-8")
    store = open_store(None, data_dir.database)
    workspaces.add_workspace(store, data_dir, source, SystemClock().now())
    return store


async def _ledgered(
    store: EmbeddedStore, box: MailProvider, planned: list[tuple[SendIntent, OutgoingMessage]]
) -> tuple[float, list[float], Counter[str]]:
    clock = SystemClock()
    latencies: list[float] = []
    statuses: Counter[str] = Counter()
    started = time.perf_counter()
    for intent, message in planned:
        t0 = time.perf_counter()
        outcome = await outbound.send_once(store, box, intent, message, clock)
        latencies.append(time.perf_counter() - t0)
        statuses[outcome.status.value] += 1
    return time.perf_counter() - started, latencies, statuses


async def _bare(box: MailProvider, planned: list[tuple[SendIntent, OutgoingMessage]]) -> float:
    started = time.perf_counter()
    for _, message in planned:
        await box.send(await box.prepare(message))
    return time.perf_counter() - started


def _commit_ms(scratch: Path) -> float:
    """One plain one-row transaction with the store's exact connection settings (WAL,
    synchronous=FULL: an fsync per commit, BEGIN IMMEDIATE), in milliseconds."""
    db = scratch / "commits.db"
    conn = connect(db)
    conn.execute("CREATE TABLE IF NOT EXISTS rows (k TEXT PRIMARY KEY, v TEXT NOT NULL)")
    started = time.perf_counter()
    for n in range(PROBES):
        begin_immediate(conn, db)
        conn.execute("INSERT INTO rows (k, v) VALUES (?, ?)", (f"k{n}", "x" * 64))
        conn.execute("COMMIT")
    took = time.perf_counter() - started
    conn.close()
    return took / PROBES * 1000


def _ledger_writes_ms(store: EmbeddedStore, handovers: list[Handover]) -> float:
    """The ledger's writes of one new send alone (begin_send, attempt_send, complete_send:
    three durable transactions, no channel), in ms; on fresh keys of their own."""
    clock = SystemClock()
    holder = current_holder()
    started = time.perf_counter()
    for n, handover in enumerate(handovers):
        assert handover.marker is not None
        intent, _ = _planned("probe", n)
        intent = intent.model_copy(update={"holder": holder, "marker": handover.marker})
        store.begin_send(intent, clock.now())
        attempt = SendAttempt(
            channel="api",
            marker=handover.marker,
            keeps_sent_copy=True,
            sent_copy_latency=timedelta(0),
        )
        store.attempt_send(intent.key, holder, attempt, clock.now())
        store.complete_send(intent.key, f"probe-{n}", "via api", clock.now())
    return (time.perf_counter() - started) / len(handovers) * 1000


def _check_ms(handovers: list[Handover]) -> float:
    """One check of a prepared handover against its plan (the MIME read back), in ms."""
    started = time.perf_counter()
    for handover in handovers:
        check_handover(handover)
    return (time.perf_counter() - started) / len(handovers) * 1000


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


@dataclass
class _Timed:
    ledger_s: float = 0.0
    bare_s: float = 0.0
    latencies: list[float] = field(default_factory=list[float])
    statuses: Counter[str] = field(default_factory=Counter[str])


async def _timed_blocks(
    store: EmbeddedStore,
    box: InMemoryProvider,
    planned: tuple[list[Planned], list[Planned]],
    sends: int,
    progress: Callable[[str], None],
) -> _Timed:
    """Bare and ledgered sends timed block by block, alternating (after a warm-up)."""
    ledgered, bare = planned
    warm = len(ledgered) - sends
    await _ledgered(store, box, ledgered[:warm])
    await _bare(box, bare[:warm])
    timed = _Timed()
    size = -(-sends // BLOCKS)
    for block in range(BLOCKS):
        lo, hi = warm + block * size, warm + min(sends, (block + 1) * size)
        if lo >= hi:
            break
        timed.bare_s += await _bare(box, bare[lo:hi])
        took, block_latencies, block_statuses = await _ledgered(store, box, ledgered[lo:hi])
        timed.ledger_s += took
        timed.latencies += block_latencies
        timed.statuses += block_statuses
        progress(f"block {block + 1}/{BLOCKS}: {hi - warm} of {sends} sends each side")
    return timed


def _outcome(
    store: EmbeddedStore, state: MailboxState, ledgered: list[Planned]
) -> tuple[int, int, int]:
    """Duplicates (extra copies of one Message-ID), lost sends (no copy, or not confirmed)
    and the send events written, counted from the mailbox and the ledger themselves."""
    copies = Counter(r.message.internet_message_id for r in state.sent_records())
    records = {r.key: r for r in store.list_sends(WORKSPACE)}
    events = sum(len(store.send_events(intent.key)) for intent, _ in ledgered)
    duplicates = sum(n - 1 for n in copies.values() if n > 1)
    lost = sum(
        1
        for intent, _ in ledgered
        if copies[intent.internet_message_id] == 0
        or (r := records.get(intent.key)) is None
        or r.state is not SendState.CONFIRMED
    )
    return duplicates, lost, events


async def _measure(
    scratch: Path, sends: int, mailbox: str, progress: Callable[[str], None]
) -> dict[str, Any]:
    store = _station(scratch)
    state: MailboxState = (
        FileMailbox(scratch / "mailbox.db", MAILBOX)
        if mailbox == "file"
        else MemoryMailbox(MAILBOX)
    )
    box = InMemoryProvider.through(state, API)
    warm = max(5, min(50, sends // 10))
    ledgered = [_planned("ledgered", n) for n in range(warm + sends)]
    bare = [_planned("bare", n) for n in range(warm + sends)]
    try:
        timed = await _timed_blocks(store, box, (ledgered, bare), sends, progress)
        probes = [await box.prepare(m) for _, m in ledgered[:PROBES]]
        costs = (_check_ms(probes), _ledger_writes_ms(store, probes), _commit_ms(scratch))
        duplicates, lost, events = _outcome(store, state, ledgered)
    finally:
        store.close()
        if isinstance(state, FileMailbox):
            state.close()
    return _result(mailbox, sends, timed, costs, (duplicates, lost, events / len(ledgered)))


def _result(
    mailbox: str,
    sends: int,
    timed: _Timed,
    costs: tuple[float, float, float],
    counted: tuple[int, int, float],
) -> dict[str, Any]:
    check_ms, writes_ms, commit_ms = costs
    duplicates, lost, commits = counted
    rate, baseline = sends / timed.ledger_s, sends / timed.bare_s
    ledgered_ms, bare_ms = 1000 / rate, 1000 / baseline
    return {
        "bench": "send",
        "mailbox": mailbox,
        "rate_per_s": round(rate, 1),
        "baseline_per_s": round(baseline, 1),
        "ratio": round(rate / baseline, 4),
        "target_ratio": 0.8,
        "p50_ms": round(statistics.median(timed.latencies) * 1000, 3),
        "p99_ms": round(_percentile(timed.latencies, 0.99) * 1000, 3),
        "sends": sends,
        "ledgered_send_ms": round(ledgered_ms, 3),
        "bare_send_ms": round(bare_ms, 3),
        "added_by_ledger_ms": round(ledgered_ms - bare_ms, 3),
        "ledger_commits_per_send": round(commits, 2),
        "ledger_writes_ms": round(writes_ms, 3),
        "store_commit_ms": round(commit_ms, 3),
        "handover_check_ms": round(check_ms, 3),
        "statuses": dict(timed.statuses),
        "duplicates": duplicates,
        "lost": lost,
        "includes": _includes(mailbox),
        "processes": 1,
        "cpus": os.cpu_count(),
    }


def _includes(mailbox: str) -> dict[str, str]:
    return {
        "ledgered": "prepare (MIME) + handover checked against the plan + ledger writes "
        + ", ".join(LEDGER_WRITES)
        + " (each a durable SQLite commit: WAL, synchronous=FULL, fsync) + the channel's send",
        "bare": "prepare (MIME) + the channel's send, nothing ledgered or checked",
        "channel": f"the fake's {mailbox} mailbox through its API channel"
        + (
            " (each accepted send one SQLite transaction, WAL, synchronous=NORMAL)"
            if mailbox == "file"
            else " (each accepted send a list append in this process)"
        ),
    }


def run(
    scratch: Path,
    *,
    sends: int = 2000,
    mailbox: str = "file",
    progress: Callable[[str], None] = lambda _line: None,
) -> dict[str, Any]:
    """Measure ``sends`` ledgered sends and as many bare ones; the figures."""
    if mailbox not in MAILBOXES:
        raise ValueError(f"mailbox must be one of {', '.join(MAILBOXES)}")
    if sends < 1:
        raise ValueError("at least one send")
    scratch.mkdir(parents=True, exist_ok=True)
    return anyio.run(_measure, scratch, sends, mailbox, progress)
