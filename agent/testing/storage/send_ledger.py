"""The SendLedger role: sends ledgered once, attempted by their holder only, confirmed once,
settled by a person, every change audited; automated sends capped per recipient."""

from __future__ import annotations

from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from agent.domain.errors import InvalidRequest, SendStateConflict, StoreError, UnknownSend
from agent.domain.mail import Marker, MarkerKind
from agent.domain.records import SendAttempt, SendEvent, SendIntent, SendRecord, SendState
from agent.ports import EmbeddedStore
from agent.testing import FrozenClock
from agent.testing.storage.base import (
    ALIVE,
    CAP,
    CAP_WORKERS,
    DANA,
    DEAD,
    NOA,
    OTHER_WS,
    WS,
    StoreContract,
    cap_worker,
    intent,
    race_processes,
    register,
)

OTHER = "host/3/3/other"

PLANNED = Marker(kind=MarkerKind.MESSAGE_ID, value="<send-1@fabrikam.test>")


def attempt(
    channel: str = "api",
    marker: Marker = PLANNED,
    keeps_sent_copy: bool = True,
    latency: timedelta = timedelta(minutes=2),
) -> SendAttempt:
    return SendAttempt(
        channel=channel,
        marker=marker,
        keeps_sent_copy=keeps_sent_copy,
        sent_copy_latency=latency,
    )


def begun(
    store: EmbeddedStore, now: datetime, key: str = "send-1", holder: str = ALIVE
) -> SendRecord:
    """A registered workspace and one PREPARED send held by ``holder``."""
    if store.get_workspace(WS) is None:
        register(store, WS)
    record = store.begin_send(
        intent(key).model_copy(update={"holder": holder, "marker": PLANNED}), now
    )
    assert record.created and record.state is SendState.PREPARED
    return record


def snapshot(store: EmbeddedStore, key: str) -> tuple[SendRecord | None, list[SendEvent]]:
    """Everything the ledger holds of one send."""
    return store.get_send(key), store.send_events(key)


def trail(store: EmbeddedStore, key: str) -> list[tuple[SendState, str]]:
    return [(e.state, e.actor) for e in store.send_events(key)]


def takeover_worker(
    opener: Any, address: str, key: str, holder: str, now: datetime, barrier: Any, results: Any
) -> None:
    """One process: take the dead worker's send over, then try to attempt it."""
    store = opener(address)
    try:
        barrier.wait(timeout=120)
        took = store.take_over_send(key, DEAD, holder, now)
        attempted = store.attempt_send(key, holder, attempt(), now)
        results.put((holder, took, attempted is not None))
    except Exception as exc:  # reported to the parent, which fails the test
        results.put((holder, f"error: {type(exc).__name__}: {exc}", False))
    finally:
        store.close()


