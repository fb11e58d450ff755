"""``outloop fixtures serve``: the local mock providers. The CLI is the only part of the
product that runs them (they import nothing of it)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from mcp_server.cli.shared import number_option


@click.group()
def fixtures() -> None:
    """The local mock providers (Gmail API, Microsoft Graph, OAuth, the admin API)."""


@fixtures.command("serve")
@number_option("--port", click.IntRange(0, 65535), 0, "Loopback port to serve on (0: a free port).")
@click.option(
    "--state-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Keep the mock tenant here across restarts (default: in memory only).",
)
def fixtures_serve(port: int, state_dir: Path | None) -> None:
    """Serve every mock surface on 127.0.0.1 until stopped: the Gmail API, Graph, their
    OAuth token endpoints, the mock mail MCP servers, Outlook on the web
    ({base}/web/outlook/mail/) and Gmail ({base}/web/gmail/mail/) with their sign-in pages,
    and the admin API (docs/fixtures.md). Prints one JSON line with the base URL once it
    accepts connections."""
    # Imported here: only this command needs the web server.
    from fixtures import serve  # noqa: PLC0415

    try:
        sock = serve.listening_socket("127.0.0.1", port)
    except OSError as exc:
        click.echo(f"cannot listen on 127.0.0.1:{port}: {exc}", err=True)
        sys.exit(2)
    bound = sock.getsockname()[1]
    click.echo(json.dumps({"base_url": f"http://127.0.0.1:{bound}"}))
    sys.stdout.flush()
    serve.run(sock, state_dir)


@fixtures.command("mail-mcp")
@click.option(
    "--dialect",
    type=click.Choice(["ms365", "gmail"]),
    required=True,
    help="ms365: Softeria's ms-365-mcp-server (token in MS365_MCP_OAUTH_TOKEN); "
    "gmail: GongRzhe's Gmail-MCP-Server (token in GMAIL_MCP_ACCESS_TOKEN).",
)
@click.option(
    "--api-base",
    required=True,
    help="Base URL of running mock providers (`outloop fixtures serve`), "
    "e.g. http://127.0.0.1:8765.",
)
def fixtures_mail_mcp(dialect: str, api_base: str) -> None:
    """A mock third-party mail MCP server on stdio (docs/fixtures.md).

    It plays the tools and result texts of a popular mail MCP server and calls the mock
    Gmail API or Graph at --api-base with the access token of a mock account, read from the
    environment as the real server reads it. Stdout carries only the protocol. The same
    servers are also served over HTTP by `outloop fixtures serve` at
    {base}/mcp/ms365/mcp and {base}/mcp/gmail/mcp.
    """
    # Imported here: only this command needs the MCP server.
    from fixtures import mail_mcp  # noqa: PLC0415

    mail_mcp.run_stdio(dialect, api_base)
