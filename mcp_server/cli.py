"""The ``outloop`` command line. The only layer that prints."""

from __future__ import annotations

import json
import logging
import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn, TypeVar

import anyio
import click

from agent import crashpoints
from agent.domain.errors import OutloopError
from agent.domain.untrusted import flag
from agent.services import intake, workspaces
from agent.services.clock import SystemClock
from bench import claims, reconcile, render
from mcp_server import demo
from mcp_server.composition import (
    DATA_DIR_ENV,
    DATABASE_URL_SETTING,
    Station,
    default_data_dir,
    open_station,
    provider_for,
)

F = TypeVar("F", bound=Callable[..., Any])


def data_dir_option(func: F) -> F:
    return click.option(
        "--data-dir",
        type=click.Path(file_okay=False, path_type=Path),
        envvar=DATA_DIR_ENV,
        default=None,
        help=f"Outloop data directory (env {DATA_DIR_ENV}; default: the XDG data directory).",
    )(func)


def _root(data_dir: Path | None) -> Path:
    return data_dir if data_dir is not None else default_data_dir()


def _fail(exc: OutloopError) -> NoReturn:
    raise click.ClickException(str(exc)) from exc


def _open_station(root: Path) -> Station:
    """The station, or a clear error (a bad OUTLOOP_DATABASE_URL, an unreadable data dir)."""
    try:
        return open_station(root)
    except OutloopError as exc:
        _fail(exc)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="outloop")
def main() -> None:
    """Outloop: the email workstation for AI agents and operators."""
    # The PostgreSQL driver's pool logs every connection it discards after a fault as a
    # warning; the store retries those faults itself and reports what it could not survive.
    logging.getLogger("psycopg").setLevel(logging.ERROR)
    spec = os.environ.get("OUTLOOP_CRASHPOINT")
    if spec:  # test-only switch used by the crash tests
        crashpoints.arm_from_spec(spec)


# -- workspace ---------------------------------------------------------------------------


@main.group()
def workspace() -> None:
    """Register, update and show workspaces (resolved by immutable workspace id only)."""


@workspace.command("add")
@click.option(
    "--context",
    "context_file",
    required=True,
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="The Workspace Context YAML file (see docs/workspace-context.md).",
)
@data_dir_option
def workspace_add(context_file: Path, data_dir: Path | None) -> None:
    """Register one workspace from its context file. A duplicate id is refused."""
    station = _open_station(_root(data_dir))
    try:
        row = workspaces.add_workspace(
            station.store, station.data_dir, context_file, SystemClock().now()
        )
    except OutloopError as exc:
        _fail(exc)
    else:
        click.echo(f"registered workspace {row.workspace_id} ({row.label or 'no label'})")
    finally:
        station.close()


@workspace.command("update")
@click.option(
    "--context",
    "context_file",
    required=True,
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="The new Workspace Context file; its workspace_id picks the workspace.",
)
@data_dir_option
def workspace_update(context_file: Path, data_dir: Path | None) -> None:
    """Replace a registered workspace's context (re-read on every run)."""
    station = _open_station(_root(data_dir))
    try:
        row = workspaces.update_workspace(
            station.store, station.data_dir, context_file, SystemClock().now()
        )
    except OutloopError as exc:
        _fail(exc)
    else:
        click.echo(f"updated workspace {row.workspace_id}")
    finally:
        station.close()


@workspace.command("show")
@click.option(
    "--workspace",
    "workspace_id",
    default=None,
    help="Show this workspace's context and queue; default: list all.",
)
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@data_dir_option
def workspace_show(workspace_id: str | None, as_json: bool, data_dir: Path | None) -> None:
    """List registered workspaces, or show one with its queue."""
    station = _open_station(_root(data_dir))
    try:
        if workspace_id is None:
            rows = station.store.list_workspaces()
            if as_json:
                click.echo(json.dumps([r.model_dump(mode="json") for r in rows], indent=2))
            elif not rows:
                click.echo(
                    "no workspaces registered (add one with 'outloop workspace add --context FILE')"
                )
            for row in rows if not as_json else []:
                click.echo(f"{row.workspace_id}\t{row.label}\t{row.context_path}")
            return
        context = workspaces.load_context(station.store, workspace_id)
        queue = station.store.list_queue(workspace_id)
        proposals = station.store.list_proposals(workspace_id)
        if as_json:
            click.echo(
                json.dumps(
                    {
                        "context": context.model_dump(mode="json", by_alias=True),
                        "queue": [t.model_dump(mode="json") for t in queue],
                        "learning_proposals": [p.model_dump(mode="json") for p in proposals],
                    },
                    indent=2,
                    ensure_ascii=False,
                )
            )
            return
        click.echo(f"workspace {context.workspace_id} ({context.label})")
        click.echo(f"  timezone {context.timezone}, language {context.language}")
        for mailbox in context.mailboxes:
            click.echo(f"  mailbox {mailbox.mailbox_id} via {mailbox.provider}")
        click.echo(f"  queue: {len(queue)} open task(s), oldest first")
        for task in queue:
            # Titles and names are untrusted: control characters are written out, and the
            # task's flags are shown with them.
            title = flag(task.title).shown
            sender = f" from {task.sender_name}" if task.sender_name else ""
            click.echo(
                f"    {task.received_at:%Y-%m-%d %H:%M} {task.state:<26} {title}"
                f"{sender} <{task.sender_identity}>"
            )
            for warning in task.content_flags:
                click.echo(f"      ⚠ {warning}")
        queued = [p for p in proposals if p.state.value == "queued"]
        if queued:
            # An agent wrote these while reading client mail: shown, never applied.
            click.echo(
                f"  learning proposals: {len(queued)} queued (agent-written; apply one by "
                "editing the context file and running 'outloop workspace update')"
            )
            for proposal in queued:
                click.echo(
                    f"    {proposal.proposal_id} [{proposal.kind}] {flag(proposal.summary).shown}"
                )
    except OutloopError as exc:
        _fail(exc)
    finally:
        station.close()


