"""Exactly once, whatever is lost: worker processes share one store, one mailbox and one
clock and send the same planned messages until every one is settled, while answers are
lost after acceptance, sent copies show late, the channel is switched after every uncertain
outcome and workers die by SIGKILL at random points (around the handover, and anywhere).

Three runs (docs/lifecycle.md, "Sending exactly once, whatever the channel"):

- the fake mailbox kept in a file (``FileMailbox``), reached through its API and IMAP
  channels (both search by Message-ID and our header; copies declared searchable within
  ``LATENCY``, shown ``FAKE_DELAY`` late); its own switches lose 30% of the answers;
- a Maildir through two channels that mark copies in opposite orders (Message-ID first,
  our header first), each wrapped in ``agent.testing.faults.FaultyChannel``: 30% of the
  answers lost, each copy shown between half the latency and the latency late (the
  Maildir's search is its own);
- a smaller run through channels that keep no sent copy: a lost answer cannot be settled
  from a copy, so it goes to a person, with the reason.

Each worker goes over the sends not yet settled in its own random order, round after round;
after an uncertain outcome it calls again at once through the other channel (whose search
the late copy usually misses), and moves the clock on by ``STEP`` if that is uncertain too.
The parent kills a random worker after a random number of its calls, some workers kill
themselves at a crash point around the handover, and each is replaced by a fresh one.

Afterwards, counted from the mailbox itself: zero duplicates (Message-IDs with more than
one copy), zero unapproved copies (a Message-ID no planned send carries), every planned
send ledgered and settled - confirmed with exactly one copy, or (only where no copy is kept)
with a person, for a reason; no send raised. The clock moves only when a worker moves it;
every wait on another process is bounded (``BOUND``); nothing sleeps.
"""

from __future__ import annotations

import email.parser
import json
import mailbox
import multiprocessing
import os
import random
import signal
import time
from collections import Counter
from dataclasses import dataclass, field, replace
from datetime import timedelta
from multiprocessing.connection import Connection, wait
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import Any

import pytest

from agent import crashpoints
from agent.domain.mail import Marker, MarkerKind, OutgoingMessage, StoredCopy
from agent.domain.records import SendIntent, SendState
from agent.ports import MailProvider
from agent.providers.maildir import SENT_FOLDER, MaildirProvider
from agent.services import outbound, workspaces
from agent.storage.backend import open_store
from agent.testing import API, IMAP, FileClock, FileMailbox, InMemoryProvider
from agent.testing.contexts import context_yaml
from agent.testing.faults import ChannelFaults, FaultyChannel
from tests.conftest import REPORTED

WS = "ws-exactly-once"
MAILBOX = "support@fabrikam.test"
CLIENT = "dana.levi@contoso.test"
WORKERS = 4
SENDS = 1_000  # per mailbox kind that keeps copies
SENDS_WITHOUT_COPY = 300
LOST = 0.3  # of the answers, after acceptance
LATENCY = timedelta(seconds=60)  # declared by every channel that keeps a copy
FAKE_DELAY = timedelta(seconds=45)  # how late the fake shows every copy
STEP = 10.0  # seconds the clock moves after each uncertain outcome
KILLS_FROM_OUTSIDE = 8  # per run, at a random call of a random worker
CRASH_ARMS = 8  # incarnations armed to kill themselves around the handover, per run
BOUND = 60.0  # seconds any wait on a worker may take
RACE_BOUND = 300.0  # seconds a whole run may take
MAX_ERRORS = 20  # errors raised by send_once before a run stops (it must raise none)
POINTS = ("before_provider_send", "after_provider_send")


@dataclass(frozen=True)
class Plan:
    """One run, as every worker of it sees it."""

    kind: str  # "fake", "maildir" or "no_copy"
    root: str
    sends: int
    seed: int

    @property
    def keeps_copies(self) -> bool:
        return self.kind != "no_copy"

    def planned(self) -> list[tuple[SendIntent, OutgoingMessage]]:
        return [
            outbound.outgoing(
                key=f"note|{self.kind}|{n}",
                kind="internal_note",
                workspace_id=WS,
                task_id=None,
                mailbox_id=MAILBOX,
                to=(CLIENT,),
                subject=f"Note {n}",
                text=f"Note {n} of the exactly-once run.",
            )
            for n in range(self.sends)
        ]


