"""Exactly once through a real mail system: worker processes share one store and one clock
and send the same planned messages through the IMAP/SMTP adapter (agent/providers/
imap_smtp.py) until every one is settled, while the submission server drops its answer
after DATA 30% of the time and workers die by SIGKILL - from outside at random moments, and
at the crash points around the handover.

The mail system is real: the session's private Dovecot (fixtures/dovecot.py) and an SMTP
submission server relaying into it (fixtures/submission.py), run in the test process so that
it outlives every killed worker (a message whose sender died mid-DATA is still relayed,
recorded and, where copies are kept, filed). The sender and the recipient are Dovecot users
of their own. Two runs (docs/lifecycle.md, "Sending exactly once, whatever the channel"):

- ``server_copy``: the submission server files each accepted message in the sender's Sent
  folder itself, before it answers (``submission_keeps_sent_copy``, a declared latency of
  ``LATENCY_S``): a lost answer is settled from that copy, nothing goes to a person;
- ``own_copy``: the submission server keeps no copy and the adapter appends its own after
  the answer: a lost answer - an answer dropped after DATA, or a worker killed mid-attempt -
  goes to a person with the reason, and nothing goes twice.

Each worker goes over the sends not yet settled in its own random order, round after round;
after an uncertain outcome it calls again at once (the copy is searched), and if that is
uncertain too it tells the parent, which moves the shared clock by ``STEP``. The parent
moves it only while no message being accepted began before its last step (the server's
acceptances are counted as they start and end), so once the server has a whole message its
copy is filed within one step of the clock - well within the declared latency, as it is
within real time: settling never waits on wall time, and the fake clock cannot outrun the
server. The parent kills a random worker at a random moment (up to ``KILL_WITHIN`` after a
random number of its calls: in the SMTP transaction, the ledger or a search), some workers
kill themselves at a crash point, and each is replaced by a fresh one (the workers' loop and
the parent are tests/exactly_once_harness.py's; the clock steps and the server are this run's).

Afterwards, counted from what the mail system took - the submission server's accepted
envelopes, the sender's Sent folder and the recipient's inbox, per Message-ID: zero
duplicates, zero unapproved messages, every planned send ledgered and settled (confirmed
with exactly one accepted submission, or - only without a server copy - with a person for a
reason naming the lost outcome, each traced to an answer dropped after DATA or to a killed
worker). Every wait on another process is bounded (the harness's ``BOUND``); nothing sleeps.
"""

from __future__ import annotations

import itertools
import json
import os
import random
import threading
import time
from collections import Counter
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import pytest
from aiosmtpd.smtp import SMTP

from agent.domain.context import MailServer
from agent.domain.mail import OutgoingMessage
from agent.domain.records import SendEvent, SendIntent, SendState
from agent.domain.secrets import Secret
from agent.providers.imap_smtp import ImapSmtpProvider
from agent.services import outbound, workspaces
from agent.testing import FileClock
from agent.testing.contexts import context_yaml
from fixtures.dovecot import Dovecot
from fixtures.submission import Envelope, SubmissionServer
from tests import exactly_once_harness as harness
from tests.conftest import REPORTED, session_dovecot

WS = "ws-imap-exactly-once"
PASSWORD = "imap-once-secret"  # a test user of the private Dovecot
SENDS = 500  # through the submission server that files sent copies
SENDS_WITHOUT_COPY = 300
DROPPED = 0.3  # of the answers to DATA, after the server took the message
LATENCY_S = 30  # declared by the copy-keeping submission server
STEP = 5.0  # seconds the clock moves when a worker is stuck on an unsettled send
KILL_WITHIN = 0.4  # seconds after a victim's call: a call takes about 0.1 to 0.4 s here
RACE_BOUND = 240.0  # seconds a whole run may take
WORKER_STOPPED = "the worker handing it over stopped before the answer"
_runs = itertools.count(1)


@dataclass(frozen=True)
class Plan:
    """One run, as every worker of it sees it."""

    kind: str  # "server_copy" or "own_copy"
    root: str
    sends: int
    seed: int
    sender: str
    recipient: str
    server: MailServer  # read back from the registered Workspace Context

    def planned(self) -> list[harness.Planned]:
        return harness.planned_notes(
            "IMAP exactly-once", self.kind, self.sends, WS, self.sender, self.recipient
        )


