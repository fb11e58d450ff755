"""The sends ledger and task amendments: every backend runs these (see conftest BACKENDS)."""

from __future__ import annotations

import multiprocessing
import queue
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from agent.domain.approval import ApprovalRequest
from agent.domain.dispositions import GateKind
from agent.domain.envelope import Envelope, work_key
from agent.domain.errors import CloseRefused, StoreError, TransitionError
from agent.domain.execution import ClaimOutcome
from agent.domain.records import (
    Binding,
    DraftRecord,
    LearningProposal,
    ProposalState,
    SendIntent,
    SendRecord,
    SendState,
    TaskAmendment,
)
from agent.domain.states import TRANSITIONS, TaskState
from agent.domain.task import Gate, MessageRef, Task
from agent.ports import Store
from agent.storage.postgres import PostgresStore
from agent.storage.schema import MIGRATIONS
from agent.storage.sqlite import SqliteStore
from agent.testing import FrozenClock
from tests.conftest import pg_url_at
from tests.storage.test_store_contract import MAILBOX, WS, Harness, env, row

OTHER_WS = "ws-contract-other"
DANA = "dana.levi@contoso.test"
NOA = "noa.bar@fabrikam.test"
CAP_WORKERS = 10
CAP = 3


def register(store: Store, *workspace_ids: str) -> None:
    """Register workspaces (the sends ledger locks the workspace row to decide the cap)."""
    for workspace_id in workspace_ids:
        binding = Binding(
            workspace_id=workspace_id, provider="memory", mailbox_id=MAILBOX, shared=False
        )
        store.register_workspace(row(workspace_id), [binding])


def intent(
    key: str,
    *recipients: str,
    automated: bool = True,
    workspace_id: str = WS,
    task_id: str | None = None,
) -> SendIntent:
    return SendIntent(
        key=key,
        workspace_id=workspace_id,
        kind="client_reply",
        task_id=task_id,
        internet_message_id=f"<{key}@fabrikam.test>",
        recipients=recipients or (DANA,),
        automated=automated,
    )


@pytest.fixture
def h(store: Store, clock: FrozenClock) -> Harness:
    return Harness(store, clock)


def new_task(h: Harness, message_no: int = 1, thread_no: int = 1) -> Task:
    """A task in DISCOVERED, created by a won claim the way intake creates it."""
    e = env(message_no, thread_no)
    result = h.claim(h.run(e), e)
    assert result.outcome is ClaimOutcome.CLAIMED and result.task_created
    assert result.task is not None and result.task.state is TaskState.DISCOVERED
    return result.task


def gate(kind: GateKind, since: datetime) -> Gate:
    return Gate(kind=kind, owner=NOA, since=since, reason=f"{kind} open")


def approval_request(n: int, sent_at: datetime) -> ApprovalRequest:
    return ApprovalRequest(
        draft_id=f"draft-{n}",
        draft_digest=f"digest-{n}",
        internet_message_id=f"<approval-{n}@fabrikam.test>",
        provider_thread_id=f"approval-thread-{n}",
        approvers=(NOA,),
        sent_at=sent_at,
    )


# -- schema --------------------------------------------------------------------------------


def test_a_fresh_store_is_at_the_latest_schema_version_with_empty_sends_drafts_and_proposals(
    store: Store,
) -> None:
    assert store.schema_version() == MIGRATIONS[-1][0] == 5
    assert store.counts()["sends"] == 0
    assert store.list_sends(WS) == []
    assert store.get_draft("draft-none") is None
    assert store.list_proposals(WS) == []
    assert store.integrity_check() == "ok"


# -- drafts and learning proposals ------------------------------------------------------------


def test_a_saved_draft_is_kept_once_and_read_back_by_id(h: Harness, clock: FrozenClock) -> None:
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


