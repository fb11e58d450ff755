"""The TaskBoard port on the embedded store: the queue and transitions."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from agent.domain.dispositions import Disposition
from agent.domain.errors import CloseRefused
from agent.domain.records import TaskUpdate
from agent.domain.states import TaskState
from agent.testing import FrozenClock
from agent.testing.storage.base import WS, Harness, StoreContract, env


class TaskBoardContract(StoreContract):
    """The TaskBoard port on the embedded store: the queue and transitions."""

    def test_the_queue_is_non_terminal_tasks_oldest_received_first(self, h: Harness) -> None:
        base = datetime(2026, 11, 1, tzinfo=UTC)
        late = env(1, 1, received_at=base + timedelta(hours=5))
        early = env(2, 2, received_at=base)
        done = env(3, 3, received_at=base - timedelta(hours=1))
        run_id = h.run(late, early, done)
        for e in (late, early, done):
            h.claim(run_id, e)
        h.report(
            run_id, done, Disposition.NOISE_EXCLUDED, update=TaskUpdate(state=TaskState.COMPLETED)
        )
        queue = h.store.list_queue(WS)
        assert [t.provider_thread_id for t in queue] == ["thread-2", "thread-1"]
        entries = h.store.list_queue_entries(WS)
        assert [(e.task_id, e.state, e.title, e.received_at) for e in entries] == [
            (t.task_id, t.state, t.title, t.received_at) for t in queue
        ]

    def test_transition_task_refuses_to_close_a_waiting_task(
        self, h: Harness, clock: FrozenClock
    ) -> None:
        run_id, e, claimed = h.claim_first()
        h.report(run_id, e)
        assert claimed.task is not None
        h.store.transition_task(
            claimed.task.task_id, TaskState.WAITING_CLIENT, "asked", clock.now()
        )
        with pytest.raises(CloseRefused):
            h.store.transition_task(claimed.task.task_id, TaskState.COMPLETED, "done?", clock.now())
        task = h.store.get_task(claimed.task.task_id)
        assert task is not None and task.state is TaskState.WAITING_CLIENT
        moved = h.store.transition_task(
            claimed.task.task_id, TaskState.TASK_RESOLVED, "reply", clock.now()
        )
        assert moved.state is TaskState.TASK_RESOLVED
