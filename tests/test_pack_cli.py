"""``outloop pack`` on this repository's own internal source: the public pack every
workspace installs, its helper commands, and the installation's last step."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner

from agent.domain import gates, schedule
from agent.domain import pack as rules
from agent.domain.context import WorkspaceContext, parse_context
from agent.domain.records import DispatcherRow
from agent.services import pack
from agent.services.holder import current_holder
from agent.services.workspaces import DataDir
from agent.storage.sqlite import SqliteStore
from mcp_server import composition
from mcp_server.cli import main
from tests.test_schedule_cli import WS, Station

REPO = Path(__file__).resolve().parent.parent
SOURCE = REPO / "pack" / "source"
MAP = REPO / "pack" / "rename-map.txt"
LIFECYCLE = "outloop-email-lifecycle"
BOOTSTRAPPER = "outloop-workspace-bootstrapper"


def outloop(*args: str, env: dict[str, str] | None = None) -> tuple[int, str, str]:
    done = CliRunner().invoke(main, list(args), env=env)
    return done.exit_code, done.stdout, done.stderr


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("pack") / "out"
    code, shown, err = outloop("pack", "build", "--out", str(out), "--json")
    assert code == 0, err
    assert json.loads(shown)["out"] == str(out)
    return out


def contents(built: Path, package: str) -> dict[str, str]:
    manifest = pack.read_manifest(built)
    [entry] = [e for e in manifest.packages if e.name == package]
    files = pack.unpack((built / entry.archive).read_bytes())
    return {p.removeprefix(package + "/"): d.decode() for p, d in files.items()}


def test_the_repository_pack_builds_from_its_own_source_and_passes_the_leak_gate(
    built: Path,
) -> None:
    manifest = pack.read_manifest(built)
    assert manifest.public_version == "public-2.3-rc.4"
    assert manifest.install_order == ("outloop", BOOTSTRAPPER, LIFECYCLE)
    assert manifest.wheel == composition.wheel_pin()
    rename_map, problems = rules.parse_map(MAP.read_text(), MAP.name)
    assert problems == []
    values, _ = pack.context_values(pack.read_tree(SOURCE), rules.Renamer(rename_map.forward))
    assert {
        "Tidewater",
        "Yael Sharon",
        "tidewater-unresolved",
        "priya.nair@brightwell-clinics.test",
    } <= set(values)
    identity = rules.Identity(tuple(rename_map.forward), rename_map.internal_domains, values)
    for entry in manifest.packages:
        for path, text in contents(built, entry.name).items():
            assert rules.registry_rows(text, yaml=path.endswith(".yaml")) == [], path
            assert rules.leaks(path, text, identity) == [], path


def test_the_map_does_real_work_on_nested_names_urls_code_and_yaml_keys(built: Path) -> None:
    rename_map, _ = rules.parse_map(MAP.read_text(), MAP.name)
    forward = rename_map.forward
    assert len(forward) >= 20
    assert any(a != b and rules.mentions(b, a) for a in forward for b in forward)  # nesting
    assert pack.read_manifest(built).renames >= 50
    guide = contents(built, BOOTSTRAPPER)["SKILL.md"]
    assert "https://docs.outloop.example/pack-guides/bootstrap" in guide  # inside a URL
    script = contents(built, LIFECYCLE)["scripts/workflow_guards.py"]
    assert "from guard_evidence import EvidenceError" in script  # in code
    context = (
        SOURCE / "harbor-workspace-bootstrapper/templates/workspace-context.yaml"
    ).read_text()
    assert "hbx_escalation_contact:" in context  # a YAML key the source writes its own way
    assert (
        "\nescalation_contact:" in contents(built, BOOTSTRAPPER)["templates/workspace-context.yaml"]
    )


def test_the_skills_the_server_serves_are_the_packs_own(built: Path) -> None:
    files = contents(built, LIFECYCLE)
    served = REPO / "mcp_server" / "skills"
    assert files["SKILL.md"] == (served / "SKILL.md").read_text()
    for name in ("request-closure", "task-record", "access-fallback"):
        assert files[f"references/{name}.md"] == (served / f"{name}.md").read_text(), name


def test_the_packs_defaults_are_the_running_codes_defaults(built: Path) -> None:
    defaults: dict[str, Any] = yaml.safe_load(contents(built, BOOTSTRAPPER)["config/defaults.yaml"])
    minimal = WorkspaceContext.model_validate({"workspace_id": "ws-defaults"})
    shown = minimal.model_dump(mode="json", by_alias=True)
    for key, value in defaults["context"].items():
        if isinstance(value, dict):
            for inner, v in value.items():  # pyright: ignore[reportUnknownVariableType]
                assert shown[key][inner] == v, f"{key}.{inner}"
        else:
            assert shown[key] == value, key
    assert tuple(defaults["schedule"]["hours"]) == schedule.HOURS
    assert defaults["schedule"]["days"] == schedule.DAYS
    assert defaults["schedule"]["minute"] == schedule.DERIVATION
    assert defaults["registry"] == []


def test_the_packs_template_is_a_workspace_context_the_product_reads(built: Path) -> None:
    text = contents(built, BOOTSTRAPPER)["templates/workspace-context.yaml"]
    context = parse_context(text, "template")
    assert all(rules.reserved(c.address.rsplit("@", 1)[1]) for c in context.contacts)


def test_verify_passes_on_the_built_pack_and_names_a_changed_byte(
    built: Path, tmp_path: Path
) -> None:
    code, shown, _ = outloop("pack", "verify", str(built))
    assert code == 0 and "every byte" in shown
    copy = shutil.copytree(built, tmp_path / "copy")
    sums = copy / "SHA256SUMS"
    sums.write_text(sums.read_text().replace("packages/", "packages/x", 1))
    code, _, err = outloop("pack", "verify", str(copy))
    assert code == 1 and ": lists packages/xoutloop-" in err and "not listed in SHA256SUMS" in err


def test_build_without_the_repository_source_says_what_to_give(tmp_path: Path) -> None:
    code, _, err = outloop(
        "pack", "build", "--out", str(tmp_path / "o"), "--source", str(tmp_path / "none")
    )
    assert code == 1 and "give --source" in err
    assert not (tmp_path / "o").exists()


def snapshot(root: Path) -> dict[str, tuple[int, bytes]]:
    return {
        p.relative_to(root).as_posix(): (p.stat().st_mode, p.read_bytes())
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def helper(script: Path, evidence: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    done = subprocess.run(
        [sys.executable, str(script)], input=json.dumps(evidence), capture_output=True,
        text=True, timeout=60, check=False, env={**os.environ, "PYTHONDONTWRITEBYTECODE": ""},
    )  # fmt: skip
    return done.returncode, json.loads(done.stdout or done.stderr)


OTHER = """\
workspace_id: ws-other-0002
contacts:
  - {address: rival@other-client.test, name: Rival, side: client, verified_by: crm-record}
