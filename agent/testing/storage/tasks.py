"""The Tasks role: task records changed by amendments under the task's lock."""

from __future__ import annotations

from datetime import timedelta

import pytest

from agent.domain.dispositions import GateKind
from agent.domain.envelope import work_key
from agent.domain.errors import CloseRefused, StoreError, TransitionError
from agent.domain.records import TaskAmendment
from agent.domain.states import TRANSITIONS, TaskState
from agent.domain.task import MessageRef
from agent.ports import EmbeddedStore
from agent.testing import FrozenClock
from agent.testing.storage.base import (
    MAILBOX,
    WS,
    Harness,
    StoreContract,
    approval_request,
    gate,
    new_task,
    reply_in_thread,
)


class TasksContract(StoreContract):
    """The Tasks role: task records changed by amendments under the task's lock."""

    def test_an_amendment_moves_the_task_as_the_table_allows_and_records_its_event(
        self, h: Harness, clock: FrozenClock
    ) -> None:
        task = new_task(h)
        before_events = h.store.task_events(task.task_id)
        steps = [
            (TaskState.TASK_RESOLVED, "triaged: a client request"),
            (TaskState.DRAFT_READY, "draft written"),
            (TaskState.WAITING_INTERNAL_APPROVAL, "approval request sent"),
            (TaskState.APPROVED_TO_SEND, "approver approved draft-1"),
        ]
        expected_events = list(before_events)
        current = TaskState.DISCOVERED
        for target, event in steps:
            assert target in TRANSITIONS[current]
            at = clock.advance(minutes=10)
            amended = h.store.amend_task(
                task.task_id, TaskAmendment(event=event, expect_states=(current,), state=target), at
            )
            assert amended.state is target and amended.state_since == at
            assert amended.updated_at == at
            assert h.store.get_task(task.task_id) == amended
            expected_events.append((at, target, event))
            current = target
        assert h.store.task_events(task.task_id) == expected_events

        # An amendment that changes no state keeps state_since, and is still an event.
        at = clock.advance(minutes=10)
        same = h.store.amend_task(
            task.task_id, TaskAmendment(event="message class set", message_class="invoice"), at
        )
        assert same.state is TaskState.APPROVED_TO_SEND and same.message_class == "invoice"
        assert same.state_since == at - timedelta(minutes=10)
        assert h.store.task_events(task.task_id)[-1] == (
            at,
            TaskState.APPROVED_TO_SEND,
            "message class set",
        )

    def test_an_amendment_expecting_another_state_is_refused_and_changes_nothing(
        self, h: Harness, clock: FrozenClock
    ) -> None:
        task = new_task(h)
        before = h.store.get_task(task.task_id)
        events, counts = h.store.task_events(task.task_id), h.store.counts()
        amendment = TaskAmendment(
            event="approver approved draft-1",
            expect_states=(TaskState.WAITING_INTERNAL_APPROVAL,),
            state=TaskState.APPROVED_TO_SEND,
            add_gates=(gate(GateKind.CLIENT_RESPONSE, clock.now()),),
            approval_request=approval_request(1, clock.now()),
            message_class="invoice",
            sent_message=MessageRef(
                provider_message_id="sent-x", internet_message_id="<sent-x@fabrikam.test>",
                direction="outbound", received_at=clock.now(), sender=MAILBOX,
            ),
        )  # fmt: skip
        with pytest.raises(TransitionError, match="approver approved draft-1 was not applied"):
            h.store.amend_task(task.task_id, amendment, clock.advance(minutes=1))
        assert h.store.get_task(task.task_id) == before
        assert h.store.task_events(task.task_id) == events
        assert h.store.counts() == counts

    @pytest.mark.parametrize(
        ("path", "target", "error"),
        [
            ((), TaskState.APPROVED_TO_SEND, TransitionError),
            ((), TaskState.WAITING_CLIENT, TransitionError),
            (
                (TaskState.TASK_RESOLVED, TaskState.WAITING_CLIENT),
                TaskState.COMPLETED,
                CloseRefused,
            ),
            (
                (TaskState.TASK_RESOLVED, TaskState.EXECUTING),
                TaskState.TASK_RESOLVED,
                TransitionError,
            ),
        ],
    )
    def test_an_amendment_the_transition_table_forbids_raises_and_changes_nothing(
        self,
        h: Harness,
        clock: FrozenClock,
        path: tuple[TaskState, ...],
        target: TaskState,
        error: type[Exception],
    ) -> None:
        task = new_task(h)
        current = TaskState.DISCOVERED
        for state in path:
            h.store.amend_task(
                task.task_id,
                TaskAmendment(event=f"to {state}", state=state),
                clock.advance(minutes=1),
            )
            current = state
        assert target not in TRANSITIONS[current]
        before = h.store.get_task(task.task_id)
        events, counts = h.store.task_events(task.task_id), h.store.counts()
        sent = MessageRef(
            provider_message_id="sent-y", internet_message_id="<sent-y@fabrikam.test>",
            direction="outbound", received_at=clock.now(), sender=MAILBOX,
        )  # fmt: skip
        with pytest.raises(error):
            h.store.amend_task(
                task.task_id,
                TaskAmendment(
                    event="forbidden", state=target, sent_message=sent, remaining_work="x"
                ),
                clock.advance(minutes=1),
            )
        assert h.store.get_task(task.task_id) == before
        assert h.store.task_events(task.task_id) == events
        assert h.store.counts() == counts

    def test_an_amendment_closing_a_task_with_an_open_gate_is_refused(
        self, h: Harness, clock: FrozenClock
    ) -> None:
        task = new_task(h)
        before = h.store.get_task(task.task_id)
        events = h.store.task_events(task.task_id)
        closing = TaskAmendment(
            event="closed with a gate",
            state=TaskState.COMPLETED,
            add_gates=(gate(GateKind.INTERNAL_APPROVAL, clock.now()),),
        )
        with pytest.raises(TransitionError, match="open gates"):
            h.store.amend_task(task.task_id, closing, clock.advance(minutes=1))
        assert h.store.get_task(task.task_id) == before
        assert h.store.task_events(task.task_id) == events

    def test_a_sent_message_is_added_to_the_task_and_a_reply_to_it_joins_the_task(
        self, h: Harness, clock: FrozenClock
    ) -> None:
        task = new_task(h, 1, thread_no=1)
        sent = MessageRef(
            provider_message_id="sent-1", internet_message_id="<sent-1@fabrikam.test>",
            direction="outbound", received_at=clock.now(), sender=MAILBOX,
        )  # fmt: skip
        amended = h.store.amend_task(
            task.task_id, TaskAmendment(event="client reply sent", sent_message=sent), clock.now()
        )
        assert amended.messages == (*task.messages, sent)
        stored = h.store.get_task(task.task_id)
        assert stored is not None and stored.messages == (*task.messages, sent)
        # The same message recorded again is not listed twice.
        again = h.store.amend_task(
            task.task_id, TaskAmendment(event="client reply read back", sent_message=sent),
            clock.advance(seconds=1),
        )  # fmt: skip
        assert again.messages == (*task.messages, sent)

        # The client answers the sent message; the provider files it in another thread.
        reply, joined = reply_in_thread(h, 2, 9, "<sent-1@fabrikam.test>")
        assert joined.task_id == task.task_id
        assert h.store.counts()["tasks"] == 1
        assert h.store.task_for_thread(work_key(WS, reply)) == h.store.get_task(task.task_id)
        final = h.store.get_task(task.task_id)
        assert final is not None
        assert [m.provider_message_id for m in final.messages] == ["pm-1", "sent-1", "pm-2"]

        # A reply to a message no task sent starts its own task.
        _, unrelated = reply_in_thread(h, 3, 10, "<never-sent@fabrikam.test>")
        assert unrelated.task_id != task.task_id
        assert h.store.counts()["tasks"] == 2

    def test_amendments_add_and_remove_gates(self, h: Harness, clock: FrozenClock) -> None:
        task = new_task(h)
        now = clock.now()
        approval, gap = gate(GateKind.INTERNAL_APPROVAL, now), gate(GateKind.CONTEXT_GAP, now)
        added = h.store.amend_task(
            task.task_id, TaskAmendment(event="gates opened", add_gates=(approval, gap)), now
        )
        assert added.open_gates == (approval, gap)
        assert added.readiness_tier.value == "pending_gates"
        # A second gate of a kind already open is not added.
        duplicate = gate(GateKind.INTERNAL_APPROVAL, clock.advance(minutes=1))
        same = h.store.amend_task(
            task.task_id, TaskAmendment(event="asked again", add_gates=(duplicate,)), clock.now()
        )
        assert same.open_gates == (approval, gap)
        removed = h.store.amend_task(
            task.task_id,
            TaskAmendment(event="gap answered", remove_gate_kinds=(GateKind.CONTEXT_GAP,)),
            clock.advance(minutes=1),
        )
        assert removed.open_gates == (approval,)
        # Removing a kind and adding one in the same amendment.
        client = gate(GateKind.CLIENT_RESPONSE, clock.advance(minutes=1))
        swapped = h.store.amend_task(
            task.task_id,
            TaskAmendment(
                event="approved; waiting for the client",
                remove_gate_kinds=(GateKind.INTERNAL_APPROVAL,),
                add_gates=(client,),
            ),
            clock.now(),
        )
        assert swapped.open_gates == (client,)
        cleared = h.store.amend_task(
            task.task_id,
            TaskAmendment(event="client answered", remove_gate_kinds=(GateKind.CLIENT_RESPONSE,)),
            clock.advance(minutes=1),
        )
        assert cleared.open_gates == () and cleared.readiness_tier.value == "ready"
        assert h.store.get_task(task.task_id) == cleared

    def test_approval_requests_are_appended(self, h: Harness, clock: FrozenClock) -> None:
        task = new_task(h)
        first, second = approval_request(1, clock.now()), approval_request(2, clock.now())
        h.store.amend_task(
            task.task_id, TaskAmendment(event="approval request 1 sent", approval_request=first),
            clock.now(),
        )  # fmt: skip
        amended = h.store.amend_task(
            task.task_id, TaskAmendment(event="approval request 2 sent", approval_request=second),
            clock.advance(minutes=1),
        )  # fmt: skip
        assert amended.approval_requests == (first, second)
        stored = h.store.get_task(task.task_id)
        assert stored is not None and stored.approval_requests == (first, second)
        assert [e for _, _, e in h.store.task_events(task.task_id)][-2:] == [
            "approval request 1 sent",
            "approval request 2 sent",
        ]

    def test_amending_an_unknown_task_is_an_error(
        self, store: EmbeddedStore, clock: FrozenClock
    ) -> None:
        with pytest.raises(StoreError, match="does not exist"):
            store.amend_task("task-nobody", TaskAmendment(event="x"), clock.now())
        assert store.task_events("task-nobody") == []

    def test_list_tasks_lists_every_task_of_the_workspace_oldest_first(self, h: Harness) -> None:
        first, second = new_task(h, 1, 1), new_task(h, 2, 2)
        assert [t.task_id for t in h.store.list_tasks(WS)] == [first.task_id, second.task_id]
        assert h.store.list_tasks("ws-other") == []
