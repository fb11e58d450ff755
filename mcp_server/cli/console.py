"""``outloop console``: the operator console on loopback, and its sign-in credentials."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from urllib.parse import quote

import click

from agent.domain.errors import OutloopError
from agent.domain.secrets import Secret
from agent.services.clock import SystemClock
from managed_login import console as credentials
from mcp_server import composition
from mcp_server.cli.observe import log_options, metrics_option, serving_probes
from mcp_server.cli.shared import data_dir_option, fail, read_settings, station_for


@click.group("console", invoke_without_command=True)
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option("--port", default=8770, show_default=True, type=int, help="Port (0: any free).")
@click.option(
    "--tls-cert",
    type=click.Path(dir_okay=False, path_type=Path),
    help="TLS certificate (required off loopback).",
)
@click.option(
    "--tls-key",
    type=click.Path(dir_okay=False, path_type=Path),
    help="TLS private key (required off loopback).",
)
@metrics_option
@log_options
@data_dir_option
@click.pass_context
def console_group(
    ctx: click.Context,
    host: str,
    port: int,
    tls_cert: Path | None,
    tls_key: Path | None,
    metrics_port: int | None,
    data_dir: Path | None,
) -> None:
    """Run the operator console: sign in as a Workspace Context identity, see the queue,
    open a task and its draft as it will be sent, approve or request changes (judged by
    the core, as an emailed decision is). Loopback only unless TLS settings are given. A
    JSON line with the URL is printed once it accepts connections."""
    if ctx.invoked_subcommand is not None:
        return
    from mcp_server import http  # noqa: PLC0415 - the web server only when serving
    from mcp_server.console.app import LOOPBACK_HOSTS, Console, build_app  # noqa: PLC0415
    from mcp_server.console.mail import MailboxBodies  # noqa: PLC0415

    loopback = http.is_loopback(host)
    if not loopback and (tls_cert is None or tls_key is None):
        raise click.UsageError(
            f"the console serves {host} only over TLS: give --tls-cert and --tls-key (or "
            "listen on 127.0.0.1)"
        )
    settings = read_settings(data_dir)
    station = composition.open_station(settings)
    try:
        vault = composition.open_vault(settings)
        sock = http.listening_socket(host, port)
    except OutloopError as exc:
        station.close()
        fail(exc)
    providers = composition.Providers(settings, health=station.store)
    bodies = MailboxBodies(station.store, providers, providers.aclose)
    app = build_app(
        Console(
            station.store,
            station.data_dir.root,
            vault,
            SystemClock(),
            secure=not loopback,
            bodies=bodies,
        ),
        hosts=LOOPBACK_HOSTS if loopback else (host,),
    )
    scheme = "http" if loopback else "https"
    shown = f"[{host}]" if ":" in host else host
    url = f"{scheme}://{shown}:{sock.getsockname()[1]}/"

    def ready() -> None:
        click.echo(json.dumps({"url": url}))
        sys.stdout.flush()

    try:
        with serving_probes(settings, metrics_port, "operator console"):
            http.serve(app, sock, ready, tls=(tls_cert, tls_key) if not loopback else None)
    finally:
        station.close()


@console_group.command("invite")
@click.argument("address")
@click.option(
    "--url",
    default="http://127.0.0.1:8770/",
    show_default=True,
    help="The console's address, for the link.",
)
@data_dir_option
def invite_command(address: str, url: str, data_dir: Path | None) -> None:
    """Print a one-time sign-in link for ADDRESS (valid 30 minutes; a new one replaces an
    unused one). Only its digest is stored, in the vault."""
    settings = read_settings(data_dir)
    with station_for(data_dir) as station:
        vault = composition.open_vault(settings)
        token = credentials.invite(station.store, vault, address, SystemClock().now())
    link = f"{url.rstrip('/')}/signin/link?address={quote(address)}&token={token.reveal()}"
    click.echo(link)


@console_group.command("password")
@click.argument("address")
@click.option(
    "--stdin",
    "from_stdin",
    is_flag=True,
    help="Read the password from stdin instead of a hidden prompt.",
)
@data_dir_option
def password_command(address: str, from_stdin: bool, data_dir: Path | None) -> None:
    """Set ADDRESS's console password (at least 12 characters), from a hidden prompt typed
    twice or stdin. The vault keeps its scrypt digest only."""
    if from_stdin:
        value = sys.stdin.read().removesuffix("\n")
    else:
        value = click.prompt("Password", hide_input=True, confirmation_prompt=True, type=str)
    settings = read_settings(data_dir)
    with station_for(data_dir) as station:
        vault = composition.open_vault(settings)
        credentials.set_password(station.store, vault, address, Secret(value))
    click.echo(f"console password set for {address.strip().lower()}")