def test_a_learning_proposal_is_queued_once_in_submission_order(
    store: Store, clock: FrozenClock
) -> None:
    register(store, WS)

    def proposal(n: int) -> LearningProposal:
        return LearningProposal(
            proposal_id=f"lp-{n}",
            workspace_id=WS,
            kind="new_contact",
            summary=f"add contact {n}",
            detail="seen in three threads",
            evidence=(f"<m{n}@contoso.test>",),
            submitted_at=clock.advance(minutes=1),
        )

    assert store.add_proposal(proposal(1)).created
    assert store.add_proposal(proposal(2)).created
    repeat = store.add_proposal(proposal(1))
    assert not repeat.created and repeat.summary == "add contact 1"
    listed = store.list_proposals(WS)
    assert [p.proposal_id for p in listed] == ["lp-1", "lp-2"]
    assert listed[0].state is ProposalState.QUEUED
    assert listed[0].evidence == ("<m1@contoso.test>",)
    assert store.list_proposals("ws-other") == []


# -- the sends ledger ------------------------------------------------------------------------


def test_begin_send_records_an_intent_once_and_complete_send_marks_it_sent(
    store: Store, clock: FrozenClock
) -> None:
    register(store, WS)
    begun_at = clock.now()
    first = store.begin_send(intent("send-1"), begun_at, cap=5)
    assert first.created and first.state is SendState.INTENT
    assert (first.key, first.workspace_id, first.kind) == ("send-1", WS, "client_reply")
    assert first.recipients == (DANA,) and first.internet_message_id == "<send-1@fabrikam.test>"
    assert first.created_at == begun_at and first.sent_at is None
    assert first.provider_message_id is None

    # The same key again (a retry after a crash): the existing record, nothing new.
    again = store.begin_send(intent("send-1"), clock.advance(minutes=5), cap=5)
    assert not again.created and again.state is SendState.INTENT
    assert again.created_at == begun_at
    assert [s.key for s in store.list_sends(WS)] == ["send-1"]
    assert store.counts()["sends"] == 1

    sent_at = clock.advance(minutes=1)
    sent = store.complete_send("send-1", "provider-77", "delivered to the provider", sent_at)
    assert sent.state is SendState.SENT and sent.provider_message_id == "provider-77"
    assert sent.sent_at == sent_at and sent.detail == "delivered to the provider"
    assert sent.created_at == begun_at
    assert store.get_send("send-1") == sent
    assert store.list_sends(WS) == [sent]

    # A sent message is never ledgered (or sent) twice: the key returns the sent record.
    later = store.begin_send(intent("send-1"), clock.advance(minutes=1), cap=5)
    assert not later.created and later.state is SendState.SENT
    assert later.provider_message_id == "provider-77"
    assert store.counts()["sends"] == 1


def test_completing_a_send_that_was_never_begun_is_an_error(
    store: Store, clock: FrozenClock
) -> None:
    register(store, WS)
    with pytest.raises(StoreError, match="begin_send records it first"):
        store.complete_send("send-unknown", "provider-1", "", clock.now())
    assert store.get_send("send-unknown") is None
    assert store.list_sends(WS) == []