# -- a worker (harness.worker runs _work) -----------------------------------------------------


async def _work(plan: Plan, crash: str | None, seed: str, out: Connection) -> None:
    """Send every planned message not yet settled through the IMAP/SMTP adapter; after an
    uncertain outcome call again at once (the copy is searched), and if that is uncertain
    too tell the parent, which moves the clock."""
    root = Path(plan.root)
    store = harness.open_station(root)
    clock = harness.run_clock(root)
    provider = ImapSmtpProvider(plan.server, plan.sender, Secret(PASSWORD), clock=clock)
    rng = random.Random(seed)
    pending = harness.unsettled(store, WS, plan.planned())

    async def call(intent: SendIntent, message: OutgoingMessage) -> outbound.SendStatus | None:
        return await harness.call_reported(store, provider, intent, message, clock, out)

    def stuck() -> None:
        out.send(("stuck",))  # the copy may show later: the parent moves the clock

    await harness.send_until_settled(store, pending, rng, crash, out, call, stuck)
    await provider.aclose()
    out.send(("done", os.getpid()))
    store.close()


# -- the submission server --------------------------------------------------------------------


class _Submission(SubmissionServer):
    """The submission server, knowing the clock step each acceptance in flight began in
    (an acceptance relays the message and files its copy, and goes on when the sender died
    mid-DATA)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._flight = threading.Condition()
        self._began: Counter[int] = Counter()
        self._step = 0

    async def accept(
        self,
        server: SMTP,
        mail_from: str,
        rcpt_tos: tuple[str, ...],
        data: bytes,
        auth_user: str | None,
    ) -> str:
        with self._flight:
            began = self._step
            self._began[began] += 1
        try:
            return await super().accept(server, mail_from, rcpt_tos, data, auth_user)
        finally:
            with self._flight:
                self._began[began] -= 1
                self._flight.notify_all()

    def next_step(self) -> bool:
        """Whether the clock may move one step now: no acceptance in flight began before
        the last step (each one spans at most one step of the clock)."""
        with self._flight:
            if any(n for step, n in self._began.items() if step < self._step):
                return False
            self._step += 1
            return True

    def wait_idle(self, timeout: float) -> None:
        """Block (bounded) until no acceptance is in flight."""
        with self._flight:
            idle = self._flight.wait_for(lambda: not any(self._began.values()), timeout)
        assert idle, f"the submission server was still accepting after {timeout} s"


# -- the parent -------------------------------------------------------------------------------


@dataclass
class _Steps:
    """The parent's answer to a worker stuck on an unsettled send: it moves the shared clock
    by ``STEP`` when no acceptance in flight began before its last step."""

    server: _Submission
    clock: FileClock
    stuck: int = 0
    steps: int = 0

    def note(self, message: harness.Message) -> None:
        if message[0] == "stuck":
            self.stuck += 1
            if self.server.next_step():
                self.clock.advance(seconds=STEP)
                self.steps += 1


def _register(root: Path, sender: str, dovecot: Dovecot, smtp_port: int, keeps: bool) -> MailServer:
    """The station (store and workspace, its mailbox reached over IMAP and SMTP) and the
    clock; returns the mailbox's server settings as read back from the registered Context."""
    host = dovecot.host
    server = (
        f"server: {{imap: {{host: {host}, port: {dovecot.imap_port}, security: none}}, "
        f"smtp: {{host: {host}, port: {smtp_port}, security: none}}, username: '{sender}', "
        f"submission_keeps_sent_copy: {str(keeps).lower()}, "
        f"sent_copy_latency_seconds: {LATENCY_S}, timeout_seconds: {harness.BOUND / 2}}}"
    )
    source = harness.register_station(
        root, WS, context_yaml(WS, mailbox=sender, provider="imap", mailbox_fields=server)
    )
    [binding] = workspaces.read_context_file(source)[0].mailboxes
    assert binding.server is not None
    return binding.server


@dataclass(frozen=True)
class _Taken:
    """What the mail system took, per Message-ID."""

    envelopes: list[Envelope]
    submitted: Counter[str]
    dropped: set[str]  # whose answer to DATA never reached the sender
    in_sent: Counter[str]
    in_inbox: Counter[str]


