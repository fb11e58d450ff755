"""The Registry role: workspaces and their mailbox bindings."""

from __future__ import annotations

import pytest

from agent.domain.errors import RegistryError
from agent.domain.records import Binding
from agent.ports import EmbeddedStore
from agent.testing.contexts import context_yaml
from agent.testing.storage.base import MAILBOX, WS, StoreContract, row


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
