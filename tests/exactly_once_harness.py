"""The machinery the exactly-once runs share (tests/test_send_exactly_once.py, through the
fake mailbox and a Maildir, and tests/test_imap_exactly_once.py, through Dovecot and an SMTP
submission server): the station a run registers in its folder, the worker processes that
send the run's planned notes until every one is settled, the race that starts, kills and
replaces them, and the ledger read back afterwards.

A worker process runs ``worker``, which runs the test module's own ``work`` (it opens the
run's channels) in an event loop of its own; ``work`` finds the sends not yet settled
(``unsettled``) and hands them to ``send_until_settled``: in its own random order, round
after round, each send not settled meanwhile by another worker is called (``call_reported``)
and, when its outcome is uncertain, called again at once; a second uncertain outcome is the
run's to handle (``stuck``: move the clock, or ask the parent to). A worker tells the parent
over its pipe ``("ready", pid)``, ``("call", status, *extra)`` for each call, ``("error",
text)`` for each error ``send_once`` raised and ``("done", pid)``; a run may add messages of
its own, which the parent hands to the run's ``on_message``.

The parent (``Race``) starts ``WORKERS`` workers, arms up to ``CRASH_ARMS`` incarnations to
kill themselves at one of the crash ``POINTS`` around the handover, kills up to
``KILLS_FROM_OUTSIDE`` from outside by SIGKILL (a random worker, after a random number of its
calls: at once, or at a random moment within the run's ``kill_within``) and replaces each
killed worker by a fresh one, until every worker is done (a run may ask for other numbers
of workers, kills and armed incarnations: a browser run's workers take turns at one browser
session). Every wait on a worker is bounded (``BOUND``), the whole race too (the run's
``race_bound``); it stops at ``MAX_ERRORS`` errors, and a failed race leaves no worker behind.
Nothing sleeps.
"""

from __future__ import annotations

import multiprocessing
import os
import random
import signal
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, wait
from multiprocessing.context import ForkServerContext
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import Any, Generic, Protocol, TypeVar

from agent import crashpoints
from agent.domain.mail import OutgoingMessage
from agent.domain.records import SendEvent, SendIntent, SendRecord, SendState
from agent.ports import EmbeddedStore, MailProvider
from agent.services import outbound, workspaces
from agent.storage.backend import open_store
from agent.testing import FileClock

WORKERS = 4
KILLS_FROM_OUTSIDE = 8  # per run, after a random number of calls of a random worker
CRASH_ARMS = 8  # incarnations armed to kill themselves around the handover, per run
BOUND = 60.0  # seconds any wait on a worker (or on a run's server) may take
MAX_ERRORS = 20  # errors raised by send_once before a run stops (it must raise none)
POINTS = ("before_provider_send", "after_provider_send")
SETTLED = {SendState.CONFIRMED, SendState.WITH_PERSON}
FINAL = {
    outbound.SendStatus.SENT,
    outbound.SendStatus.ALREADY_SENT,
    outbound.SendStatus.RECOVERED,
    outbound.SendStatus.WITH_PERSON,
    outbound.SendStatus.REFUSED,
}
ANSWER_LOST = "OutcomeUnknown: "  # how the ledger records an answer lost after acceptance
TAKEN_OVER = "taken over from "  # a takeover's event, which keeps the state it found

Planned = tuple[SendIntent, OutgoingMessage]
Message = tuple[Any, ...]  # what a worker tells the parent: its kind first
Call = Callable[[SendIntent, OutgoingMessage], Awaitable[outbound.SendStatus | None]]


class RunPlan(Protocol):
    """What the race reads of a run's plan (each test module's frozen ``Plan``, which every
    worker of the run is given)."""

    @property
    def kind(self) -> str: ...

    @property
    def seed(self) -> int: ...


PlanT = TypeVar("PlanT", bound=RunPlan)
Work = Callable[[PlanT, str | None, str, Connection], Awaitable[None]]


