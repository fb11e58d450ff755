"""The Health role: health events counted by key."""

from __future__ import annotations

from agent.ports import EmbeddedStore
from agent.testing import FrozenClock
from agent.testing.storage.base import StoreContract


class HealthContract(StoreContract):
    """The Health role: health events counted by key."""

    def test_health_records_count_repeats(self, store: EmbeddedStore, clock: FrozenClock) -> None:
        store.record_health("station.yaml: escalation_contact", "missing", clock.now())
        store.record_health("station.yaml: escalation_contact", "missing", clock.now())
        [record] = store.list_health()
        assert record.key == "station.yaml: escalation_contact" and record.count == 2