def _race(
    kind: str, root: Path, sends: int, seed: int
) -> tuple[Plan, harness.Race[Plan], _Steps, _Taken, float]:
    """One run against the session's Dovecot and a submission server of its own."""
    dovecot = session_dovecot()
    tag = f"{kind.replace('_', '-')}-{os.getpid()}-{next(_runs)}"
    sender, recipient = f"once-{tag}@fabrikam.test", f"client-{tag}@contoso.test"
    dovecot.add_user(sender, PASSWORD)
    dovecot.add_user(recipient, PASSWORD)
    keeps = kind == "server_copy"
    server = _Submission.for_dovecot(dovecot, keeps_sent_copy=keeps)
    assert isinstance(server, _Submission)
    server.drop_rate(DROPPED, seed)
    with server:
        settings = _register(root, sender, dovecot, server.port, keeps)
        plan = Plan(kind, str(root), sends, seed, sender, recipient, settings)
        steps = _Steps(server, harness.run_clock(root))
        race = harness.Race(plan, _work, RACE_BOUND, KILL_WITHIN, on_message=steps.note)
        started = time.monotonic()
        race.run()
        elapsed = time.monotonic() - started
        server.wait_idle(harness.BOUND)  # a message whose sender was killed is still being taken
        envelopes = server.envelopes
        assert server.errors == [], server.errors[:3]
    taken = _Taken(
        envelopes=envelopes,
        submitted=Counter(e.message_id for e in envelopes),
        dropped={e.message_id for e in envelopes if e.dropped},
        in_sent=Counter(dovecot.message_ids(sender, PASSWORD, "Sent")),
        in_inbox=Counter(dovecot.message_ids(recipient, PASSWORD, "INBOX")),
    )
    return plan, race, steps, taken, elapsed


def _cause(events: list[SendEvent]) -> str:
    """Why a send's last attempt was found lost: the detail of its last UNCERTAIN event (a
    takeover's event keeps the state it found: it is no cause)."""
    lost = [
        e.detail
        for e in events
        if e.state is SendState.UNCERTAIN and not e.detail.startswith(harness.TAKEN_OVER)
    ]
    return lost[-1] if lost else ""


