"""``outloop bench claims|reconcile|render|mcp|send|mail|intake|browser``: the benchmarks of the
``bench`` package. Each measures its baseline in the same run and prints one JSON object
with --json."""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio
import click

from bench import choices
from mcp_server.cli.shared import F, choice_option, data_dir_option, number_option
from mcp_server.composition import BROWSER_EXECUTABLE_ENV, DATABASE_URL_SETTING, Settings

if TYPE_CHECKING:
    from bench.browser import Outlook, OutlookFactory, Worker


def database_url_option(func: F) -> F:
    return click.option(
        "--database-url",
        envvar=DATABASE_URL_SETTING,
        help="PostgreSQL to measure on (a fresh schema, dropped afterwards); default: "
        f"{DATABASE_URL_SETTING}, else a throwaway cluster on 127.0.0.1 started for the run.",
    )(func)


def json_option(func: F) -> F:
    return click.option(
        "--json", "as_json", is_flag=True, help="Print one JSON object as the last line."
    )(func)


def bench_output_options(func: F) -> F:
    return json_option(data_dir_option(func))


def echo_result(result: dict[str, Any], as_json: bool, width: int) -> None:
    """One JSON object (--json), else one figure per line."""
    if as_json:
        click.echo(json.dumps(result))
        return
    for key, value in result.items():
        click.echo(f"{key:>{width}}  {value}")


def _bench_scratch(data_dir: Path | None) -> Path:
    """A fresh scratch directory for one run (under --data-dir when given): a reused one
    would already hold a previous run's baseline rows and bench workspace."""
    if data_dir is not None:
        data_dir.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix="outloop-bench-", dir=data_dir))
    click.echo(f"bench scratch directory: {scratch}", err=True)
    return scratch


@click.group()
def bench() -> None:
    """Benchmarks: each measures a baseline in the same run and prints the ratio to it."""


@bench.command("claims")
@choice_option("--backend", choices.STORE_BACKENDS, "sqlite", "Store backend to measure.")
@database_url_option
@number_option(
    "--workers",
    click.IntRange(min=1, max=64),
    4,
    "Worker processes racing over the same occurrences.",
)
@number_option("--items", click.IntRange(min=1), 2000, "Occurrences every worker claims.")
@choice_option(
    "--mode",
    choices.CLAIM_MODES,
    "claim",
    "claim: the claim service alone; intake: the whole intake cycle per worker.",
)
@number_option(
    "--per-thread", click.IntRange(min=1), 4, "Messages per thread (one task per thread)."
)
@number_option(
    "--metrics-rounds",
    click.IntRange(min=0, max=10),
    0,
    "Also race this many times with metrics off and on (each worker counting its decision "
    "records, as a server with --metrics-port does), alternately: 'metrics' in the output "
    "holds both rates and their ratio.",
)
@bench_output_options
def bench_claims(
    backend: str,
    database_url: str | None,
    workers: int,
    items: int,
    mode: str,
    per_thread: int,
    metrics_rounds: int,
    as_json: bool,
    data_dir: Path | None,
) -> None:
    """N worker processes each claim the same M occurrences in random order."""
    from bench import claims  # noqa: PLC0415 - loaded by the command that runs it only

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
        metrics_rounds=metrics_rounds,
        counting="mcp_server.observability.metrics:count_decisions",
    )
    echo_result(result, as_json, 22)


@bench.command("reconcile")
@choice_option(
    "--backend", [*choices.STORE_BACKENDS, "both"], "both", "Store backend(s) to measure."
)
@database_url_option
@number_option("--items", click.IntRange(min=1), 100_000, "Scanned items in the run to reconcile.")
@bench_output_options
def bench_reconcile(
    backend: str, database_url: str | None, items: int, as_json: bool, data_dir: Path | None
) -> None:
    """Time the reconciliation of one run of N scanned items, 1% of them undecided."""
    from bench import reconcile  # noqa: PLC0415 - loaded by the command that runs it only

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
@number_option("--seconds", click.FloatRange(min=0.1), 3.0, "How long to measure each side.")
@json_option
def bench_render(seconds: float, as_json: bool) -> None:
    """Render plus read-back verification of a Hebrew reply, on one core, against the bare
    template render."""
    from bench import render  # noqa: PLC0415 - loaded by the command that runs it only

    echo_result(render.run(seconds), as_json, 16)


