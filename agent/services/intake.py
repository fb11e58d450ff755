"""Intake: one dispatcher cycle over a workspace's mailboxes, in the order of seed 000 s.4.

1. licence and grant preflight (a failure gates work, never detection or recording)
2. read each provider item and normalize it into the canonical envelope
3. resolve exactly one workspace from the registry and the live context read-back
4. derive the occurrence key
5. claim it (the claim and the task write are one transaction)
6. already claimed or done: record that disposition and create nothing
7. claimed: the one task for the verified thread was created or updated with the claim
8. triage deterministically (noise, context gaps, preflight) and route
11. report, then reconcile the run
Steps 9 and 10 (the work itself, approvals, replies) belong to the agent host.
"""

from __future__ import annotations

import logging
import re
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Protocol

from agent import crashpoints
from agent.domain.context import MailboxBinding, StationConfig, WorkspaceContext
from agent.domain.dispositions import Disposition
from agent.domain.envelope import (
    Envelope,
    OccurrenceScope,
    compose_key,
    identity_digest,
    legacy_occurrence_key,
    occurrence_key,
    proposed_thread,
    thread_alias,
)
from agent.domain.errors import (
    ClaimLost,
    CursorExpired,
    InvalidRequest,
    ProviderError,
    StoreError,
    Unsupported,
)
from agent.domain.execution import ClaimOutcome, ExecutionRecord
from agent.domain.mail import Capabilities, ChangePage, ScannedMessage
from agent.domain.records import (
    ClaimRequest,
    EscalationDraft,
    ReportRequest,
)
from agent.domain.registry import Candidate, ResolutionStatus, resolve_workspace
from agent.domain.run import LedgerEntry, MailboxCursor, Reconciliation, ThreadLink
from agent.events import Event, emit
from agent.ports import Claims, Clock, Health, MailProvider, RunLedger, ThreadAliases
from agent.services import acks, approvals, claim, classify, reminders
from agent.services.holder import current_holder, holder_alive
from agent.services.reminders import ReminderStore
from agent.services.replies import ReplyStore
from agent.services.workspaces import DataDir, candidates, load_context, load_station


class IntakeStore(RunLedger, ThreadAliases, Claims, ReplyStore, ReminderStore, Protocol):
    """What a run needs: the run ledger (with the mailboxes' cursors), thread aliases,
    claims, and what the replies it may send on the way (acknowledgements, reminders) and
    the approvals it reads need."""


SERVICE = "email-intake"
STATION_SCOPE = "station"
RACE_BATCH = 256
RUN_LEASE = timedelta(minutes=15)
"""How long a run stays its worker's without renewal. A worker renews it as it goes; a run
whose lease ran out (its machine died, or stalled that long) is reconciled by the next run of
the scope on any machine."""


@dataclass(frozen=True)
class ItemOutcome:
    item_ref: str
    disposition: Disposition
    claim: ClaimOutcome | None
    task_id: str | None
    task_created: bool
    detail: str


@dataclass(frozen=True)
class Progress:
    done: int
    total: int
    outcome: ItemOutcome


@dataclass
class RunResult:
    run_id: str
    workspace_id: str
    items: list[ItemOutcome] = field(default_factory=list[ItemOutcome])
    reconciliation: Reconciliation | None = None
    access_errors: list[str] = field(default_factory=list[str])
    reconciled_stale: list[Reconciliation] = field(default_factory=list[Reconciliation])
    item_errors: list[str] = field(default_factory=list[str])
    reminders: list[str] = field(default_factory=list[str])
    """What each reminder due this run did (sent, already sent, held by the cap, ...)."""
    """Items whose handling failed this run (each also has a health record)."""
    """Earlier runs of dead workers that this run reconciled."""
    """Mailboxes that could not be read this run (each also has a health record)."""


@dataclass(frozen=True)
class Planned:
    scanned: ScannedMessage
    mailbox: MailboxBinding
    owner: str  # workspace id, or the station scope
    key: str
    reason: str  # why the item is escalated ("" when it resolved)

    @property
    def envelope(self) -> Envelope | None:
        return self.scanned.envelope

    @property
    def ref(self) -> str:
        """The item's ledger reference: provider ids are unique per mailbox only."""
        return item_ref(self.mailbox, self.scanned.item_ref)


