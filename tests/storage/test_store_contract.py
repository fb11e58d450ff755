"""The Store contract suite: every backend runs exactly these tests (see conftest BACKENDS)."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta

import pytest

from agent.domain.context import parse_context
from agent.domain.dispositions import Disposition, GateKind
from agent.domain.envelope import Envelope, occurrence_key, work_key
from agent.domain.errors import CloseRefused, RegistryError, StoreError, TransitionError
from agent.domain.execution import ClaimOutcome, ExecutionState
from agent.domain.records import (
    Binding,
    ClaimRequest,
    EscalationDraft,
    ReportRequest,
    TaskDraft,
    TaskUpdate,
    WorkspaceRow,
)
from agent.domain.run import LedgerEntry
from agent.domain.states import TaskState
from agent.domain.task import Gate
from agent.ports import Store
from agent.services import claim
from agent.testing import FrozenClock, make_envelope
from tests.conftest import context_yaml

WS = "ws-contract"
MAILBOX = "support@fabrikam.test"
ALIVE = "host/1/1/alive"
DEAD = "host/2/2/dead"


def alive(holder: str) -> bool:
    return holder != DEAD


CONTEXT = parse_context(context_yaml(WS, mailbox=MAILBOX))


def draft_for(env: Envelope) -> TaskDraft:
    """What the intake service's claim writes for this message."""
    return claim.task_draft(
        CONTEXT, env, occurrence_key(WS, env), "noa.bar@fabrikam.test", env.received_at
    )


class Harness:
    """Drives one store through runs the way the intake service does."""

    def __init__(self, store: Store, clock: FrozenClock) -> None:
        self.store = store
        self.clock = clock
        self.runs = 0

    def run(self, *envs: Envelope) -> str:
        self.runs += 1
        run_id = f"run-{self.runs}"
        self.store.start_run(run_id, WS, ALIVE, self.clock.now())
        self.store.record_scanned(
            [
                LedgerEntry(
                    run_id=run_id, item_ref=e.provider_message_id, occurrence_key=self.key(e)
                )
                for e in envs
            ],
            self.clock.now(),
        )
        return run_id

    @staticmethod
    def key(env: Envelope) -> str:
        return occurrence_key(WS, env)

    def claim(self, run_id: str, env: Envelope, holder: str = ALIVE, lease: float = 300.0):
        request = ClaimRequest(
            key=self.key(env),
            service="email-intake",
            holder=holder,
            run_id=run_id,
            item_ref=env.provider_message_id,
            lease_seconds=lease,
        )
        return self.store.claim(request, draft_for(env), self.clock.now(), alive)

    def report(
        self,
        run_id: str,
        env: Envelope,
        disposition: Disposition = Disposition.QUEUED,
        holder: str = ALIVE,
        update: TaskUpdate | None = None,
    ):
        return self.store.report(
            ReportRequest(
                key=self.key(env),
                holder=holder,
                run_id=run_id,
                item_ref=env.provider_message_id,
                disposition=disposition,
                task_update=update or TaskUpdate(state=TaskState.TASK_RESOLVED),
            ),
            self.clock.now(),
        )


@pytest.fixture
def h(store: Store, clock: FrozenClock) -> Harness:
    return Harness(store, clock)


def env(n: int, thread: int, **kw: object) -> Envelope:
    return make_envelope(mailbox_id=MAILBOX, message_no=n, thread_no=thread, **kw)  # type: ignore[arg-type]


# -- schema ------------------------------------------------------------------------------


def test_migrations_apply_once_and_reopening_changes_nothing(
    store: Store, open_store: Callable[[], Store]
) -> None:
    version = store.schema_version()
    assert open_store().schema_version() == version
    assert store.integrity_check() == "ok"


def test_a_fresh_store_has_zero_workspaces_tasks_and_claims(store: Store) -> None:
    assert store.list_workspaces() == []
    assert store.counts() == dict.fromkeys(
        ("executions", "tasks", "task_threads", "task_messages", "runs", "run_items", "escalations",
         "sends", "executions_done"), 0
    )  # fmt: skip