def planned_notes(
    run: str, kind: str, sends: int, workspace: str, mailbox: str, recipient: str
) -> list[Planned]:
    """The ``sends`` internal notes a run of ``kind`` plans, from ``mailbox`` to
    ``recipient``, each under a key of its own (``note|kind|n``)."""
    return [
        outbound.outgoing(
            key=f"note|{kind}|{n}",
            kind="internal_note",
            workspace_id=workspace,
            task_id=None,
            mailbox_id=mailbox,
            to=(recipient,),
            subject=f"Note {n}",
            text=f"Note {n} of the {run} run.",
        )
        for n in range(sends)
    ]


# -- the station ------------------------------------------------------------------------------


def open_station(root: Path) -> EmbeddedStore:
    """The store of the station in a run's folder ``root`` (each process opens its own)."""
    return open_store(None, root / "station" / "outloop.db")


def run_clock(root: Path) -> FileClock:
    """The clock every process of the run in ``root`` shares."""
    return FileClock(root / "clock")


def register_station(root: Path, workspace: str, context: str) -> Path:
    """Make the station in ``root`` (its store, with ``workspace`` registered from the
    Workspace Context text ``context``) and the run's clock; returns the context file."""
    data_dir = workspaces.DataDir(root / "station")
    data_dir.root.mkdir(parents=True)
    clock = run_clock(root)
    source = root / "context.yaml"
    source.write_text(context, encoding="utf-8")
    store = open_store(None, data_dir.database)
    try:
        workspaces.add_workspace(store, data_dir, source, clock.now())
    finally:
        store.close()
    return source


# -- a worker ---------------------------------------------------------------------------------


def worker(work: Work[PlanT], plan: PlanT, crash: str | None, seed: str, out: Connection) -> None:
    """One worker process (what every incarnation runs): the run's ``work`` in its own event
    loop, armed to crash at ``crash`` (``point:skip``) if given, its outcomes sent on ``out``."""
    import anyio  # noqa: PLC0415 - the worker's own event loop

    anyio.run(work, plan, crash, seed, out)


def unsettled(store: EmbeddedStore, workspace: str, planned: list[Planned]) -> list[Planned]:
    """The planned sends the ledger does not have settled yet, in planned order."""
    settled = {r.key for r in store.list_sends(workspace) if r.state in SETTLED}
    return [p for p in planned if p[0].key not in settled]


async def call_reported(
    store: EmbeddedStore,
    provider: MailProvider,
    intent: SendIntent,
    message: OutgoingMessage,
    clock: FileClock,
    out: Connection,
    extra: Callable[[outbound.SendStatus], tuple[Any, ...]] = lambda _: (),
) -> outbound.SendStatus | None:
    """One ``send_once`` through ``provider``; its outcome goes to the parent as ``("call",
    status, *extra(status))`` (``extra`` runs after the outcome is known), an error's text as
    ``("error", text)``, and then the send stays pending (None)."""
    try:
        outcome = await outbound.send_once(store, provider, intent, message, clock)
    except Exception as exc:
        out.send(("error", f"{type(exc).__name__}: {exc}"))
        return None
    out.send(("call", outcome.status.value, *extra(outcome.status)))
    return outcome.status


async def send_until_settled(
    store: EmbeddedStore,
    pending: list[Planned],
    rng: random.Random,
    crash: str | None,
    out: Connection,
    call: Call,
    stuck: Callable[[], object],
) -> None:
    """Arm the crash point (if any), tell the parent the worker is ready, then go over the
    ``pending`` sends in ``rng``'s order, round after round, until every one has a final
    outcome. A send settled meanwhile by another worker is not called; one whose outcome is
    uncertain is called again at once (the copy is searched for before anything else may go
    out), and if that is uncertain too ``stuck`` is called (the copy may show later)."""
    if crash is not None:
        crashpoints.arm_from_spec(crash)
    out.send(("ready", os.getpid()))
    while pending:
        rng.shuffle(pending)
        left: list[Planned] = []
        for intent, message in pending:
            record = store.get_send(intent.key)
            if record is not None and record.state in SETTLED:
                continue  # settled by another worker: nothing to call
            status = await call(intent, message)
            if status is outbound.SendStatus.UNCERTAIN:
                status = await call(intent, message)
            if status is outbound.SendStatus.UNCERTAIN:
                stuck()
            if status not in FINAL:
                left.append((intent, message))
        pending = left