def test_the_per_recipient_cap_refuses_the_third_automated_send_and_stores_nothing(
    store: Store, clock: FrozenClock
) -> None:
    register(store, WS, OTHER_WS)
    now = clock.now()
    assert store.begin_send(intent("a-1"), now, cap=2).created
    assert store.begin_send(intent("a-2"), now + timedelta(hours=1), cap=2).created
    third = store.begin_send(intent("a-3"), now + timedelta(hours=2), cap=2)
    assert third.state is SendState.REFUSED and not third.created
    assert DANA in third.detail
    assert store.get_send("a-3") is None
    assert [s.key for s in store.list_sends(WS)] == ["a-1", "a-2"]
    # One capped recipient among several holds the whole message back.
    both = store.begin_send(intent("a-4", NOA, DANA), now + timedelta(hours=2), cap=2)
    assert both.state is SendState.REFUSED and store.get_send("a-4") is None

    # A message a human decided to send is never capped, and is not counted either.
    manual = store.begin_send(intent("m-1", automated=False), now + timedelta(hours=3), cap=2)
    assert manual.created and manual.state is SendState.INTENT
    # Another address, and the same address in another workspace, have their own counts.
    assert store.begin_send(intent("a-5", NOA), now + timedelta(hours=3), cap=2).created
    elsewhere = intent("o-1", workspace_id=OTHER_WS)
    assert store.begin_send(elsewhere, now + timedelta(hours=3), cap=2).created

    # Still inside the 24 hours of the first two: refused.
    inside = store.begin_send(intent("a-6"), now + timedelta(hours=23, minutes=59), cap=2)
    assert inside.state is SendState.REFUSED
    # Once the first send is more than 24 hours old, one more is allowed, then refused.
    after = now + timedelta(hours=24, minutes=1)
    allowed = store.begin_send(intent("a-7"), after, cap=2)
    assert allowed.created and allowed.state is SendState.INTENT
    assert store.begin_send(intent("a-8"), after, cap=2).state is SendState.REFUSED
    # A day after the second, only a-7 is inside the window: one more, then refused.
    day_later = now + timedelta(hours=48)
    assert store.begin_send(intent("a-9"), day_later, cap=2).created
    assert store.begin_send(intent("a-10"), day_later, cap=2).state is SendState.REFUSED

    # Listed by creation time, then key.
    assert [s.key for s in store.list_sends(WS)] == [
        "a-1", "a-2", "a-5", "m-1", "a-7", "a-9",
    ]  # fmt: skip
    assert [s.key for s in store.list_sends(OTHER_WS)] == ["o-1"]
    assert store.counts()["sends"] == 7


def test_without_a_cap_automated_sends_are_not_limited(store: Store, clock: FrozenClock) -> None:
    register(store, WS)
    for n in range(5):
        assert store.begin_send(intent(f"u-{n}"), clock.now()).created
    assert len(store.list_sends(WS)) == 5


def _cap_worker(
    backend: str,
    where: str,
    key: str,
    now: datetime,
    barrier: Any,
    results: Any,
) -> None:
    """One process: open the shared store, wait for the others, then ledger one send."""
    store: Store = SqliteStore(Path(where)) if backend == "sqlite" else PostgresStore(where)
    try:
        barrier.wait(timeout=120)
        record = store.begin_send(intent(key), now, cap=CAP)
        results.put((key, record.state.value, record.created))
    except Exception as exc:  # reported to the parent, which fails the test
        results.put((key, f"error: {type(exc).__name__}: {exc}", False))
    finally:
        store.close()


@pytest.mark.slow
def test_the_cap_holds_when_many_processes_send_to_one_recipient_at_once(
    store: Store, clock: FrozenClock, tmp_path: Path
) -> None:
    register(store, WS)
    if isinstance(store, SqliteStore):
        backend, where = "sqlite", str(tmp_path / "store.db")
    else:
        backend, where = "postgres", pg_url_at(tmp_path)
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(CAP_WORKERS)
    results = ctx.Queue()
    keys = [f"race-{n}" for n in range(CAP_WORKERS)]
    procs = [
        ctx.Process(target=_cap_worker, args=(backend, where, key, clock.now(), barrier, results))
        for key in keys
    ]
    for p in procs:
        p.start()
    outcomes: list[tuple[str, str, bool]] = []
    try:
        for _ in procs:
            outcomes.append(results.get(timeout=180))
    except queue.Empty:
        pytest.fail(f"only {len(outcomes)} of {CAP_WORKERS} workers reported: {outcomes}")
    finally:
        for p in procs:
            p.join(timeout=60)
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join()
        results.close()
        results.join_thread()
    assert [p.exitcode for p in procs] == [0] * CAP_WORKERS, outcomes
    errors = [o for o in outcomes if o[1].startswith("error")]
    assert errors == []
    recorded = sorted(k for k, state, created in outcomes if created)
    refused = [k for k, state, _ in outcomes if state == SendState.REFUSED.value]
    assert len(recorded) == CAP and len(refused) == CAP_WORKERS - CAP, outcomes
    sends: list[SendRecord] = store.list_sends(WS)
    assert sorted(s.key for s in sends) == recorded
    assert all(s.state is SendState.INTENT and s.recipients == (DANA,) for s in sends)


