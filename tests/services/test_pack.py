"""Building, verifying and installing a public pack from a realistic sample source tree."""

from __future__ import annotations

import gzip
import io
import json
import os
import tarfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from agent.domain import pack as rules
from agent.domain.errors import PackError
from agent.domain.pack import Renamer, WheelPin
from agent.services import pack

FILES = {"agent/__init__.py": "a" * 64, "agent/domain/gates.py": "b" * 64}
WHEEL = WheelPin(name="outloop", version="1.0.0", code_sha256=rules.code_digest(FILES), files=FILES)
RUNNING = ("1.0.0", FILES)

MAP = """\
harbor                        -> outloop
Harbor                        -> Outloop
HARBOR_DATA_DIR               -> OUTLOOP_DATA_DIR
harbor-email-lifecycle        -> outloop-email-lifecycle
harbor-access-fallback        -> outloop-access-fallback
harbor-workspace-bootstrapper -> outloop-workspace-bootstrapper
harbor_guards                 -> workflow_guards
hb_verdict                    -> guard_verdict
hbx_receipt_ack               -> receipt_ack
hbx_escalation_contact        -> escalation_contact
wiki.harbor.internal          -> docs.outloop.example
harbor.internal               -> outloop.example
@internal-domain harbor.internal
@internal-domain harborline.test
"""

SOURCE = {
    "pack.yaml": "public_version: public-2.3-rc.4\n",
    "harbor-email-lifecycle/package.yaml": (
        "name: harbor-email-lifecycle\nversion: 2.3.0\ndepends:\n"
        "  - harbor\n  - harbor-access-fallback\n  - harbor-workspace-bootstrapper\n"
    ),
    "harbor-email-lifecycle/SKILL.md": (
        "---\nname: harbor-email-lifecycle\n---\n# The email lifecycle\n\n"
        "Call `harbor.execution.claim` before a task; read harbor://skills/lifecycle.\n"
        "Guides: https://wiki.harbor.internal/lifecycle (ask client@example.com to wait).\n\n"
        "| Workspace label | Workspace ID | Intake project ID |\n|---|---|---|\n"
    ),
    "harbor-email-lifecycle/scripts/harbor_guards.py": (
        "import os\n\n\ndef hb_verdict(evidence: dict[str, str]) -> str:\n"
        '    """Harbor\'s guard: reads HARBOR_DATA_DIR, grants nothing."""\n'
        '    return os.environ.get("HARBOR_DATA_DIR", "") + evidence.get("x", "")\n'
    ),
    "harbor-access-fallback/package.yaml": (
        "name: harbor-access-fallback\nversion: 1.4.0\ndepends: [harbor]\n"
    ),
    "harbor-access-fallback/SKILL.md": "# Access\n\nAPI, then the provider's MCP, then the browser.\n",
    "harbor-workspace-bootstrapper/package.yaml": (
        "name: harbor-workspace-bootstrapper\nversion: 2.0.1\ndepends: [harbor]\n"
    ),
    "harbor-workspace-bootstrapper/config/defaults.yaml": (
        "hbx_receipt_ack: false\nhbx_escalation_contact: null\nregistry: []\n"
    ),
    "contexts/tidewater.yaml": (
        "workspace_id: ws-tidewater-7c21\nlabel: Tidewater Freight\n"
        "contacts:\n  - {address: yael.sharon@tidewater-freight.test, name: Yael Sharon}\n"
    ),
}