# -- the parent -------------------------------------------------------------------------------


@dataclass
class Slot:
    """One worker's place in the race, and the incarnation now in it."""

    process: BaseProcess
    pipe: Connection
    crash: str | None  # the crash point it was armed with, ``point:skip``
    calls: int = 0
    killed_by_us: bool = False


def _ignore(message: Message) -> None:
    """A run's ``on_message`` when it reads nothing more than the race does."""


@dataclass
class Race(Generic[PlanT]):
    """The parent of one run: starts ``WORKERS`` workers running ``work`` on ``plan``, kills
    and replaces them, and counts what they tell it (outcomes, errors, kills)."""

    plan: PlanT
    work: Work[PlanT]
    race_bound: float  # seconds the whole run may take
    kill_within: float | None = None  # None: a victim is killed right after its call
    on_message: Callable[[Message], None] = _ignore  # the run's own reading of each message
    workers: int = WORKERS  # workers running at once
    kills_from_outside: int = KILLS_FROM_OUTSIDE
    crash_arms: int = CRASH_ARMS
    kill_after: int = 40  # the most calls a victim makes (from its start) before it is killed
    crash_skips: int = 20  # the most hits of its crash point an armed incarnation lets pass
    rng: random.Random = field(init=False)
    context: ForkServerContext = field(init=False)
    slots: dict[int, Slot] = field(default_factory=lambda: {})
    incarnations: int = 0
    armed: int = 0
    outcomes: Counter[str] = field(default_factory=Counter[str])
    errors: list[str] = field(default_factory=lambda: [])
    kills_sent: int = 0
    victim: int = -1
    at: int = 0
    kill_at: float | None = None  # when the victim is killed (time.monotonic)
    kills_outside: int = 0
    kills_at: Counter[str] = field(default_factory=Counter[str])  # per crash point

    def __post_init__(self) -> None:
        self.rng = random.Random(self.plan.seed)
        self.context = multiprocessing.get_context("forkserver")
        # Workers start forked, the run's module (and with it this one) imported.
        self.context.set_forkserver_preload([self.work.__module__])

    @property
    def kills(self) -> int:
        """Workers killed, from outside and at the crash points."""
        return self.kills_outside + sum(self.kills_at.values())

    def start(self, number: int) -> None:
        self.incarnations += 1
        crash = None
        if self.armed < self.crash_arms and self.rng.random() < 0.75:
            self.armed += 1
            crash = f"{self.rng.choice(POINTS)}:{self.rng.randint(0, self.crash_skips)}"
        mine, theirs = self.context.Pipe(duplex=False)
        seed = f"{self.plan.seed}:{self.incarnations}"
        args = (self.work, self.plan, crash, seed, theirs)
        process = self.context.Process(target=worker, args=args)
        process.start()
        theirs.close()  # its end is the worker's alone: its death reads as EOF here
        self.slots[number] = Slot(process, mine, crash)

    def run(self) -> None:
        try:
            self._run()
        finally:  # a failed run leaves no worker behind
            for slot in self.slots.values():
                if slot.process.pid is not None and slot.process.is_alive():
                    os.kill(slot.process.pid, signal.SIGKILL)
                slot.process.join(BOUND)

    def _run(self) -> None:
        for number in range(self.workers):
            self.start(number)
        self.pick_victim()
        deadline = time.monotonic() + self.race_bound
        while self.slots:
            now = time.monotonic()
            assert now < deadline, f"the {self.plan.kind} run took too long"
            if self.kill_at is not None and now >= self.kill_at:
                self.kill_victim()
            by_pipe = {slot.pipe: n for n, slot in self.slots.items()}
            timeout = BOUND if self.kill_at is None else max(0.0, self.kill_at - now)
            ready = wait(list(by_pipe), timeout=timeout)
            assert ready or self.kill_at is not None, (
                f"no worker of the {self.plan.kind} run answered in {BOUND} s"
            )
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
                    and self.kill_at is None
                    and slot.calls >= self.at
                    and self.kills_sent < self.kills_from_outside
                    and not slot.killed_by_us
                ):
                    self.doom()

    def doom(self) -> None:
        """The victim has made its calls: kill it now, or (with ``kill_within``) at a random
        moment of what it does next - not always right after a call."""
        if self.kill_within is None:
            self.kill_victim()
        else:
            self.kill_at = time.monotonic() + self.rng.uniform(0.0, self.kill_within)

    def kill_victim(self) -> None:
        self.kill_at = None
        slot = self.slots.get(self.victim)
        if slot is not None and not slot.killed_by_us and slot.process.is_alive():
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
        self.at = self.rng.randint(1, self.kill_after)

    def note(self, message: Message) -> None:
        if message[0] == "call":
            self.outcomes[message[1]] += 1
        elif message[0] == "error":
            self.errors.append(message[1])
        self.on_message(message)

    def ended(self, number: int, slot: Slot) -> None:
        slot.process.join(BOUND)
        code = slot.process.exitcode
        slot.pipe.close()
        del self.slots[number]
        if number == self.victim:
            self.kill_at = None  # a kill due is for this incarnation, not its successor
        if code == 0:
            if number == self.victim:
                self.pick_victim()
            return
        assert code == -signal.SIGKILL, f"worker {number} exited with {code}"
        if slot.killed_by_us:
            self.kills_outside += 1
        else:
            assert slot.crash is not None, f"worker {number} was killed by no one we know"
            self.kills_at[slot.crash.partition(":")[0]] += 1
        self.start(number)  # a fresh worker in its place takes over what it left
        if self.victim not in self.slots:
            self.pick_victim()


