"""The SendLedger role: intents ledgered once, completed once, capped per recipient."""

from __future__ import annotations

import multiprocessing
import queue
from datetime import timedelta
from pathlib import Path

import pytest

from agent.domain.errors import StoreError
from agent.domain.records import SendIntent, SendRecord, SendState
from agent.ports import EmbeddedStore
from agent.testing import FrozenClock
from agent.testing.storage.base import (
    CAP,
    CAP_WORKERS,
    DANA,
    NOA,
    OTHER_WS,
    WS,
    StoreContract,
    cap_worker,
    intent,
    register,
)


class SendLedgerContract(StoreContract):
    """The SendLedger role: intents ledgered once, completed once, capped per recipient."""

    def test_begin_send_records_an_intent_once_and_complete_send_marks_it_sent(
        self, store: EmbeddedStore, clock: FrozenClock
    ) -> None:
        register(store, WS)
        begun_at = clock.now()
        first = store.begin_send(intent("send-1"), begun_at, cap=5)
        assert first.created and first.state is SendState.INTENT
        assert (first.key, first.workspace_id, first.kind) == ("send-1", WS, "client_reply")
        assert first.recipients == (DANA,) and first.internet_message_id == "<send-1@fabrikam.test>"
        assert first.created_at == begun_at and first.sent_at is None
        assert first.provider_message_id is None

        # The same key again (a retry after a crash): the existing record, nothing new.
        again = store.begin_send(intent("send-1"), clock.advance(minutes=5), cap=5)
        assert not again.created and again.state is SendState.INTENT
        assert again.created_at == begun_at
        assert [s.key for s in store.list_sends(WS)] == ["send-1"]
        assert store.counts()["sends"] == 1

        sent_at = clock.advance(minutes=1)
        sent = store.complete_send("send-1", "provider-77", "delivered to the provider", sent_at)
        assert sent.state is SendState.SENT and sent.provider_message_id == "provider-77"
        assert sent.sent_at == sent_at and sent.detail == "delivered to the provider"
        assert sent.created_at == begun_at
        assert store.get_send("send-1") == sent
        assert store.list_sends(WS) == [sent]

        # A sent message is never ledgered (or sent) twice: the key returns the sent record.
        later = store.begin_send(intent("send-1"), clock.advance(minutes=1), cap=5)
        assert not later.created and later.state is SendState.SENT
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
        assert manual.created and manual.state is SendState.INTENT
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
        assert allowed.created and allowed.state is SendState.INTENT
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
        ctx = multiprocessing.get_context("spawn")
        barrier = ctx.Barrier(CAP_WORKERS)
        results = ctx.Queue()
        keys = [f"race-{n}" for n in range(CAP_WORKERS)]
        procs = [
            ctx.Process(
                target=cap_worker,
                args=(self.open_address, address, key, clock.now(), barrier, results),
            )
            for key in keys
        ]
        for p in procs:
            p.start()
        outcomes: list[tuple[str, str, bool]] = []
        try:
            for _ in procs:
                outcomes.append(results.get(timeout=180))
        except queue.Empty:
            pytest.fail(f"only {len(outcomes)} of {CAP_WORKERS} workers reported: {outcomes}")
        finally:
            for p in procs:
                p.join(timeout=60)
            for p in procs:
                if p.is_alive():
                    p.kill()
                    p.join()
            results.close()
            results.join_thread()
        assert [p.exitcode for p in procs] == [0] * CAP_WORKERS, outcomes
        errors = [o for o in outcomes if o[1].startswith("error")]
        assert errors == []
        recorded = sorted(k for k, _, created in outcomes if created)
        refused = [k for k, state, _ in outcomes if state == SendState.REFUSED.value]
        assert len(recorded) == CAP and len(refused) == CAP_WORKERS - CAP, outcomes
        sends: list[SendRecord] = store.list_sends(WS)
        assert sorted(s.key for s in sends) == recorded
        assert all(s.state is SendState.INTENT and s.recipients == (DANA,) for s in sends)

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
