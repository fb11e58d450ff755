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
themselves at a crash point around the handover, and each is replaced by a fresh one (the
workers' loop and the parent are tests/exactly_once_harness.py's; the channels are this run's).

Afterwards, counted from the mailbox itself: zero duplicates (Message-IDs with more than
one copy), zero unapproved copies (a Message-ID no planned send carries), every planned
send ledgered and settled - confirmed with exactly one copy, or (only where no copy is kept)
with a person, for a reason; no send raised. The clock moves only when a worker moves it;
every wait on another process is bounded (the harness's ``BOUND``); nothing sleeps.
"""

from __future__ import annotations

import email.parser
import json
import mailbox
import os
import random
from collections import Counter
from dataclasses import dataclass, replace
from datetime import timedelta
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import pytest

from agent.domain.mail import Marker, MarkerKind, OutgoingMessage, StoredCopy
from agent.domain.records import SendIntent, SendState
from agent.ports import EmbeddedStore, MailProvider
from agent.providers.maildir import SENT_FOLDER, MaildirProvider
from agent.services import outbound
from agent.testing import API, IMAP, FileClock, FileMailbox, InMemoryProvider
from agent.testing.contexts import context_yaml
from agent.testing.faults import ChannelFaults, FaultyChannel
from tests import exactly_once_harness as harness
from tests.conftest import REPORTED

WS = "ws-exactly-once"
MAILBOX = "support@fabrikam.test"
CLIENT = "dana.levi@contoso.test"
SENDS = 1_000  # per mailbox kind that keeps copies
SENDS_WITHOUT_COPY = 300
LOST = 0.3  # of the answers, after acceptance
LATENCY = timedelta(seconds=60)  # declared by every channel that keeps a copy
FAKE_DELAY = timedelta(seconds=45)  # how late the fake shows every copy
STEP = 10.0  # seconds the clock moves after each uncertain outcome
RACE_BOUND = 300.0  # seconds a whole run may take


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

    def planned(self) -> list[harness.Planned]:
        return harness.planned_notes("exactly-once", self.kind, self.sends, WS, MAILBOX, CLIENT)


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


# -- a worker (harness.worker runs _work) -----------------------------------------------------


async def _call(
    store: EmbeddedStore,
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
    with whether it was a switch and how many searches found no copy."""
    key = intent.key
    switched = key in uncertain_via and uncertain_via.pop(key) != use[key]
    provider = channels[use[key]]
    misses_before = type(provider).misses  # type: ignore[attr-defined]

    def switch(status: outbound.SendStatus) -> tuple[bool, int]:
        if status is outbound.SendStatus.UNCERTAIN:
            uncertain_via[key] = use[key]
            use[key] = (use[key] + 1) % len(channels)
        return switched, type(provider).misses - misses_before  # type: ignore[attr-defined]

    return await harness.call_reported(store, provider, intent, message, clock, out, switch)


async def _work(plan: Plan, crash: str | None, seed: str, out: Connection) -> None:
    """Send every planned message not yet settled through the run's two channels, each
    key's first through a random one; after an uncertain outcome the key's next call goes
    through the other channel (whose search the late copy usually misses), and the clock
    moves by ``STEP`` if that is uncertain too."""
    root = Path(plan.root)
    store = harness.open_station(root)
    clock = harness.run_clock(root)
    channels, _ = _channels(plan, clock)
    rng = random.Random(seed)
    pending = harness.unsettled(store, WS, plan.planned())
    use = {intent.key: rng.randrange(len(channels)) for intent, _ in pending}
    via: dict[str, int] = {}  # the channel of each key's last uncertain outcome

    async def call(intent: SendIntent, message: OutgoingMessage) -> outbound.SendStatus | None:
        return await _call(store, channels, use, via, intent, message, clock, out)

    await harness.send_until_settled(
        store, pending, rng, crash, out, call, stuck=lambda: clock.advance(seconds=STEP)
    )
    out.send(("done", os.getpid()))
    store.close()


# -- the parent -------------------------------------------------------------------------------


@dataclass
class _Searches:
    """What the workers' calls tell beyond their outcomes: channel switches, and searches
    that found no copy."""

    switches: int = 0
    misses: int = 0

    def note(self, message: harness.Message) -> None:
        if message[0] == "call":
            _, _, switched, misses = message
            self.switches += bool(switched)
            self.misses += misses


def _prepare(plan: Plan) -> Any:
    """The station (store and registered workspace), the clock and the mailbox, with its
    fault switches set; returns what reads the mailbox's copies afterwards."""
    root = Path(plan.root)
    path = root / "Maildir"
    provider = "maildir" if plan.kind == "maildir" else "memory"
    context = context_yaml(
        WS,
        mailbox=MAILBOX,
        provider=provider,
        path=str(path) if plan.kind == "maildir" else None,
    )
    harness.register_station(root, WS, context)
    clock = harness.run_clock(root)
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
    searches = _Searches()
    race = harness.Race(plan, _work, RACE_BOUND, on_message=searches.note)
    race.run()

    planned = {intent.key: intent.internet_message_id for intent, _ in plan.planned()}
    copies = _copies(plan, mailbox_state)
    per_id = Counter(copies)
    ledger = harness.Ledger.read(Path(plan.root), WS, planned)
    hand_offs = ledger.hand_offs()
    counts: dict[str, Any] = {
        "sends": len(planned),
        "workers": harness.WORKERS,
        "calls": sum(race.outcomes.values()),
        "copies": len(copies),
        "duplicates": sum(1 for n in per_id.values() if n > 1),
        "unapproved": sum(1 for mid in copies if mid not in set(planned.values())),
        "confirmed": ledger.confirmed(),
        "attempts": len(ledger.attempts()),
        "answers_lost": ledger.answers_lost(),
        "uncertain_outcomes": race.outcomes["uncertain"],
        "searches_missed": searches.misses,
        "settled_from_copy": ledger.settled_from_copy(),
        "retries_after_proven_absence": ledger.retries_after_proven_absence(),
        "channel_switches": searches.switches,
        "kills": race.kills,
        "kills_from_outside": race.kills_outside,
        "kills_around_the_handover": sum(race.kills_at.values()),
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
    ledger.assert_settled(planned)
    for key, record in ledger.records.items():
        if record.state is SendState.CONFIRMED:
            assert per_id[planned[key]] == 1, (
                f"{key} is confirmed with {per_id[planned[key]]} copies"
            )
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