# -- task amendments -----------------------------------------------------------------------


def test_an_amendment_moves_the_task_as_the_table_allows_and_records_its_event(
    h: Harness, clock: FrozenClock
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
    h: Harness, clock: FrozenClock
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
        ((TaskState.TASK_RESOLVED, TaskState.WAITING_CLIENT), TaskState.COMPLETED, CloseRefused),
        ((TaskState.TASK_RESOLVED, TaskState.EXECUTING), TaskState.TASK_RESOLVED, TransitionError),
    ],
)
def test_an_amendment_the_transition_table_forbids_raises_and_changes_nothing(
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
            task.task_id, TaskAmendment(event=f"to {state}", state=state), clock.advance(minutes=1)
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
            TaskAmendment(event="forbidden", state=target, sent_message=sent, remaining_work="x"),
            clock.advance(minutes=1),
        )
    assert h.store.get_task(task.task_id) == before
    assert h.store.task_events(task.task_id) == events
    assert h.store.counts() == counts


def test_an_amendment_closing_a_task_with_an_open_gate_is_refused(
    h: Harness, clock: FrozenClock
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


def _reply(h: Harness, message_no: int, thread_no: int, in_reply_to: str) -> tuple[Envelope, Task]:
    e = env(message_no, thread_no, in_reply_to=in_reply_to)
    result = h.claim(h.run(e), e)
    assert result.outcome is ClaimOutcome.CLAIMED and result.task is not None
    return e, result.task


def test_a_sent_message_is_added_to_the_task_and_a_reply_to_it_joins_the_task(
    h: Harness, clock: FrozenClock
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
    reply, joined = _reply(h, 2, 9, "<sent-1@fabrikam.test>")
    assert joined.task_id == task.task_id
    assert h.store.counts()["tasks"] == 1
    assert h.store.task_for_thread(work_key(WS, reply)) == h.store.get_task(task.task_id)
    final = h.store.get_task(task.task_id)
    assert final is not None
    assert [m.provider_message_id for m in final.messages] == ["pm-1", "sent-1", "pm-2"]

    # A reply to a message no task sent starts its own task.
    _, unrelated = _reply(h, 3, 10, "<never-sent@fabrikam.test>")
    assert unrelated.task_id != task.task_id
    assert h.store.counts()["tasks"] == 2


def test_amendments_add_and_remove_gates(h: Harness, clock: FrozenClock) -> None:
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


def test_approval_requests_are_appended(h: Harness, clock: FrozenClock) -> None:
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


def test_amending_an_unknown_task_is_an_error(store: Store, clock: FrozenClock) -> None:
    with pytest.raises(StoreError, match="does not exist"):
        store.amend_task("task-nobody", TaskAmendment(event="x"), clock.now())
    assert store.task_events("task-nobody") == []


def test_a_send_for_an_unregistered_workspace_is_refused_and_nothing_is_recorded(
    store: Store, clock: FrozenClock
) -> None:
    intent = SendIntent(
        key="ack|nobody",
        workspace_id="ws-not-registered",
        kind="ack",
        task_id=None,
        internet_message_id="<nobody@x.test>",
        recipients=("a@b.test",),
        automated=True,
    )
    with pytest.raises(StoreError, match="not registered"):
        store.begin_send(intent, clock.now(), cap=3)
    assert store.get_send("ack|nobody") is None