# Long on purpose: one run's figures and every assertion on them, read top to bottom.
def _exactly_once(kind: str, root: Path, sends: int, seed: int) -> dict[str, Any]:
    plan, race, steps, taken, elapsed = _race(kind, root, sends, seed)
    planned = {intent.key: intent.internet_message_id for intent, _ in plan.planned()}
    ledger = harness.Ledger.read(root, WS, planned)
    records, events = ledger.records, ledger.events
    hand_offs = ledger.hand_offs()
    causes = {r.key: _cause(events[r.key]) for r in hand_offs}
    for_drops = [k for k, why in causes.items() if why.startswith(harness.ANSWER_LOST)]
    for_kills = [k for k, why in causes.items() if why == WORKER_STOPPED]
    lost_to_kills = [  # attempts found ATTEMPTING with their worker dead
        k for k, history in events.items() if any(e.detail == WORKER_STOPPED for e in history)
    ]
    answered = {e.message_id for e in taken.envelopes if e.answered}

    def when(key: str) -> str:
        """How far the killed worker's attempt had gone, from what the server recorded."""
        if taken.submitted[planned[key]] == 0:
            return "before the server took it"
        if planned[key] in answered:
            return "after the server answered"
        return "after the server took it, before its answer"

    def fate(key: str) -> str:
        """What became of a send whose attempt was found with its worker dead."""
        history = events[key]
        after = history[max(i for i, e in enumerate(history) if e.detail == WORKER_STOPPED) :]
        if records[key].state is SendState.WITH_PERSON:
            return f"with a person, killed {when(key)}"
        if any("left no sent copy" in e.detail for e in after):
            return "sent again once its copy was proven absent"
        if any(e.state is SendState.CONFIRMED and "sent copy" in e.detail for e in after):
            return "settled from the server's copy"
        return records[key].state.value

    kills = race.kills
    mids = set(planned.values())
    counts: dict[str, Any] = {
        "sends": len(planned),
        "workers": harness.WORKERS,
        "seconds": round(elapsed, 1),
        "calls": sum(race.outcomes.values()),
        "outcomes": dict(race.outcomes),
        "submissions": len(taken.envelopes),
        "answers_dropped_by_the_server": len(taken.dropped),
        "copies_in_sent": sum(taken.in_sent[m] for m in mids),
        "copies_in_inbox": sum(taken.in_inbox[m] for m in mids),
        "duplicates": sum(
            1 for m in mids if max(taken.submitted[m], taken.in_sent[m], taken.in_inbox[m]) > 1
        ),
        "unapproved": sum(1 for m in taken.submitted if m not in mids),
        "confirmed": ledger.confirmed(),
        "attempts": len(ledger.attempts()),
        "answers_lost": ledger.answers_lost(),
        "settled_from_copy": ledger.settled_from_copy(),
        "retries_after_proven_absence": ledger.retries_after_proven_absence(),
        "attempts_lost_to_kills": dict(Counter(map(fate, lost_to_kills))),
        "stuck_reports": steps.stuck,
        "clock_steps": steps.steps,
        "kills": kills,
        "kills_from_outside": race.kills_outside,
        "kills_at_points": dict(race.kills_at),
        "errors": len(race.errors),
        "hand_offs": len(hand_offs),
        "hand_offs_for_answers_dropped_after_data": len(for_drops),
        "hand_offs_for_kills": dict(Counter(map(when, for_kills))),
        "hand_offs_with_our_copy_in_sent": sum(
            1 for r in hand_offs if taken.in_sent[r.internet_message_id] > 0
        ),
        "hand_off_reasons": dict(Counter(r.detail for r in hand_offs)),
    }
    print(f"imap exactly-once {kind}: {json.dumps(counts)}")
    REPORTED[f"imap exactly-once {kind}"] = counts

    assert race.errors == [], race.errors[:5]
    assert counts["duplicates"] == 0, [
        (m, taken.submitted[m], taken.in_sent[m], taken.in_inbox[m])
        for m in mids
        if max(taken.submitted[m], taken.in_sent[m], taken.in_inbox[m]) > 1
    ][:5]
    assert counts["unapproved"] == 0
    ledger.assert_settled(planned)
    for mid in mids:  # the server relayed every message it took to the recipient, once
        assert taken.in_inbox[mid] == taken.submitted[mid], mid
    for key, record in records.items():
        mid = planned[key]
        if record.state is SendState.CONFIRMED:
            assert taken.submitted[mid] == 1, f"{key} is confirmed with {taken.submitted[mid]}"
            assert taken.in_sent[mid] == 1, f"{key} is confirmed with no copy in Sent"
        if mid in taken.dropped and not plan.server.submission_keeps_sent_copy:
            # Its sender never got the answer, and no copy can tell: it is with a person.
            assert record.state is SendState.WITH_PERSON, f"{key}: {record.detail}"
    for key in for_drops:  # an answer lost after DATA: the server took it and dropped it
        assert planned[key] in taken.dropped, f"{key}: {causes[key]}"
    assert sorted(for_drops + for_kills) == sorted(causes), {
        k: why for k, why in causes.items() if k not in for_drops + for_kills
    }
    assert len(for_kills) <= kills, "a killed worker leaves at most one attempt unanswered"
    assert kills >= 5 and counts["answers_lost"] > 0 and taken.dropped
    return counts


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["server_copy", "own_copy"])
def test_sends_through_dropped_answers_after_data_and_sigkills_go_out_once(
    kind: str, tmp_path: Path
) -> None:
    if kind == "server_copy":
        counts = _exactly_once(kind, tmp_path, SENDS, seed=20261210)
        assert counts["hand_offs"] == 0, "a server that files every copy hands nothing over"
        assert counts["confirmed"] == SENDS, "every send sent or settled from its copy"
        assert counts["settled_from_copy"] > 0
        assert counts["copies_in_sent"] == counts["submissions"] == SENDS
        return
    counts = _exactly_once(kind, tmp_path, SENDS_WITHOUT_COPY, seed=20261211)
    assert counts["hand_offs"] > 0 and counts["hand_offs_for_answers_dropped_after_data"] > 0
    for reason in counts["hand_off_reasons"]:
        assert "was lost" in reason and "keeps no sent copy" in reason, reason
        assert "through imap" in reason, reason
    assert counts["confirmed"] + counts["hand_offs"] == SENDS_WITHOUT_COPY
    assert counts["settled_from_copy"] == 0 and counts["retries_after_proven_absence"] == 0
