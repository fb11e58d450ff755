"""A workspace's schedule: its minute chosen once at registration, recorded in the registry
and in the workspace's tenant-config.md, and verified check by check (``outloop schedule
verify``): a human-readable summary is not verification.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from zoneinfo import ZoneInfo

from pydantic import BaseModel, ConfigDict, ValidationError

from agent.domain import schedule
from agent.domain.context import WorkspaceContext
from agent.domain.errors import ContextError, MinuteTaken
from agent.domain.records import Binding, DispatcherRow, WorkspaceRow
from agent.domain.schedule import MinuteChoice
from agent.ports import Dispatch, Registry
from agent.services.contexts import registered_context
from agent.services.holder import holder_alive, holder_where

DISPATCHER_STALE = timedelta(minutes=3)
"""A dispatcher that has not reported for this long is not counted as running."""
REPAIR = "outloop workspace update --context FILE (records the workspace's minute again)"
MARKER = "<!-- outloop:schedule - read back by 'outloop schedule verify'; do not edit -->"
WEEK = timedelta(days=7)


class Recorded(BaseModel):
    """The schedule as tenant-config.md records it."""

    model_config = ConfigDict(frozen=True)

    workspace_id: str
    expression: str
    choice: MinuteChoice


@dataclass(frozen=True)
class Installation:
    """Where this Outloop runs from: what a dispatcher records and verify compares."""

    executable: str
    install: str
    version: str


def choice_of(row: WorkspaceRow) -> MinuteChoice | None:
    if row.schedule_derivation is None:
        return None
    try:
        return MinuteChoice.model_validate_json(row.schedule_derivation)
    except ValidationError:
        return None


def consistent(workspace_id: str, choice: MinuteChoice) -> bool:
    """Whether a recorded choice is the derivation's: the derived value is the id's, and
    re-run against the recorded collisions it gives the recorded minute."""
    return (
        choice.derived == schedule.derive_minute(workspace_id)
        and schedule.rerun(workspace_id, choice).minute == choice.minute
    )


def with_schedule(row: WorkspaceRow, choice: MinuteChoice, shared: bool) -> WorkspaceRow:
    return row.model_copy(
        update={
            "schedule_minute": choice.minute,
            "schedule_expression": choice.expression,
            "schedule_derivation": choice.model_dump_json(),
            "schedule_shared": shared,
        }
    )


def register(
    store: Registry, tenant_config: Path, row: WorkspaceRow, bindings: Sequence[Binding]
) -> WorkspaceRow:
    """Register the row with its minute: the one tenant-config.md recorded (a reinstall reads
    it back), else the derived one moved past the minutes other workspaces hold. The registry
    decides a race for a minute; the loser chooses again."""
    recorded = read_recorded(tenant_config, row.workspace_id)
    if recorded is not None and not consistent(row.workspace_id, recorded.choice):
        raise ContextError(
            f"{tenant_config} records minute {recorded.choice.minute} for "
            f"{row.workspace_id}, but its derivation does not re-run to it (edited by hand?); "
            "restore the file, or remove it to choose the minute again"
        )
    for _ in schedule.MINUTES:
        held = store.held_minutes()
        if recorded is not None:
            choice = recorded.choice
            shared = held.get(choice.minute, row.workspace_id) != row.workspace_id
        else:
            choice = schedule.choose_minute(row.workspace_id, held)
            shared = choice.shared_with is not None
        chosen = with_schedule(row, choice, shared)
        try:
            store.register_workspace(chosen, bindings)
        except MinuteTaken:
            continue
        write_tenant_config(tenant_config, chosen, choice)
        return chosen
    raise MinuteTaken("the schedule minutes kept changing while choosing one; try again")


def write_tenant_config(path: Path, row: WorkspaceRow, choice: MinuteChoice) -> None:
    """tenant-config.md: the schedule for people, and the record verify reads back."""
    recorded = Recorded(workspace_id=row.workspace_id, expression=choice.expression, choice=choice)
    times = ", ".join(f"{hour:02d}:{choice.minute:02d}" for hour in schedule.HOURS)
    text = (
        f"# Tenant config: {row.workspace_id}\n\n"
        "## Schedule\n\n"
        f"- Expression: `{choice.expression}` (cron day numbering: 0 = Sunday, 6 = Saturday)\n"
        f"- Runs at {times}, Sunday to Friday: seven runs a day, none on Saturday, in the "
        "workspace timezone unless its context's `schedule.timezone` overrides it.\n"
        f"- Minute {choice.minute}: {choice.described()}.\n"
        "- Chosen once, when the workspace was first registered; a reinstall reads it back.\n\n"
        f"{MARKER}\n```json\n{recorded.model_dump_json(indent=2)}\n```\n"
    )
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".md.tmp")
        tmp.write_text(text, encoding="utf-8")
        tmp.replace(path)
    except OSError as exc:
        raise ContextError(
            f"workspace {row.workspace_id} is registered with minute {choice.minute}, but "
            f"{path} could not be written ({exc.strerror}); make its directory writable and "
            "run 'outloop workspace update --context FILE' to write it"
        ) from exc


def read_recorded(path: Path, workspace_id: str) -> Recorded | None:
    """The schedule tenant-config.md records for this workspace; None when there is none.
    A record that cannot be read is an error naming the file (never silently replaced)."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise ContextError(f"cannot read {path}: {exc.strerror}") from exc
    found = re.search(re.escape(MARKER) + r"\s*```json\s*(.*?)```", text, re.DOTALL)
    if found is None:
        raise ContextError(f"{path} has no schedule record (the block after {MARKER!r})")
    try:
        recorded = Recorded.model_validate(json.loads(found.group(1)))
    except (ValueError, ValidationError) as exc:
        raise ContextError(f"{path}: the schedule record cannot be read ({exc})") from None
    if recorded.workspace_id != workspace_id:
        raise ContextError(
            f"{path} records the schedule of {recorded.workspace_id}, not {workspace_id}"
        )
    return recorded