# -- registry ----------------------------------------------------------------------------


def row(workspace_id: str = WS) -> WorkspaceRow:
    now = datetime(2026, 11, 30, tzinfo=UTC)
    return WorkspaceRow(
        workspace_id=workspace_id, label="x", context_path="/x", context_sha256="0",
        registered_at=now, updated_at=now,
    )  # fmt: skip


def test_registering_a_duplicate_workspace_id_is_refused(store: Store) -> None:
    binding = Binding(workspace_id=WS, provider="memory", mailbox_id=MAILBOX, shared=False)
    store.register_workspace(row(), [binding])
    with pytest.raises(RegistryError, match="already registered"):
        store.register_workspace(row(), [binding])
    assert [w.workspace_id for w in store.list_workspaces()] == [WS]
    assert store.bindings_for_mailbox("memory", MAILBOX.upper()) == [binding]


def test_the_registered_context_text_is_kept_and_replaced_by_an_update(store: Store) -> None:
    text = context_yaml(WS, mailbox=MAILBOX)
    store.register_workspace(row().model_copy(update={"context_text": text}), [])
    stored = store.get_workspace(WS)
    assert stored is not None and stored.context_text == text
    later = text.replace("Test workspace", "Renamed workspace")
    store.update_workspace(row().model_copy(update={"context_text": later, "label": "y"}), [])
    stored = store.get_workspace(WS)
    assert stored is not None and stored.context_text == later and stored.label == "y"


def test_updating_an_unknown_workspace_is_refused(store: Store) -> None:
    with pytest.raises(RegistryError, match="not registered"):
        store.update_workspace(row("ws-nobody"), [])


# -- claims ------------------------------------------------------------------------------


def test_the_first_claim_wins_and_creates_the_task_in_the_same_transaction(h: Harness) -> None:
    e = env(1, 1)
    run_id = h.run(e)
    result = h.claim(run_id, e)
    assert result.outcome is ClaimOutcome.CLAIMED and result.task_created
    assert result.task is not None and result.execution.task_id == result.task.task_id
    assert h.store.get_task(result.task.task_id) == result.task
    assert result.task.state is TaskState.DISCOVERED


def test_a_second_claim_on_a_held_occurrence_creates_nothing(h: Harness) -> None:
    e = env(1, 1)
    r1, r2 = h.run(e), h.run(e)
    h.claim(r1, e)
    before = h.store.counts()
    lost = h.claim(r2, e, holder="host/3/3/other")
    assert lost.outcome is ClaimOutcome.EXECUTION_ALREADY_CLAIMED and lost.task is None
    assert lost.execution.holder == ALIVE
    # A lost claim writes nothing at all; its caller records the claim-race disposition.
    assert h.store.counts() == before and h.store.ledger(r2)[0].disposition is None


def test_a_claim_after_the_report_is_already_done(h: Harness) -> None:
    e = env(1, 1)
    r1 = h.run(e)
    h.claim(r1, e)
    h.report(r1, e)
    r2 = h.run(e)
    assert h.claim(r2, e).outcome is ClaimOutcome.EXECUTION_ALREADY_DONE


def test_a_dead_holders_claim_is_taken_over_exactly_once(h: Harness) -> None:
    e = env(1, 1)
    r1, r2, r3 = h.run(e), h.run(e), h.run(e)
    first = h.claim(r1, e, holder=DEAD)
    taken = h.claim(r2, e, holder=ALIVE)
    assert taken.outcome is ClaimOutcome.CLAIMED and taken.taken_over
    # Taking over the claim that created the task is still the task's first handling.
    assert taken.task_created and taken.task is not None
    assert taken.task.task_id == first.execution.task_id
    assert taken.execution.generation == 2
    # The new holder is alive: nobody takes it over again.
    assert h.claim(r3, e, holder="host/4/4/x").outcome is ClaimOutcome.EXECUTION_ALREADY_CLAIMED
    assert h.store.counts()["tasks"] == 1


