"""``outloop connect --workspace ID --mailbox M``: prove a mailbox's OAuth client and refresh
token by signing in to the provider's API, and store them in the vault (values that do not
sign in never replace the ones stored).

The mailbox must be registered in the workspace's context with the provider ``google`` or
``microsoft`` and the ``api`` channel permitted; its ``api`` block names the vault entries
(``oauth_client_id``, ``oauth_client_secret``, ``oauth_refresh_token`` unless renamed). The
values are typed at hidden prompts or piped in with --stdin (three lines: client id, client
secret, refresh token); never arguments, never printed. docs/api-channels.md says where each
value comes from for a Google Cloud or Entra ID app registration, and for the local mock.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

import anyio
import click

from agent.domain.context import MailboxBinding
from agent.domain.errors import OutloopError, ProviderError
from agent.domain.mail import Channel
from agent.domain.secrets import CredentialRef, Secret
from agent.ports import MailProvider, Registry
from agent.services import workspaces
from mcp_server import composition
from mcp_server.cli.shared import data_dir_option, fail, station_for, worded

VALUES = ("client id", "client secret", "refresh token")
STEPS = """\
Connecting {mailbox} ({provider}) of workspace {workspace}.
You need, from the app registration this mailbox consented to (docs/api-channels.md):
  1. its OAuth client id,
  2. its client secret,
  3. a refresh token the mailbox's account granted it (offline access).
They are stored in the vault as {names}; nothing is echoed or printed."""


@click.command("connect")
@click.option("--workspace", "workspace_id", required=True, help="The workspace's id.")
@click.option("--mailbox", "mailbox_id", required=True, help="The mailbox's address.")
@click.option(
    "--stdin",
    "from_stdin",
    is_flag=True,
    help="Read the three values from standard input, one per line (client id, client "
    "secret, refresh token), instead of hidden prompts.",
)
@click.option(
    "--check/--no-check",
    default=True,
    show_default=True,
    help="Before storing, sign in to the provider's API with the values and read the "
    "mailbox's profile; values that do not sign in are not stored (a refresh token the "
    "provider rotates is what is stored).",
)
@data_dir_option
def connect_command(
    workspace_id: str,
    mailbox_id: str,
    from_stdin: bool,
    check: bool,
    data_dir: Path | None,
) -> None:
    """Check MAILBOX's OAuth client and refresh token for WORKSPACE, then store them.

    The mailbox must be in the workspace's registered context, with provider google or
    microsoft and the api channel permitted. Values come from hidden prompts (or --stdin)
    and are never printed. A mailbox whose refresh token was revoked is connected again
    the same way."""
    with station_for(data_dir) as station:
        try:
            binding = _api_binding(workspace_id, mailbox_id, station.store)
        except OutloopError as exc:
            fail(exc)
        names = (binding.api.client_id, binding.api.client_secret, binding.api.refresh_token)
        click.echo(
            STEPS.format(
                mailbox=binding.mailbox_id,
                provider=binding.provider,
                workspace=workspace_id,
                names=", ".join(names),
            ),
            err=True,
        )
        try:  # a vault that cannot be opened fails before anything is asked
            vault = composition.open_vault(composition.read_settings(data_dir=data_dir))
        except OutloopError as exc:
            fail(exc)
        values = dict(zip(names, _read_values(from_stdin), strict=True))
        if check:
            # Signed in with the new values held in memory first: values that do not sign in
            # never replace the ones the vault holds.
            _check(composition.api_adapter(binding.provider), binding, values, workspace_id)
        try:
            for name, value in values.items():
                vault.set_secret(_ref(workspace_id, binding, name), value)
        except OutloopError as exc:
            fail(exc)
        click.echo(f"stored {', '.join(names)} for {binding.mailbox_id}")


def _api_binding(workspace_id: str, mailbox_id: str, store: Registry) -> MailboxBinding:
    context = workspaces.load_context(store, workspace_id)
    wanted = mailbox_id.strip().lower()
    for binding in context.mailboxes:
        if binding.mailbox_id != wanted:
            continue
        if binding.provider not in composition.API_PROVIDERS:
            raise ProviderError(
                f"mailbox {wanted} is a {binding.provider!r} mailbox; OAuth connects only "
                f"google and microsoft mailboxes ({_other_way(binding)})"
            )
        if Channel.API not in binding.permitted_channels:
            raise ProviderError(
                f"mailbox {wanted} does not permit the api channel in workspace "
                f"{workspace_id}'s context; add 'api' to its channels first"
            )
        return binding
    known = ", ".join(b.mailbox_id for b in context.mailboxes) or "none"
    raise ProviderError(
        f"workspace {workspace_id} has no mailbox {wanted} (its mailboxes: {known}); add it "
        "to the context file and run 'outloop workspace update'"
    )


def _other_way(binding: MailboxBinding) -> str:
    if binding.server is not None:
        return (
            f"store its password with 'outloop vault set WORKSPACE {binding.mailbox_id} "
            f"{binding.server.password}'"
        )
    return "it needs no OAuth secrets"


def _ref(workspace_id: str, binding: MailboxBinding, name: str) -> CredentialRef:
    return CredentialRef(workspace_id=workspace_id, mailbox_id=binding.mailbox_id, name=name)


def _read_values(from_stdin: bool) -> tuple[Secret, ...]:
    if from_stdin:
        lines = [line.strip() for line in sys.stdin.read().splitlines() if line.strip()]
        if len(lines) != len(VALUES):
            raise click.UsageError(
                f"--stdin reads {len(VALUES)} lines ({', '.join(VALUES)}); got {len(lines)}: "
                "nothing stored"
            )
        return tuple(Secret(line) for line in lines)
    return tuple(_prompt(what) for what in VALUES)


def _prompt(what: str) -> Secret:
    value = click.prompt(f"OAuth {what}", hide_input=True, type=str, err=True).strip()
    if not value:
        raise click.UsageError(f"the {what} is empty: nothing stored")
    return Secret(value)


def _check(
    adapter: Callable[..., MailProvider],
    binding: MailboxBinding,
    values: dict[str, Secret],
    workspace_id: str,
) -> None:
    """Sign in with ``values`` (a refresh token the provider rotates replaces its entry) and
    read the mailbox's profile; exit 1 saying what was refused, nothing stored."""
    channel = adapter(
        binding,
        read=values.__getitem__,
        write=values.__setitem__,
        reconnect=composition.connect_command(workspace_id, binding.mailbox_id),
    )

    async def health() -> str:
        try:
            result = await channel.health()
        finally:
            await channel.aclose()
        if not result.ok:
            raise ProviderError(result.detail)
        return result.detail

    try:
        detail = anyio.run(health)
    except OutloopError as exc:
        click.echo(
            f"error: the values did not sign in, and nothing was stored: {worded(exc)}", err=True
        )
        sys.exit(1)
    click.echo(f"connected: {detail}")