# -- the channels (built in every worker) ----------------------------------------------------


class _CountingFake(InMemoryProvider):
    """The fake through one channel, counting the searches that found no copy."""

    misses = 0

    async def find_sent(self, marker: Marker) -> StoredCopy | None:
        copy = await super().find_sent(marker)
        if copy is None:
            type(self).misses += 1
        return copy


class _CountingFaulty(FaultyChannel):
    """A wrapped channel, counting the searches that found no copy."""

    misses = 0

    async def find_sent(self, marker: Marker) -> StoredCopy | None:
        copy = await super().find_sent(marker)
        if copy is None:
            type(self).misses += 1
        return copy


def _channels(plan: Plan, clock: FileClock) -> tuple[list[MailProvider], Any]:
    """The run's two channels of its one mailbox, and the mailbox state (to close)."""
    root = Path(plan.root)
    if plan.kind == "maildir":
        faults = ChannelFaults(root / "faults.db", clock)
        orders = (
            (MarkerKind.MESSAGE_ID, MarkerKind.HEADER),
            (MarkerKind.HEADER, MarkerKind.MESSAGE_ID),
        )
        inner = [
            MaildirProvider(root / "Maildir", MAILBOX, markers=order, clock=clock)
            for order in orders
        ]
        return [_CountingFaulty(i, faults, sent_copy_latency=LATENCY) for i in inner], faults
    state = FileMailbox(root / "mailbox.db", clock=clock)
    if plan.keeps_copies:
        views = [replace(v, sent_copy_latency=LATENCY) for v in (API, IMAP)]
    else:
        views = [replace(v, keeps_sent_copy=False, markers=()) for v in (API, IMAP)]
    return [_CountingFake.through(state, view) for view in views], state


# -- a worker ---------------------------------------------------------------------------------

SETTLED = {SendState.CONFIRMED, SendState.WITH_PERSON}
FINAL = {
    outbound.SendStatus.SENT,
    outbound.SendStatus.ALREADY_SENT,
    outbound.SendStatus.RECOVERED,
    outbound.SendStatus.WITH_PERSON,
    outbound.SendStatus.REFUSED,
}


def _worker(plan: Plan, crash: str | None, seed: str, out: Connection) -> None:
    """One worker process: send every planned message not yet settled, in its own random
    order, round after round, until all are settled; tell the parent each call's outcome."""
    import anyio  # noqa: PLC0415 - the worker's own event loop

    anyio.run(_work, plan, crash, seed, out)


async def _call(
    store: Any,
    channels: list[MailProvider],
    use: dict[str, int],
    uncertain_via: dict[str, int],
    intent: SendIntent,
    message: OutgoingMessage,
    clock: FileClock,
    out: Connection,
) -> outbound.SendStatus | None:
    """One ``send_once`` through the key's current channel; after an uncertain outcome the
    key's next call goes through another channel (a switch). Its outcome goes to the parent
    (an error's text too: the send stays pending)."""
    key = intent.key
    switched = key in uncertain_via and uncertain_via.pop(key) != use[key]
    provider = channels[use[key]]
    misses_before = type(provider).misses  # type: ignore[attr-defined]
    try:
        outcome = await outbound.send_once(store, provider, intent, message, clock)
    except Exception as exc:
        out.send(("error", f"{type(exc).__name__}: {exc}"))
        return None
    if outcome.status is outbound.SendStatus.UNCERTAIN:
        uncertain_via[key] = use[key]
        use[key] = (use[key] + 1) % len(channels)
    misses = type(provider).misses - misses_before  # type: ignore[attr-defined]
    out.send(("call", outcome.status.value, switched, misses))
    return outcome.status