# -- run ---------------------------------------------------------------------------------


def _print_progress(progress: intake.Progress) -> None:
    item = progress.outcome
    click.echo(f"[{progress.done}/{progress.total}] {item.item_ref}: {item.disposition}", err=True)


def _run_once(root: Path, workspace_id: str, quiet: bool) -> intake.RunResult:
    station = _open_station(root)
    try:
        return anyio.run(_cycle, station, workspace_id, quiet)
    finally:
        station.close()


async def _cycle(station: Any, workspace_id: str, quiet: bool) -> intake.RunResult:
    return await intake.run_cycle(
        store=station.store,
        data_dir=station.data_dir,
        workspace_id=workspace_id,
        provider_for=provider_for,
        clock=SystemClock(),
        on_progress=None if quiet else _print_progress,
    )


def _summary(result: intake.RunResult) -> dict[str, Any]:
    rec = result.reconciliation
    return {
        "run_id": result.run_id,
        "workspace_id": result.workspace_id,
        "items": [
            {
                "item_ref": i.item_ref,
                "disposition": i.disposition.value,
                "claim": i.claim.value if i.claim else None,
                "task_id": i.task_id,
                "task_created": i.task_created,
                "detail": i.detail,
            }
            for i in result.items
        ],
        "reconciliation": rec.model_dump(mode="json") if rec else None,
        "access_errors": result.access_errors,
        "item_errors": result.item_errors,
        "reminders": result.reminders,
    }


def _echo_reconciliation(result: intake.RunResult) -> None:
    rec = result.reconciliation
    assert rec is not None
    click.echo(
        f"run {rec.run_id}: scanned {rec.scanned} = terminal {rec.terminal} + non-terminal "
        f"{rec.non_terminal} + claim-race {rec.claim_race}"
        + (
            f" + RECONCILIATION_FAILED {rec.reconciliation_failed}"
            if rec.reconciliation_failed
            else ""
        )
        + (" (clean)" if rec.clean else " (NOT clean)")
    )


@main.command("run")
@click.option("--workspace", "workspace_id", required=True, help="The workspace id to run.")
@click.option("--once", is_flag=True, help="Run one dispatcher cycle and exit.")
@click.option(
    "--interval",
    type=click.FloatRange(min=1),
    default=300.0,
    show_default=True,
    help="Seconds between cycles when not --once.",
)
@click.option("--json", "as_json", is_flag=True, help="Print each run's result as JSON.")
@click.option("--quiet", is_flag=True, help="No per-item progress on stderr.")
@data_dir_option
def run_command(
    workspace_id: str,
    once: bool,
    interval: float,
    as_json: bool,
    quiet: bool,
    data_dir: Path | None,
) -> None:
    """Run the intake cycle: scan, normalize, resolve, claim, task, triage, report, reconcile.

    Exit status with --once: 0 clean, 3 the run did not reconcile clean, 4 a mailbox could
    not be read (named on stderr and in a health record; the other mailboxes still ran).
    """
    root = _root(data_dir)
    while True:
        try:
            result = _run_once(root, workspace_id, quiet)
        except OutloopError as exc:
            _fail(exc)
            return
        if as_json:
            click.echo(json.dumps(_summary(result), ensure_ascii=False))
        else:
            _echo_reconciliation(result)
        for error in result.access_errors:
            click.echo(f"mailbox not read: {error}", err=True)
        for error in result.item_errors:
            click.echo(f"item not handled (a later run retries it): {error}", err=True)
        if not quiet:
            for line in result.reminders:
                click.echo(f"reminder {line}", err=True)
        clean = result.reconciliation is not None and result.reconciliation.clean
        if once:
            sys.exit(4 if result.access_errors else 0 if clean else 3)
        time.sleep(interval)