def test_an_expired_lease_is_taken_over(h: Harness, clock: FrozenClock) -> None:
    e = env(1, 1)
    r1, r2 = h.run(e), h.run(e)
    h.claim(r1, e, holder="elsewhere/9/9/x", lease=30)
    clock.advance(seconds=31)
    assert h.claim(r2, e, holder=ALIVE).taken_over


def test_the_previous_holder_cannot_report_after_a_takeover(h: Harness) -> None:
    e = env(1, 1)
    r1, r2 = h.run(e), h.run(e)
    h.claim(r1, e, holder=DEAD)
    h.claim(r2, e, holder=ALIVE)
    with pytest.raises(StoreError, match="no longer holds"):
        h.report(r1, e, holder=DEAD)
    record = h.store.get_execution(h.key(e))
    assert record is not None and record.state is ExecutionState.CLAIMED


def test_reporting_an_unclaimed_occurrence_is_refused(h: Harness) -> None:
    e = env(1, 1)
    run_id = h.run(e)
    with pytest.raises(StoreError, match="claim the occurrence before reporting"):
        h.report(run_id, e)


# -- tasks -------------------------------------------------------------------------------


def test_a_later_message_in_the_thread_updates_the_one_task(h: Harness) -> None:
    first, second = env(1, 5), env(2, 5)
    run_id = h.run(first, second)
    a = h.claim(run_id, first)
    b = h.claim(run_id, second)
    assert a.task is not None and b.task is not None
    assert not b.task_created and b.task.task_id == a.task.task_id
    task = h.store.get_task(a.task.task_id)
    assert task is not None and [m.provider_message_id for m in task.messages] == ["pm-1", "pm-2"]
    assert h.store.counts()["tasks"] == 1


def test_an_exact_in_reply_to_links_a_message_from_another_provider_thread(h: Harness) -> None:
    first = env(1, 5)
    reply = env(2, 6, in_reply_to=first.internet_message_id)
    run_id = h.run(first, reply)
    a = h.claim(run_id, first)
    b = h.claim(run_id, reply)
    assert a.task is not None and b.task is not None and b.task.task_id == a.task.task_id
    # The linked thread now maps to the same task.
    assert h.store.task_for_thread(work_key(WS, reply)) == h.store.get_task(a.task.task_id)


def test_the_report_moves_the_task_and_records_gates_and_outcome(
    h: Harness, clock: FrozenClock
) -> None:
    e = env(1, 1)
    run_id = h.run(e)
    claimed = h.claim(run_id, e)
    gate = Gate(
        kind=GateKind.CONTEXT_GAP, owner="noa.bar@fabrikam.test", since=clock.now(), reason="r"
    )
    h.report(
        run_id, e, Disposition.CONTEXT_GAP_DISCOVERY,
        update=TaskUpdate(state=TaskState.IN_DISCOVERY, add_gates=(gate,),
                          provisional_basis={"first_response_hours": "24"}),
    )  # fmt: skip
    assert claimed.task is not None
    task = h.store.get_task(claimed.task.task_id)
    assert task is not None
    assert task.state is TaskState.IN_DISCOVERY and task.open_gates == (gate,)
    assert task.execution_outcome == "CONTEXT_GAP_DISCOVERY" and task.execution_key == h.key(e)
    assert task.provisional_basis == {"first_response_hours": "24"}
    assert task.readiness_tier.value == "pending_gates"


def test_the_queue_is_non_terminal_tasks_oldest_received_first(h: Harness) -> None:
    base = datetime(2026, 11, 1, tzinfo=UTC)
    late = env(1, 1, received_at=base + timedelta(hours=5))
    early = env(2, 2, received_at=base)
    done = env(3, 3, received_at=base - timedelta(hours=1))
    run_id = h.run(late, early, done)
    for e in (late, early, done):
        h.claim(run_id, e)
    h.report(run_id, done, Disposition.NOISE_EXCLUDED, update=TaskUpdate(state=TaskState.COMPLETED))
    queue = h.store.list_queue(WS)
    assert [t.provider_thread_id for t in queue] == ["thread-2", "thread-1"]