class Sample:
    """A source tree and map in a directory, to change and build."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.source = root / "source"
        self.map = root / "rename-map.txt"
        self.map.parent.mkdir(parents=True, exist_ok=True)
        self.map.write_text(MAP)
        for path, text in SOURCE.items():
            self.write(path, text)

    def write(self, path: str, text: str) -> Path:
        target = self.source / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text, encoding="utf-8")
        return target

    def edit(self, path: str, old: str, new: str) -> None:
        target = self.source / path
        text = target.read_text(encoding="utf-8")
        assert old in text
        target.write_text(text.replace(old, new, 1), encoding="utf-8")

    def derive(self) -> pack.Derived:
        return pack.derive(self.source, self.map, WHEEL)

    def build(self, out: Path) -> Path:
        pack.write_pack(self.derive(), out)
        return out

    def refused_at(self, start: str) -> None:
        """The build fails, and one problem reads ``start...`` (its file, line and why)."""
        problems = self.refused()
        assert any(p.startswith(start) for p in problems), problems

    def refused(self) -> list[str]:
        with pytest.raises(PackError) as caught:
            self.derive()
        return [str(p) for p in caught.value.problems]


@pytest.fixture
def sample(tmp_path: Path) -> Sample:
    return Sample(tmp_path / "sample")


def files_of(pack_dir: Path) -> dict[str, bytes]:
    return {
        p.relative_to(pack_dir).as_posix(): p.read_bytes()
        for p in sorted(pack_dir.rglob("*"))
        if p.is_file()
    }


def test_every_file_of_the_pack_comes_back_to_its_source_through_the_inverse_map(
    sample: Sample, tmp_path: Path
) -> None:
    out = sample.build(tmp_path / "out")
    manifest = pack.read_manifest(out)
    back = Renamer(rules.parse_map(MAP, "m")[0].inverse)
    seen = 0
    for entry in manifest.packages:
        for path, data in pack.unpack((out / entry.archive).read_bytes()).items():
            source = sample.source / back(path)
            assert back(data.decode()) == source.read_text(), path
            seen += 1
    assert seen == 7
    assert manifest.renames >= 20
    skill = pack.unpack((out / manifest.packages[1].archive).read_bytes())
    text = skill["outloop-email-lifecycle/SKILL.md"].decode()
    assert "outloop.execution.claim" in text and "https://docs.outloop.example/lifecycle" in text
    assert "harbor" not in text.lower()


def test_the_pack_names_its_version_source_order_and_checksums(
    sample: Sample, tmp_path: Path
) -> None:
    out = sample.build(tmp_path / "out")
    manifest = json.loads((out / "pack.json").read_text())
    assert manifest["public_version"] == "public-2.3-rc.4"
    assert len(manifest["source"]["digest"]) == 64
    assert manifest["install_order"] == [
        "outloop", "outloop-access-fallback", "outloop-workspace-bootstrapper",
        "outloop-email-lifecycle",
    ]  # fmt: skip
    assert manifest["wheel"]["version"] == "1.0.0"
    sums: dict[str, str] = {}
    for line in (out / "SHA256SUMS").read_text().splitlines():
        digest, path = line.split("  ")
        sums[path] = digest
    for entry in manifest["packages"]:
        assert (
            sums[entry["archive"]]
            == entry["sha256"]
            == rules.sha256((out / entry["archive"]).read_bytes())
        )
    assert sums["pack.json"] == rules.sha256((out / "pack.json").read_bytes())


@contextmanager
def umask(mask: int) -> Iterator[None]:
    old = os.umask(mask)
    try:
        yield
    finally:
        os.umask(old)


def test_two_builds_in_different_places_times_and_umasks_are_byte_for_byte_identical(
    tmp_path: Path,
) -> None:
    first, second = Sample(tmp_path / "one"), Sample(tmp_path / "two")
    for n, path in enumerate(sorted(second.source.rglob("*"))):
        os.utime(path, (1_000_000 + n * 86_400, 1_000_000 + n * 86_400))
        path.chmod(0o700 if path.is_dir() else 0o600)
    with umask(0o022):
        a = first.build(tmp_path / "out-a")
    with umask(0o077):
        b = second.build(tmp_path / "elsewhere" / "out-b")
    assert files_of(a) == files_of(b)
    for archive in (a / "packages").iterdir():
        with tarfile.open(archive) as tar:
            members = tar.getmembers()
        assert [m.name for m in members] == sorted(m.name for m in members)
        assert {m.mtime for m in members} == {pack.ARCHIVE_MTIME}
        assert {m.mode for m in members} <= {0o644, 0o755}
        assert gzip.decompress(archive.read_bytes())  # a plain gzip stream
        assert archive.read_bytes()[4:8] == b"\0\0\0\0"  # no time in the gzip header


def test_a_change_outside_the_map_fails_the_build_at_its_file_and_line(sample: Sample) -> None:
    sample.edit("harbor-access-fallback/SKILL.md", "API, then", "API (outloop's own), then")
    assert any(
        p.startswith("harbor-access-fallback/SKILL.md:3: the source already says 'outloop'")
        for p in sample.refused()
    )


def test_a_rename_that_would_collide_fails_the_build_at_the_map_line(sample: Sample) -> None:
    sample.map.write_text(MAP + "hb_other -> guard_verdict\n")
    assert any(
        p.startswith("rename-map.txt:15: 'hb_other' and 'hb_verdict'") for p in sample.refused()
    )


def test_a_rename_ambiguous_in_reverse_fails_the_build(sample: Sample) -> None:
    sample.map.write_text(MAP + "outloop -> outloop-public\n")
    assert any(
        p.startswith("rename-map.txt:1: 'outloop' is a public name and an internal one: "
                     "ambiguous in reverse")
        for p in sample.refused()
    )  # fmt: skip


def test_a_dependency_outside_the_distribution_fails_the_build_at_its_line(sample: Sample) -> None:
    sample.edit(
        "harbor-access-fallback/package.yaml", "depends: [harbor]", "depends: [harbor, harbor-crm]"
    )
    sample.refused_at(
        "harbor-access-fallback/package.yaml:3: outloop-access-fallback depends on "
        "'harbor-crm', which is not a package of this distribution"
    )


def test_a_dependency_cycle_fails_the_build_naming_the_cycle(sample: Sample) -> None:
    sample.edit(
        "harbor-workspace-bootstrapper/package.yaml", "depends: [harbor]",
        "depends: [harbor, harbor-email-lifecycle]",
    )  # fmt: skip
    problems = sample.refused()
    assert (
        "harbor-email-lifecycle/package.yaml:6: a dependency cycle: outloop-email-lifecycle -> "
        "outloop-workspace-bootstrapper -> outloop-email-lifecycle"
    ) in problems, problems


@pytest.mark.parametrize(
    ("path", "text", "expected"),
    [
        (
            "harbor-email-lifecycle/SKILL.md",
            "| Acme | ws-acme | p-1 |\n",
            "harbor-email-lifecycle/SKILL.md:11: a workspace registry row",
        ),
        (
            "harbor-workspace-bootstrapper/config/defaults.yaml",
            "  - ws-acme\n",
            "harbor-workspace-bootstrapper/config/defaults.yaml:3: a workspace registry entry",
        ),
        (
            "harbor-access-fallback/SKILL.md",
            "Write to ops@acme-corp.com.\n",
            "harbor-access-fallback/SKILL.md:4: the address 'ops@acme-corp.com'",
        ),
        (
            "harbor-access-fallback/SKILL.md",
            "Mail relay: smtp.harborline.test\n",
            "harbor-access-fallback/SKILL.md:4: the internal domain 'harborline.test'",
        ),
        (
            "harbor-access-fallback/SKILL.md",
            "Ask Harbor-ops.\n",
            "harbor-access-fallback/SKILL.md:4: the internal identifier 'harbor'",
        ),
        (
            "harbor-access-fallback/SKILL.md",
            "As Tidewater Freight asked.\n",
            "harbor-access-fallback/SKILL.md:4: 'Tidewater Freight', a name or address",
        ),
        (
            "harbor-access-fallback/SKILL.md",
            "cc yael.sharon@tidewater-freight.test\n",
            "harbor-access-fallback/SKILL.md:4: 'tidewater-freight.test', a name or address",
        ),
    ],
)
def test_each_kind_of_leak_planted_in_the_source_fails_the_build(
    sample: Sample, path: str, text: str, expected: str
) -> None:
    if path.endswith("defaults.yaml"):
        sample.edit(path, "registry: []\n", "registry:\n" + text)
    else:
        target = sample.source / path
        target.write_text(target.read_text() + text)
    problems = sample.refused()
    assert any(expected in p for p in problems), problems


def test_a_file_that_is_not_text_fails_the_build(sample: Sample) -> None:
    (sample.source / "harbor-access-fallback" / "logo.bin").write_bytes(b"ok\n\xff\xfe")
    assert any("logo.bin:2: not UTF-8 text" in p for p in sample.refused())


def test_verify_accepts_the_pack_it_derives_again(sample: Sample, tmp_path: Path) -> None:
    out = sample.build(tmp_path / "out")
    assert pack.verify(out, sample.source, sample.map, WHEEL) == []


def resum(out: Path) -> None:
    """Recompute SHA256SUMS, as someone who tampered with the pack would."""
    lines = [
        f"{rules.sha256(p.read_bytes())}  {p.relative_to(out).as_posix()}\n"
        for p in sorted(out.rglob("*"))
        if p.is_file() and p.name != "SHA256SUMS"
    ]
    (out / "SHA256SUMS").write_text("".join(lines))


def tamper_byte(out: Path) -> None:
    archive = next((out / "packages").glob("outloop-access-fallback-*"))
    files = pack.unpack(archive.read_bytes())
    name = "outloop-access-fallback/SKILL.md"
    files[name] = files[name].replace(b"browser", b"brOwser")
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w") as tar:
        for path, data in sorted(files.items()):
            info = tarfile.TarInfo(path)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    archive.write_bytes(gzip.compress(raw.getvalue(), mtime=0))
    resum(out)


def tamper_added(out: Path) -> None:
    (out / "packages" / "extra.tar.gz").write_bytes(b"not mine")
    resum(out)


def tamper_dependency(out: Path) -> None:
    manifest = json.loads((out / "pack.json").read_text())
    for entry in manifest["packages"]:
        if entry["name"] == "outloop-email-lifecycle":
            entry["depends"].remove("outloop-access-fallback")
    (out / "pack.json").write_text(json.dumps(manifest, indent=2) + "\n")
    resum(out)


def tamper_escape(out: Path) -> None:
    manifest = json.loads((out / "pack.json").read_text())
    manifest["public_version"] = "../../escaped"
    (out / "pack.json").write_text(json.dumps(manifest, indent=2) + "\n")
    resum(out)


TAMPERS = {
    "one byte changed": tamper_byte,
    "a file added": tamper_added,
    "a dependency removed": tamper_dependency,
    "a release path leaving the target": tamper_escape,
}
WHY = {
    "one byte changed": "missing or not the archive pack.json names",
    "a file added": "not a package pack.json names",
    "a dependency removed": "its package.yaml is not what pack.json says",
    "a release path leaving the target": "not a pack manifest",
}


@pytest.mark.parametrize("tamper", sorted(TAMPERS))
def test_a_tampered_pack_fails_verify_and_install_and_the_previous_installation_stays(
    sample: Sample, tmp_path: Path, tamper: str
) -> None:
    good = sample.build(tmp_path / "good")
    target = tmp_path / "installed"
    first = pack.install(good, target, RUNNING)
    before = files_of(target)
    sample.edit("harbor-access-fallback/SKILL.md", "# Access", "# Access (new)")
    bad = sample.build(tmp_path / "bad")
    TAMPERS[tamper](bad)
    assert pack.verify(bad, sample.source, sample.map, WHEEL) != []
    with pytest.raises(PackError) as caught:
        pack.install(bad, target, RUNNING)
    assert WHY[tamper] in str(caught.value)
    assert files_of(target) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad", "good", "installed", "sample"]
    assert pack.current_release(target) == first.release
    assert [p.name for p in (target / "releases").iterdir()] == [first.release]


def test_verify_names_the_file_inside_an_archive_that_differs(
    sample: Sample, tmp_path: Path
) -> None:
    out = sample.build(tmp_path / "out")
    tamper_byte(out)
    problems = [str(p) for p in pack.verify(out, sample.source, sample.map, WHEEL)]
    assert any("!outloop-access-fallback/SKILL.md:3: differs" in p for p in problems), problems
    assert any(p.startswith("SHA256SUMS:2: differs") for p in problems), problems


def test_install_switches_to_the_new_release_and_keeps_the_previous_one(
    sample: Sample, tmp_path: Path
) -> None:
    target = tmp_path / "installed"
    first = pack.install(sample.build(tmp_path / "a"), target, RUNNING)
    sample.edit("harbor-access-fallback/SKILL.md", "# Access", "# Access (new)")
    second = pack.install(sample.build(tmp_path / "b"), target, RUNNING)
    assert second.previous == first.release != second.release
    assert pack.current_release(target) == second.release
    shown = (target / "current" / "outloop-access-fallback" / "SKILL.md").read_text()
    assert shown.startswith("# Access (new)")
    assert sorted(p.name for p in (target / "releases").iterdir()) == sorted(
        [first.release, second.release]
    )
    assert os.access(
        target / "current" / "outloop-email-lifecycle" / "scripts" / "workflow_guards.py", os.X_OK
    )


def test_install_refuses_a_pack_pinned_to_another_outloop_unless_drift_is_accepted(
    sample: Sample, tmp_path: Path
) -> None:
    out = sample.build(tmp_path / "out")
    target = tmp_path / "installed"
    other = ("1.0.1", {**FILES, "agent/domain/gates.py": "c" * 64})
    with pytest.raises(PackError) as caught:
        pack.install(out, target, other)
    assert "changed agent/domain/gates.py" in str(caught.value)
    assert not (target / "current").exists()
    pack.install(out, target, other, accept_drift=True)
    found = pack.status(target, other)
    assert found.status == "drifted"
    assert found.differences == (
        "the pack pins outloop 1.0.0; 1.0.1 runs",
        "changed agent/domain/gates.py",
    )


def test_status_is_unknown_without_a_pack_and_in_sync_with_the_pinned_code(
    sample: Sample, tmp_path: Path
) -> None:
    target = tmp_path / "installed"
    assert pack.status(target, RUNNING).status == "unknown"
    pack.install(sample.build(tmp_path / "out"), target, RUNNING)
    found = pack.status(target, RUNNING)
    assert (found.status, found.package_version) == ("in_sync", "public-2.3-rc.4")


def test_build_refuses_an_output_directory_that_holds_something(
    sample: Sample, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    with pytest.raises(PackError, match="not an empty directory"):
        sample.build(out)
    assert [p.name for p in out.iterdir()] == ["keep.txt"]


def test_a_failure_while_writing_the_release_leaves_the_previous_installation(
    sample: Sample, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = tmp_path / "installed"
    first = pack.install(sample.build(tmp_path / "a"), target, RUNNING)
    before = files_of(target)
    sample.edit("harbor-access-fallback/SKILL.md", "# Access", "# Access (new)")
    newer = sample.build(tmp_path / "b")

    def disk_full(_: Path) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(pack, "_fsync_tree", disk_full)
    with pytest.raises(OSError, match="No space left"):
        pack.install(newer, target, RUNNING)
    assert files_of(target) == before
    assert pack.current_release(target) == first.release
    assert [p.name for p in (target / "releases").iterdir()] == [first.release]  # no staging


def test_install_refuses_to_replace_a_current_it_did_not_make(
    sample: Sample, tmp_path: Path
) -> None:
    target = tmp_path / "installed"
    (target / "current").mkdir(parents=True)
    (target / "current" / "mine.txt").write_text("kept")
    with pytest.raises(PackError, match="not an installation's link"):
        pack.install(sample.build(tmp_path / "out"), target, RUNNING)
    assert (target / "current" / "mine.txt").read_text() == "kept"


def test_a_package_named_otherwise_than_its_directory_fails_the_build_at_its_line(
    sample: Sample,
) -> None:
    sample.edit(
        "harbor-access-fallback/package.yaml", "name: harbor-access-fallback", "name: harbor-access"
    )
    sample.refused_at(
        "harbor-access-fallback/package.yaml:1: the package is named 'harbor-access' but its "
        "directory gives 'outloop-access-fallback'"
    )


def test_a_package_named_like_the_pinned_wheel_fails_the_build(sample: Sample) -> None:
    sample.write("harbor/package.yaml", "name: harbor\nversion: 1.0.0\n")
    assert any(
        p.startswith("harbor/package.yaml:1: a package may not be named 'outloop'")
        for p in sample.refused()
    )


def test_verify_refuses_a_pack_pinned_to_another_outloop(sample: Sample, tmp_path: Path) -> None:
    out = sample.build(tmp_path / "out")
    files = {**FILES, "agent/domain/gates.py": "c" * 64}
    other = WheelPin(
        name="outloop", version="1.0.0", code_sha256=rules.code_digest(files), files=files
    )
    problems = [str(p) for p in pack.verify(out, sample.source, sample.map, other)]
    assert any(p.startswith("pack.json: it pins outloop 1.0.0 (code ") for p in problems), problems


def test_a_wheel_pin_whose_digest_is_not_its_files_is_refused() -> None:
    with pytest.raises(ValueError, match="not the digest of the files"):
        WheelPin(name="outloop", version="1.0.0", code_sha256="0" * 64, files=FILES)


def test_the_leak_gate_knows_every_tenant_value_and_word_of_the_contexts(sample: Sample) -> None:
    sample.write(
        "contexts/tidewater.yaml",
        "workspace_id: ws-tidewater-7c21\nlabel: Tidewater Freight dispatch desk\n"
        "hbx_escalation_contact: omer.katz@harborline.test\n"
        "unresolved_queue: tidewater-unresolved\ntimezone: Asia/Jerusalem\n"
        "mailboxes:\n  - {mailbox_id: desk@harborline.test, provider: maildir, path: /srv/mail/tw}\n"
        "contacts:\n  - {address: yael.sharon@tidewater-freight.test, name: Yael Sharon, side: client}\n",
    )
    found, _ = pack.context_values(
        pack.read_tree(sample.source), Renamer(rules.parse_map(MAP, "m")[0].forward)
    )
    for value in ("Tidewater", "Freight", "Yael", "Sharon", "tidewater-unresolved", "/srv/mail/tw",
                  "omer.katz@harborline.test", "tidewater-freight", "ws-tidewater-7c21"):  # fmt: skip
        assert value in found, value
    for vocabulary in ("Asia/Jerusalem", "maildir", "client", "desk", "dispatch"):
        assert vocabulary not in found, vocabulary
    target = sample.source / "harbor-access-fallback" / "SKILL.md"
    target.write_text(target.read_text() + "Yael asked.\n")
    assert any("'Yael', a name or address" in p for p in sample.refused())