ProviderFactory = Callable[[str, MailboxBinding], MailProvider]
"""The channel to a workspace's mailbox: ``provider_for(workspace_id, binding)``."""


def item_ref(binding: MailboxBinding, provider_ref: str) -> str:
    """An item's reference in the run ledger: ``provider:mailbox/provider-item-ref``."""
    return f"{binding.provider}:{binding.mailbox_id}/{provider_ref}"


@dataclass
class Scan:
    """One run's scan (steps 1-4), its items recorded in the run ledger, ready to be claimed
    one by one (steps 5-8) and then reconciled (step 11)."""

    store: IntakeStore
    context: WorkspaceContext
    station: StationConfig
    holder: str
    result: RunResult
    planned: list[Planned]
    providers: dict[str, MailProvider]
    preflights: dict[str, str | None]
    renewed_at: datetime
    lookahead: claim.Lookahead
    race: list[tuple[str, Disposition, str]] = field(
        default_factory=list[tuple[str, Disposition, str]]
    )
    owns_run: bool = True
    """This worker started the run and keeps its lease; a worker that resumed another's
    open run only claims its items."""

    @property
    def run_id(self) -> str:
        return self.result.run_id

    def index_of(self, item_ref: str) -> int | None:
        for index, plan in enumerate(self.planned):
            if plan.ref == item_ref:
                return index
        return None


async def scan(
    *,
    store: IntakeStore,
    data_dir: DataDir,
    workspace_id: str,
    provider_for: ProviderFactory,
    clock: Clock,
    holder: str | None = None,
    mailbox_ids: frozenset[str] | None = None,
    from_start: bool = False,
) -> Scan:
    """Steps 1-4 for a workspace's mailboxes (or only ``mailbox_ids``): start a run, take
    over what runs of dead workers left unclaimed, read each mailbox's changes since its
    cursor (``from_start``: the whole mailbox again, a replay), normalize, resolve and key
    every item, and record each page of items in the run ledger together with the cursor
    that covers it."""
    holder = holder or current_holder()
    context = load_context(store, workspace_id)  # live context, re-read on every run
    station = load_station(data_dir)
    run_id = f"run-{uuid.uuid4().hex}"
    result = RunResult(run_id=run_id, workspace_id=workspace_id)
    renewed_at = clock.now()
    store.start_run(run_id, workspace_id, holder, renewed_at, renewed_at + RUN_LEASE)
    planned = _carry_over_dead_runs(store, context, run_id, clock, result)
    planned += _take_up_unfinished(store, context, run_id, clock, {p.ref for p in planned})
    bindings = [b for b in context.mailboxes if mailbox_ids is None or b.mailbox_id in mailbox_ids]

    # 1. Preflight first; a failure gates the work on each item, never detection.
    preflights = {b.mailbox_id: classify.preflight(context, b.mailbox_id) for b in bindings}
    reader = _Reader(store, run_id, workspace_id, clock, {p.ref for p in planned}, from_start)
    providers = await reader.read_all(bindings, provider_for, result)
    planned.extend(reader.planned)
    if planned:
        renewed_at = _renew(store, run_id, holder, clock, renewed_at, force=True)
    _oldest_first(planned)
    return Scan(
        store=store,
        context=context,
        station=station,
        holder=holder,
        result=result,
        planned=planned,
        providers=providers,
        preflights=preflights,
        renewed_at=renewed_at,
        lookahead=claim.Lookahead(store, [p.key for p in planned]),
    )


async def resume(
    *,
    store: IntakeStore,
    data_dir: DataDir,
    run_id: str,
    provider_for: ProviderFactory,
    clock: Clock,
    holder: str | None = None,
) -> Scan:
    """An open run as any worker on any machine can go on with it: its recorded items,
    ready to be claimed (the run's own worker keeps its lease and reconciles it)."""
    open_run = store.run_holder(run_id)
    if open_run is None:
        raise InvalidRequest(
            f"run {run_id} is not an open run here (unknown, or already reconciled); call "
            "intake again - a new run takes what an earlier one left unclaimed"
        )
    context = load_context(store, open_run.scope)
    entries = store.ledger(run_id)
    planned = [p for e in entries if (p := _replanned(context, e)) is not None]
    _oldest_first(planned)
    bindings = {p.mailbox.mailbox_id: p.mailbox for p in planned}
    providers = {m: provider_for(context.workspace_id, b) for m, b in bindings.items()}
    preflights = {m: classify.preflight(context, m) for m in providers}
    return Scan(
        store=store,
        context=context,
        station=load_station(data_dir),
        holder=holder or current_holder(),
        result=RunResult(run_id=run_id, workspace_id=open_run.scope),
        planned=planned,
        providers=providers,
        preflights=preflights,
        renewed_at=clock.now(),
        lookahead=claim.Lookahead(store, [p.key for p in planned]),
        owns_run=False,
    )