# -- verification ------------------------------------------------------------------------


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    detail: str
    fix: str = ""


@dataclass
class Verification:
    workspace_id: str
    expression: str | None
    timezone: str | None
    minute: MinuteChoice | None = None
    """The minute and its derivation as tenant-config.md records it."""
    next_runs: list[datetime] = field(default_factory=list[datetime])
    checks: list[Check] = field(default_factory=list[Check])
    dispatchers: list[DispatcherRow] = field(default_factory=list[DispatcherRow])

    @property
    def ok(self) -> bool:
        return all(c.ok for c in self.checks)


@dataclass(frozen=True)
class Facts:
    """What verify reads: the registry row, its bindings, the live context, tenant-config.md."""

    row: WorkspaceRow
    context: WorkspaceContext | None
    context_error: str | None
    bindings: list[Binding]
    recorded: Recorded | None
    recorded_error: str | None


def check_binding(facts: Facts) -> Check:
    if facts.context is None:
        return Check(
            "binding",
            False,
            f"the registered context cannot be read: {facts.context_error}",
            "outloop workspace update --context FILE",
        )
    if not facts.context.mailboxes:
        return Check(
            "binding",
            False,
            "the context binds no mailbox",
            "add the workspace's mailbox to its context and run 'outloop workspace "
            "update --context FILE'",
        )
    bound = {(b.provider, b.mailbox_id) for b in facts.bindings}
    missing = [
        f"{m.provider}:{m.mailbox_id}"
        for m in facts.context.mailboxes
        if (m.provider, m.mailbox_id) not in bound
    ]
    if missing:
        return Check(
            "binding",
            False,
            f"the registry has no binding of {', '.join(missing)} to this workspace",
            "outloop workspace update --context FILE (writes the bindings again)",
        )
    shown = ", ".join(f"{b.provider}:{b.mailbox_id}" for b in facts.bindings)
    return Check("binding", True, f"workspace {facts.row.workspace_id} binds {shown}")


def check_expression(facts: Facts) -> Check:
    stored = facts.row.schedule_expression
    fix = REPAIR
    if stored is None or facts.row.schedule_minute is None:
        return Check(
            "expression", False, "the registry records no schedule for this workspace", REPAIR
        )
    if not schedule.valid(stored):
        return Check(
            "expression", False, f"the stored expression {stored!r} is not valid cron", fix
        )
    expected = schedule.expression(facts.row.schedule_minute)
    if stored != expected:
        why = f"the stored expression {stored!r} is not the schedule {expected!r}"
        return Check("expression", False, f"{why} (only the minute is the workspace's)", fix)
    if facts.recorded is None:
        why = facts.recorded_error or "it is missing"
        return Check("expression", False, f"tenant-config.md cannot be read back: {why}", fix)
    if facts.recorded.expression != stored:
        return Check(
            "expression",
            False,
            f"tenant-config.md records {facts.recorded.expression!r} but the registry {stored!r}",
            fix,
        )
    return Check("expression", True, f"stored {stored!r} in the registry and tenant-config.md")


