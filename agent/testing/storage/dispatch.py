"""The Dispatch role: named leases, dispatcher processes, scheduled cycles."""

from __future__ import annotations

from datetime import timedelta

from agent.domain.records import DispatcherRow
from agent.ports import EmbeddedStore
from agent.testing import FrozenClock
from agent.testing.storage.base import ALIVE, DEAD, WS, StoreContract

TTL = timedelta(seconds=30)
NAME = f"dispatch {WS}"


class DispatchContract(StoreContract):
    """The Dispatch role: named leases, dispatcher processes, scheduled cycles."""

    def test_a_lease_is_kept_by_its_holder_until_it_expires(
        self, store: EmbeddedStore, clock: FrozenClock
    ) -> None:
        first = store.take_lease(NAME, ALIVE, clock.now(), TTL)
        assert first is not None and first.holder == ALIVE
        assert store.take_lease(NAME, DEAD, clock.advance(seconds=10), TTL) is None
        renewed = store.take_lease(NAME, ALIVE, clock.advance(seconds=10), TTL)
        assert renewed is not None and renewed.acquired_at == first.acquired_at
        assert renewed.expires_at == clock.now() + TTL
        taken = store.take_lease(NAME, DEAD, clock.advance(seconds=31), TTL)
        assert taken is not None and taken.holder == DEAD and taken.acquired_at == clock.now()
        lease = store.get_lease(NAME)
        assert lease is not None and lease.holder == DEAD

    def test_a_lease_of_a_holder_proven_dead_is_taken_before_it_expires(
        self, store: EmbeddedStore, clock: FrozenClock
    ) -> None:
        assert store.take_lease(NAME, DEAD, clock.now(), TTL) is not None
        assert store.take_lease(NAME, ALIVE, clock.now(), TTL, dead="someone-else") is None
        taken = store.take_lease(NAME, ALIVE, clock.now(), TTL, dead=DEAD)
        assert taken is not None and taken.holder == ALIVE

    def test_a_released_lease_is_free_and_only_its_holder_releases_it(
        self, store: EmbeddedStore, clock: FrozenClock
    ) -> None:
        assert store.take_lease(NAME, ALIVE, clock.now(), TTL) is not None
        store.release_lease(NAME, DEAD)
        assert store.get_lease(NAME) is not None
        store.release_lease(NAME, ALIVE)
        assert store.get_lease(NAME) is None

    def test_a_dispatcher_report_replaces_its_role_and_last_seen_and_old_ones_are_forgotten(
        self, store: EmbeddedStore, clock: FrozenClock
    ) -> None:
        report = DispatcherRow(
            holder=ALIVE, workspace_id=WS, role="standby", executable="/venv/bin/python",
            install="/opt/outloop", version="1.0", started_at=clock.now(), seen_at=clock.now(),
        )  # fmt: skip
        store.record_dispatcher(report)
        later = clock.advance(seconds=5)
        store.record_dispatcher(report.model_copy(update={"role": "active", "seen_at": later}))
        [seen] = store.list_dispatchers(WS)
        assert (seen.role, seen.seen_at, seen.started_at) == ("active", later, report.started_at)
        assert store.list_dispatchers("ws-other") == []
        much_later = clock.advance(days=91)  # a report not seen for 90 days is forgotten
        store.record_dispatcher(report.model_copy(update={"holder": DEAD, "seen_at": much_later}))
        assert [d.holder for d in store.list_dispatchers(WS)] == [DEAD]

    def test_a_scheduled_cycle_runs_once_and_an_unfinished_one_goes_to_a_holder_proven_dead(
        self, store: EmbeddedStore, clock: FrozenClock
    ) -> None:
        due = clock.now()
        assert store.start_cycle(WS, due, DEAD, clock.now())
        assert not store.start_cycle(WS, due, ALIVE, clock.now())
        assert store.start_cycle(WS, due, ALIVE, clock.advance(seconds=1), dead=DEAD)
        store.finish_cycle(WS, due, ALIVE, clock.advance(seconds=1), "run-1", "clean")
        assert not store.start_cycle(WS, due, DEAD, clock.now(), dead=ALIVE)
        [cycle] = store.list_cycles(WS)
        assert (cycle.holder, cycle.run_id, cycle.outcome) == (ALIVE, "run-1", "clean")
        assert cycle.finished_at == clock.now()