def _carry_over_dead_runs(
    store: IntakeStore, context: WorkspaceContext, run_id: str, clock: Clock, result: RunResult
) -> list[Planned]:
    """Runs whose worker died before reconciling are reconciled now, so every scanned item
    of every run ends with exactly one outcome; their items nobody decided are carried into
    this run (their cursor moved past them, so no later read brings them back)."""
    carried: list[Planned] = []
    for open_run in store.unreconciled_runs(context.workspace_id):
        if open_run.run_id == run_id or not open_run.stale(clock.now(), holder_alive):
            continue
        undecided = [e for e in store.ledger(open_run.run_id) if e.disposition is None]
        stale = store.reconcile_stale(open_run.run_id, clock.now(), holder_alive)
        if stale is None:
            continue  # another worker reconciled it (and carried its items) first
        result.reconciled_stale.append(reconciled(stale, context.workspace_id))
        carried.extend(p for e in undecided if (p := _replanned(context, e)) is not None)
    carried = list({p.ref: p for p in carried}.values())  # several dead runs held one item
    if carried:
        _record(store, run_id, carried, clock)
    return carried


def _take_up_unfinished(
    store: IntakeStore, context: WorkspaceContext, run_id: str, clock: Clock, taken: set[str]
) -> list[Planned]:
    """The scope's occurrences a claim may take over now - a retry that is due, a claim
    whose holder died or whose lease ran out - taken up again in this run: no mailbox read
    brings them back once the cursor moved past them."""
    due = [
        p
        for e in store.reclaimable(context.workspace_id, clock.now(), holder_alive)
        if (p := _replanned(context, e)) is not None and p.ref not in taken
    ]
    if due:
        _record(store, run_id, due, clock)
    return due


def _replanned(context: WorkspaceContext, entry: LedgerEntry) -> Planned | None:
    """A recorded item as it was planned, if its mailbox is still bound."""
    binding = next((b for b in context.mailboxes if b.mailbox_id == entry.mailbox_id), None)
    if entry.scanned is None or binding is None or entry.occurrence_key is None:
        return None
    return Planned(entry.scanned, binding, entry.owner, entry.occurrence_key, entry.reason)


def _record(
    store: RunLedger,
    run_id: str,
    planned: list[Planned],
    clock: Clock,
    cursor: MailboxCursor | None = None,
) -> None:
    """Planned items go into the run ledger with what any worker needs to claim them, and
    the cursor (if any) advances past them in the same transaction."""
    entries = [
        LedgerEntry(
            run_id=run_id,
            item_ref=p.ref,
            occurrence_key=p.key,
            detail=p.reason,
            scanned=p.scanned,
            owner=p.owner,
            mailbox_id=p.mailbox.mailbox_id,
            reason=p.reason,
        )
        for p in planned
    ]
    store.record_scanned(entries, clock.now(), cursor)