@bench.command("send")
@number_option(
    "--sends", click.IntRange(min=1), 2000, "Messages sent each way: ledgered, and bare."
)
@choice_option(
    "--mailbox",
    choices.SEND_MAILBOXES,
    "file",
    "The fake mailbox: file (each accepted send a committed SQLite transaction) or memory "
    "(a list append in this process).",
)
@bench_output_options
def bench_send(sends: int, mailbox: str, as_json: bool, data_dir: Path | None) -> None:
    """Ledgered exactly-once sends per second through the fake mailbox (SQLite store in a
    scratch directory), against bare sends (prepare + send) through the same channel in the
    same run."""
    from bench import send  # noqa: PLC0415 - loaded by the command that runs it only

    scratch = _bench_scratch(data_dir)
    result = send.run(
        scratch, sends=sends, mailbox=mailbox, progress=lambda line: click.echo(line, err=True)
    )
    echo_result(result, as_json, 24)


@bench.command("mail")
@number_option(
    "--processes", click.IntRange(min=1, max=64), 8, "Sending processes, all into one mailbox."
)
@number_option("--messages", click.IntRange(min=1), 1000, "Messages each process sends.")
@bench_output_options
def bench_mail(processes: int, messages: int, as_json: bool, data_dir: Path | None) -> None:
    """Internal messages sent and delivered per second by several processes into one
    mailbox, against bare atomic writes (temporary file, fsync, rename) of the same bytes by
    as many processes in the same run; every message is then read back (lost, duplicates)."""
    from bench import mail  # noqa: PLC0415 - loaded by the command that runs it only

    scratch = _bench_scratch(data_dir)
    try:
        result = mail.run(
            scratch,
            senders=processes,
            count=messages,
            progress=lambda line: click.echo(line, err=True),
        )
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    echo_result(result, as_json, 16)


@bench.command("intake")
@choice_option(
    "--provider",
    [*choices.IMAP_PROVIDERS, *choices.API_PROVIDERS],
    "imap",
    "The mail system read: imap (a throwaway Dovecot started for the run), or gmail or "
    "graph (the Gmail API or Microsoft Graph of throwaway mock providers started for the run).",
)
@number_option(
    "--messages", click.IntRange(min=1), 2000, "Messages in the mailbox (4 to a thread)."
)
@number_option(
    "--rounds",
    click.IntRange(min=1),
    choices.INTAKE_ROUNDS,
    "Times each side runs, alternating which goes first (intake into a fresh store each time).",
)
@bench_output_options
def bench_intake(
    provider: str, messages: int, rounds: int, as_json: bool, data_dir: Path | None
) -> None:
    """Messages per second from a mailbox to claimed, triaged tasks (the whole intake cycle
    through the provider's adapter into a scratch SQLite store), against a bare fetch of the
    same messages with the same client in the same run. --provider imap starts a private
    Dovecot, so it must run as root; gmail and graph start the mock providers."""
    # Loaded by the command that runs them only.
    from bench import intake_api, intake_imap  # noqa: PLC0415
    from fixtures.admin import MockServer  # noqa: PLC0415
    from fixtures.dovecot import Dovecot, DovecotError  # noqa: PLC0415

    scratch = _bench_scratch(data_dir)

    def progress(line: str) -> None:
        click.echo(line, err=True)

    try:
        if provider in intake_api.PROVIDERS:
            result = intake_api.run(
                scratch,
                MockServer,
                provider=provider,
                messages=messages,
                rounds=rounds,
                progress=progress,
            )
        else:
            result = intake_imap.run(
                scratch,
                Dovecot,
                provider=provider,
                messages=messages,
                rounds=rounds,
                progress=progress,
            )
    except (intake_imap.BenchError, DovecotError) as exc:
        raise click.ClickException(str(exc)) from exc
    echo_result(result, as_json, 26)


@bench.command("console")
@number_option("--tasks", click.IntRange(min=1), 5000, "Open tasks in the workspace's queue.")
@number_option("--rounds", click.IntRange(min=3), 30, "Renders measured of each.")
@bench_output_options
def bench_console(tasks: int, rounds: int, as_json: bool, data_dir: Path | None) -> None:
    """p50/p99 of the console's queue page for a workspace with TASKS open tasks (read from
    the store, filtered, rendered) against the bare template render of the same rows."""
    from bench import console as console_bench  # noqa: PLC0415
    from mcp_server.console.app import queue_html, row_of, templates  # noqa: PLC0415

    scratch = _bench_scratch(data_dir)
    click.echo(f"taking {tasks} messages in through intake ...", err=True)
    store = console_bench.fill_queue(scratch, tasks)
    try:
        env = templates()
        workspace = console_bench.WORKSPACE
        rows = [row_of(t) for t in store.list_queue_entries(workspace)]
        template = env.get_template("queue.j2")
        click.echo(f"rendering the queue {rounds} times each ...", err=True)
        result = console_bench.run(
            lambda: queue_html(env, store, workspace, session=None, token=""),
            lambda: template.render(
                session=None, token="", workspace_id=workspace, rows=rows, state="", gate=""
            ),
            tasks,
            rounds,
        )
    finally:
        store.close()
    echo_result(result, as_json, 12)


