"""``outloop serve``: the MCP server over stdio (a host starts it) or streamable HTTP (a host
connects, with a bearer token)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import anyio
import click

from agent.domain.errors import OutloopError
from mcp_server.cli.observe import log_options, metrics_option, serving_probes
from mcp_server.cli.shared import data_dir_option, fail, number_option, read_settings


@click.command("serve")
@click.option(
    "--transport",
    type=click.Choice(["stdio", "http"]),
    default="stdio",
    show_default=True,
    help="stdio for a host that starts the server; http (streamable HTTP) for one that connects.",
)
@click.option(
    "--host",
    default="127.0.0.1",
    show_default=True,
    help="HTTP address to bind. A non-loopback address requires a bearer token.",
)
@number_option(
    "--port", click.IntRange(0, 65535), 8765, "HTTP port (0: a free port; the ready line names it)."
)
@click.option(
    "--insecure-no-auth",
    is_flag=True,
    help="Serve HTTP without a bearer token. Loopback only; for local tools such as the MCP "
    "conformance suite.",
)
@metrics_option
@log_options
@data_dir_option
def serve_command(
    transport: str,
    host: str,
    port: int,
    insecure_no_auth: bool,
    metrics_port: int | None,
    data_dir: Path | None,
) -> None:
    """Run the Outloop MCP server for the workspaces registered in the data directory.

    Over HTTP the endpoint is /mcp and every request needs 'Authorization: Bearer <token>'
    with the token from OUTLOOP_MCP_TOKEN. A JSON line with the URL is printed on stdout
    once it accepts connections.
    """
    from mcp_server import http, stdio  # noqa: PLC0415 - the web server only when serving HTTP
    from mcp_server.server import build_server  # noqa: PLC0415

    settings = read_settings(data_dir)
    if transport == "stdio":
        if insecure_no_auth:
            raise click.UsageError("--insecure-no-auth applies to --transport http only")
        # stdout carries the protocol: nothing else may be printed there (log records go
        # to stderr). Every line the SDK cannot read is answered (see mcp_server/stdio.py).
        with serving_probes(settings, metrics_port, "mcp server (stdio)"):
            anyio.run(stdio.serve, build_server(settings))
        return
    token = settings.mcp_token
    try:
        http.check_binding(host, token, insecure_no_auth)
        verifier = http.StaticTokenVerifier(token) if token else None
        sock = http.listening_socket(host, port)
    except OutloopError as exc:
        fail(exc)
    bound = sock.getsockname()[1]
    server = build_server(
        settings,
        token_verifier=verifier,
        auth=http.auth_settings(host, bound) if verifier else None,
    )
    if insecure_no_auth:
        click.echo(
            "WARNING: serving the Outloop MCP server WITHOUT AUTHENTICATION on "
            f"{host}:{bound}. Any local process can drive the lifecycle. Use this for local "
            f"test tools only; set {http.TOKEN_ENV} for real use.",
            err=True,
        )
    shown = f"[{host}]" if ":" in host else host
    url = f"http://{shown}:{bound}/mcp"

    def ready() -> None:
        click.echo(json.dumps({"url": url, "auth": "none" if insecure_no_auth else "bearer"}))
        sys.stdout.flush()

    with serving_probes(settings, metrics_port, "mcp server (http)"):
        http.serve(server.streamable_http_app(host=host), sock, ready)