"""


def test_the_helper_commands_answer_with_the_cores_gate_functions_and_store_nothing(
    built: Path, tmp_path: Path
) -> None:
    target = tmp_path / "installed"
    code, _, err = outloop("pack", "install", str(built), "--target", str(target),
                           "--data-dir", str(tmp_path / "data"))  # fmt: skip
    assert code == 0, err
    scripts = target / "current" / LIFECYCLE / "scripts"
    context_path = target / "current" / BOOTSTRAPPER / "templates" / "workspace-context.yaml"
    (tmp_path / "other.yaml").write_text(OTHER)
    before = snapshot(tmp_path)
    evidence = {"context": str(context_path), "to": ["client@example.com", "stray@example.net"],
                "other_contexts": [str(tmp_path / "other.yaml")]}  # fmt: skip
    code, verdict = helper(scripts / "recipient_gate.py", evidence)
    context = parse_context(context_path.read_text(), "t")
    other = parse_context(OTHER, "o")
    plan, reasons = gates.check_recipients(context, to=evidence["to"], cc=[], others=[other])
    assert code == 3 and verdict["passes"] is False
    assert verdict["reasons"] == [r.model_dump(mode="json") for r in reasons]
    assert verdict["to"] == [r.model_dump(mode="json") for r in plan.to]
    guards = {"context": str(context_path), "requester": "approver@example.org",
              "closing": True, "attachments": ["scan.pages", "brief.pdf"],
              "draft_text": "as rival@other-client.test asked",
              "other_contexts": [str(tmp_path / "other.yaml")]}  # fmt: skip
    code, verdict = helper(scripts / "workflow_guards.py", guards)
    assert code == 3
    assert verdict["release"]["reason"] == gates.requester_guard(
        "approver@example.org", False, True
    )
    assert verdict["foreign_content"] == list(
        gates.foreign_content(guards["draft_text"], gates.foreign_markers(context, [other]))
    )
    assert verdict["foreign_content"]
    code, verdict = helper(scripts / "workflow_guards.py", {**guards, "requester_loop_closed": True,
                           "draft_text": "", "attachments": []})  # fmt: skip
    assert code == 0 and verdict["release"]["allowed"] is True
    code, verdict = helper(scripts / "recipient_gate.py", {"context": 7})
    assert code == 2 and "Workspace Context file" in verdict["error"]
    missing = subprocess.run(
        [sys.executable, str(scripts / "workflow_guards.py"), str(tmp_path / "absent.json")],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert missing.returncode == 2 and "the evidence cannot be read" in missing.stderr
    assert snapshot(tmp_path) == before  # nothing stored, not even bytecode


def test_install_ends_with_schedule_verify_naming_a_dispatcher_on_the_previous_installation(
    built: Path, tmp_path: Path
) -> None:
    station = Station(tmp_path)
    station.add()
    code, shown = station.outloop("pack", "install", str(built))
    assert code == 0, shown
    first = pack.current_release(DataDir(station.data_dir).pack)
    assert first is not None and f"installed {first}" in shown
    previous = composition.installation(DataDir(station.data_dir).pack)
    store = SqliteStore(DataDir(station.data_dir).database)
    try:
        now = datetime.now(UTC)
        store.record_dispatcher(
            DispatcherRow(
                holder=current_holder(), workspace_id=WS, role="active",
                executable=previous.executable, install=previous.install,
                version=previous.version, started_at=now, seen_at=now,
            )
        )  # fmt: skip
    finally:
        store.close()
    _, report = station.verify()
    assert all(c["ok"] for c in report["checks"] if c["name"] == "dispatcher")
    source = shutil.copytree(SOURCE, tmp_path / "source")
    guide = source / "harbor-workspace-bootstrapper" / "SKILL.md"
    guide.write_text(guide.read_text() + "\nA newer guide.\n")
    newer = tmp_path / "newer"
    code, shown = station.outloop("pack", "build", "--out", str(newer), "--source", str(source))
    assert code == 0, shown
    done = CliRunner().invoke(main, ["pack", "install", str(newer), "--json"], env=station.env)
    assert done.exit_code == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["previous"] == first != result["release"]
    [failed] = result["schedule_verify"][WS]["failed"]
    assert failed["name"] == "dispatcher"
    assert "another installation" in failed["detail"] and f"(pack {first})" in failed["detail"]


def test_the_repository_pack_builds_byte_for_byte_the_same_from_two_copies(
    built: Path, tmp_path: Path
) -> None:
    outs: list[dict[str, bytes]] = []
    for n, mask in ((1, 0o022), (2, 0o077)):
        copy = shutil.copytree(REPO / "pack", tmp_path / f"copy{n}" / "pack")
        for path in copy.rglob("*"):
            os.utime(path, (n * 1_000_000, n * 1_000_000))
        old = os.umask(mask)
        try:
            code, _, err = outloop("pack", "build", "--out", str(tmp_path / f"out{n}"),
                                   "--source", str(copy / "source"),
                                   "--map", str(copy / "rename-map.txt"))  # fmt: skip
        finally:
            os.umask(old)
        assert code == 0, err
        outs.append(snapshot_bytes(tmp_path / f"out{n}"))
    assert outs[0] == outs[1]
    assert {p: d for p, d in outs[0].items() if p.startswith("packages/")} == {
        p: d for p, d in snapshot_bytes(built).items() if p.startswith("packages/")
    }


def snapshot_bytes(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in root.rglob("*") if p.is_file()}