def test_transition_task_refuses_to_close_a_waiting_task(h: Harness, clock: FrozenClock) -> None:
    e = env(1, 1)
    run_id = h.run(e)
    claimed = h.claim(run_id, e)
    h.report(run_id, e)
    assert claimed.task is not None
    h.store.transition_task(claimed.task.task_id, TaskState.WAITING_CLIENT, "asked", clock.now())
    with pytest.raises(CloseRefused):
        h.store.transition_task(claimed.task.task_id, TaskState.COMPLETED, "done?", clock.now())
    task = h.store.get_task(claimed.task.task_id)
    assert task is not None and task.state is TaskState.WAITING_CLIENT
    moved = h.store.transition_task(
        claimed.task.task_id, TaskState.TASK_RESOLVED, "reply", clock.now()
    )
    assert moved.state is TaskState.TASK_RESOLVED


def test_a_report_resuming_on_inbound_uses_the_state_current_at_report_time(h: Harness) -> None:
    first, follow = env(1, 1), env(2, 1)
    run_id = h.run(first, follow)
    h.claim(run_id, first)
    h.claim(run_id, follow)  # snapshot: DISCOVERED
    h.report(
        run_id, first, Disposition.WAITING_CLIENT, update=TaskUpdate(state=TaskState.TASK_RESOLVED)
    )
    h.report(run_id, follow, update=TaskUpdate(resume_on_inbound=True))
    task = h.store.task_for_thread(work_key(WS, first))
    assert task is not None and task.state is TaskState.TASK_RESOLVED


# -- ledger and reconciliation -------------------------------------------------------------


