"""What every storage contract suite shares: the fixtures a backend's test class gets, a
harness that drives a store the way intake does, and the test data."""

from __future__ import annotations

import multiprocessing
import queue
from collections.abc import Callable, Iterator, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from agent.domain.approval import ApprovalRequest
from agent.domain.context import parse_context
from agent.domain.dispositions import Disposition, GateKind
from agent.domain.envelope import Envelope, occurrence_key
from agent.domain.execution import ClaimOutcome
from agent.domain.mail import ScannedMessage
from agent.domain.records import (
    Binding,
    ClaimRequest,
    ClaimResult,
    ReportRequest,
    SendIntent,
    TaskDraft,
    TaskUpdate,
    WorkspaceRow,
)
from agent.domain.run import LedgerEntry
from agent.domain.states import TaskState
from agent.domain.task import Gate, Task
from agent.ports import EmbeddedStore
from agent.services import claim
from agent.testing import FrozenClock, make_envelope
from agent.testing.contexts import context_yaml

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

    def __init__(self, store: EmbeddedStore, clock: FrozenClock) -> None:
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
                    run_id=run_id,
                    item_ref=e.provider_message_id,
                    occurrence_key=self.key(e),
                    scanned=ScannedMessage(item_ref=e.provider_message_id, envelope=e),
                    owner=WS,
                    mailbox_id=MAILBOX,
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

    def claim_first(self) -> tuple[str, Envelope, ClaimResult]:
        """A run that scanned thread 1's first message, and that message's claim."""
        e = env(1, 1)
        run_id = self.run(e)
        return run_id, e, self.claim(run_id, e)

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


def env(n: int, thread: int, **kw: object) -> Envelope:
    return make_envelope(mailbox_id=MAILBOX, message_no=n, thread_no=thread, **kw)  # type: ignore[arg-type]


def row(workspace_id: str = WS) -> WorkspaceRow:
    now = datetime(2026, 11, 30, tzinfo=UTC)
    return WorkspaceRow(
        workspace_id=workspace_id, label="x", context_path="/x", context_sha256="0",
        registered_at=now, updated_at=now,
    )  # fmt: skip


def retry_later(
    h: Harness, run_id: str, e: Envelope, clock: FrozenClock, minutes: float, holder: str = ALIVE
) -> None:
    h.store.report(
        ReportRequest(key=h.key(e), holder=holder, run_id=run_id, item_ref=e.provider_message_id,
                      disposition=Disposition.QUEUED, retry_at=clock.now() + timedelta(minutes=minutes)),
        clock.now(),
    )  # fmt: skip


OTHER_WS = "ws-contract-other"


DANA = "dana.levi@contoso.test"


NOA = "noa.bar@fabrikam.test"


CAP_WORKERS = 10


CAP = 3


def register(store: EmbeddedStore, *workspace_ids: str) -> None:
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


def cap_worker(
    opener: Callable[[str], EmbeddedStore],
    address: str,
    key: str,
    now: datetime,
    barrier: Any,
    results: Any,
) -> None:
    """One process: open the shared store, wait for the others, then ledger one send."""
    store = opener(address)
    try:
        barrier.wait(timeout=120)
        record = store.begin_send(intent(key), now, cap=CAP)
        results.put((key, record.state.value, record.created))
    except Exception as exc:  # reported to the parent, which fails the test
        results.put((key, f"error: {type(exc).__name__}: {exc}", False))
    finally:
        store.close()


def race_processes(
    target: Callable[..., None], arguments: Sequence[tuple[Any, ...]], timeout: float = 180
) -> list[Any]:
    """Run ``target(*args, barrier, results)`` in one spawned process per entry of
    ``arguments``; each waits on the barrier (so all start at the same moment) and puts one
    outcome on the queue. The outcomes, in the order they were reported."""
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(len(arguments))
    results = ctx.Queue()
    procs = [ctx.Process(target=target, args=(*args, barrier, results)) for args in arguments]
    for p in procs:
        p.start()
    outcomes: list[Any] = []
    try:
        for _ in procs:
            outcomes.append(results.get(timeout=timeout))
    except queue.Empty:
        pytest.fail(f"only {len(outcomes)} of {len(procs)} workers reported: {outcomes}")
    finally:
        for p in procs:
            p.join(timeout=60)
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join()
        results.close()
        results.join_thread()
    assert [p.exitcode for p in procs] == [0] * len(procs), outcomes
    return outcomes


def reply_in_thread(
    h: Harness, message_no: int, thread_no: int, in_reply_to: str
) -> tuple[Envelope, Task]:
    e = env(message_no, thread_no, in_reply_to=in_reply_to)
    result = h.claim(h.run(e), e)
    assert result.outcome is ClaimOutcome.CLAIMED and result.task is not None
    return e, result.task


class StoreContract:
    """The base of every storage role's contract suite. A backend's test class supplies
    where its stores live (``address``) and how one is opened there (``open_address``, a
    static method, so other processes can open the same store); every suite runs unchanged
    on it, as keyring's backend tests only ask for ``init_keyring()``."""

    def address(self, where: Path) -> str:
        """Where the store for a test directory lives (a file path, a database URL)."""
        raise NotImplementedError

    @staticmethod
    def open_address(address: str) -> EmbeddedStore:
        """Open (creating when new) the store at ``address``."""
        raise NotImplementedError

    @pytest.fixture
    def open_store(self, tmp_path: Path) -> Iterator[Callable[[], EmbeddedStore]]:
        """Opens (and later closes) stores of this backend, always at the same location."""
        address = self.address(tmp_path)
        opened: list[EmbeddedStore] = []

        def _open() -> EmbeddedStore:
            opened.append(self.open_address(address))
            return opened[-1]

        yield _open
        for s in opened:
            s.close()

    @pytest.fixture
    def store(self, open_store: Callable[[], EmbeddedStore]) -> EmbeddedStore:
        return open_store()

    @pytest.fixture
    def clock(self) -> FrozenClock:
        return FrozenClock()

    @pytest.fixture
    def h(self, store: EmbeddedStore, clock: FrozenClock) -> Harness:
        return Harness(store, clock)


def reported_task_and_reply(h: Harness) -> tuple[Task, Envelope]:
    """A thread's first message claimed and reported (its task resolved), and a reply in
    that thread not yet scanned."""
    first, second = env(1, 1), env(2, 1, in_reply_to="<m1@example.test>")
    r1 = h.run(first)
    task = h.claim(r1, first).task
    h.report(r1, first)
    assert task is not None
    return task, second