@bench.command("mcp")
@number_option(
    "--calls",
    click.IntRange(min=10),
    300,
    "Calls measured per tool and transport (after a warm-up of a tenth of them).",
)
@json_option
def bench_mcp(calls: int, as_json: bool) -> None:
    """p50/p99 latency of gate_check and get_task through the MCP server, in process and over
    stdio, against the SDK's bare no-op tool on the same transport."""
    from bench import mcp as mcp_bench  # noqa: PLC0415 - imports the MCP SDK
    from mcp_server.server import build_server  # noqa: PLC0415

    with tempfile.TemporaryDirectory(prefix="outloop-bench-mcp-") as scratch:
        click.echo("measuring in process, then over stdio ...", err=True)
        result = anyio.run(
            lambda: mcp_bench.run(
                # The bench's own scratch station, on the embedded store (as the stdio server
                # started with the SDK's default environment is).
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


@bench.command("browser")
@number_option(
    "--rounds",
    click.IntRange(min=1),
    10,
    "Replies each side sends and reads back (after one warm-up round each), alternating "
    "which goes first.",
)
@click.option(
    "--browser-executable",
    envvar=BROWSER_EXECUTABLE_ENV,
    help=f"The Chromium to drive (default: {BROWSER_EXECUTABLE_ENV}, else `chromium` on PATH).",
)
@bench_output_options
def bench_browser(
    rounds: int, browser_executable: str | None, as_json: bool, data_dir: Path | None
) -> None:
    """Median seconds of one reply and the read-back of its stored copy through the Outlook
    on the web adapter (a warm browser, signed in once, one adapter instance), against the
    same page actions scripted directly with Playwright in the same run and browser. Starts
    the mock providers (Outlook on the web) and a headless Chromium of its own."""
    # Loaded by the command that runs them only.
    from bench import browser  # noqa: PLC0415
    from fixtures.admin import MockServer  # noqa: PLC0415

    executable = browser_executable or shutil.which("chromium")
    if executable is None:
        raise click.ClickException(
            f"no Chromium: set {BROWSER_EXECUTABLE_ENV} to a Chromium executable, or install "
            "`chromium` on PATH (./scripts/setup does)"
        )
    scratch = _bench_scratch(data_dir)
    try:
        result = browser.run(
            scratch,
            MockServer,
            _outlook_web(executable),
            rounds=rounds,
            progress=lambda line: click.echo(line, err=True),
        )
    except browser.BenchError as exc:
        raise click.ClickException(str(exc)) from exc
    echo_result(result, as_json, 22)


def _outlook_web(executable: str) -> OutlookFactory:
    """Outlook on the web as the station builds it (``OutlookWeb`` on a ``MailboxBrowser``
    of this process's ``Browsers``, the worker's password and authenticator codes), with the
    page objects and a second context of the same browser for the bench's baseline."""
    # Loaded by the command that runs them only.
    from bench.browser import Outlook  # noqa: PLC0415
    from browser_adapters.outlook import OutlookWeb  # noqa: PLC0415
    from browser_adapters.outlook_pages import Composer, MailPage  # noqa: PLC0415
    from browser_adapters.session import Browsers, BrowserSettings, MailboxBrowser  # noqa: PLC0415
    from managed_login.flow import WorkerSignIn  # noqa: PLC0415
    from managed_login.totp import Codes  # noqa: PLC0415

    def build(app_url: str, worker: Worker, state_dir: Path) -> Outlook:
        browsers = Browsers(BrowserSettings(state_dir=state_dir, executable=executable))
        mailbox = MailboxBrowser(browsers, "ws-bench-browser", worker.address)
        baseline = MailboxBrowser(browsers, "ws-bench-browser", worker.address)

        def sign_in() -> WorkerSignIn:
            codes = Codes(worker.totp_secret, clock=worker.clock, sleep=worker.sleep)
            return WorkerSignIn(account=worker.address, password=worker.password, codes=codes)

        channel = OutlookWeb(
            mailbox, worker.address, app_url, sign_in, workspace_id="ws-bench-browser"
        )

        async def aclose() -> None:
            await baseline.aclose()
            await channel.aclose()
            await browsers.aclose()

        return Outlook(
            channel=channel,
            working_context=mailbox.context,
            baseline_context=baseline.context,
            mail_page=MailPage,
            composer=Composer,
            aclose=aclose,
        )

    return build