# -- demo --------------------------------------------------------------------------------


@main.command("demo")
@data_dir_option
def demo_command(data_dir: Path | None) -> None:
    """Seed a Maildir with sample mail, run one cycle, show claims, tasks and reconciliation."""
    root = data_dir if data_dir is not None else Path(tempfile.mkdtemp(prefix="outloop-demo-"))
    click.echo(f"demo data directory: {root}")
    try:
        demo.run(root, click.echo)
    except OutloopError as exc:
        _fail(exc)


# -- bench -------------------------------------------------------------------------------


def database_url_option(func: F) -> F:
    return click.option(
        "--database-url",
        envvar=DATABASE_URL_SETTING,
        help="PostgreSQL to measure on (a fresh schema, dropped afterwards); default: "
        f"{DATABASE_URL_SETTING}, else a throwaway cluster on 127.0.0.1 started for the run.",
    )(func)


def bench_output_options(func: F) -> F:
    func = data_dir_option(func)
    return click.option(
        "--json", "as_json", is_flag=True, help="Print one JSON object as the last line."
    )(func)


def _bench_scratch(data_dir: Path | None) -> Path:
    """A fresh scratch directory for one run (under --data-dir when given): a reused one
    would already hold a previous run's baseline rows and bench workspace."""
    if data_dir is not None:
        data_dir.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix="outloop-bench-", dir=data_dir))
    click.echo(f"bench scratch directory: {scratch}", err=True)
    return scratch


@main.group()
def bench() -> None:
    """Benchmarks: each measures a baseline in the same run and prints the ratio to it."""


@bench.command("claims")
@click.option(
    "--backend",
    type=click.Choice(claims.BACKENDS),
    default="sqlite",
    show_default=True,
    help="Store backend to measure.",
)
@database_url_option
@click.option(
    "--workers",
    type=click.IntRange(min=1, max=64),
    default=4,
    show_default=True,
    help="Worker processes racing over the same occurrences.",
)
@click.option(
    "--items",
    type=click.IntRange(min=1),
    default=2000,
    show_default=True,
    help="Occurrences every worker claims.",
)
@click.option(
    "--mode",
    type=click.Choice(claims.MODES),
    default="claim",
    show_default=True,
    help="claim: the claim service alone; intake: the whole intake cycle per worker.",
)
@click.option(
    "--per-thread",
    type=click.IntRange(min=1),
    default=4,
    show_default=True,
    help="Messages per thread (one task per thread).",
)
@bench_output_options
def bench_claims(
    backend: str,
    database_url: str | None,
    workers: int,
    items: int,
    mode: str,
    per_thread: int,
    as_json: bool,
    data_dir: Path | None,
) -> None:
    """N worker processes each claim the same M occurrences in random order."""
    scratch = _bench_scratch(data_dir)
    result = claims.run(
        scratch,
        backend=backend,
        url=database_url if backend == "postgres" else None,
        workers=workers,
        items=items,
        per_thread=per_thread,
        mode=mode,
        progress=lambda line: click.echo(line, err=True),
    )
    if as_json:
        click.echo(json.dumps(result))
        return
    for key, value in result.items():
        click.echo(f"{key:>22}  {value}")


@bench.command("reconcile")
@click.option(
    "--backend",
    type=click.Choice([*reconcile.BACKENDS, "both"]),
    default="both",
    show_default=True,
    help="Store backend(s) to measure.",
)
@database_url_option
@click.option(
    "--items",
    type=click.IntRange(min=1),
    default=100_000,
    show_default=True,
    help="Scanned items in the run to reconcile.",
)
@bench_output_options
def bench_reconcile(
    backend: str, database_url: str | None, items: int, as_json: bool, data_dir: Path | None
) -> None:
    """Time the reconciliation of one run of N scanned items, 1% of them undecided."""
    scratch = _bench_scratch(data_dir)
    result = reconcile.run(
        scratch,
        backends=reconcile.BACKENDS if backend == "both" else (backend,),
        items=items,
        url=database_url,
        progress=lambda line: click.echo(line, err=True),
    )
    if as_json:
        click.echo(json.dumps(result))
        return
    for name, figures in result["backends"].items():
        click.echo(f"[{name}]")
        for key, value in figures.items():
            click.echo(f"{key:>24}  {value}")