def check_minute(facts: Facts) -> Check:
    row, recorded = facts.row, facts.recorded
    fix = REPAIR
    if row.schedule_minute is None or recorded is None:
        return Check("minute", False, "no recorded minute to compare", fix)
    choice = recorded.choice
    derived = schedule.derive_minute(row.workspace_id)
    if choice.derived != derived:
        return Check(
            "minute",
            False,
            f"tenant-config.md records derived minute {choice.derived}"
            f", but the derivation gives {derived}",
            fix,
        )
    again = schedule.rerun(row.workspace_id, choice)
    if again.minute != choice.minute:
        return Check(
            "minute",
            False,
            f"tenant-config.md records minute {choice.minute}, but "
            f"the derivation re-run against its recorded collisions gives "
            f"{again.minute}",
            fix,
        )
    if row.schedule_minute != choice.minute:
        return Check(
            "minute",
            False,
            f"the registry holds minute {row.schedule_minute}, but the"
            f" recorded deterministic value is {choice.minute}",
            fix,
        )
    return Check("minute", True, f"minute {choice.minute}: {choice.described()}")


def check_saturday(expr: str, timezone: str, now: datetime) -> Check:
    reason = schedule.saturday_reason(expr)
    if reason is not None:
        return Check("no_saturday", False, f"{expr!r} can run on a Saturday: {reason}")
    runs = schedule.runs_between(expr, timezone, now, now + 2 * WEEK)
    saturdays = [r for r in runs if r.weekday() == 5]
    if saturdays:
        return Check(
            "no_saturday",
            False,
            f"{len(saturdays)} run(s) fall on a Saturday, the "
            f"first {saturdays[0]:%Y-%m-%d %H:%M %Z}",
        )
    return Check(
        "no_saturday",
        True,
        "cron's day numbering (0 and 7 Sunday, 6 Saturday) "
        f"excludes Saturday; none of the next {len(runs)} runs falls on one",
    )


def check_next_runs(expr: str, minute: int, timezone: str, now: datetime) -> Check:
    """Seven runs on each active day of the coming week, at the schedule's hours and minute in
    local time, none on Saturday (computed across any DST change)."""
    runs = schedule.runs_between(expr, timezone, now, now + WEEK)
    wrong = [r for r in runs if (r.hour, r.minute) not in {(h, minute) for h in schedule.HOURS}]
    per_day: dict[str, int] = {}
    tz = ZoneInfo(timezone)
    day = now.astimezone(tz).date()
    for offset in range(1, 7):
        when = day + timedelta(days=offset)
        per_day[f"{when:%a %Y-%m-%d}"] = sum(1 for r in runs if r.date() == when)
    off = {d: n for d, n in per_day.items() if n != (0 if d.startswith("Sat") else 7)}
    if wrong or off:
        detail = "; ".join(
            [f"{r:%a %H:%M}" for r in wrong[:3]] + [f"{d}: {n}" for d, n in off.items()]
        )
        return Check(
            "next_runs",
            False,
            f"the next week's runs in {timezone} are not seven per "
            f"active day at the schedule's hours: {detail}",
        )
    first = f"{runs[0]:%a %Y-%m-%d %H:%M %Z}" if runs else "-"
    return Check(
        "next_runs",
        True,
        f"{len(runs)} runs in the next 7 days in {timezone}, seven per active day, first {first}",
    )


def live_dispatchers(
    store: Dispatch,
    context: WorkspaceContext | None,
    expr: str | None,
    now: datetime,
    workspace_id: str,
) -> list[DispatcherRow]:
    """The workspace's dispatchers that still run: a daemon reporting within the stale bound
    (and not proven dead), and the host timer - the newest one-shot - until its next run is
    missed."""
    rows = store.list_dispatchers(workspace_id)
    live = [
        r
        for r in rows
        if r.role in ("active", "standby")
        and holder_alive(r.holder)
        and r.seen_at + DISPATCHER_STALE >= now
    ]
    one_shots = sorted((r for r in rows if r.role == "one-shot"), key=lambda r: r.seen_at)
    if one_shots and expr is not None and context is not None:
        # The timer may still be starting a scheduled run: a grace of the stale bound.
        due = schedule.previous_run(expr, context.schedule_timezone, now - DISPATCHER_STALE)
        if one_shots[-1].seen_at + DISPATCHER_STALE >= due:
            live.append(one_shots[-1])
    return live


def check_dispatcher(live: list[DispatcherRow], here: Installation, workspace_id: str) -> Check:
    start = f"outloop dispatch --workspace {workspace_id}"
    running = [d for d in live if d.role in ("active", "one-shot")]
    if not running:
        standby = len(live)
        return Check(
            "dispatcher",
            False,
            "no dispatcher is active for this workspace"
            + (f" ({standby} standing by)" if standby else ""),
            f"start one: '{start}' (or run it from the host scheduler: "
            f"'outloop schedule show --workspace {workspace_id} --systemd')",
        )
    if len(running) > 1:
        shown = "; ".join(_who(d) for d in running)
        return Check(
            "dispatcher",
            False,
            f"{len(running)} dispatchers run this workspace: {shown}",
            "stop all but one (a host timer and a running 'outloop dispatch' are two dispatchers)",
        )
    [active] = running
    if (active.executable, active.install, active.version) != (
        here.executable,
        here.install,
        here.version,
    ):
        return Check(
            "dispatcher",
            False,
            f"the active dispatcher runs another installation: {_who(active)}; this one "
            f"is {here.install} ({here.executable}) version {here.version}",
            f"stop it and start '{start}' from this installation",
        )
    standby = [d for d in live if d.role == "standby"]
    extra = f"; {len(standby)} standing by" if standby else ""
    return Check("dispatcher", True, f"one active: {_who(active)}{extra}")


