"""``outloop bench claims|reconcile|render|mcp``: the benchmarks of the ``bench`` package.
Each measures its baseline in the same run and prints one JSON object with --json."""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

import anyio
import click

from bench import claims, reconcile, render
from mcp_server.cli.shared import F, data_dir_option
from mcp_server.composition import DATABASE_URL_SETTING, Settings


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


@click.group()
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
