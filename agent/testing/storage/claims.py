"""The Claims role: one holder per occurrence, one task per thread, reports and retries."""

from __future__ import annotations

from datetime import timedelta

import pytest

from agent.domain.dispositions import Disposition, GateKind
from agent.domain.envelope import Envelope, work_key
from agent.domain.errors import StoreError, TransitionError
from agent.domain.execution import ClaimOutcome, ExecutionState
from agent.domain.records import ClaimRequest, EscalationDraft, ReportRequest, TaskUpdate
from agent.domain.states import TaskState
from agent.domain.task import Gate
from agent.ports import EmbeddedStore
from agent.testing import FrozenClock
from agent.testing.storage.base import (
    ALIVE,
    DEAD,
    MAILBOX,
    WS,
    Harness,
    StoreContract,
    alive,
    env,
    reported_task_and_reply,
    retry_later,
)


class ClaimsContract(StoreContract):
    """The Claims role: one holder per occurrence, one task per thread, reports and retries."""

    def test_the_first_claim_wins_and_creates_the_task_in_the_same_transaction(
        self, h: Harness
    ) -> None:
        _, _, result = h.claim_first()
        assert result.outcome is ClaimOutcome.CLAIMED and result.task_created
        assert result.task is not None and result.execution.task_id == result.task.task_id
        assert h.store.get_task(result.task.task_id) == result.task
        assert result.task.state is TaskState.DISCOVERED

    def test_reclaimable_gives_what_a_claim_may_take_over_now_with_the_item_it_was_for(
        self, h: Harness, store: EmbeddedStore, clock: FrozenClock
    ) -> None:
        held, dead, done, retry, lapsing = env(1, 1), env(2, 2), env(3, 3), env(4, 4), env(5, 5)
        run_id = h.run(held, dead, done, retry, lapsing)
        h.claim(run_id, held, lease=3600)
        h.claim(run_id, dead, holder=DEAD)
        h.claim(run_id, done)
        h.report(run_id, done)
        h.claim(run_id, retry)
        store.report(
            ReportRequest(
                key=h.key(retry), holder=ALIVE, run_id=run_id, item_ref=retry.provider_message_id,
                disposition=Disposition.QUEUED, detail="provider timed out",
                retry_at=clock.now() + timedelta(minutes=5),
            ),
            clock.now(),
        )  # fmt: skip
        h.claim(run_id, lapsing, lease=30)

        def due() -> list[str]:
            found = store.reclaimable(WS, clock.now(), alive)
            assert all(e.run_id == run_id and e.owner == WS for e in found)
            assert all(e.scanned is not None and e.scanned.envelope is not None for e in found)
            return sorted(e.item_ref for e in found)

        assert due() == [dead.provider_message_id]
        clock.advance(seconds=31)
        assert due() == sorted([dead.provider_message_id, lapsing.provider_message_id])
        clock.advance(minutes=5)
        assert due() == sorted(
            [dead.provider_message_id, lapsing.provider_message_id, retry.provider_message_id]
        )
        [entry] = [e for e in store.reclaimable(WS, clock.now(), alive) if e.item_ref == "pm-2"]
        assert entry.scanned is not None and entry.scanned.envelope == dead
        assert entry.occurrence_key == h.key(dead) and entry.mailbox_id == MAILBOX
        assert store.reclaimable("station", clock.now(), alive) == []
        assert store.reclaimable("ws-contract2", clock.now(), alive) == []

    def test_a_second_claim_on_a_held_occurrence_creates_nothing(self, h: Harness) -> None:
        e = env(1, 1)
        r1, r2 = h.run(e), h.run(e)
        h.claim(r1, e)
        before = h.store.counts()
        lost = h.claim(r2, e, holder="host/3/3/other")
        assert lost.outcome is ClaimOutcome.EXECUTION_ALREADY_CLAIMED and lost.task is None
        assert lost.execution.holder == ALIVE
        # A lost claim writes nothing at all; its caller records the claim-race disposition.
        assert h.store.counts() == before and h.store.ledger(r2)[0].disposition is None

    def test_a_claim_after_the_report_is_already_done(self, h: Harness) -> None:
        e = env(1, 1)
        r1 = h.run(e)
        h.claim(r1, e)
        h.report(r1, e)
        r2 = h.run(e)
        assert h.claim(r2, e).outcome is ClaimOutcome.EXECUTION_ALREADY_DONE

    def test_a_dead_holders_claim_is_taken_over_exactly_once(self, h: Harness) -> None:
        e = env(1, 1)
        r1, r2, r3 = h.run(e), h.run(e), h.run(e)
        first = h.claim(r1, e, holder=DEAD)
        taken = h.claim(r2, e, holder=ALIVE)
        assert taken.outcome is ClaimOutcome.CLAIMED and taken.taken_over
        # Taking over the claim that created the task is still the task's first handling.
        assert taken.task_created and taken.task is not None
        assert taken.task.task_id == first.execution.task_id
        assert taken.execution.generation == 2
        # The new holder is alive: nobody takes it over again.
        assert h.claim(r3, e, holder="host/4/4/x").outcome is ClaimOutcome.EXECUTION_ALREADY_CLAIMED
        assert h.store.counts()["tasks"] == 1

    def test_an_expired_lease_is_taken_over(self, h: Harness, clock: FrozenClock) -> None:
        e = env(1, 1)
        r1, r2 = h.run(e), h.run(e)
        h.claim(r1, e, holder="elsewhere/9/9/x", lease=30)
        clock.advance(seconds=31)
        assert h.claim(r2, e, holder=ALIVE).taken_over

    def test_the_previous_holder_cannot_report_after_a_takeover(self, h: Harness) -> None:
        e = env(1, 1)
        r1, r2 = h.run(e), h.run(e)
        h.claim(r1, e, holder=DEAD)
        h.claim(r2, e, holder=ALIVE)
        with pytest.raises(StoreError, match="no longer holds"):
            h.report(r1, e, holder=DEAD)
        record = h.store.get_execution(h.key(e))
        assert record is not None and record.state is ExecutionState.CLAIMED

    def test_reporting_an_unclaimed_occurrence_is_refused(self, h: Harness) -> None:
        e = env(1, 1)
        run_id = h.run(e)
        with pytest.raises(StoreError, match="claim the occurrence before reporting"):
            h.report(run_id, e)

    def test_a_later_message_in_the_thread_updates_the_one_task(self, h: Harness) -> None:
        first, second = env(1, 5), env(2, 5)
        run_id = h.run(first, second)
        a = h.claim(run_id, first)
        b = h.claim(run_id, second)
        assert a.task is not None and b.task is not None
        assert not b.task_created and b.task.task_id == a.task.task_id
        task = h.store.get_task(a.task.task_id)
        assert task is not None and [m.provider_message_id for m in task.messages] == [
            "pm-1",
            "pm-2",
        ]
        assert h.store.counts()["tasks"] == 1

    def test_an_exact_in_reply_to_links_a_message_from_another_provider_thread(
        self, h: Harness
    ) -> None:
        first = env(1, 5)
        reply = env(2, 6, in_reply_to=first.internet_message_id)
        run_id = h.run(first, reply)
        a = h.claim(run_id, first)
        b = h.claim(run_id, reply)
        assert a.task is not None and b.task is not None and b.task.task_id == a.task.task_id
        # The linked thread now maps to the same task.
        assert h.store.task_for_thread(work_key(WS, reply)) == h.store.get_task(a.task.task_id)

    def test_the_report_moves_the_task_and_records_gates_and_outcome(
        self, h: Harness, clock: FrozenClock
    ) -> None:
        run_id, e, claimed = h.claim_first()
        gate = Gate(
            kind=GateKind.CONTEXT_GAP, owner="noa.bar@fabrikam.test", since=clock.now(), reason="r"
        )
        h.report(
            run_id, e, Disposition.CONTEXT_GAP_DISCOVERY,
            update=TaskUpdate(state=TaskState.IN_DISCOVERY, add_gates=(gate,),
                              provisional_basis={"first_response_hours": "24"}),
        )  # fmt: skip
        assert claimed.task is not None
        task = h.store.get_task(claimed.task.task_id)
        assert task is not None
        assert task.state is TaskState.IN_DISCOVERY and task.open_gates == (gate,)
        assert task.execution_outcome == "CONTEXT_GAP_DISCOVERY" and task.execution_key == h.key(e)
        assert task.provisional_basis == {"first_response_hours": "24"}
        assert task.readiness_tier.value == "pending_gates"

    def test_a_report_resuming_on_inbound_uses_the_state_current_at_report_time(
        self, h: Harness
    ) -> None:
        first, follow = env(1, 1), env(2, 1)
        run_id = h.run(first, follow)
        h.claim(run_id, first)
        h.claim(run_id, follow)  # snapshot: DISCOVERED
        h.report(
            run_id,
            first,
            Disposition.WAITING_CLIENT,
            update=TaskUpdate(state=TaskState.TASK_RESOLVED),
        )
        h.report(run_id, follow, update=TaskUpdate(resume_on_inbound=True))
        task = h.store.task_for_thread(work_key(WS, first))
        assert task is not None and task.state is TaskState.TASK_RESOLVED

    def test_an_escalation_is_claimed_once_and_recorded_once(self, h: Harness) -> None:
        e = env(1, 1)
        r1, r2 = h.run(e), h.run(e)
        draft = EscalationDraft(
            scope="station", queue="unresolved", assignee="ops@fabrikam.test", reason="no binding",
            provider="memory", mailbox_id=MAILBOX, item_ref=e.provider_message_id,
        )  # fmt: skip
        for run_id in (r1, r2):
            h.store.claim(
                ClaimRequest(key="station-key", service="s", holder=ALIVE, run_id=run_id,
                             item_ref=e.provider_message_id),
                draft, h.clock.now(), alive,
            )  # fmt: skip
        assert len(h.store.list_escalations("station")) == 1
        assert h.store.list_escalations("ws-other") == []

    def test_a_retry_is_held_on_the_execution_record_and_claimable_once_due(
        self, h: Harness, clock: FrozenClock
    ) -> None:
        e = env(1, 1)
        r1, r2, r3 = h.run(e), h.run(e), h.run(e)
        claimed = h.claim(r1, e)
        h.store.report(
            ReportRequest(
                key=h.key(e), holder=ALIVE, run_id=r1, item_ref=e.provider_message_id,
                disposition=Disposition.QUEUED, detail="provider timed out",
                retry_at=clock.now() + timedelta(minutes=10),
            ),
            clock.now(),
        )  # fmt: skip
        record = h.store.get_execution(h.key(e))
        assert record is not None and record.state is ExecutionState.RETRY_PENDING
        assert claimed.task is not None
        task = h.store.get_task(claimed.task.task_id)
        assert task is not None and task.state is TaskState.BLOCKED_RETRY_PENDING
        # The task holds no retry timer of its own.
        assert "retry" not in task.model_dump_json().replace("BLOCKED_RETRY_PENDING", "")
        assert h.claim(r2, e, holder="host/5/5/x").outcome is ClaimOutcome.EXECUTION_ALREADY_CLAIMED
        clock.advance(minutes=11)
        retried = h.claim(r3, e, holder="host/6/6/y")
        assert retried.outcome is ClaimOutcome.CLAIMED and retried.taken_over
        assert retried.task is not None and retried.task.task_id == claimed.task.task_id

    def test_a_retry_with_a_terminal_outcome_is_refused(
        self, h: Harness, clock: FrozenClock
    ) -> None:
        e = env(1, 1)
        run_id = h.run(e)
        h.claim(run_id, e)
        with pytest.raises(StoreError, match="cannot carry the terminal disposition"):
            h.store.report(
                ReportRequest(
                    key=h.key(e), holder=ALIVE, run_id=run_id, item_ref=e.provider_message_id,
                    disposition=Disposition.NOISE_EXCLUDED, retry_at=clock.now(),
                ),
                clock.now(),
            )  # fmt: skip

    def test_a_noise_verdict_never_closes_a_thread_that_gained_a_real_message(
        self, h: Harness, clock: FrozenClock
    ) -> None:
        noise, reply = env(1, 1, auto_submitted="auto-replied"), env(2, 1)
        run_id = h.run(noise, reply)
        created = h.claim(run_id, noise)
        h.claim(run_id, reply)
        h.report(run_id, reply, update=TaskUpdate(resume_on_inbound=True))
        h.report(
            run_id, noise, Disposition.NOISE_EXCLUDED,
            update=TaskUpdate(state=TaskState.COMPLETED, sole_message=noise.provider_message_id),
        )  # fmt: skip
        assert created.task is not None
        task = h.store.get_task(created.task.task_id)
        # The thread holds real mail, so it is open and triaged, never left half-made.
        assert task is not None and task.state is TaskState.TASK_RESOLVED
        assert task.next_action.description != "none: automated message"
        assert [t.task_id for t in h.store.list_queue(WS)] == [task.task_id]

    def test_a_terminal_report_with_an_open_gate_is_rewritten_and_never_closes_the_task(
        self, h: Harness, clock: FrozenClock
    ) -> None:
        run_id, e, claimed = h.claim_first()
        gate = Gate(
            kind=GateKind.INTERNAL_APPROVAL,
            owner="noa.bar@fabrikam.test",
            since=clock.now(),
            reason="draft awaits approval",
        )
        record = h.report(
            run_id, e, Disposition.CLOSED_NO_REPLY_NEEDED,
            update=TaskUpdate(state=TaskState.COMPLETED, add_gates=(gate,)),
        )  # fmt: skip
        assert record.outcome is Disposition.WAITING_INTERNAL_APPROVAL
        assert h.store.ledger(run_id)[0].disposition is Disposition.WAITING_INTERNAL_APPROVAL
        assert claimed.task is not None
        task = h.store.get_task(claimed.task.task_id)
        assert task is not None and task.state is not TaskState.COMPLETED
        assert task.execution_outcome == "WAITING_INTERNAL_APPROVAL"
        with pytest.raises(TransitionError, match="open gates"):
            h.store.transition_task(task.task_id, TaskState.TASK_RESOLVED, "x", clock.now())
            h.store.transition_task(task.task_id, TaskState.COMPLETED, "close", clock.now())

    def test_a_finished_retry_goes_straight_to_a_state_the_table_allows(
        self, h: Harness, clock: FrozenClock
    ) -> None:
        task, second = reported_task_and_reply(h)
        for state in (TaskState.DRAFT_READY, TaskState.APPROVED_TO_SEND):
            h.store.transition_task(task.task_id, state, "work", clock.now())
        r2 = h.run(second)
        h.claim(r2, second)
        retry_later(h, r2, second, clock, 1)
        clock.advance(minutes=2)
        r3 = h.run(second)
        h.claim(r3, second, holder="host/0/7/7/b")
        h.report(
            r3, second, holder="host/0/7/7/b", update=TaskUpdate(state=TaskState.APPROVED_TO_SEND)
        )
        done = h.store.get_task(task.task_id)
        assert (
            done is not None and done.state is TaskState.APPROVED_TO_SEND and done.blocked_by == ()
        )

    def test_a_retry_is_recorded_whatever_state_the_task_waits_in(
        self, h: Harness, clock: FrozenClock
    ) -> None:
        task, second = reported_task_and_reply(h)
        h.store.transition_task(task.task_id, TaskState.WAITING_CLIENT, "asked", clock.now())
        r2 = h.run(second)
        h.claim(r2, second)
        retry_later(h, r2, second, clock, 1)
        record = h.store.get_execution(h.key(second))
        assert record is not None and record.state is ExecutionState.RETRY_PENDING
        waiting = h.store.get_task(task.task_id)
        assert waiting is not None and waiting.blocked_by == (h.key(second),)
        # WAITING_CLIENT may not move to BLOCKED_RETRY_PENDING; the task keeps its state and
        # shows the block in its readiness tier.
        assert (
            waiting.state is TaskState.WAITING_CLIENT and waiting.readiness_tier.value == "blocked"
        )

    def test_a_task_stays_blocked_until_its_last_retry_has_run(
        self, h: Harness, clock: FrozenClock
    ) -> None:
        first, second = env(1, 1), env(2, 1, in_reply_to="<m1@example.test>")
        r1, r2 = h.run(first), h.run(second)
        task = h.claim(r1, first).task
        retry_later(h, r1, first, clock, 60)
        h.claim(r2, second)
        retry_later(h, r2, second, clock, 1)
        clock.advance(minutes=2)
        r3 = h.run(second)
        h.claim(r3, second, holder="host/0/7/7/b")
        h.report(r3, second, holder="host/0/7/7/b", update=TaskUpdate(resume_on_inbound=True))
        assert task is not None
        still = h.store.get_task(task.task_id)
        assert still is not None and still.state is TaskState.BLOCKED_RETRY_PENDING
        assert still.blocked_by == (h.key(first),)

    def test_a_message_id_with_nul_bytes_or_thousands_of_characters_is_claimed_like_any_other(
        self,
        h: Harness,
    ) -> None:
        # Whatever a sender puts in Message-ID, In-Reply-To and References, every backend keys it.
        long_id = "<" + "x" * 5000 + "@contoso.test>"
        first = env(1, 1).model_copy(update={"internet_message_id": None})
        hostile = Envelope.model_validate(
            {**first.model_dump(by_alias=True), "internet_message_id": "<a\x00b@contoso.test>",
             "in_reply_to": long_id, "references": [long_id, long_id]}
        )  # fmt: skip
        assert hostile.internet_message_id == "<ab@contoso.test>"
        assert hostile.in_reply_to is not None and len(hostile.in_reply_to) < 100
        assert hostile.references == (hostile.in_reply_to,)
        run_id = h.run(hostile)
        result = h.claim(run_id, hostile)
        assert result.outcome is ClaimOutcome.CLAIMED and result.task is not None
        h.report(run_id, hostile)
        assert h.store.reconcile(run_id, h.clock.now()).clean

    def test_execution_records_are_listed_by_state_and_read_by_their_keys(
        self, h: Harness, clock: FrozenClock
    ) -> None:
        done, held = env(1, 1), env(2, 2)
        run_id = h.run(done, held)
        h.claim(run_id, done)
        h.report(run_id, done)
        clock.advance(seconds=1)
        h.claim(run_id, held)
        listed = h.store.list_executions()
        assert [x.key for x in listed] == [h.key(done), h.key(held)]
        assert [x.key for x in h.store.list_executions(ExecutionState.DONE)] == [h.key(done)]
        assert [x.key for x in h.store.list_executions(ExecutionState.CLAIMED)] == [h.key(held)]
        assert h.store.list_executions(ExecutionState.RETRY_PENDING) == []
        found = h.store.get_executions([h.key(held), "no-such-key", h.key(held), h.key(done)])
        assert found == {x.key: x for x in listed}
        assert h.store.get_executions([]) == {}
