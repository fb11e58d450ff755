"""The dispatcher: exactly one per workspace runs its cycles on the workspace's schedule.

Whoever holds the workspace's lease in the store (PostgreSQL when machines share it) is the
active dispatcher; any other stands by, saying who holds it, and takes over when the holder's
lease lapses or the holder is proven dead. A cycle is recorded by its scheduled time, so an
occurrence runs once: a cycle its dispatcher died in is run again by the next holder (the
intake reconciles the dead run), and the latest occurrence missed while no dispatcher ran is
caught up once. A shared mailbox is scanned under a lease of its own, so two workspaces'
dispatchers never scan it at once.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Protocol

import anyio
import anyio.lowlevel

from agent.domain import schedule
from agent.domain.errors import StoreError
from agent.domain.records import DispatcherRow, Lease
from agent.events import Event, emit
from agent.ports import Clock, Dispatch, Health
from agent.services.holder import current_holder, holder_alive, holder_where
from agent.services.schedule import Installation

LEASE_TTL = timedelta(seconds=60)
RECENT_CYCLES = 20
"""How far back a new holder looks for a cycle another dispatcher left unfinished."""
REQUEST_STEP = timedelta(milliseconds=1)
"""How far after the newest cycle a requested one is recorded when both fall in one second
(a step the store's timestamps keep exactly)."""


class Role(StrEnum):
    ACTIVE = "active"
    STANDBY = "standby"
    ONE_SHOT = "one-shot"
    STOPPED = "stopped"


_LEASE_OUTCOME = {
    Role.ACTIVE: "taken",
    Role.STANDBY: "held_by_another",
    Role.ONE_SHOT: "one_shot",
    Role.STOPPED: "released",
}


@dataclass(frozen=True)
class CycleOutcome:
    run_id: str | None
    outcome: str
    """``clean``, ``not clean``, ``mailbox not read`` or ``failed: ...``."""


class DispatchStore(Dispatch, Health, Protocol):
    """What a dispatcher needs of the store."""


@dataclass(frozen=True)
class Plan:
    """The workspace as the dispatcher runs it, re-read before each step."""

    expression: str
    timezone: str
    shared_mailboxes: tuple[str, ...]
    """``provider:mailbox`` of each shared mailbox the workspace reads."""


def lease_name(workspace_id: str) -> str:
    return f"dispatch {workspace_id}"


def scan_lease_name(mailbox: str) -> str:
    return f"scan {mailbox}"


class LeaseLost(Exception):
    """This dispatcher's lease was taken while it worked: it stops and stands by."""


@dataclass
class Dispatcher:
    store: DispatchStore
    workspace_id: str
    here: Installation
    clock: Clock
    plan: Callable[[], Plan]
    cycle: Callable[[], Awaitable[CycleOutcome]]
    sleep: Callable[[float], Awaitable[None]]
    say: Callable[[str], None]
    lease_ttl: timedelta = LEASE_TTL
    poll: float = 10.0
    holder: str = field(default_factory=current_holder)
    started_at: datetime | None = None
    role: Role | None = None
    detail: str = ""
    requested: bool = False
    """An operator asked for a cycle now (``outloop dispatch`` takes SIGUSR1 as that)."""

    # -- the lease and the report ----------------------------------------------------------

    def _take(self, name: str) -> Lease | None:
        """Take or renew the named lease; a holder proven dead loses it at once."""
        now = self.clock.now()
        current = self.store.get_lease(name)
        dead = None
        if current is not None and current.holder != self.holder:
            dead = None if holder_alive(current.holder) else current.holder
        return self.store.take_lease(name, self.holder, now, self.lease_ttl, dead=dead)

    def _renew(self) -> None:
        """Keep the workspace's lease (and report alive); ``LeaseLost`` when it was taken."""
        if self._take(lease_name(self.workspace_id)) is None:
            raise LeaseLost
        self._report(self.role or Role.ACTIVE, self.detail)

    def _report(self, role: Role, detail: str = "") -> None:
        now = self.clock.now()
        if self.started_at is None:
            self.started_at = now
        if role != self.role:
            self.say(f"{role}: {detail}" if detail else str(role))
            emit(
                Event.LEASE,
                level=logging.INFO,
                workspace_id=self.workspace_id,
                holder=self.holder,
                role=role.value,
                outcome="lost" if self.role is Role.ACTIVE and role is Role.STANDBY
                else _LEASE_OUTCOME[role],
            )  # fmt: skip
        self.role, self.detail = role, detail
        self.store.record_dispatcher(
            DispatcherRow(
                holder=self.holder,
                workspace_id=self.workspace_id,
                role=role.value,
                executable=self.here.executable,
                install=self.here.install,
                version=self.here.version,
                started_at=self.started_at,
                seen_at=now,
                detail=detail,
            )
        )

    def holder_of(self, name: str) -> str:
        """Who holds the named lease, as an operator finds them."""
        lease = self.store.get_lease(name)
        if lease is None:
            return "nobody"
        until = f"lease until {lease.expires_at:%H:%M:%S} UTC"
        for row in self.store.list_dispatchers(self.workspace_id):
            if row.holder == lease.holder:
                installed = f"from {row.install}, version {row.version}"
                return f"{holder_where(lease.holder)} ({installed}), {until}"
        return f"{holder_where(lease.holder)}, {until}"

    # -- what is due ----------------------------------------------------------------------

    def due(self, plan: Plan) -> tuple[datetime, str | None] | None:
        """The cycle to run now and the holder it is taken from: a cycle left unfinished (by
        another dispatcher, which lost the lease this one holds now, or by this one), else
        the latest occurrence not yet run since the last cycle (or since this dispatcher
        started, on a fresh install)."""
        cycles = self.store.list_cycles(self.workspace_id, RECENT_CYCLES)
        for cycle in reversed(cycles):  # oldest first
            if cycle.finished_at is None:
                return cycle.scheduled_for, None if cycle.holder == self.holder else cycle.holder
        now = self.clock.now()
        latest = schedule.previous_run(plan.expression, plan.timezone, now)
        since = cycles[0].scheduled_for if cycles else self.started_at or now
        if latest > since:
            return latest, None
        return None

    # -- running --------------------------------------------------------------------------

    async def run_cycle(self, scheduled_for: datetime, dead: str | None, plan: Plan) -> bool:
        """Run the cycle due at ``scheduled_for`` once: False when another ran it (or runs
        it). ``LeaseLost`` when the lease was taken meanwhile: the cycle stops there, and the
        holder runs it again."""
        now = self.clock.now()
        if not self.store.start_cycle(self.workspace_id, scheduled_for, self.holder, now, dead):
            return False
        held = await self._scan_leases(plan.shared_mailboxes)
        self.say(f"cycle due {scheduled_for:%Y-%m-%d %H:%M %Z}: running")
        try:
            outcome = await self._kept_while_running(held)
        finally:
            for name in held:
                self.store.release_lease(name, self.holder)
        self._finish(scheduled_for, outcome)
        return True

    async def _kept_while_running(self, scan_leases: list[str]) -> CycleOutcome:
        """The cycle, its leases renewed every ``poll`` seconds while it runs (and this
        dispatcher reported alive); ``LeaseLost`` when one was taken (the cycle stopped)."""
        lost = False
        outcome = CycleOutcome(None, "stopped")
        async with anyio.create_task_group() as group:

            async def keep() -> None:
                nonlocal lost
                while True:
                    await anyio.lowlevel.checkpoint()
                    await self.sleep(self.poll)
                    try:
                        self._renew()
                        if any(self._take(name) is None for name in scan_leases):
                            raise LeaseLost
                    except (LeaseLost, StoreError):
                        lost = True
                        group.cancel_scope.cancel()
                        return

            group.start_soon(keep)
            try:
                outcome = await self.cycle()
            except Exception as exc:
                first = (str(exc) or type(exc).__name__).splitlines()[0]
                outcome = CycleOutcome(None, f"failed: {first[:300]}")
            group.cancel_scope.cancel()
        if lost:
            raise LeaseLost
        return outcome

    def _finish(self, scheduled_for: datetime, outcome: CycleOutcome) -> None:
        end = self.clock.now()
        self.store.finish_cycle(
            self.workspace_id, scheduled_for, self.holder, end, outcome.run_id, outcome.outcome
        )
        detail = {
            "scheduled_for": scheduled_for.isoformat(),
            "run_id": outcome.run_id,
            "outcome": outcome.outcome,
            "holder": self.holder,
        }
        self.store.record_health(f"dispatch {self.workspace_id}", json.dumps(detail), end)
        self.say(f"cycle due {scheduled_for:%Y-%m-%d %H:%M %Z}: {outcome.outcome}")

    async def _scan_leases(self, mailboxes: Sequence[str]) -> list[str]:
        """The scan lease of each shared mailbox, in one order (no two dispatchers wait on
        each other), waiting while another workspace's dispatcher scans it and keeping this
        dispatcher's own lease meanwhile."""
        held: list[str] = []
        try:
            for mailbox in sorted(mailboxes):
                name = scan_lease_name(mailbox)
                while self._take(name) is None:
                    self.say(f"waiting: shared mailbox {mailbox} is being scanned by another")
                    await self.sleep(self.poll)
                    self._renew()
                held.append(name)
        except BaseException:
            for name in held:
                self.store.release_lease(name, self.holder)
            raise
        return held

    async def step(self, run_now: bool = False) -> float:
        """One turn: hold (or wait for) the lease, run what is due; the seconds to wait."""
        plan = self.plan()
        name = lease_name(self.workspace_id)
        if self._take(name) is None:
            self._report(Role.STANDBY, f"the lease is held by {self.holder_of(name)}")
            return self.poll
        self._report(Role.ACTIVE, f"holds the lease of workspace {self.workspace_id}")
        try:
            due = self.due(plan)
            if due is not None:
                await self.run_cycle(*due, plan)
            if run_now or self.requested:
                self.requested = False
                await self.run_cycle(self._requested_for(), None, plan)
        except LeaseLost:
            self._report(Role.STANDBY, "lost the lease mid-cycle: its holder runs the cycle")
            return self.poll
        upcoming = schedule.next_runs(plan.expression, plan.timezone, self.clock.now(), 1)[0]
        return max(0.0, min(self.poll, (upcoming - self.clock.now()).total_seconds()))

    def _requested_for(self) -> datetime:
        """When a cycle asked for now is recorded as due: now (to the second), or just after
        the newest cycle when that one is as recent. A request is a cycle of its own, never
        the one that finished in the same second (mail may have come since it scanned)."""
        now = self.clock.now().replace(microsecond=0)
        newest = self.store.list_cycles(self.workspace_id, 1)
        if newest and newest[0].scheduled_for >= now:
            return newest[0].scheduled_for + REQUEST_STEP
        return now

    async def run(self, *, no_wait: bool = False, run_now: bool = False) -> bool:
        """Run until cancelled; False at once when ``no_wait`` and another holds the lease."""
        try:
            first = True
            while True:
                try:
                    wait = await self.step(run_now=run_now and first)
                except StoreError as exc:  # the store is unreachable for now: try again
                    self.say(f"store error, retrying in {self.poll:.0f} s: {exc}")
                    await self.sleep(self.poll)
                    continue
                if self.role is Role.ACTIVE:
                    first = False
                elif no_wait:
                    return False
                await self.sleep(wait)
        finally:
            self.stop()

    async def once(self) -> bool:
        """One cycle now, as a host timer runs it: False when a dispatcher holds the lease."""
        plan = self.plan()
        name = lease_name(self.workspace_id)
        if self._take(name) is None:
            # Recorded all the same: a host timer and a running dispatcher are two.
            self._report(Role.ONE_SHOT, f"not run: the lease is held by {self.holder_of(name)}")
            return False
        try:
            self._report(Role.ONE_SHOT, "run by the host scheduler")
            due = self.due(plan)
            scheduled_for = due[0] if due is not None else self._requested_for()
            if not await self.run_cycle(scheduled_for, due[1] if due else None, plan):
                self.say(f"the cycle due {scheduled_for:%Y-%m-%d %H:%M %Z} ran already")
        except LeaseLost:
            self.say("lost the lease mid-cycle: its holder runs the cycle again")
        finally:
            self.store.release_lease(name, self.holder)
        return True

    def stop(self) -> None:
        """Give the lease up and say so (a standby takes over at its next turn)."""
        if self.role is Role.ACTIVE:
            self.store.release_lease(lease_name(self.workspace_id), self.holder)
        if self.role in (Role.ACTIVE, Role.STANDBY):
            self._report(Role.STOPPED)