@dataclass
class _Reader:
    """Steps 2-4 over a run's mailboxes, page by page: each item planned once."""

    store: IntakeStore
    run_id: str
    workspace_id: str
    clock: Clock
    seen: set[str]
    from_start: bool = False
    planned: list[Planned] = field(default_factory=list[Planned])

    async def read_all(
        self, bindings: list[MailboxBinding], provider_for: ProviderFactory, result: RunResult
    ) -> dict[str, MailProvider]:
        """Read every mailbox, with the channel each was read through. A mailbox that cannot
        be read is an access gap, not a policy refusal: the other mailboxes still run, and
        the gap is on record for the operator and the access resolver."""
        providers: dict[str, MailProvider] = {}
        for binding in bindings:
            try:
                provider = provider_for(self.workspace_id, binding)
                providers[binding.mailbox_id] = provider
                await self.read(provider, binding)
            except ProviderError as exc:
                self.store.record_health(
                    f"mailbox {binding.mailbox_id} ({binding.provider})",
                    str(exc),
                    self.clock.now(),
                )
                result.access_errors.append(f"{binding.mailbox_id}: {exc}")
        return providers

    async def read(self, provider: MailProvider, binding: MailboxBinding) -> None:
        """The mailbox's changes since its cursor; an expired cursor is read again in full
        (occurrence keys keep that from recording anything twice)."""
        caps = provider.capabilities
        if not caps.key_basis:
            raise Unsupported(
                f"channel {caps.channel} cannot give the Message-ID, sender and Date every "
                "channel of the mailbox keys messages by; it is not used for intake"
            )
        where = (self.workspace_id, binding.provider, binding.mailbox_id, caps.channel.value)
        cursor = None if self.from_start else self.store.get_cursor(*where)
        while True:
            try:
                page = await provider.changes(cursor)
            except CursorExpired:
                if cursor is None:
                    raise
                self.store.clear_cursor(*where)
                cursor = None
                continue
            self._take(
                page,
                binding,
                caps,
                MailboxCursor(
                    scope=where[0],
                    provider=where[1],
                    mailbox_id=where[2],
                    channel=where[3],
                    cursor=page.cursor,
                ),
            )
            cursor = page.cursor
            if not page.more:
                return

    def _take(
        self,
        page: ChangePage,
        binding: MailboxBinding,
        caps: Capabilities,
        cursor: MailboxCursor,
    ) -> None:
        cands = candidates(self.store, binding.provider, binding.mailbox_id)
        found: list[Planned] = []
        for scanned in _threaded(self.store, page.items, caps):
            plan = _plan(scanned, binding, cands, self.workspace_id)
            if plan is not None and plan.ref not in self.seen:
                self.seen.add(plan.ref)
                found.append(plan)
        found = _keep_legacy_keys(self.store, found)
        _record(self.store, self.run_id, found, self.clock, cursor)
        self.planned.extend(found)
        emit(
            Event.SCAN,
            workspace_id=self.workspace_id,
            run_id=self.run_id,
            mailbox_id=binding.mailbox_id,
            provider=binding.provider,
            channel=caps.channel.value,
            scanned=len(found),
        )


def _threaded(
    store: ThreadAliases, items: Sequence[ScannedMessage], caps: Capabilities
) -> list[ScannedMessage]:
    """The page's items with their threads named as every channel of its mail system names
    them: the channel's own thread id where the mail system shows it everywhere, else the
    alias the store keeps for the thread (reached from its Message-IDs; a Message-ID that
    messages which differ carry is nobody's parent), resolved for the page at once."""
    if caps.native_threads:
        return list(items)
    links = {i: link for i, item in enumerate(items) if (link := _link(item)) is not None}
    if not links:
        return list(items)
    first = items[next(iter(links))].envelope
    assert first is not None
    aliases = store.resolve_threads(first.provider, first.mailbox_id, list(links.values()))
    named = dict(zip(links, aliases, strict=True))
    return [_named(item, named[i]) if i in named else item for i, item in enumerate(items)]


def _link(scanned: ScannedMessage) -> ThreadLink | None:
    envelope = scanned.envelope
    if envelope is None or envelope.internet_message_id is None:
        return None
    mid = envelope.internet_message_id
    identity = identity_digest(envelope)
    return ThreadLink(
        message_id=mid,
        identity=identity,
        related=tuple(m for m in (envelope.in_reply_to, *envelope.references) if m is not None),
        proposed=proposed_thread(envelope),
        if_reused=thread_alias(f"{mid}#{identity}"),
    )


def _named(scanned: ScannedMessage, alias: str) -> ScannedMessage:
    assert scanned.envelope is not None
    threaded = scanned.envelope.model_copy(update={"provider_thread_id": alias})
    return scanned.model_copy(update={"envelope": threaded})


def _keep_legacy_keys(store: Claims, planned: list[Planned]) -> list[Planned]:
    """Items a store recorded before occurrence keys were channel-independent keep the key
    they were claimed under, so nothing is claimed twice across the upgrade."""
    legacy = {
        p.key: legacy_occurrence_key(p.owner, p.envelope)
        for p in planned
        if p.envelope is not None and p.envelope.internet_message_id is not None
    }
    if not legacy:
        return planned
    known = store.get_executions([*legacy, *legacy.values()])
    return [
        replace(p, key=legacy[p.key])
        if p.key in legacy and p.key not in known and legacy[p.key] in known
        else p
        for p in planned
    ]


