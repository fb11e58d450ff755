"""``outloop dispatch``: the long-running dispatcher of one workspace (or one cycle of it, as a
host timer runs it with ``--once``)."""

from __future__ import annotations

import signal
import sys
from collections.abc import Awaitable, Callable
from datetime import timedelta
from pathlib import Path

import anyio
import click

from agent.domain.errors import OutloopError
from agent.services import dispatch
from agent.services.clock import SystemClock
from agent.services.dispatch import CycleOutcome, Dispatcher, Plan, Role
from agent.services.workspaces import load_context
from mcp_server.cli.observe import log_options, metrics_option, serving_probes
from mcp_server.cli.shared import data_dir_option, fail, open_station, read_settings, run_cycle
from mcp_server.composition import Station, installation

EXIT_HELD = 7


def _plan(station: Station, workspace_id: str) -> Callable[[], Plan]:
    def plan() -> Plan:
        row = station.store.get_workspace(workspace_id)
        context = load_context(station.store, workspace_id)
        if row is None or row.schedule_expression is None:
            raise OutloopError(
                f"workspace {workspace_id} has no recorded schedule; run 'outloop workspace "
                "update --context FILE' to record its minute"
            )
        shared = tuple(f"{m.provider}:{m.mailbox_id}" for m in context.mailboxes if m.shared)
        return Plan(row.schedule_expression, context.schedule_timezone, shared)

    return plan


def _cycle(
    station: Station, workspace_id: str, quiet: bool
) -> Callable[[], Awaitable[CycleOutcome]]:
    async def cycle() -> CycleOutcome:
        result = await run_cycle(station, workspace_id, None)
        for error in result.access_errors:
            click.echo(f"mailbox not read: {error}", err=True)
        rec = result.reconciliation
        if result.access_errors:
            outcome = "mailbox not read"
        elif rec is not None and rec.clean:
            outcome = "clean"
        else:
            outcome = "not clean"
        if not quiet and rec is not None:
            click.echo(
                f"run {rec.run_id}: scanned {rec.scanned} = terminal {rec.terminal} + "
                f"non-terminal {rec.non_terminal} + claim-race {rec.claim_race}",
                err=True,
            )
        return CycleOutcome(result.run_id, outcome)

    return cycle


def _say(line: str) -> None:
    click.echo(f"[dispatch] {line}", err=True)


@click.command("dispatch")
@click.option("--workspace", "workspace_id", required=True, help="The workspace id.")
@click.option(
    "--no-wait",
    is_flag=True,
    help="Exit at once (status 7) when another dispatcher holds the lease, instead of "
    "standing by to take over.",
)
@click.option(
    "--once",
    is_flag=True,
    help="Run one cycle now and exit, as a host timer runs it (status 7 when a dispatcher "
    "holds the lease: that one runs the schedule).",
)
@click.option("--run-now", is_flag=True, help="Run one cycle as soon as this one is active.")
@click.option(
    "--poll",
    type=click.FloatRange(min=0.05, max=60),
    default=10.0,
    show_default=True,
    help="Seconds between lease renewals and checks of what is due.",
)
@click.option(
    "--lease-seconds",
    type=click.FloatRange(min=1, max=3600),
    default=60.0,
    show_default=True,
    help="How long the lease holds without renewal: a standby on another machine takes "
    "over this long after the holder stopped (at once on the same machine).",
)
@click.option("--quiet", is_flag=True, help="No per-run summary on stderr.")
@metrics_option
@log_options
@data_dir_option
def dispatch_command(
    workspace_id: str,
    no_wait: bool,
    once: bool,
    run_now: bool,
    poll: float,
    lease_seconds: float,
    quiet: bool,
    metrics_port: int | None,
    data_dir: Path | None,
) -> None:
    """Run the workspace's cycles on its schedule: intake, claims, triage, acknowledgements
    and reminders due, reconciliation, and the health record. Exactly one dispatcher per
    workspace is active (a lease in the store; PostgreSQL when machines share it); another
    stands by and takes over when the holder's lease lapses. Stops on SIGTERM or Ctrl-C,
    giving the lease up; SIGUSR1 asks for one cycle now."""
    if lease_seconds <= poll:
        raise click.BadParameter("must be longer than --poll", param_hint="--lease-seconds")
    settings = read_settings(data_dir)
    station = open_station(settings)
    dispatcher = Dispatcher(
        store=station.store,
        workspace_id=workspace_id,
        here=installation(station.data_dir.pack),
        clock=SystemClock(),
        plan=_plan(station, workspace_id),
        cycle=_cycle(station, workspace_id, quiet),
        sleep=anyio.sleep,
        say=_say,
        lease_ttl=timedelta(seconds=lease_seconds),
        poll=poll,
    )
    try:
        dispatcher.plan()  # the workspace and its schedule, or one line saying what to run
        with serving_probes(
            settings,
            metrics_port,
            f"dispatcher of {workspace_id}",
            role=lambda: readiness(dispatcher),
            roles=lambda: {workspace_id: (dispatcher.role or "starting")},
        ):
            ran = anyio.run(_main, dispatcher, once, no_wait, run_now)
        if not ran:
            held_by = dispatcher.holder_of(dispatch.lease_name(workspace_id))
            _say(f"not run: the lease is held by {held_by}")
    except OutloopError as exc:
        fail(exc)
    finally:
        station.close()
    if not ran:
        sys.exit(EXIT_HELD)


def readiness(dispatcher: Dispatcher) -> tuple[bool, str]:
    """Ready while it holds the workspace's lease or stands by for it (standing by is its
    work, not an error); not before its first turn or after it stopped."""
    role = dispatcher.role
    if role is None:
        return False, "starting: the lease not yet asked for"
    said = f"{role.value}: {dispatcher.detail}" if dispatcher.detail else role.value
    return role is not Role.STOPPED, said


async def _main(dispatcher: Dispatcher, once: bool, no_wait: bool, run_now: bool) -> bool:
    if once:
        return await dispatcher.once()
    # The handlers are in place before the dispatcher reports itself: a SIGUSR1 sent once it
    # shows as active never meets the default action (which would end the process).
    wanted = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1)
    try:
        return await _dispatch(dispatcher, no_wait, run_now, wanted)
    except BaseExceptionGroup as group:  # the task group's: the core's error, as one line
        errors = group.subgroup(OutloopError)
        if errors is None:
            raise
        first = errors.exceptions[0]
        while isinstance(first, BaseExceptionGroup):
            first = first.exceptions[0]
        raise first from None


async def _dispatch(
    dispatcher: Dispatcher, no_wait: bool, run_now: bool, wanted: tuple[signal.Signals, ...]
) -> bool:
    """The dispatcher, with its signals: SIGTERM and SIGINT stop it, SIGUSR1 asks for a
    cycle now."""
    with anyio.open_signal_receiver(*wanted) as signals:
        async with anyio.create_task_group() as group:

            async def on_signals() -> None:
                async for received in signals:
                    if received == signal.SIGUSR1:
                        dispatcher.requested = True  # a cycle now, once this one is active
                        continue
                    group.cancel_scope.cancel()
                    return

            group.start_soon(on_signals)
            ran = await dispatcher.run(no_wait=no_wait, run_now=run_now)
            group.cancel_scope.cancel()
            return ran
    return True
