"""``outloop login --workspace ID [--mailbox M] [--headed]``: managed login of a mailbox's
browser channel, now, with the worker's password and authenticator secret from the vault;
the outcome is printed (steps, never a value).

Headless by default: routine login and codes never need a person. A page managed login
may not answer (a push to approve, "More information required", a locked account) stops
it with AUTH_CHALLENGE_UNRESOLVED and what to do. ``--headed`` opens a visible browser
on this machine instead: managed login fills what it can, and a person completes the
challenge in the window; the session is then kept for the headless channel.
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import anyio
import click

from agent.domain.context import MailboxBinding
from agent.domain.errors import OutloopError, ProviderError, SignInFailed
from agent.domain.mail import Channel
from agent.ports import Health
from agent.services import challenges, workspaces
from agent.services.clock import SystemClock
from mcp_server import composition
from mcp_server.cli.shared import data_dir_option, fail, read_settings

PERSON_SECONDS = 300.0
SIGN_IN_FAILED = 5


@click.command("login")
@click.option("--workspace", "workspace_id", required=True, help="The workspace's id.")
@click.option(
    "--mailbox",
    "mailbox_id",
    default=None,
    help="The mailbox to sign in (default: every mailbox of the workspace that permits the "
    "browser channel).",
)
@click.option(
    "--headed",
    is_flag=True,
    help="Open a visible browser on this machine so a person can complete a challenge "
    "managed login stops at (the session is kept for the headless channel).",
)
@click.option(
    "--wait",
    type=click.FloatRange(min=10, max=3600),
    default=PERSON_SECONDS,
    show_default=True,
    help="With --headed: seconds a person has to complete the sign-in.",
)
@data_dir_option
def login_command(
    workspace_id: str, mailbox_id: str | None, headed: bool, wait: float, data_dir: Path | None
) -> None:
    """Sign a mailbox's browser channel in with managed login and report the outcome.

    Exit status: 0 signed in (or already signed in), 5 managed login could not sign in
    (the reason and what to do on stderr), 1 a configuration error."""
    settings = read_settings(data_dir)
    if headed:
        settings = dataclasses.replace(settings, browser_headless=False)
    station = composition.open_station(settings)
    try:
        bindings = _browser_bindings(station, workspace_id, mailbox_id)
        providers = station.provider_for
        assert isinstance(providers, composition.Providers)
        failed = anyio.run(
            _sign_in_all, providers, station.store, workspace_id, bindings, wait if headed else None
        )
    except OutloopError as exc:
        fail(exc)
    finally:
        station.close()
    sys.exit(SIGN_IN_FAILED if failed else 0)


def _browser_bindings(
    station: composition.Station, workspace_id: str, mailbox_id: str | None
) -> list[MailboxBinding]:
    context = workspaces.load_context(station.store, workspace_id)
    found = [b for b in context.mailboxes if Channel.BROWSER in b.permitted_channels]
    if mailbox_id is not None:
        wanted = mailbox_id.strip().lower()
        found = [b for b in context.mailboxes if b.mailbox_id == wanted]
        if not found:
            known = ", ".join(b.mailbox_id for b in context.mailboxes) or "none"
            raise ProviderError(
                f"workspace {workspace_id} has no mailbox {wanted} (its mailboxes: {known})"
            )
    if not found:
        raise ProviderError(
            f"no mailbox of workspace {workspace_id} permits the browser channel; add "
            "'browser' to a mailbox's channels in the context file and run "
            "'outloop workspace update'"
        )
    return found


async def _sign_in_all(
    providers: composition.Providers,
    health: Health,
    workspace_id: str,
    bindings: list[MailboxBinding],
    person_seconds: float | None,
) -> bool:
    """Each mailbox signed in, its outcome printed; True when any could not be."""
    failed = False
    try:
        for binding in bindings:
            channel = providers.browser(workspace_id, binding, person_seconds=person_seconds)
            try:
                report = await channel.login()
            except SignInFailed as exc:
                click.echo(f"{binding.mailbox_id}: not signed in: {exc}", err=True)
                failed = True
                continue
            finally:
                await channel.aclose()
            resolved = challenges.signed_in(
                health, workspace_id, binding.mailbox_id, Channel.BROWSER, SystemClock().now()
            )
            if resolved is not None:
                click.echo(f"{binding.mailbox_id}: the {resolved.challenge} challenge is resolved")
            if report.signed_in:
                steps = ", ".join(step.value for step in report.steps)
                click.echo(f"{binding.mailbox_id}: signed in as {report.account} ({steps})")
            else:
                click.echo(f"{binding.mailbox_id}: already signed in (its kept session)")
    finally:
        await providers.aclose()
    return failed
