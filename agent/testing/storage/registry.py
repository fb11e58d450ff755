"""The Registry role: workspaces and their mailbox bindings."""

from __future__ import annotations

import pytest

from agent.domain.errors import MinuteTaken, RegistryError
from agent.domain.records import Binding
from agent.ports import EmbeddedStore
from agent.testing.contexts import context_yaml
from agent.testing.storage.base import MAILBOX, OTHER_WS, WS, StoreContract, row


class RegistryContract(StoreContract):
    """The Registry role: workspaces and their mailbox bindings."""

    def test_registering_a_duplicate_workspace_id_is_refused(self, store: EmbeddedStore) -> None:
        binding = Binding(workspace_id=WS, provider="memory", mailbox_id=MAILBOX, shared=False)
        store.register_workspace(row(), [binding])
        with pytest.raises(RegistryError, match="already registered"):
            store.register_workspace(row(), [binding])
        assert [w.workspace_id for w in store.list_workspaces()] == [WS]
        assert store.bindings_for_mailbox("memory", MAILBOX.upper()) == [binding]

    def test_the_registered_context_text_is_kept_and_replaced_by_an_update(
        self, store: EmbeddedStore
    ) -> None:
        text = context_yaml(WS, mailbox=MAILBOX)
        store.register_workspace(row().model_copy(update={"context_text": text}), [])
        stored = store.get_workspace(WS)
        assert stored is not None and stored.context_text == text
        later = text.replace("Test workspace", "Renamed workspace")
        store.update_workspace(row().model_copy(update={"context_text": later, "label": "y"}), [])
        stored = store.get_workspace(WS)
        assert stored is not None and stored.context_text == later and stored.label == "y"

    def test_updating_an_unknown_workspace_is_refused(self, store: EmbeddedStore) -> None:
        with pytest.raises(RegistryError, match="not registered"):
            store.update_workspace(row("ws-nobody"), [])

    def test_a_schedule_minute_is_held_by_one_workspace_unless_it_is_shared(
        self, store: EmbeddedStore
    ) -> None:
        store.register_workspace(row().model_copy(update={"schedule_minute": 17}), [])
        taken = row(OTHER_WS).model_copy(update={"schedule_minute": 17})
        with pytest.raises(MinuteTaken):
            store.register_workspace(taken, [])
        assert store.get_workspace(OTHER_WS) is None
        store.register_workspace(taken.model_copy(update={"schedule_shared": True}), [])
        assert store.held_minutes() == {17: WS}

    def test_a_schedule_recorded_later_is_read_back(self, store: EmbeddedStore) -> None:
        store.register_workspace(row(), [])
        assert store.held_minutes() == {}
        recorded = row().model_copy(
            update={"schedule_minute": 5, "schedule_expression": "5 8 * * 0-5"}
        )
        store.set_schedule(recorded)
        stored = store.get_workspace(WS)
        assert stored is not None
        assert (stored.schedule_minute, stored.schedule_expression) == (5, "5 8 * * 0-5")
        with pytest.raises(RegistryError, match="not registered"):
            store.set_schedule(row("ws-nobody"))
