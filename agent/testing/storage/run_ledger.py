"""The RunLedger role: runs, one disposition per scanned item, reconciliation."""

from __future__ import annotations

from datetime import timedelta

import pytest

from agent.domain.dispositions import Disposition
from agent.domain.errors import StoreError
from agent.domain.execution import ClaimOutcome
from agent.domain.records import TaskUpdate
from agent.domain.run import LedgerEntry
from agent.domain.states import TaskState
from agent.ports import EmbeddedStore
from agent.testing import FrozenClock
from agent.testing.storage.base import ALIVE, DEAD, WS, Harness, StoreContract, alive, env


class RunLedgerContract(StoreContract):
    """The RunLedger role: runs, one disposition per scanned item, reconciliation."""

    def test_claim_race_dispositions_are_recorded_in_one_batch_all_or_none(
        self, h: Harness, clock: FrozenClock
    ) -> None:
        a, b = env(1, 1), env(2, 2)
        run_id = h.run(a, b)
        race = [
            ("pm-1", Disposition.EXECUTION_ALREADY_DONE, ""),
            ("pm-2", Disposition.EXECUTION_ALREADY_CLAIMED, "held"),
        ]
        h.store.record_dispositions(run_id, race, clock.now())
        assert [e.disposition for e in h.store.ledger(run_id)] == [d for _, d, _ in race]
        # A batch with one bad entry records nothing.
        run2 = h.run(a, b)
        bad = [("pm-1", Disposition.EXECUTION_ALREADY_DONE, ""), ("pm-9", Disposition.QUEUED, "")]
        with pytest.raises(StoreError, match="never recorded as scanned"):
            h.store.record_dispositions(run2, bad, clock.now())
        assert all(e.disposition is None for e in h.store.ledger(run2))

    def test_an_item_gets_exactly_one_disposition_per_run(
        self, h: Harness, clock: FrozenClock
    ) -> None:
        e = env(1, 1)
        run_id = h.run(e)
        h.store.record_disposition(
            run_id, e.provider_message_id, Disposition.ESCALATED, "", clock.now()
        )
        with pytest.raises(StoreError, match="already has disposition ESCALATED"):
            h.store.record_disposition(
                run_id, e.provider_message_id, Disposition.QUEUED, "", clock.now()
            )
        with pytest.raises(StoreError, match="never recorded as scanned"):
            h.store.record_disposition(run_id, "pm-unknown", Disposition.QUEUED, "", clock.now())

    def test_reconcile_counts_every_scanned_item_into_one_class(
        self, h: Harness, clock: FrozenClock
    ) -> None:
        a, b, c = env(1, 1), env(2, 2), env(3, 3)
        r1 = h.run(a)
        h.claim(r1, a)
        h.report(r1, a)
        run_id = h.run(a, b, c)
        assert h.claim(run_id, a).outcome is ClaimOutcome.EXECUTION_ALREADY_DONE
        h.store.record_disposition(
            run_id, "pm-1", Disposition.EXECUTION_ALREADY_DONE, "", clock.now()
        )
        h.claim(run_id, b)
        h.report(
            run_id, b, Disposition.NOISE_EXCLUDED, update=TaskUpdate(state=TaskState.COMPLETED)
        )
        h.claim(run_id, c)
        h.report(run_id, c, Disposition.WAITING_INTERNAL_APPROVAL, update=TaskUpdate())
        rec = h.store.reconcile(run_id, clock.now())
        assert (rec.scanned, rec.terminal, rec.non_terminal, rec.claim_race) == (3, 1, 1, 1)
        assert rec.clean and rec.reconciliation_failed == 0
        assert h.store.run_summary(run_id) == rec

    def test_an_item_without_an_outcome_is_reconciliation_failed_and_the_run_not_clean(
        self, h: Harness, clock: FrozenClock
    ) -> None:
        a, b = env(1, 1), env(2, 2)
        run_id = h.run(a, b)
        h.claim(run_id, a)
        h.report(run_id, a)
        h.claim(run_id, b)  # the worker died before reporting b
        rec = h.store.reconcile(run_id, clock.now())
        assert rec.reconciliation_failed == 1 and not rec.clean
        assert (
            rec.scanned
            == rec.terminal + rec.non_terminal + rec.claim_race + rec.reconciliation_failed
        )
        dispositions = {e.item_ref: e.disposition for e in h.store.ledger(run_id)}
        assert dispositions["pm-2"] is Disposition.RECONCILIATION_FAILED

    def test_reconcile_is_idempotent(self, h: Harness, clock: FrozenClock) -> None:
        a = env(1, 1)
        run_id = h.run(a)
        h.claim(run_id, a)
        h.report(run_id, a)
        first = h.store.reconcile(run_id, clock.now())
        again = h.store.reconcile(run_id, clock.now())
        assert first.clean and again.model_dump(exclude={"reconciled_at"}) == first.model_dump(
            exclude={"reconciled_at"}
        )

    def test_reconciling_an_unknown_run_is_an_error(
        self, store: EmbeddedStore, clock: FrozenClock
    ) -> None:
        with pytest.raises(StoreError, match="does not exist"):
            store.reconcile("run-nope", clock.now())

    def test_unreconciled_runs_lists_open_runs_of_the_scope_with_their_holder(
        self, h: Harness, clock: FrozenClock
    ) -> None:
        e = env(1, 1)
        open_run, done_run = h.run(e), h.run(e)
        h.store.reconcile(done_run, clock.now())
        h.store.start_run("run-other-scope", "ws-other", DEAD, clock.now())
        assert [
            (r.run_id, r.holder, r.lease_expires_at) for r in h.store.unreconciled_runs(WS)
        ] == [(open_run, ALIVE, None)]

    def test_a_run_lease_is_kept_renewed_by_its_holder_only_until_it_is_reconciled(
        self, store: EmbeddedStore, clock: FrozenClock
    ) -> None:
        lease = clock.now() + timedelta(minutes=15)
        store.start_run("run-leased", WS, ALIVE, clock.now(), lease)
        [run] = store.unreconciled_runs(WS)
        assert run.lease_expires_at == lease
        assert not run.stale(clock.now(), alive)
        assert run.stale(lease, alive)  # the lease ran out
        assert run.stale(clock.now(), lambda _holder: False)  # the holder is provably dead
        later = lease + timedelta(minutes=10)
        assert not store.renew_run("run-leased", DEAD, later)  # only the holder renews
        assert store.renew_run("run-leased", ALIVE, later)
        [run] = store.unreconciled_runs(WS)
        assert run.lease_expires_at == later and not run.stale(lease, alive)
        store.reconcile("run-leased", clock.now())
        assert not store.renew_run("run-leased", ALIVE, later + timedelta(minutes=10))
        assert store.unreconciled_runs(WS) == []

    def test_a_stale_run_is_reconciled_only_while_it_is_still_open_and_stale(
        self, store: EmbeddedStore, clock: FrozenClock
    ) -> None:
        lease = clock.now() + timedelta(minutes=15)
        store.start_run("run-leased", WS, ALIVE, clock.now(), lease)
        store.record_scanned([LedgerEntry(run_id="run-leased", item_ref="a")], clock.now())
        assert store.reconcile_stale("run-leased", clock.now(), alive) is None  # lease runs
        # Its worker renewed in time: a reconciler that decided on the old lease gets nothing.
        assert store.renew_run("run-leased", ALIVE, lease + timedelta(minutes=15))
        assert store.reconcile_stale("run-leased", lease, alive) is None
        later = lease + timedelta(minutes=20)
        stale = store.reconcile_stale("run-leased", later, alive)
        assert stale is not None and stale.reconciliation_failed == 1 and not stale.clean
        assert store.reconcile_stale("run-leased", later, alive) is None  # once only
        # A worker whose run was reconciled under it cannot record more items into it.
        with pytest.raises(StoreError, match="already reconciled"):
            store.record_scanned([LedgerEntry(run_id="run-leased", item_ref="b")], later)
        assert [e.item_ref for e in store.ledger("run-leased")] == ["a"]
        assert store.reconcile_stale("run-unknown", later, alive) is None