async def _work(plan: Plan, crash: str | None, seed: str, out: Connection) -> None:
    root = Path(plan.root)
    store = open_store(None, root / "station" / "outloop.db")
    clock = FileClock(root / "clock")
    channels, _ = _channels(plan, clock)
    rng = random.Random(seed)
    settled = {r.key for r in store.list_sends(WS) if r.state in SETTLED}
    pending = [p for p in plan.planned() if p[0].key not in settled]
    use = {intent.key: rng.randrange(len(channels)) for intent, _ in pending}
    via: dict[str, int] = {}  # the channel of each key's last uncertain outcome
    if crash is not None:
        crashpoints.arm_from_spec(crash)
    out.send(("ready", os.getpid()))
    while pending:
        rng.shuffle(pending)
        left: list[tuple[SendIntent, OutgoingMessage]] = []
        for intent, message in pending:
            record = store.get_send(intent.key)
            if record is not None and record.state in SETTLED:
                continue  # settled by another worker: nothing to call
            status = await _call(store, channels, use, via, intent, message, clock, out)
            if status is outbound.SendStatus.UNCERTAIN:
                # Forced onto the other channel at once: it searches for the copy (which may
                # not show yet) before anything else may go out.
                status = await _call(store, channels, use, via, intent, message, clock, out)
            if status is outbound.SendStatus.UNCERTAIN:
                clock.advance(seconds=STEP)
            if status not in FINAL:
                left.append((intent, message))
        pending = left
    out.send(("done", os.getpid()))
    store.close()


# -- the parent -------------------------------------------------------------------------------


@dataclass
class _Slot:
    process: BaseProcess
    pipe: Connection
    calls: int = 0
    killed_by_us: bool = False


@dataclass
class _Race:
    plan: Plan
    rng: random.Random
    context: Any
    slots: dict[int, _Slot] = field(default_factory=lambda: {})
    incarnations: int = 0
    armed: int = 0
    outcomes: Counter[str] = field(default_factory=Counter[str])
    errors: list[str] = field(default_factory=lambda: [])
    switches: int = 0
    misses: int = 0
    kills_sent: int = 0
    victim: int = -1
    at: int = 0
    kills_outside: int = 0
    kills_at_points: int = 0

    def start(self, number: int) -> None:
        self.incarnations += 1
        crash = None
        if self.armed < CRASH_ARMS and self.rng.random() < 0.75:
            self.armed += 1
            crash = f"{self.rng.choice(POINTS)}:{self.rng.randint(0, 20)}"
        mine, theirs = self.context.Pipe(duplex=False)
        seed = f"{self.plan.seed}:{self.incarnations}"
        process = self.context.Process(target=_worker, args=(self.plan, crash, seed, theirs))
        process.start()
        theirs.close()  # its end is the worker's alone: its death reads as EOF here
        self.slots[number] = _Slot(process, mine)

    def run(self) -> None:
        try:
            self._run()
        finally:  # a failed run leaves no worker behind
            for slot in self.slots.values():
                if slot.process.pid is not None and slot.process.is_alive():
                    os.kill(slot.process.pid, signal.SIGKILL)
                slot.process.join(BOUND)

    def _run(self) -> None:
        for number in range(WORKERS):
            self.start(number)
        self.pick_victim()
        deadline = time.monotonic() + RACE_BOUND
        while self.slots:
            assert time.monotonic() < deadline, f"the {self.plan.kind} run took too long"
            by_pipe = {slot.pipe: n for n, slot in self.slots.items()}
            ready = wait(list(by_pipe), timeout=BOUND)
            assert ready, f"no worker of the {self.plan.kind} run answered in {BOUND} s"
            for pipe in ready:
                number = by_pipe[pipe]  # type: ignore[index]
                slot = self.slots[number]
                try:
                    message = slot.pipe.recv()
                except EOFError:
                    self.ended(number, slot)
                    continue
                self.note(message)
                assert len(self.errors) < MAX_ERRORS, f"send_once raised: {self.errors[:3]}"
                slot.calls += message[0] == "call"
                if (
                    number == self.victim
                    and slot.calls >= self.at
                    and self.kills_sent < KILLS_FROM_OUTSIDE
                    and not slot.killed_by_us
                ):
                    slot.killed_by_us = True
                    self.kills_sent += 1
                    assert slot.process.pid is not None
                    os.kill(slot.process.pid, signal.SIGKILL)
                    self.pick_victim()

    def pick_victim(self) -> None:
        """The next worker killed from outside, and after how many of its calls (counted
        from its start): one of those still running."""
        running = sorted(n for n, slot in self.slots.items() if not slot.killed_by_us)
        self.victim = self.rng.choice(running) if running else -1
        self.at = self.rng.randint(1, 40)

    def note(self, message: tuple[Any, ...]) -> None:
        if message[0] == "call":
            _, status, switched, misses = message
            self.outcomes[status] += 1
            self.switches += bool(switched)
            self.misses += misses
        elif message[0] == "error":
            self.errors.append(message[1])

    def ended(self, number: int, slot: _Slot) -> None:
        slot.process.join(BOUND)
        code = slot.process.exitcode
        slot.pipe.close()
        del self.slots[number]
        if code == 0:
            if number == self.victim:
                self.pick_victim()
            return
        assert code == -signal.SIGKILL, f"worker {number} exited with {code}"
        if slot.killed_by_us:
            self.kills_outside += 1
        else:
            self.kills_at_points += 1
        self.start(number)  # a fresh worker in its place takes over what it left
        if self.victim not in self.slots:
            self.pick_victim()


