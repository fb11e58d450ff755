"""The ``outloop`` command line: a front end above the MCP server, and the only layer that
prints. One module per command group; each command reads its settings once through the
composition root (``mcp_server.composition``) and builds what it runs from them."""

from __future__ import annotations

import logging
import os

import click

from mcp_server.cli.bench import bench
from mcp_server.cli.connect import connect_command
from mcp_server.cli.console import console_group
from mcp_server.cli.demo import demo_command
from mcp_server.cli.dispatch import dispatch_command
from mcp_server.cli.fixtures import fixtures
from mcp_server.cli.health import health_command
from mcp_server.cli.login import login_command
from mcp_server.cli.mail import mail_group
from mcp_server.cli.pack import pack_group
from mcp_server.cli.run import run_command
from mcp_server.cli.schedule import schedule_group
from mcp_server.cli.sends import sends
from mcp_server.cli.serve import serve_command
from mcp_server.cli.vault import vault
from mcp_server.cli.workspace import workspace
from mcp_server.observability import logs

__all__ = ["main"]


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="outloop")
def main() -> None:
    """Outloop: the email workstation for AI agents and operators."""
    # The PostgreSQL driver's pool logs every connection it discards after a fault as a
    # warning; the store retries those faults itself and reports what it could not survive.
    logging.getLogger("psycopg").setLevel(logging.ERROR)
    # Every command's records go to stderr from WARNING up (the servers' own options show
    # more); OUTLOOP_LOG_FORMAT chooses text or JSON lines.
    form = os.environ.get(logs.FORMAT_ENV, "")
    logs.configure(form if form in logs.FORMATS else "text", "warning")


for command in (
    workspace,
    vault,
    connect_command,
    login_command,
    run_command,
    schedule_group,
    dispatch_command,
    health_command,
    sends,
    mail_group,
    console_group,
    pack_group,
    demo_command,
    bench,
    serve_command,
    fixtures,
):
    main.add_command(command)