def _oldest_first(planned: list[Planned]) -> None:
    """Oldest first by the canonical received_at, then by when the sender wrote it (a
    mail server stamps arrivals to the second), then by the item's reference with its
    numbers compared as numbers (UID 2 before UID 10), so every worker orders a run alike;
    unreadable items last."""
    planned.sort(
        key=lambda p: (
            p.envelope is None,
            p.envelope.received_at.timestamp() if p.envelope else 0.0,
            p.envelope.sent_at.timestamp() if p.envelope and p.envelope.sent_at else 0.0,
            _natural(p.ref),
        )
    )


def _natural(ref: str) -> tuple[tuple[int, str], ...]:
    """A reference as its runs of digits (compared as numbers) and of other text."""
    return tuple(
        (int(run), "") if run.isdigit() else (-1, run) for run in re.split(r"(\d+)", ref) if run
    )


async def claim_item(run: Scan, index: int, clock: Clock) -> ItemOutcome | None:
    """Steps 5-8 for one scanned item: claim it; the holder creates or updates the one task
    and reports the item's disposition. A lost claim writes nothing now: its claim-race
    disposition is buffered (``flush``). None when the item's handling failed (the failure
    is in ``item_errors`` and the station health record)."""
    store = run.store
    plan = run.planned[index]
    if run.owns_run:
        run.renewed_at = _renew(store, run.run_id, run.holder, clock, run.renewed_at)
    request = ClaimRequest(
        key=plan.key,
        service=SERVICE,
        holder=run.holder,
        run_id=run.run_id,
        item_ref=plan.ref,
    )
    try:
        if plan.owner == run.result.workspace_id and plan.envelope is not None and not plan.reason:
            outcome = await _handle(
                store,
                run.context,
                plan.envelope,
                request,
                run.preflights[plan.mailbox.mailbox_id],
                clock,
                run.lookahead.seen(index),
                run.providers[plan.mailbox.mailbox_id],
            )
        else:
            outcome = _escalate(
                store, run.context, run.station, plan, request, clock, run.lookahead.seen(index)
            )
    except ClaimLost as exc:
        # This worker was too slow: its lease expired and another holder took the
        # occurrence over. The other holder finishes it; this run records the race.
        outcome = ItemOutcome(
            plan.ref,
            Disposition.EXECUTION_ALREADY_CLAIMED,
            ClaimOutcome.EXECUTION_ALREADY_CLAIMED,
            None,
            False,
            str(exc),
        )
    except StoreError:
        flush(run, clock)  # keep what was decided
        raise
    except Exception as exc:
        # One item's failure never stops the others, whatever it is: the item stays
        # without an outcome (the reconciliation says so), its claim is taken over by a
        # later run, and the station health record names it.
        _item_failed(run, plan.ref, exc, clock)
        return None
    run.result.items.append(outcome)
    _record_decision(run, outcome)
    if outcome.claim is not None and outcome.claim is not ClaimOutcome.CLAIMED:
        run.race.append((outcome.item_ref, outcome.disposition, outcome.detail))
        if len(run.race) >= RACE_BATCH:
            flush(run, clock)
    return outcome


def _item_failed(run: Scan, ref: str, exc: Exception, clock: Clock) -> None:
    """One item's handling failed: the health record, the run's errors, a warning record."""
    run.store.record_health(f"intake item {ref}", f"{type(exc).__name__}: {exc}", clock.now())
    run.result.item_errors.append(f"{ref}: {type(exc).__name__}: {exc}")
    emit(
        Event.DISPOSITION,
        level=logging.WARNING,
        workspace_id=run.result.workspace_id,
        run_id=run.run_id,
        item_ref=ref,
        outcome="item_failed",
        reason=type(exc).__name__,
    )


def _record_decision(run: Scan, outcome: ItemOutcome) -> None:
    """The item's disposition, as a decision record (its claim recorded itself)."""
    emit(
        Event.DISPOSITION,
        workspace_id=run.result.workspace_id,
        run_id=run.run_id,
        item_ref=outcome.item_ref,
        disposition=outcome.disposition.value,
        task_id=outcome.task_id,
    )


def flush(run: Scan, clock: Clock) -> None:
    """Record the buffered claim-race dispositions in the run ledger."""
    if run.race:
        run.store.record_dispositions(run.run_id, run.race, clock.now())
        run.race.clear()