def _prepare(plan: Plan) -> Any:
    """The station (store and registered workspace), the clock and the mailbox, with its
    fault switches set; returns what reads the mailbox's copies afterwards."""
    root = Path(plan.root)
    data_dir = workspaces.DataDir(root / "station")
    data_dir.root.mkdir(parents=True)
    clock = FileClock(root / "clock")
    path = root / "Maildir"
    provider = "maildir" if plan.kind == "maildir" else "memory"
    source = root / "context.yaml"
    source.write_text(
        context_yaml(
            WS,
            mailbox=MAILBOX,
            provider=provider,
            path=str(path) if plan.kind == "maildir" else None,
        ),
        encoding="utf-8",
    )
    store = open_store(None, data_dir.database)
    try:
        workspaces.add_workspace(store, data_dir, source, clock.now())
    finally:
        store.close()
    if plan.kind == "maildir":
        mailbox.Maildir(str(path), create=True).add_folder(SENT_FOLDER)
        faults = ChannelFaults(root / "faults.db", clock)
        faults.lose_acks(0, probability=LOST, seed=plan.seed)
        faults.delay_sent_copies(LATENCY, at_least=LATENCY / 2)
        return faults
    state = FileMailbox(root / "mailbox.db", MAILBOX, clock=clock)
    state.lose_acks(0, probability=LOST, seed=plan.seed)
    if plan.keeps_copies:
        state.delay_sent_copies(FAKE_DELAY)
    return state


def _copies(plan: Plan, mailbox_state: Any) -> list[str]:
    """The Message-ID of every message the mailbox took for sending, from the mailbox."""
    if plan.kind != "maildir":
        assert isinstance(mailbox_state, FileMailbox)
        return [r.message.internet_message_id for r in mailbox_state.sent_records()]
    sent = mailbox.Maildir(str(Path(plan.root) / "Maildir"), create=False).get_folder(SENT_FOLDER)
    parser = email.parser.BytesHeaderParser()
    return [str(parser.parsebytes(sent.get_bytes(key))["Message-ID"]) for key in sent.iterkeys()]


