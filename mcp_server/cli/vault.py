"""``outloop vault set|list|delete``: the secrets managed login signs in with, by reference.

A value enters only from a hidden prompt (typed twice) or, with --stdin, from standard
input: never from an argument, where it would stay in the shell's history and the process
list. No command prints a value; ``list`` prints references only.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click
from pydantic import ValidationError

from agent.domain.errors import OutloopError
from agent.domain.secrets import CredentialRef, Secret
from agent.ports import Vault
from mcp_server import composition
from mcp_server.cli.shared import data_dir_option, fail, read_settings

NOT_AN_ARGUMENT = (
    "a secret's value is never given on the command line (it would stay in the shell's "
    "history and the process list): leave it out and type it at the hidden prompt, or pipe "
    "it in with --stdin"
)
SET_HINT = "store one with 'outloop vault set WORKSPACE MAILBOX NAME'"


@click.group()
def vault() -> None:
    """Store, list and delete the secrets of mailboxes (values are never shown)."""


def ref_arguments(func: Callable[..., Any]) -> Callable[..., Any]:
    """WORKSPACE MAILBOX NAME: which secret."""
    for name, metavar in (
        ("name", "NAME"),
        ("mailbox_id", "MAILBOX"),
        ("workspace_id", "WORKSPACE"),
    ):
        func = click.argument(name, metavar=metavar)(func)
    return func


@vault.command("set", context_settings={"ignore_unknown_options": True, "allow_extra_args": True})
@ref_arguments
@click.option(
    "--stdin",
    "from_stdin",
    is_flag=True,
    help="Read the value from standard input (its final line break is dropped) instead of "
    "a hidden prompt.",
)
@data_dir_option
@click.pass_context
def vault_set(
    ctx: click.Context,
    workspace_id: str,
    mailbox_id: str,
    name: str,
    from_stdin: bool,
    data_dir: Path | None,
) -> None:
    """Store the secret NAME (password, totp, ...) of MAILBOX in WORKSPACE, replacing any
    value it had.

    The value is typed at a hidden prompt, twice, or piped in with --stdin; it is never
    an argument and never printed. The vault is the encrypted file unless
    OUTLOOP_VAULT_BACKEND=plain; its key comes from OUTLOOP_VAULT_KEY_FILE (or
    OUTLOOP_VAULT_KEY). See docs/vault.md."""
    if ctx.args:
        raise click.UsageError(NOT_AN_ARGUMENT)  # never echoes what was given
    ref = _ref(workspace_id, mailbox_id, name)
    store = _open(data_dir)  # a missing key fails before the value is asked for
    value = _read_value(ref, from_stdin)
    try:
        replaced = store.has_secret(ref)
        store.set_secret(ref, value)
    except OutloopError as exc:
        fail(exc)
    click.echo(f"{'replaced' if replaced else 'stored'} {ref}")


@vault.command("list")
@click.option("--workspace", "workspace_id", default=None, help="Only this workspace's secrets.")
@data_dir_option
def vault_list(workspace_id: str | None, data_dir: Path | None) -> None:
    """List the stored secrets by reference (workspace, mailbox, name): never a value."""
    try:
        refs = _open(data_dir).list_refs(workspace_id)
    except OutloopError as exc:
        fail(exc)
    if not refs:
        scope = f" for workspace {workspace_id}" if workspace_id else ""
        click.echo(f"no secrets stored{scope} ({SET_HINT})")
    for ref in refs:
        click.echo(f"{ref.workspace_id}\t{ref.mailbox_id}\t{ref.name}")


@vault.command("delete")
@ref_arguments
@data_dir_option
def vault_delete(workspace_id: str, mailbox_id: str, name: str, data_dir: Path | None) -> None:
    """Delete the secret NAME of MAILBOX in WORKSPACE; says whether there was one."""
    ref = _ref(workspace_id, mailbox_id, name)
    try:
        deleted = _open(data_dir).delete_secret(ref)
    except OutloopError as exc:
        fail(exc)
    click.echo(f"deleted {ref}" if deleted else f"no secret {ref} was stored; nothing deleted")


def _ref(workspace_id: str, mailbox_id: str, name: str) -> CredentialRef:
    try:
        return CredentialRef(workspace_id=workspace_id, mailbox_id=mailbox_id, name=name)
    except ValidationError:
        raise click.UsageError(
            f"{workspace_id} {mailbox_id} {name} does not name a secret: a workspace id and "
            "a name are 1-64 letters, digits, '_', '.' or '-' (starting with a letter or "
            "digit), a mailbox id has no spaces or slashes"
        ) from None


def _open(data_dir: Path | None) -> Vault:
    """The vault this command's settings select, or one line on stderr saying what to set."""
    try:
        return composition.open_vault(read_settings(data_dir))
    except OutloopError as exc:
        fail(exc)


def _read_value(ref: CredentialRef, from_stdin: bool) -> Secret:
    """The value, from standard input or a hidden prompt typed twice; never echoed."""
    if from_stdin:
        text = sys.stdin.read()
        value = text.removesuffix("\n").removesuffix("\r")
    else:
        value = click.prompt(f"Value of {ref}", hide_input=True, confirmation_prompt=True, type=str)
    if not value:
        raise click.UsageError(f"the value is empty: nothing stored for {ref}")
    return Secret(value)