async def finish(run: Scan, clock: Clock) -> RunResult:
    """Step 11: record what is buffered, reconcile the run, then send the reminders due."""
    flush(run, clock)
    run.result.reconciliation = reconciled(
        run.store.reconcile(run.run_id, clock.now()), run.result.workspace_id
    )
    # Reminders are their own work: a run that reconciled still sends the ones now due.
    try:
        run.result.reminders = await reminders.send_due(
            run.store, run.context, run.providers, clock
        )
    finally:
        for provider in run.providers.values():
            await provider.aclose()
    return run.result


RECONCILIATION_FIGURES = frozenset(
    {
        "run_id",
        "scanned",
        "terminal",
        "non_terminal",
        "claim_race",
        "reconciliation_failed",
        "clean",
    }
)


def reconciled(rec: Reconciliation, workspace_id: str) -> Reconciliation:
    """The run's reconciliation, recorded as a decision (a warning when it failed)."""
    figures = rec.model_dump(include=set(RECONCILIATION_FIGURES))
    level = logging.INFO if rec.clean else logging.WARNING
    emit(Event.RECONCILIATION, level=level, workspace_id=workspace_id, **figures)
    return rec


async def run_cycle(
    *,
    store: IntakeStore,
    data_dir: DataDir,
    workspace_id: str,
    provider_for: ProviderFactory,
    clock: Clock,
    holder: str | None = None,
    on_progress: Callable[[Progress], None] | None = None,
    from_start: bool = False,
) -> RunResult:
    """Run one intake cycle for a workspace and reconcile it."""
    run = await scan(
        store=store,
        data_dir=data_dir,
        workspace_id=workspace_id,
        provider_for=provider_for,
        clock=clock,
        holder=holder,
        from_start=from_start,
    )
    for index in range(len(run.planned)):
        outcome = await claim_item(run, index, clock)
        if outcome is not None and on_progress is not None:
            on_progress(Progress(done=index + 1, total=len(run.planned), outcome=outcome))
    return await finish(run, clock)


def _renew(
    store: RunLedger,
    run_id: str,
    holder: str,
    clock: Clock,
    renewed_at: datetime,
    *,
    force: bool = False,
) -> datetime:
    """Renew the run's lease once a third of it has passed (or now, with ``force``)."""
    if not force and clock.now() - renewed_at <= RUN_LEASE / 3:
        return renewed_at
    now = clock.now()
    if not store.renew_run(run_id, holder, now + RUN_LEASE):
        raise StoreError(
            f"run {run_id} was reconciled by another worker after its lease ran out; this "
            "worker stops here (each claim's execution record still governs it)"
        )
    return now


def _plan(
    scanned: ScannedMessage,
    binding: MailboxBinding,
    cands: list[Candidate],
    workspace_id: str,
) -> Planned | None:
    envelope = scanned.envelope
    if envelope is None:
        # Unreadable: it cannot be bound by shared-mailbox rules, so only an unshared
        # mailbox's own workspace escalates it; otherwise the station does.
        owner = STATION_SCOPE if binding.shared else workspace_id
        key = compose_key(
            owner, binding.provider, binding.mailbox_id, "unreadable", scanned.item_ref
        )
        return Planned(scanned, binding, owner, key, f"could not be normalized: {scanned.error}")
    resolution = resolve_workspace(envelope, cands)
    if resolution.status is ResolutionStatus.RESOLVED:
        if resolution.workspace_id != workspace_id:
            return None  # another workspace's item in a shared mailbox: not read here
        return Planned(
            scanned,
            binding,
            workspace_id,
            occurrence_key(workspace_id, envelope, OccurrenceScope.MESSAGE),
            "",
        )
    if resolution.status is ResolutionStatus.ESCALATE_IN_WORKSPACE:
        if resolution.workspace_id != workspace_id:
            return None
        return Planned(
            scanned,
            binding,
            workspace_id,
            occurrence_key(workspace_id, envelope),
            resolution.reason,
        )
    return Planned(
        scanned, binding, STATION_SCOPE, occurrence_key(STATION_SCOPE, envelope), resolution.reason
    )