def _who(row: DispatcherRow) -> str:
    seen = f"{row.seen_at:%Y-%m-%d %H:%M:%S} UTC"
    return (
        f"{row.role} on {holder_where(row.holder)} from {row.install} ({row.executable}) "
        f"version {row.version} (last seen {seen})"
    )


def facts_of(store: Registry, tenant_config: Path, workspace_id: str) -> Facts | None:
    """What verify reads, or None when the workspace is not registered."""
    row = store.get_workspace(workspace_id)
    if row is None:
        return None
    context: WorkspaceContext | None = None
    context_error = None
    try:
        context = registered_context(row)
    except ContextError as exc:
        context_error = str(exc)
    bindings = [
        b
        for m in (context.mailboxes if context else ())
        for b in store.bindings_for_mailbox(m.provider, m.mailbox_id)
        if b.workspace_id == workspace_id
    ]
    recorded: Recorded | None = None
    recorded_error = None
    try:
        recorded = read_recorded(tenant_config, workspace_id)
    except ContextError as exc:
        recorded_error = str(exc)
    if recorded is None and recorded_error is None:
        recorded_error = f"{tenant_config} does not exist"
    return Facts(row, context, context_error, bindings, recorded, recorded_error)


def verify(
    store: Registry,
    dispatch: Dispatch,
    tenant_config: Path,
    workspace_id: str,
    here: Installation,
    now: datetime,
) -> Verification | None:
    """Every check of the workspace's schedule; None when the workspace is not registered."""
    facts = facts_of(store, tenant_config, workspace_id)
    if facts is None:
        return None
    expr = facts.row.schedule_expression
    timezone = facts.context.schedule_timezone if facts.context else None
    result = Verification(workspace_id, expr, timezone)
    result.minute = facts.recorded.choice if facts.recorded else choice_of(facts.row)
    result.checks += [check_binding(facts), check_expression(facts), check_minute(facts)]
    usable = expr is not None and schedule.valid(expr) and timezone is not None
    if usable:
        assert expr is not None and timezone is not None
        result.checks.append(check_saturday(expr, timezone, now))
        minute = facts.row.schedule_minute or 0
        result.checks.append(check_next_runs(expr, minute, timezone, now))
        result.next_runs = schedule.next_runs(expr, timezone, now, 7)
    else:
        why = "no valid stored expression" if timezone else "no readable context"
        result.checks.append(Check("no_saturday", False, f"cannot be computed: {why}", REPAIR))
        result.checks.append(Check("next_runs", False, f"cannot be computed: {why}", REPAIR))
    result.dispatchers = live_dispatchers(dispatch, facts.context, expr, now, workspace_id)
    result.checks.append(check_dispatcher(result.dispatchers, here, workspace_id))
    return result


def restore(store: Registry, tenant_config: Path, row: WorkspaceRow) -> WorkspaceRow:
    """Record the workspace's minute again (``workspace update``): the one tenant-config.md
    records when its derivation re-runs to it, else the registry's, else a new choice for a
    workspace registered before schedules were kept."""
    try:
        recorded = read_recorded(tenant_config, row.workspace_id)
    except ContextError:
        recorded = None
    candidates = [recorded.choice] if recorded is not None else []
    if (registered := choice_of(row)) is not None:
        candidates.append(registered)
    kept = [c for c in candidates if consistent(row.workspace_id, c)]
    if kept:
        choice = kept[0]
    else:
        held = {m: w for m, w in store.held_minutes().items() if w != row.workspace_id}
        choice = schedule.choose_minute(row.workspace_id, held)
    held_by = store.held_minutes().get(choice.minute, row.workspace_id)
    restored = with_schedule(row, choice, held_by != row.workspace_id)
    if (
        restored.schedule_minute,
        restored.schedule_expression,
        restored.schedule_derivation,
    ) != (row.schedule_minute, row.schedule_expression, row.schedule_derivation):
        store.set_schedule(restored)
    if recorded is None or recorded.choice != choice or recorded.expression != choice.expression:
        write_tenant_config(tenant_config, restored, choice)
    return restored