def test_claim_race_dispositions_are_recorded_in_one_batch_all_or_none(
    h: Harness, clock: FrozenClock
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


def test_an_item_gets_exactly_one_disposition_per_run(h: Harness, clock: FrozenClock) -> None:
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


def test_reconcile_counts_every_scanned_item_into_one_class(h: Harness, clock: FrozenClock) -> None:
    a, b, c = env(1, 1), env(2, 2), env(3, 3)
    r1 = h.run(a)
    h.claim(r1, a)
    h.report(r1, a)
    run_id = h.run(a, b, c)
    assert h.claim(run_id, a).outcome is ClaimOutcome.EXECUTION_ALREADY_DONE
    h.store.record_disposition(run_id, "pm-1", Disposition.EXECUTION_ALREADY_DONE, "", clock.now())
    h.claim(run_id, b)
    h.report(run_id, b, Disposition.NOISE_EXCLUDED, update=TaskUpdate(state=TaskState.COMPLETED))
    h.claim(run_id, c)
    h.report(run_id, c, Disposition.WAITING_INTERNAL_APPROVAL, update=TaskUpdate())
    rec = h.store.reconcile(run_id, clock.now())
    assert (rec.scanned, rec.terminal, rec.non_terminal, rec.claim_race) == (3, 1, 1, 1)
    assert rec.clean and rec.reconciliation_failed == 0
    assert h.store.run_summary(run_id) == rec


def test_an_item_without_an_outcome_is_reconciliation_failed_and_the_run_not_clean(
    h: Harness, clock: FrozenClock
) -> None:
    a, b = env(1, 1), env(2, 2)
    run_id = h.run(a, b)
    h.claim(run_id, a)
    h.report(run_id, a)
    h.claim(run_id, b)  # the worker died before reporting b
    rec = h.store.reconcile(run_id, clock.now())
    assert rec.reconciliation_failed == 1 and not rec.clean
    assert (
        rec.scanned == rec.terminal + rec.non_terminal + rec.claim_race + rec.reconciliation_failed
    )
    dispositions = {e.item_ref: e.disposition for e in h.store.ledger(run_id)}
    assert dispositions["pm-2"] is Disposition.RECONCILIATION_FAILED


def test_reconcile_is_idempotent(h: Harness, clock: FrozenClock) -> None:
    a = env(1, 1)
    run_id = h.run(a)
    h.claim(run_id, a)
    h.report(run_id, a)
    first = h.store.reconcile(run_id, clock.now())
    again = h.store.reconcile(run_id, clock.now())
    assert first.clean and again.model_dump(exclude={"reconciled_at"}) == first.model_dump(
        exclude={"reconciled_at"}
    )


def test_reconciling_an_unknown_run_is_an_error(store: Store, clock: FrozenClock) -> None:
    with pytest.raises(StoreError, match="does not exist"):
        store.reconcile("run-nope", clock.now())


# -- escalations and health ----------------------------------------------------------------


def test_an_escalation_is_claimed_once_and_recorded_once(h: Harness) -> None:
    e = env(1, 1)
    r1, r2 = h.run(e), h.run(e)
    draft = EscalationDraft(
        scope="station", queue="unresolved", assignee="ops@fabrikam.test", reason="no binding",
        provider="memory", mailbox_id=MAILBOX, item_ref=e.provider_message_id,
    )  # fmt: skip
    for run_id in (r1, r2):
        h.store.claim(
            ClaimRequest(key="station-key", service="s", holder=ALIVE, run_id=run_id,
                         item_ref=e.provider_message_id),
            draft, h.clock.now(), alive,
        )  # fmt: skip
    assert len(h.store.list_escalations("station")) == 1
    assert h.store.list_escalations("ws-other") == []


def test_health_records_count_repeats(store: Store, clock: FrozenClock) -> None:
    store.record_health("station.yaml: escalation_contact", "missing", clock.now())
    store.record_health("station.yaml: escalation_contact", "missing", clock.now())
    [record] = store.list_health()
    assert record.key == "station.yaml: escalation_contact" and record.count == 2


# -- retry state lives on the execution record ---------------------------------------------


def test_a_retry_is_held_on_the_execution_record_and_claimable_once_due(
    h: Harness, clock: FrozenClock
) -> None:
    e = env(1, 1)
    r1, r2, r3 = h.run(e), h.run(e), h.run(e)
    claimed = h.claim(r1, e)
    h.store.report(
        ReportRequest(
            key=h.key(e), holder=ALIVE, run_id=r1, item_ref=e.provider_message_id,
            disposition=Disposition.QUEUED, detail="provider timed out",
            retry_at=clock.now() + timedelta(minutes=10),
        ),
        clock.now(),
    )  # fmt: skip
    record = h.store.get_execution(h.key(e))
    assert record is not None and record.state is ExecutionState.RETRY_PENDING
    assert claimed.task is not None
    task = h.store.get_task(claimed.task.task_id)
    assert task is not None and task.state is TaskState.BLOCKED_RETRY_PENDING
    # The task holds no retry timer of its own.
    assert "retry" not in task.model_dump_json().replace("BLOCKED_RETRY_PENDING", "")
    assert h.claim(r2, e, holder="host/5/5/x").outcome is ClaimOutcome.EXECUTION_ALREADY_CLAIMED
    clock.advance(minutes=11)
    retried = h.claim(r3, e, holder="host/6/6/y")
    assert retried.outcome is ClaimOutcome.CLAIMED and retried.taken_over
    assert retried.task is not None and retried.task.task_id == claimed.task.task_id


def test_a_retry_with_a_terminal_outcome_is_refused(h: Harness, clock: FrozenClock) -> None:
    e = env(1, 1)
    run_id = h.run(e)
    h.claim(run_id, e)
    with pytest.raises(StoreError, match="cannot carry the terminal disposition"):
        h.store.report(
            ReportRequest(
                key=h.key(e), holder=ALIVE, run_id=run_id, item_ref=e.provider_message_id,
                disposition=Disposition.NOISE_EXCLUDED, retry_at=clock.now(),
            ),
            clock.now(),
        )  # fmt: skip


def test_unreconciled_runs_lists_open_runs_of_the_scope_with_their_holder(
    h: Harness, clock: FrozenClock
) -> None:
    e = env(1, 1)
    open_run, done_run = h.run(e), h.run(e)
    h.store.reconcile(done_run, clock.now())
    h.store.start_run("run-other-scope", "ws-other", DEAD, clock.now())
    assert [(r.run_id, r.holder, r.lease_expires_at) for r in h.store.unreconciled_runs(WS)] == [
        (open_run, ALIVE, None)
    ]


def test_a_run_lease_is_kept_renewed_by_its_holder_only_until_it_is_reconciled(
    store: Store, clock: FrozenClock
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
    store: Store, clock: FrozenClock
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


# -- reports keep the lifecycle's rules whatever order they arrive in ----------------------


def test_a_noise_verdict_never_closes_a_thread_that_gained_a_real_message(
    h: Harness, clock: FrozenClock
) -> None:
    noise, reply = env(1, 1, auto_submitted="auto-replied"), env(2, 1)
    run_id = h.run(noise, reply)
    created = h.claim(run_id, noise)
    h.claim(run_id, reply)
    h.report(run_id, reply, update=TaskUpdate(resume_on_inbound=True))
    h.report(
        run_id, noise, Disposition.NOISE_EXCLUDED,
        update=TaskUpdate(state=TaskState.COMPLETED, sole_message=noise.provider_message_id),
    )  # fmt: skip
    assert created.task is not None
    task = h.store.get_task(created.task.task_id)
    # The thread holds real mail, so it is open and triaged, never left half-made.
    assert task is not None and task.state is TaskState.TASK_RESOLVED
    assert task.next_action.description != "none: automated message"
    assert [t.task_id for t in h.store.list_queue(WS)] == [task.task_id]


def test_a_terminal_report_with_an_open_gate_is_rewritten_and_never_closes_the_task(
    h: Harness, clock: FrozenClock
) -> None:
    e = env(1, 1)
    run_id = h.run(e)
    claimed = h.claim(run_id, e)
    gate = Gate(
        kind=GateKind.INTERNAL_APPROVAL,
        owner="noa.bar@fabrikam.test",
        since=clock.now(),
        reason="draft awaits approval",
    )
    record = h.report(
        run_id, e, Disposition.CLOSED_NO_REPLY_NEEDED,
        update=TaskUpdate(state=TaskState.COMPLETED, add_gates=(gate,)),
    )  # fmt: skip
    assert record.outcome is Disposition.WAITING_INTERNAL_APPROVAL
    assert h.store.ledger(run_id)[0].disposition is Disposition.WAITING_INTERNAL_APPROVAL
    assert claimed.task is not None
    task = h.store.get_task(claimed.task.task_id)
    assert task is not None and task.state is not TaskState.COMPLETED
    assert task.execution_outcome == "WAITING_INTERNAL_APPROVAL"
    with pytest.raises(TransitionError, match="open gates"):
        h.store.transition_task(task.task_id, TaskState.TASK_RESOLVED, "x", clock.now())
        h.store.transition_task(task.task_id, TaskState.COMPLETED, "close", clock.now())


def _retry(
    h: Harness, run_id: str, e: Envelope, clock: FrozenClock, minutes: float, holder: str = ALIVE
) -> None:
    h.store.report(
        ReportRequest(key=h.key(e), holder=holder, run_id=run_id, item_ref=e.provider_message_id,
                      disposition=Disposition.QUEUED, retry_at=clock.now() + timedelta(minutes=minutes)),
        clock.now(),
    )  # fmt: skip


def test_a_finished_retry_goes_straight_to_a_state_the_table_allows(
    h: Harness, clock: FrozenClock
) -> None:
    first, second = env(1, 1), env(2, 1, in_reply_to="<m1@example.test>")
    r1 = h.run(first)
    task = h.claim(r1, first).task
    h.report(r1, first)
    assert task is not None
    for state in (TaskState.DRAFT_READY, TaskState.APPROVED_TO_SEND):
        h.store.transition_task(task.task_id, state, "work", clock.now())
    r2 = h.run(second)
    h.claim(r2, second)
    _retry(h, r2, second, clock, 1)
    clock.advance(minutes=2)
    r3 = h.run(second)
    h.claim(r3, second, holder="host/0/7/7/b")
    h.report(r3, second, holder="host/0/7/7/b", update=TaskUpdate(state=TaskState.APPROVED_TO_SEND))
    done = h.store.get_task(task.task_id)
    assert done is not None and done.state is TaskState.APPROVED_TO_SEND and done.blocked_by == ()


def test_a_retry_is_recorded_whatever_state_the_task_waits_in(
    h: Harness, clock: FrozenClock
) -> None:
    first, second = env(1, 1), env(2, 1, in_reply_to="<m1@example.test>")
    r1 = h.run(first)
    task = h.claim(r1, first).task
    h.report(r1, first)
    assert task is not None
    h.store.transition_task(task.task_id, TaskState.WAITING_CLIENT, "asked", clock.now())
    r2 = h.run(second)
    h.claim(r2, second)
    _retry(h, r2, second, clock, 1)
    record = h.store.get_execution(h.key(second))
    assert record is not None and record.state is ExecutionState.RETRY_PENDING
    waiting = h.store.get_task(task.task_id)
    assert waiting is not None and waiting.blocked_by == (h.key(second),)
    # WAITING_CLIENT may not move to BLOCKED_RETRY_PENDING; the task keeps its state and
    # shows the block in its readiness tier.
    assert waiting.state is TaskState.WAITING_CLIENT and waiting.readiness_tier.value == "blocked"


def test_a_task_stays_blocked_until_its_last_retry_has_run(h: Harness, clock: FrozenClock) -> None:
    first, second = env(1, 1), env(2, 1, in_reply_to="<m1@example.test>")
    r1, r2 = h.run(first), h.run(second)
    task = h.claim(r1, first).task
    _retry(h, r1, first, clock, 60)
    h.claim(r2, second)
    _retry(h, r2, second, clock, 1)
    clock.advance(minutes=2)
    r3 = h.run(second)
    h.claim(r3, second, holder="host/0/7/7/b")
    h.report(r3, second, holder="host/0/7/7/b", update=TaskUpdate(resume_on_inbound=True))
    assert task is not None
    still = h.store.get_task(task.task_id)
    assert still is not None and still.state is TaskState.BLOCKED_RETRY_PENDING
    assert still.blocked_by == (h.key(first),)


def test_a_message_id_with_nul_bytes_or_thousands_of_characters_is_claimed_like_any_other(
    h: Harness,
) -> None:
    # Whatever a sender puts in Message-ID, In-Reply-To and References, every backend keys it.
    long_id = "<" + "x" * 5000 + "@contoso.test>"
    first = env(1, 1).model_copy(update={"internet_message_id": None})
    hostile = Envelope.model_validate(
        {**first.model_dump(by_alias=True), "internet_message_id": "<a\x00b@contoso.test>",
         "in_reply_to": long_id, "references": [long_id, long_id]}
    )  # fmt: skip
    assert hostile.internet_message_id == "<ab@contoso.test>"
    assert hostile.in_reply_to is not None and len(hostile.in_reply_to) < 100
    assert hostile.references == (hostile.in_reply_to,)
    run_id = h.run(hostile)
    result = h.claim(run_id, hostile)
    assert result.outcome is ClaimOutcome.CLAIMED and result.task is not None
    h.report(run_id, hostile)
    assert h.store.reconcile(run_id, h.clock.now()).clean