async def _handle(
    store: IntakeStore,
    context: WorkspaceContext,
    envelope: Envelope,
    request: ClaimRequest,
    preflight_failure: str | None,
    clock: Clock,
    seen: tuple[ExecutionRecord | None],
    provider: MailProvider,
) -> ItemOutcome:
    now = clock.now()
    claimed = claim.claim_occurrence(
        store,
        request,
        lambda: claim.task_draft(context, envelope, request.key, classify.work_owner(context), now),
        now,
        seen=seen,
        workspace_id=context.workspace_id,
    )
    if claimed.outcome is not ClaimOutcome.CLAIMED:
        return ItemOutcome(
            request.item_ref,
            claimed.outcome.disposition(),
            claimed.outcome,
            None,
            False,
            f"held by {claimed.execution.holder}"
            if claimed.outcome is ClaimOutcome.EXECUTION_ALREADY_CLAIMED
            else "",
        )
    crashpoints.hit("after_claim_txn")
    task = claimed.task
    assert task is not None
    approval = await approvals.judge_inbound(store, context, task, envelope, provider, clock)
    verdict = classify.triage(
        context, envelope, task, claimed.task_created, preflight_failure, clock.now(), approval
    )
    if verdict.disposition is Disposition.QUEUED and claimed.task_created and approval is None:
        verdict = await acks.acknowledge(store, context, envelope, task, verdict, provider, clock)
    record = store.report(
        ReportRequest(
            key=request.key,
            holder=request.holder,
            run_id=request.run_id,
            item_ref=request.item_ref,
            disposition=verdict.disposition,
            detail=verdict.detail,
            task_update=verdict.update,
        ),
        clock.now(),
    )
    return ItemOutcome(
        request.item_ref,
        record.outcome or verdict.disposition,
        ClaimOutcome.CLAIMED,
        task.task_id,
        claimed.task_created,
        verdict.detail,
    )


def _escalate(
    store: IntakeStore,
    context: WorkspaceContext,
    station: StationConfig,
    plan: Planned,
    request: ClaimRequest,
    clock: Clock,
    seen: tuple[ExecutionRecord | None],
) -> ItemOutcome:
    """Escalate an item no workspace can own (or whose binding is unverified)."""
    now = clock.now()
    queue, assignee, source = _escalation_target(context, station, plan)
    detail = _escalation_detail(store, plan, source, queue, assignee, now)
    draft = EscalationDraft(
        scope=plan.owner,
        queue=queue or "",
        assignee=assignee or "",
        reason=plan.reason,
        provider=plan.mailbox.provider,
        mailbox_id=plan.mailbox.mailbox_id,
        item_ref=plan.ref,
    )
    claimed = claim.claim_occurrence(
        store, request, lambda: draft, now, seen=seen, workspace_id=plan.owner
    )
    if claimed.outcome is not ClaimOutcome.CLAIMED:
        return ItemOutcome(
            request.item_ref, claimed.outcome.disposition(), claimed.outcome, None, False, ""
        )
    crashpoints.hit("after_claim_txn")
    store.report(
        ReportRequest(
            key=request.key,
            holder=request.holder,
            run_id=request.run_id,
            item_ref=request.item_ref,
            disposition=Disposition.ESCALATED,
            detail=detail,
        ),
        clock.now(),
    )
    return ItemOutcome(
        request.item_ref, Disposition.ESCALATED, ClaimOutcome.CLAIMED, None, False, detail
    )


def _escalation_target(
    context: WorkspaceContext, station: StationConfig, plan: Planned
) -> tuple[str | None, str | None, str]:
    """The queue and person an escalation goes to, and where they are configured: the
    station's for a station-scope item, else the workspace context's."""
    if plan.owner == STATION_SCOPE:
        return station.unresolved_queue, station.escalation_contact, "station.yaml"
    return (
        context.unresolved_queue,
        context.escalation_contact,
        f"workspace {context.workspace_id} context",
    )


def _escalation_detail(
    store: Health,
    plan: Planned,
    source: str,
    queue: str | None,
    assignee: str | None,
    now: datetime,
) -> str:
    """Why the item is escalated; a missing queue or contact goes on the station health
    record and is named in the detail."""
    missing = [
        name
        for name, value in (("unresolved_queue", queue), ("escalation_contact", assignee))
        if not value
    ]
    detail = plan.reason
    if missing:
        for name in missing:
            store.record_health(
                f"{source}: {name}",
                f"{source} has no {name}: escalated items cannot reach a queue or a person",
                now,
            )
        detail += f"; {source} is missing {', '.join(missing)} (see the station health record)"
    return detail