def _exactly_once(plan: Plan) -> dict[str, Any]:
    mailbox_state = _prepare(plan)
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload([__name__])  # workers start forked, modules imported
    race = _Race(plan, random.Random(plan.seed), context)
    race.run()

    planned = {intent.key: intent.internet_message_id for intent, _ in plan.planned()}
    copies = _copies(plan, mailbox_state)
    per_id = Counter(copies)
    store = open_store(None, Path(plan.root) / "station" / "outloop.db")
    try:
        ledger = {r.key: r for r in store.list_sends(WS)}
        events = [e for key in planned for e in store.send_events(key)]
    finally:
        store.close()
    hand_offs = [r for r in ledger.values() if r.state is SendState.WITH_PERSON]
    attempts = [  # a takeover's event keeps the state it found: it is no attempt
        e
        for e in events
        if e.state is SendState.ATTEMPTING and not e.detail.startswith("taken over from")
    ]
    counts: dict[str, Any] = {
        "sends": len(planned),
        "workers": WORKERS,
        "calls": sum(race.outcomes.values()),
        "copies": len(copies),
        "duplicates": sum(1 for n in per_id.values() if n > 1),
        "unapproved": sum(1 for mid in copies if mid not in set(planned.values())),
        "confirmed": sum(1 for r in ledger.values() if r.state is SendState.CONFIRMED),
        "attempts": len(attempts),
        "answers_lost": sum(1 for e in events if e.detail.startswith("OutcomeUnknown")),
        "uncertain_outcomes": race.outcomes["uncertain"],
        "searches_missed": race.misses,
        "settled_from_copy": sum(
            1 for e in events if e.state is SendState.CONFIRMED and "sent copy" in e.detail
        ),
        "retries_after_proven_absence": sum(1 for e in attempts if "left no sent copy" in e.detail),
        "channel_switches": race.switches,
        "kills": race.kills_outside + race.kills_at_points,
        "kills_from_outside": race.kills_outside,
        "kills_around_the_handover": race.kills_at_points,
        "in_progress_outcomes": race.outcomes["in_progress"],
        "errors": len(race.errors),
        "hand_offs": len(hand_offs),
        "hand_off_reasons": dict(Counter(r.detail for r in hand_offs)),
    }
    if isinstance(mailbox_state, ChannelFaults):
        counts["copies_late_past_a_search"] = sum(
            1 for a in mailbox_state.accepted() if a.hidden_searches > 0
        )
    mailbox_state.close()
    print(f"exactly-once {plan.kind}: {json.dumps(counts)}")
    REPORTED[f"exactly-once {plan.kind}"] = counts

    assert race.errors == [], race.errors[:5]
    assert counts["duplicates"] == 0, [mid for mid, n in per_id.items() if n > 1][:5]
    assert counts["unapproved"] == 0
    assert set(ledger) == set(planned), "every planned send is ledgered, nothing else"
    assert all(r.state in SETTLED for r in ledger.values()), Counter(
        r.state for r in ledger.values()
    )
    for key, record in ledger.items():
        if record.state is SendState.CONFIRMED:
            assert per_id[planned[key]] == 1, (
                f"{key} is confirmed with {per_id[planned[key]]} copies"
            )
        else:
            assert record.detail.strip(), f"{key} was handed to a person without a reason"
    assert counts["kills"] >= 5 and counts["answers_lost"] > 0
    return counts


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["fake", "maildir"])
def test_thousands_of_sends_through_lost_answers_late_copies_switches_and_kills_go_out_once(
    kind: str, tmp_path: Path
) -> None:
    counts = _exactly_once(Plan(kind, str(tmp_path), SENDS, seed=20261130))
    assert counts["confirmed"] == SENDS, "every send settled from its copy or sent: none lost"
    assert counts["hand_offs"] == 0, "a channel that keeps a searchable copy hands nothing over"
    assert counts["settled_from_copy"] > 0 and counts["searches_missed"] > 0
    assert counts["channel_switches"] > 0


@pytest.mark.slow
def test_a_lost_answer_through_channels_without_a_sent_copy_goes_to_a_person_never_out_twice(
    tmp_path: Path,
) -> None:
    counts = _exactly_once(Plan("no_copy", str(tmp_path), SENDS_WITHOUT_COPY, seed=20261201))
    assert counts["hand_offs"] > 0
    for reason in counts["hand_off_reasons"]:
        assert "keeps no sent copy" in reason
        assert any(f"through {channel}" in reason for channel in ("api", "imap")), reason
    assert counts["confirmed"] + counts["hand_offs"] == SENDS_WITHOUT_COPY
    assert counts["copies"] <= SENDS_WITHOUT_COPY