# -- afterwards -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Ledger:
    """What the station recorded of a run: every send's record, and the events of each
    planned send (oldest first)."""

    records: dict[str, SendRecord]
    events: dict[str, list[SendEvent]]

    @classmethod
    def read(cls, root: Path, workspace: str, keys: Iterable[str]) -> Ledger:
        """The ledger of ``workspace`` in the station in ``root``, with the events of the
        sends under ``keys``."""
        store = open_station(root)
        try:
            records = {r.key: r for r in store.list_sends(workspace)}
            events = {key: store.send_events(key) for key in keys}
        finally:
            store.close()
        return cls(records, events)

    def every(self) -> list[SendEvent]:
        """The events of every planned send, send after send."""
        return [e for history in self.events.values() for e in history]

    def hand_offs(self) -> list[SendRecord]:
        """The sends left with a person."""
        return [r for r in self.records.values() if r.state is SendState.WITH_PERSON]

    def attempts(self) -> list[SendEvent]:
        """Every attempt (a takeover's event keeps the state it found: it is no attempt)."""
        return [
            e
            for e in self.every()
            if e.state is SendState.ATTEMPTING and not e.detail.startswith(TAKEN_OVER)
        ]

    def confirmed(self) -> int:
        return sum(1 for r in self.records.values() if r.state is SendState.CONFIRMED)

    def answers_lost(self) -> int:
        """Attempts whose answer was lost after the channel took the message."""
        return sum(1 for e in self.every() if e.detail.startswith(ANSWER_LOST))

    def settled_from_copy(self) -> int:
        return sum(
            1 for e in self.every() if e.state is SendState.CONFIRMED and "sent copy" in e.detail
        )

    def retries_after_proven_absence(self) -> int:
        return sum(1 for e in self.attempts() if "left no sent copy" in e.detail)

    def assert_settled(self, planned: Mapping[str, str]) -> None:
        """Every planned send (key to Message-ID) is ledgered, nothing else, every one is
        settled, and every one not confirmed is with a person for a reason."""
        assert set(self.records) == set(planned), "every planned send is ledgered, nothing else"
        assert all(r.state in SETTLED for r in self.records.values()), Counter(
            r.state for r in self.records.values()
        )
        for key, record in self.records.items():
            if record.state is not SendState.CONFIRMED:
                assert record.detail.strip(), f"{key} was handed to a person without a reason"
