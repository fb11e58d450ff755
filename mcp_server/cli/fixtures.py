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
    """Serve every mock surface on 127.0.0.1 until stopped. Prints one JSON line with the
    base URL once it accepts connections."""
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