class SendLedgerContract(StoreContract):
    """The SendLedger role: sends ledgered once, each attempt recorded before its channel is
    asked (compare-and-set on holder and state), confirmed once, settled by a person when
    no channel can settle them, every change audited; capped per recipient."""

    def test_begin_send_records_an_intent_once_and_complete_send_marks_it_sent(
        self, store: EmbeddedStore, clock: FrozenClock
    ) -> None:
        register(store, WS)
        begun_at = clock.now()
        first = store.begin_send(intent("send-1"), begun_at, cap=5)
        assert first.created and first.state is SendState.PREPARED
        assert (first.key, first.workspace_id, first.kind) == ("send-1", WS, "client_reply")
        assert first.recipients == (DANA,) and first.internet_message_id == "<send-1@fabrikam.test>"
        assert first.created_at == begun_at and first.sent_at is None
        assert first.provider_message_id is None

        # The same key again (a retry after a crash): the existing record, nothing new.
        again = store.begin_send(intent("send-1"), clock.advance(minutes=5), cap=5)
        assert not again.created and again.state is SendState.PREPARED
        assert again.created_at == begun_at
        assert [s.key for s in store.list_sends(WS)] == ["send-1"]
        assert store.counts()["sends"] == 1

        sent_at = clock.advance(minutes=1)
        sent = store.complete_send("send-1", "provider-77", "delivered to the provider", sent_at)
        assert sent.state is SendState.CONFIRMED and sent.provider_message_id == "provider-77"
        assert sent.sent_at == sent_at and sent.detail == "delivered to the provider"
        assert sent.created_at == begun_at
        assert store.get_send("send-1") == sent
        assert store.list_sends(WS) == [sent]

        # A sent message is never ledgered (or sent) twice: the key returns the sent record.
        later = store.begin_send(intent("send-1"), clock.advance(minutes=1), cap=5)
        assert not later.created and later.state is SendState.CONFIRMED
        assert later.provider_message_id == "provider-77"
        assert store.counts()["sends"] == 1

    def test_completing_a_send_that_was_never_begun_is_an_error(
        self, store: EmbeddedStore, clock: FrozenClock
    ) -> None:
        register(store, WS)
        with pytest.raises(StoreError, match="begin_send records it first"):
            store.complete_send("send-unknown", "provider-1", "", clock.now())
        assert store.get_send("send-unknown") is None
        assert store.list_sends(WS) == []

    def test_the_per_recipient_cap_refuses_the_third_automated_send_and_stores_nothing(
        self, store: EmbeddedStore, clock: FrozenClock
    ) -> None:
        register(store, WS, OTHER_WS)
        now = clock.now()
        assert store.begin_send(intent("a-1"), now, cap=2).created
        assert store.begin_send(intent("a-2"), now + timedelta(hours=1), cap=2).created
        third = store.begin_send(intent("a-3"), now + timedelta(hours=2), cap=2)
        assert third.state is SendState.REFUSED and not third.created
        assert DANA in third.detail
        assert store.get_send("a-3") is None
        assert [s.key for s in store.list_sends(WS)] == ["a-1", "a-2"]
        # One capped recipient among several holds the whole message back.
        both = store.begin_send(intent("a-4", NOA, DANA), now + timedelta(hours=2), cap=2)
        assert both.state is SendState.REFUSED and store.get_send("a-4") is None

        # A message a human decided to send is never capped, and is not counted either.
        manual = store.begin_send(intent("m-1", automated=False), now + timedelta(hours=3), cap=2)
        assert manual.created and manual.state is SendState.PREPARED
        # Another address, and the same address in another workspace, have their own counts.
        assert store.begin_send(intent("a-5", NOA), now + timedelta(hours=3), cap=2).created
        elsewhere = intent("o-1", workspace_id=OTHER_WS)
        assert store.begin_send(elsewhere, now + timedelta(hours=3), cap=2).created

        # Still inside the 24 hours of the first two: refused.
        inside = store.begin_send(intent("a-6"), now + timedelta(hours=23, minutes=59), cap=2)
        assert inside.state is SendState.REFUSED
        # Once the first send is more than 24 hours old, one more is allowed, then refused.
        after = now + timedelta(hours=24, minutes=1)
        allowed = store.begin_send(intent("a-7"), after, cap=2)
        assert allowed.created and allowed.state is SendState.PREPARED
        assert store.begin_send(intent("a-8"), after, cap=2).state is SendState.REFUSED
        # A day after the second, only a-7 is inside the window: one more, then refused.
        day_later = now + timedelta(hours=48)
        assert store.begin_send(intent("a-9"), day_later, cap=2).created
        assert store.begin_send(intent("a-10"), day_later, cap=2).state is SendState.REFUSED

        # Listed by creation time, then key.
        assert [s.key for s in store.list_sends(WS)] == [
            "a-1", "a-2", "a-5", "m-1", "a-7", "a-9",
        ]  # fmt: skip
        assert [s.key for s in store.list_sends(OTHER_WS)] == ["o-1"]
        assert store.counts()["sends"] == 7

    def test_without_a_cap_automated_sends_are_not_limited(
        self, store: EmbeddedStore, clock: FrozenClock
    ) -> None:
        register(store, WS)
        for n in range(5):
            assert store.begin_send(intent(f"u-{n}"), clock.now()).created
        assert len(store.list_sends(WS)) == 5

    @pytest.mark.slow
    def test_the_cap_holds_when_many_processes_send_to_one_recipient_at_once(
        self, store: EmbeddedStore, clock: FrozenClock, tmp_path: Path
    ) -> None:
        register(store, WS)
        address = self.address(tmp_path)
        keys = [f"race-{n}" for n in range(CAP_WORKERS)]
        outcomes: list[tuple[str, str, bool]] = race_processes(
            cap_worker, [(self.open_address, address, key, clock.now()) for key in keys]
        )
        errors = [o for o in outcomes if o[1].startswith("error")]
        assert errors == []
        recorded = sorted(k for k, _, created in outcomes if created)
        refused = [k for k, state, _ in outcomes if state == SendState.REFUSED.value]
        assert len(recorded) == CAP and len(refused) == CAP_WORKERS - CAP, outcomes
        sends: list[SendRecord] = store.list_sends(WS)
        assert sorted(s.key for s in sends) == recorded
        assert all(s.state is SendState.PREPARED and s.recipients == (DANA,) for s in sends)

    def test_a_send_for_an_unregistered_workspace_is_refused_and_nothing_is_recorded(
        self, store: EmbeddedStore, clock: FrozenClock
    ) -> None:
        intent = SendIntent(
            key="ack|nobody",
            workspace_id="ws-not-registered",
            kind="ack",
            task_id=None,
            internet_message_id="<nobody@x.test>",
            recipients=("a@b.test",),
            automated=True,
        )
        with pytest.raises(StoreError, match="not registered"):
            store.begin_send(intent, clock.now(), cap=3)
        assert store.get_send("ack|nobody") is None

    def test_a_send_keeps_its_planned_marker_and_starts_its_audit_trail(
        self, store: EmbeddedStore, clock: FrozenClock
    ) -> None:
        record = begun(store, clock.now())
        assert record.marker == PLANNED and record.holder == ALIVE
        assert (record.channel, record.attempts, record.attempted_at) == ("", 0, None)
        assert record.keeps_sent_copy and record.sent_copy_latency == timedelta(0)
        assert record.refused == () and not record.resend_allowed and not record.partial
        assert store.get_send("send-1") == record.model_copy(update={"created": False})
        [event] = store.send_events("send-1")
        assert (event.key, event.at, event.state, event.actor) == (
            "send-1", clock.now(), SendState.PREPARED, ALIVE,
        )  # fmt: skip
        assert store.send_events("send-unknown") == []

    def test_the_holder_attempts_records_a_lost_answer_attempts_again_and_confirms(
        self, store: EmbeddedStore, clock: FrozenClock
    ) -> None:
        begun(store, clock.now())
        native = Marker(kind=MarkerKind.NATIVE, value="x-outloop-1")
        first = attempt("api", native, keeps_sent_copy=False, latency=timedelta(minutes=3))
        before = snapshot(store, "send-1")
        # Only the send's holder attempts it; anyone else gets None and writes nothing.
        assert store.attempt_send("send-1", OTHER, first, clock.advance(seconds=1)) is None
        assert store.attempt_send("send-unknown", ALIVE, first, clock.now()) is None
        assert snapshot(store, "send-1") == before

        at = clock.advance(seconds=1)
        attempted = store.attempt_send("send-1", ALIVE, first, at)
        assert attempted is not None and attempted.state is SendState.ATTEMPTING
        assert (attempted.channel, attempted.marker, attempted.attempts) == ("api", native, 1)
        assert attempted.attempted_at == at and not attempted.keeps_sent_copy
        assert attempted.sent_copy_latency == timedelta(minutes=3)
        assert "attempt 1 through api" in attempted.detail
        assert store.get_send("send-1") == attempted
        # An attempt in flight is never attempted again, not even by its holder.
        before = snapshot(store, "send-1")
        assert store.attempt_send("send-1", ALIVE, first, clock.advance(seconds=1)) is None
        assert snapshot(store, "send-1") == before

        lost = store.mark_uncertain(
            "send-1", ALIVE, "the answer was lost", clock.advance(seconds=1)
        )
        assert lost.state is SendState.UNCERTAIN and lost.detail == "the answer was lost"
        assert (lost.attempts, lost.channel, lost.marker) == (1, "api", native)

        # The caller searched the sent copies and found none: one more attempt.
        second = attempt("imap", PLANNED, latency=timedelta(seconds=30))
        again = store.attempt_send("send-1", ALIVE, second, clock.advance(minutes=5))
        assert again is not None and again.state is SendState.ATTEMPTING
        assert (again.attempts, again.channel, again.marker) == (2, "imap", PLANNED)
        assert again.keeps_sent_copy and again.sent_copy_latency == timedelta(seconds=30)

        sent_at = clock.advance(seconds=2)
        done = store.complete_send(
            "send-1", "provider-9", "accepted by imap", sent_at,
            refused=[("gone@contoso.test", "550 no such user")],
        )  # fmt: skip
        assert done.state is SendState.CONFIRMED and done.partial
        assert done.refused == (("gone@contoso.test", "550 no such user"),)
        assert (done.sent_at, done.provider_message_id, done.detail) == (
            sent_at, "provider-9", "accepted by imap",
        )  # fmt: skip
        assert store.get_send("send-1") == done

        events = store.send_events("send-1")
        assert [(e.state, e.actor) for e in events] == [
            (SendState.PREPARED, ALIVE), (SendState.ATTEMPTING, ALIVE),
            (SendState.UNCERTAIN, ALIVE), (SendState.ATTEMPTING, ALIVE),
            (SendState.CONFIRMED, ALIVE),
        ]  # fmt: skip
        assert [e.at for e in events] == sorted(e.at for e in events)
        assert "api" in events[1].detail and "x-outloop-1" in events[1].detail
        assert events[2].detail == "the answer was lost"
        assert "imap" in events[3].detail and "no sent copy" in events[3].detail
        assert "provider-9" in events[4].detail and "550 no such user" in events[4].detail

        # Confirmed once: completing again changes nothing, and nothing attempts it again.
        assert store.complete_send("send-1", "provider-0", "again", clock.advance(hours=1)) == done
        assert store.attempt_send("send-1", ALIVE, second, clock.now()) is None
        assert snapshot(store, "send-1") == (done, events)

    def test_changes_the_state_or_holder_does_not_allow_are_refused_and_change_nothing(
        self, store: EmbeddedStore, clock: FrozenClock
    ) -> None:
        begun(store, clock.now())
        now = clock.advance(seconds=1)
        before = snapshot(store, "send-1")
        with pytest.raises(SendStateConflict, match="is PREPARED") as raised:
            store.mark_uncertain("send-1", ALIVE, "x", now)  # never attempted
        assert (raised.value.key, raised.value.state, raised.value.holder) == (
            "send-1", "PREPARED", ALIVE,
        )  # fmt: skip
        with pytest.raises(SendStateConflict, match="Nothing was changed"):
            store.settle_send("send-1", True, "a person looked", NOA, now)  # never attempted
        with pytest.raises(UnknownSend):
            store.settle_send("send-unknown", True, "a person looked", NOA, now)
        with pytest.raises(InvalidRequest):
            store.settle_send("send-1", False, "  ", NOA, now)
        for unknown in (
            lambda: store.mark_uncertain("send-unknown", ALIVE, "x", now),
            lambda: store.hand_to_person("send-unknown", "x", now),
            lambda: store.complete_send("send-unknown", "p", "x", now),
        ):
            with pytest.raises(StoreError, match="begin_send records it first"):
                unknown()
        assert snapshot(store, "send-1") == before

        attempted = store.attempt_send("send-1", ALIVE, attempt(), clock.advance(seconds=1))
        assert attempted is not None
        before = snapshot(store, "send-1")
        with pytest.raises(SendStateConflict, match=f"held by {ALIVE}"):
            store.mark_uncertain("send-1", OTHER, "not mine", clock.now())
        assert snapshot(store, "send-1") == before

        done = store.complete_send("send-1", "provider-1", "accepted", clock.advance(seconds=1))
        before = snapshot(store, "send-1")
        for refused in (
            lambda: store.mark_uncertain("send-1", ALIVE, "x", clock.now()),
            lambda: store.hand_to_person("send-1", "x", clock.now()),
            lambda: store.settle_send("send-1", False, "a person looked", NOA, clock.now()),
        ):
            with pytest.raises(SendStateConflict, match="is CONFIRMED"):
                refused()
        assert not store.take_over_send("send-1", ALIVE, OTHER, clock.now())
        assert snapshot(store, "send-1") == before and before[0] == done

    def test_a_person_settles_a_send_no_channel_can_settle(
        self, store: EmbeddedStore, clock: FrozenClock
    ) -> None:
        begun(store, clock.now())
        store.attempt_send("send-1", ALIVE, attempt("browser", keeps_sent_copy=False), clock.now())
        reason = "the browser channel keeps no sent copy to search"
        person = store.hand_to_person("send-1", reason, clock.advance(minutes=1))
        assert person.state is SendState.WITH_PERSON and person.detail == reason
        assert person.holder == ALIVE and person.attempts == 1
        # Handed over already: again changes nothing; the holder cannot attempt it meanwhile.
        events = store.send_events("send-1")
        assert store.hand_to_person("send-1", "another reason", clock.advance(minutes=1)) == person
        assert store.attempt_send("send-1", ALIVE, attempt(), clock.now()) is None
        assert store.send_events("send-1") == events

        evidence = "the recipient confirmed by phone that nothing arrived"
        not_sent = store.settle_send("send-1", False, evidence, NOA, clock.advance(hours=1))
        assert not_sent.state is SendState.PREPARED and not_sent.resend_allowed
        assert not_sent.detail == evidence and not_sent.sent_at is None
        assert store.get_send("send-1") == not_sent

        # The one more attempt the person allowed; it uses the permission up.
        resent = store.attempt_send("send-1", ALIVE, attempt(), clock.advance(minutes=1))
        assert resent is not None and resent.attempts == 2 and not resent.resend_allowed
        assert "settled" in store.send_events("send-1")[-1].detail
        store.mark_uncertain("send-1", ALIVE, "the answer was lost again", clock.now())

        proof = "the copy is in the sent folder (checked by hand)"
        settled_at = clock.advance(hours=1)
        sent = store.settle_send("send-1", True, proof, NOA, settled_at)
        assert sent.state is SendState.CONFIRMED and sent.sent_at == settled_at
        assert sent.detail == proof and not sent.resend_allowed
        assert trail(store, "send-1") == [
            (SendState.PREPARED, ALIVE), (SendState.ATTEMPTING, ALIVE),
            (SendState.WITH_PERSON, ALIVE), (SendState.PREPARED, NOA),
            (SendState.ATTEMPTING, ALIVE), (SendState.UNCERTAIN, ALIVE),
            (SendState.CONFIRMED, NOA),
        ]  # fmt: skip
        settles = [e for e in store.send_events("send-1") if e.actor == NOA]
        assert [e.detail for e in settles] == [evidence, proof]

        # An attempt still in flight may be settled by a person too.
        begun(store, clock.now(), key="send-2")
        store.attempt_send("send-2", ALIVE, attempt(), clock.now())
        assert store.settle_send("send-2", True, proof, NOA, clock.now()).state is (
            SendState.CONFIRMED
        )

    def test_a_takeover_moves_an_unfinished_send_to_one_new_holder_keeping_its_state(
        self, store: EmbeddedStore, clock: FrozenClock
    ) -> None:
        begun(store, clock.now(), holder=DEAD)
        taken_at = clock.advance(minutes=10)
        assert not store.take_over_send("send-1", OTHER, ALIVE, taken_at)  # not its holder
        assert store.take_over_send("send-1", DEAD, ALIVE, taken_at)
        assert not store.take_over_send("send-1", DEAD, OTHER, taken_at)  # lost the race
        record = store.get_send("send-1")
        assert record is not None and record.holder == ALIVE
        assert record.state is SendState.PREPARED
        # The new holder's time in flight is measured from the takeover.
        assert record.created_at == taken_at
        assert store.attempt_send("send-1", DEAD, attempt(), clock.now()) is None

        assert store.attempt_send("send-1", ALIVE, attempt(), clock.advance(seconds=1))
        # The holder died mid-attempt: the attempt is taken over as it is, ATTEMPTING, and
        # its new holder must settle it before anything is handed over again.
        assert store.take_over_send("send-1", ALIVE, OTHER, clock.advance(minutes=10))
        taken = store.get_send("send-1")
        assert taken is not None and taken.state is SendState.ATTEMPTING
        assert store.attempt_send("send-1", OTHER, attempt(), clock.now()) is None
        with pytest.raises(SendStateConflict):
            store.mark_uncertain("send-1", ALIVE, "no longer mine", clock.now())
        store.mark_uncertain("send-1", OTHER, "the previous holder died mid-attempt", clock.now())
        assert store.take_over_send("send-1", OTHER, ALIVE, clock.advance(minutes=10))
        store.hand_to_person("send-1", "no channel can search for the copy", clock.now())
        assert not store.take_over_send("send-1", ALIVE, OTHER, clock.now())  # a person decides

        events = store.send_events("send-1")
        takeovers = [e for e in events if "taken over" in e.detail]
        assert [(e.state, e.actor) for e in takeovers] == [
            (SendState.PREPARED, ALIVE), (SendState.ATTEMPTING, OTHER),
            (SendState.UNCERTAIN, ALIVE),
        ]  # fmt: skip
        assert DEAD in takeovers[0].detail and ALIVE in takeovers[1].detail

    @pytest.mark.slow
    def test_of_many_processes_taking_over_one_send_one_wins_and_only_it_attempts(
        self, store: EmbeddedStore, clock: FrozenClock, tmp_path: Path
    ) -> None:
        begun(store, clock.now(), holder=DEAD)
        address = self.address(tmp_path)
        holders = [f"host/9/{n}/worker" for n in range(8)]
        outcomes = race_processes(
            takeover_worker,
            [(self.open_address, address, "send-1", h, clock.now()) for h in holders],
        )
        assert [o for o in outcomes if isinstance(o[1], str)] == []
        won = [holder for holder, took, _ in outcomes if took]
        attempted = [holder for holder, _, tried in outcomes if tried]
        assert len(won) == 1 and attempted == won, outcomes
        record = store.get_send("send-1")
        assert record is not None and record.holder == won[0]
        assert record.state is SendState.ATTEMPTING and record.attempts == 1
        assert trail(store, "send-1") == [
            (SendState.PREPARED, DEAD), (SendState.PREPARED, won[0]),
            (SendState.ATTEMPTING, won[0]),
        ]  # fmt: skip
