"""``outloop pack build|verify|install|status``: the public pack every workspace installs."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, NoReturn

import click

import agent
from agent.domain.errors import OutloopError, PackError
from agent.services import pack, schedule
from agent.services.clock import SystemClock
from mcp_server import composition
from mcp_server.cli.shared import data_dir_option, fail, read_settings, station_for

EXIT_PROBLEMS = 1
SOURCE = Path("pack") / "source"
MAP = Path("pack") / "rename-map.txt"


@click.group("pack")
def pack_group() -> None:
    """Build the public pack from the internal source, verify it, install it."""


def _repository() -> Path:
    return Path(agent.__file__).resolve().parent.parent


def _inputs(source: Path | None, rename_map: Path | None) -> tuple[Path, Path]:
    """The source tree and map given, else the ones this repository ships."""
    source = source or _repository() / SOURCE
    rename_map = rename_map or _repository() / MAP
    for path, flag in ((source, "--source"), (rename_map, "--map")):
        if not path.exists():
            raise click.ClickException(
                f"{path} does not exist: the internal source ships with the repository, "
                f"not with the installed package; give {flag}"
            )
    return source, rename_map


def _say(line: str) -> None:
    click.echo(line, err=True)


def _problems(exc: PackError) -> NoReturn:
    for problem in exc.problems:
        click.echo(str(problem), err=True)
    raise SystemExit(EXIT_PROBLEMS)


def _source_options(func: Any) -> Any:
    func = click.option(
        "--map",
        "rename_map",
        type=click.Path(dir_okay=False, path_type=Path),
        help="The rename map (default: this repository's pack/rename-map.txt).",
    )(func)
    return click.option(
        "--source",
        type=click.Path(file_okay=False, path_type=Path),
        help="The internal source tree (default: this repository's pack/source).",
    )(func)


@pack_group.command("build")
@click.option(
    "--out",
    "out_dir",
    required=True,
    type=click.Path(file_okay=False, path_type=Path),
    help="The directory to write the pack into (new or empty).",
)
@_source_options
@click.option("--json", "as_json", is_flag=True, help="Print the pack's manifest as JSON.")
def build_command(
    out_dir: Path, source: Path | None, rename_map: Path | None, as_json: bool
) -> None:
    """Derive the public pack: apply only the map's exact renames, prove every file comes
    back through the inverse map, resolve the dependencies and the installation order, run
    the leak gate, and write reproducible archives with their SHA-256 checksums. Exit 1
    with each problem as FILE:LINE: WHY."""
    source, rename_map = _inputs(source, rename_map)
    try:
        commit = pack.source_commit(source, rename_map)
        derived = pack.derive(source, rename_map, composition.wheel_pin(), commit, _say)
        pack.write_pack(derived, out_dir)
    except PackError as exc:
        _problems(exc)
    manifest = derived.manifest
    if as_json:
        click.echo(json.dumps(_summary(manifest, out_dir), indent=2))
        return
    click.echo(f"built {manifest.public_version} in {out_dir} ({manifest.renames} renames)")
    click.echo("installation order: " + " -> ".join(manifest.install_order))
    for entry in manifest.packages:
        click.echo(f"  {entry.sha256}  {entry.archive}")


def _summary(manifest: pack.PackManifest, out_dir: Path) -> dict[str, Any]:
    return {
        "out": str(out_dir),
        "public_version": manifest.public_version,
        "source": manifest.source.model_dump(mode="json"),
        "outloop": {"version": manifest.wheel.version, "code_sha256": manifest.wheel.code_sha256},
        "install_order": list(manifest.install_order),
        "packages": {e.name: {"archive": e.archive, "sha256": e.sha256} for e in manifest.packages},
        "renames": manifest.renames,
    }


@pack_group.command("verify")
@click.argument("pack_dir", type=click.Path(file_okay=False, path_type=Path))
@_source_options
def verify_command(pack_dir: Path, source: Path | None, rename_map: Path | None) -> None:
    """Derive the pack again from the source, the map and the running Outloop (the pinned
    wheel) and compare every byte and checksum with PACK_DIR. Exit 0 when identical, 1
    naming each difference."""
    source, rename_map = _inputs(source, rename_map)
    try:
        differences = pack.verify(pack_dir, source, rename_map, composition.wheel_pin(), _say)
    except PackError as exc:
        _problems(exc)
    if differences:
        _problems(PackError(tuple(differences)))
    click.echo(f"{pack_dir}: every byte and checksum is the derivation's")


@pack_group.command("install")
@click.argument("pack_dir", type=click.Path(file_okay=False, path_type=Path))
@click.option(
    "--target",
    type=click.Path(file_okay=False, path_type=Path),
    help="Where to install (default: 'pack' in the data directory).",
)
@click.option(
    "--accept-drift",
    is_flag=True,
    help="Install a pack that pins another Outloop than the running one (tasks show it drifted).",
)
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
@data_dir_option
def install_command(
    pack_dir: Path, target: Path | None, accept_drift: bool, as_json: bool, data_dir: Path | None
) -> None:
    """Check every checksum, the file lists, the dependencies and the order; install the
    packages in order as a new release and switch to it in one step (a failure leaves the
    previous installation intact); then run 'schedule verify' for every registered
    workspace, which names any dispatcher still running the previous installation."""
    with station_for(data_dir) as station:
        target = target or station.data_dir.pack
        try:
            done = pack.install(pack_dir, target, composition.running_code(), accept_drift, _say)
        except PackError as exc:
            _problems(exc)
        verified = _verify_workspaces(station, target)
    if as_json:
        click.echo(json.dumps(_installed_json(done, verified), indent=2))
        return
    was = f" (was {done.previous})" if done.previous and done.previous != done.release else ""
    click.echo(f"installed {done.release} in {done.path}{was}")
    if not verified:
        click.echo("schedule verify: no workspace is registered in this data directory")
    for workspace_id, result in verified.items():
        click.echo(f"schedule verify {workspace_id}: {'ok' if result.ok else 'FAILED'}")
        for check in result.checks:
            if not check.ok:
                click.echo(f"  FAIL {check.name}: {check.detail}")
                if check.fix:
                    click.echo(f"       fix: {check.fix}")


def _verify_workspaces(
    station: composition.Station, target: Path
) -> dict[str, schedule.Verification]:
    here = composition.installation(target)
    now = SystemClock().now()
    results: dict[str, schedule.Verification] = {}
    for row in station.store.list_workspaces():
        tenant_config = station.data_dir.tenant_config(row.workspace_id)
        result = schedule.verify(
            station.store, station.store, tenant_config, row.workspace_id, here, now
        )
        if result is not None:
            results[row.workspace_id] = result
    return results


def _installed_json(
    done: pack.Installed, verified: dict[str, schedule.Verification]
) -> dict[str, Any]:
    return {
        "release": done.release,
        "path": str(done.path),
        "previous": done.previous,
        "install_order": list(done.order),
        "schedule_verify": {
            ws: {
                "ok": r.ok,
                "failed": [
                    {"name": c.name, "detail": c.detail, "fix": c.fix} for c in r.checks if not c.ok
                ],
            }
            for ws, r in verified.items()
        },
    }


@pack_group.command("status")
@click.option(
    "--target",
    type=click.Path(file_okay=False, path_type=Path),
    help="The installation to check (default: 'pack' in the data directory).",
)
@click.option("--json", "as_json", is_flag=True, help="Print the status as JSON.")
@data_dir_option
def status_command(target: Path | None, as_json: bool, data_dir: Path | None) -> None:
    """The installed pack's version and drift against the running code: in_sync, drifted
    (naming what differs) or unknown. Exit 0 in sync, 1 otherwise."""
    try:
        target = target or read_settings(data_dir).data_dir / "pack"
        found = composition.pack_status(target)
    except OutloopError as exc:
        fail(exc)
    if as_json:
        click.echo(json.dumps(found.model_dump(mode="json"), indent=2))
    else:
        click.echo(f"{found.status} (pack {found.package_version or 'none'})")
        for difference in found.differences:
            click.echo(f"  {difference}")
    if found.status != "in_sync":
        raise SystemExit(EXIT_PROBLEMS)
