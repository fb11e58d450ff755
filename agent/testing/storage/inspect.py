"""What a backend says about its database: schema version, counts, integrity."""

from __future__ import annotations

from collections.abc import Callable

from agent.ports import EmbeddedStore
from agent.storage.schema import MIGRATIONS
from agent.testing.storage.base import WS, StoreContract


class InspectContract(StoreContract):
    """What a backend says about its database: schema version, counts, integrity."""

    def test_migrations_apply_once_and_reopening_changes_nothing(
        self, store: EmbeddedStore, open_store: Callable[[], EmbeddedStore]
    ) -> None:
        version = store.schema_version()
        assert open_store().schema_version() == version
        assert store.integrity_check() == "ok"

    def test_a_fresh_store_has_zero_workspaces_tasks_and_claims(self, store: EmbeddedStore) -> None:
        assert store.list_workspaces() == []
        assert store.counts() == dict.fromkeys(
            ("executions", "tasks", "task_threads", "task_messages", "runs", "run_items", "escalations",
             "sends", "executions_done"), 0
        )  # fmt: skip

    def test_a_fresh_store_is_at_the_latest_schema_version_with_empty_sends_drafts_and_proposals(
        self,
        store: EmbeddedStore,
    ) -> None:
        assert store.schema_version() == MIGRATIONS[-1][0] == 8
        assert store.counts()["sends"] == 0
        assert store.list_sends(WS) == []
        assert store.get_draft("draft-none") is None
        assert store.list_proposals(WS) == []
        assert store.integrity_check() == "ok"