@bench.command("render")
@click.option(
    "--seconds",
    type=click.FloatRange(min=0.1),
    default=3.0,
    show_default=True,
    help="How long to measure each side.",
)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object as the last line.")
def bench_render(seconds: float, as_json: bool) -> None:
    """Render plus read-back verification of a Hebrew reply, on one core, against the bare
    template render."""
    result = render.run(seconds)
    if as_json:
        click.echo(json.dumps(result))
        return
    for key, value in result.items():
        click.echo(f"{key:>16}  {value}")


@bench.command("mcp")
@click.option(
    "--calls",
    type=click.IntRange(min=10),
    default=300,
    show_default=True,
    help="Calls measured per tool and transport (after a warm-up of a tenth of them).",
)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object as the last line.")
def bench_mcp(calls: int, as_json: bool) -> None:
    """p50/p99 latency of gate_check and get_task through the MCP server, in process and over
    stdio, against the SDK's bare no-op tool on the same transport."""
    from bench import mcp as mcp_bench  # noqa: PLC0415 - imports the MCP SDK
    from mcp_server.runtime import Settings  # noqa: PLC0415
    from mcp_server.server import build_server  # noqa: PLC0415

    with tempfile.TemporaryDirectory(prefix="outloop-bench-mcp-") as scratch:
        click.echo("measuring in process, then over stdio ...", err=True)
        result = anyio.run(
            lambda: mcp_bench.run(
                lambda data: build_server(Settings(data_dir=data)),
                [sys.executable, "-m", "mcp_server.cli", "serve"],
                Path(scratch),
                calls=calls,
                warmup=max(5, calls // 10),
            )
        )
    if as_json:
        click.echo(json.dumps(result))
        return
    for transport in ("in_process", "stdio"):
        click.echo(f"[{transport}]")
        for tool, figures in result[transport].items():
            shown = "  ".join(f"{k}={v}" for k, v in figures.items())
            click.echo(f"  {tool:<12} {shown}")
    click.echo(
        f"worst p50 ratio to the no-op tool: {result['worst_p50_ratio']} "
        f"(target {result['target_p50_ratio']}): "
        + ("within target" if result["within_target"] else "OVER target")
    )


# -- serve ---------------------------------------------------------------------------------


@main.command("serve")
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
@click.option(
    "--port",
    type=click.IntRange(0, 65535),
    default=8765,
    show_default=True,
    help="HTTP port (0: a free port; the ready line names it).",
)
@click.option(
    "--insecure-no-auth",
    is_flag=True,
    help="Serve HTTP without a bearer token. Loopback only; for local tools such as the MCP "
    "conformance suite.",
)
@data_dir_option
def serve_command(
    transport: str, host: str, port: int, insecure_no_auth: bool, data_dir: Path | None
) -> None:
    """Run the Outloop MCP server for the workspaces registered in the data directory.

    Over HTTP the endpoint is /mcp and every request needs 'Authorization: Bearer <token>'
    with the token from OUTLOOP_MCP_TOKEN. A JSON line with the URL is printed on stdout
    once it accepts connections.
    """
    from mcp_server import http, stdio  # noqa: PLC0415 - the web server only when serving HTTP
    from mcp_server.runtime import Settings  # noqa: PLC0415
    from mcp_server.server import build_server  # noqa: PLC0415

    settings = Settings(data_dir=_root(data_dir))
    if transport == "stdio":
        if insecure_no_auth:
            raise click.UsageError("--insecure-no-auth applies to --transport http only")
        # stdout carries the protocol: nothing else may be printed there. Every line the
        # SDK cannot read is answered (see mcp_server/stdio.py).
        anyio.run(stdio.serve, build_server(settings))
        return
    token = os.environ.get(http.TOKEN_ENV) or None
    try:
        http.check_binding(host, token, insecure_no_auth)
        verifier = http.StaticTokenVerifier(token) if token else None
        sock = http.listening_socket(host, port)
    except OutloopError as exc:
        _fail(exc)
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

    http.serve(server.streamable_http_app(host=host), sock, ready)


# -- fixtures ------------------------------------------------------------------------------


@main.group()
def fixtures() -> None:
    """The local mock providers (Gmail API, Microsoft Graph, OAuth, the admin API)."""


@fixtures.command("serve")
@click.option(
    "--port",
    type=click.IntRange(0, 65535),
    default=0,
    show_default=True,
    help="Loopback port to serve on (0: a free port).",
)
@click.option(
    "--state-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Keep the mock tenant here across restarts (default: in memory only).",
)
def fixtures_serve(port: int, state_dir: Path | None) -> None:
    """Serve every mock surface on 127.0.0.1 until stopped. Prints one JSON line with the
    base URL once it accepts connections."""
    # Imported here: only this command needs the web server (and the CLI is the only part
    # of the product that runs the fixtures).
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


if __name__ == "__main__":  # pragma: no cover
    main()
