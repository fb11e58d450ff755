"""The Drafts role: rendered drafts kept once by id."""

from __future__ import annotations

from agent.domain.records import DraftRecord
from agent.testing import FrozenClock
from agent.testing.storage.base import WS, Harness, StoreContract, new_task


class DraftsContract(StoreContract):
    """The Drafts role: rendered drafts kept once by id."""

    def test_a_saved_draft_is_kept_once_and_read_back_by_id(
        self, h: Harness, clock: FrozenClock
    ) -> None:
        task = new_task(h)
        first = DraftRecord(
            draft_id="draft-1",
            task_id=task.task_id,
            workspace_id=WS,
            digest="d" * 64,
            rendered='{"subject": "Re: x"}',
            created_at=clock.now(),
        )
        assert h.store.save_draft(first) == first
        # Saving the same id again keeps the first one (a draft's id names its content).
        again = first.model_copy(update={"rendered": "{}", "created_at": clock.advance(minutes=1)})
        assert h.store.save_draft(again) == first
        assert h.store.get_draft("draft-1") == first
