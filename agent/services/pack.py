"""``outloop pack build|verify|install``: the public pack, derived, checked and installed.

A build reads a source tree (``pack.yaml``, one directory per package with its
``package.yaml``, and ``contexts/`` with the source's workspace contexts, which are never
shipped) and a rename map, applies only the map's exact renames, proves that every file
comes back through the inverse map, resolves the dependencies and the installation order,
runs the leak gate, and writes byte-for-byte reproducible archives with their checksums.
``verify`` derives the pack again and compares every byte; ``install`` checks every
checksum first and switches the installed release in one rename.
"""

from __future__ import annotations

import contextlib
import gzip
import io
import json
import os
import re
import shutil
import subprocess
import tarfile
import tempfile
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any, cast

import yaml
from pydantic import ValidationError

from agent.domain import pack
from agent.domain.errors import PackError
from agent.domain.pack import (
    Drift,
    Identity,
    PackageEntry,
    PackageManifest,
    PackManifest,
    Problem,
    Renamer,
    Source,
    SourceManifest,
    WheelPin,
)

SOURCE_MANIFEST = "pack.yaml"
PACKAGE_MANIFEST = "package.yaml"
CONTEXTS = "contexts"
PACK_JSON = "pack.json"
SUMS = "SHA256SUMS"
PACKAGES = "packages"
CURRENT = "current"
RELEASES = "releases"
ARCHIVE_MTIME = 315532800
"""Every archive entry's time: 1980-01-01, whatever day the build runs."""
VOCABULARY_KEYS = frozenset(
    {"timezone", "language", "provider", "side", "verified_by", "roles", "scope", "class",
     "licence", "client_send_policy", "tone", "weekend", "accepted", "intake_location_id",
     "security", "shared", "receipt_ack", "reminder_business_days", "task_owner_evidence",
     "max_per_recipient_per_day", "holidays", "official", "port"}
)  # fmt: skip
"""Workspace Context keys whose values are the product's vocabulary (an enum, a setting),
not the tenant's: every other string of a context names the tenant."""
NAME_KEYS = frozenset({"label", "name", "signature"})
"""Keys whose values are also searched for word by word (a first name, a company name)."""
COMMON_WORDS = frozenset(
    {"team", "desk", "support", "office", "front", "dispatch", "service", "services", "client",
     "clients", "mail", "inbox", "help", "sales", "the", "and", "for", "with", "workspace"}
)  # fmt: skip

Say = Callable[[str], None]


def _quiet(_: str) -> None:
    return None


# -- reading the source -----------------------------------------------------------------------


def read_tree(root: Path) -> dict[str, bytes]:
    """Every file under ``root`` by its POSIX path, but compiled Python caches."""
    if not root.is_dir():
        raise PackError((Problem(str(root), 0, "not a directory"),))
    found: dict[str, bytes] = {}
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root)
        if "__pycache__" in rel.parts or not path.is_file():
            continue
        found[rel.as_posix()] = path.read_bytes()
    return found


def _text(path: str, data: bytes, problems: list[Problem]) -> str | None:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        problems.append(Problem(path, line, "not UTF-8 text: a pack holds text files only"))
        return None


def source_commit(source: Path, rename_map: Path) -> str | None:
    """The commit the source is a clean checkout of, if it is one."""
    git = shutil.which("git")
    if git is None:
        return None
    source, rename_map = source.resolve(), rename_map.resolve()
    try:
        head = subprocess.run(  # noqa: S603 - git, with paths we were given
            [git, "-C", str(source), "rev-parse", "HEAD"], capture_output=True, text=True,
            check=True, timeout=30,
        ).stdout.strip()  # fmt: skip
        dirty = subprocess.run(  # noqa: S603
            [git, "-C", str(source), "status", "--porcelain", "--", ".", str(rename_map)],
            capture_output=True, text=True, check=True, timeout=30,
        ).stdout.strip()  # fmt: skip
    except (subprocess.SubprocessError, OSError):
        return None
    return head if head and not dirty else None


def context_values(
    tree: Mapping[str, bytes], forward: Renamer
) -> tuple[tuple[str, ...], list[Problem]]:
    """Every name and address the source's workspace contexts hold: each string value of
    a key that is not product vocabulary (keys read after renaming, as the product reads
    them), each word of a name or label, each address and its domain."""
    values: set[str] = set()
    problems: list[Problem] = []
    for path, data in tree.items():
        if not path.startswith(CONTEXTS + "/") or not path.endswith((".yaml", ".yml")):
            continue
        try:
            loaded: Any = yaml.safe_load(data.decode("utf-8"))
        except (yaml.YAMLError, UnicodeDecodeError) as exc:
            problems.append(Problem(path, 0, f"not a readable workspace context: {exc}"))
            continue
        values.update(_tenant_strings(loaded, forward))
    return tuple(sorted(v for v in values if len(v) >= 3)), problems


def _tenant_strings(node: object, forward: Renamer, key: str = "") -> set[str]:
    found: set[str] = set()
    if isinstance(node, dict):
        for k, v in cast("dict[object, object]", node).items():
            found |= _tenant_strings(v, forward, forward(str(k)))
    elif isinstance(node, list):
        for item in cast("list[object]", node):
            found |= _tenant_strings(item, forward, key)
    elif isinstance(node, str):
        found |= _strings_of(node.strip(), key)
    return found


def _strings_of(value: str, key: str) -> set[str]:
    found: set[str] = set()
    if key not in VOCABULARY_KEYS:
        found.add(value)
    if key in NAME_KEYS:
        words = re.findall(r"[^\W\d_]{4,}", value)
        found |= {w for w in words if w.lower() not in COMMON_WORDS}
    for match in pack.ADDRESS.finditer(value):
        found.add(match.group(0))
        domain = match.group(1).lower()
        if domain not in pack.RESERVED_DOMAINS:
            found.add(domain)
            found.add(domain.split(".", 1)[0])
    return found


# -- deriving the pack -----------------------------------------------------------------------


@dataclass
class Derived:
    """A derived pack: its manifest and every output file's bytes, by path."""

    manifest: PackManifest
    files: dict[str, bytes] = field(default_factory=dict[str, bytes])


@dataclass
class _Package:
    name: str
    manifest: PackageManifest
    manifest_path: str
    manifest_text: str
    files: dict[str, bytes]


class _Build:
    """One derivation: the problems it found, and what it produced."""

    def __init__(self, tree: Mapping[str, bytes], rename_map: pack.RenameMap) -> None:
        self.tree = tree
        self.map = rename_map
        self.forward = Renamer(rename_map.forward)
        self.inverse = Renamer(rename_map.inverse)
        self.problems: list[Problem] = []
        self.renames = 0

    def public(self, path: str, data: bytes) -> tuple[str, bytes] | None:
        """One file renamed, proved to round-trip (its path too)."""
        text = _text(path, data, self.problems)
        if text is None:
            return None
        public_path, public_text = self.forward(path), self.forward(text)
        names = list(self.map.inverse)
        for src, out in ((path, public_path), (text, public_text)):
            wrong = pack.round_trip_problem(path, src, out, self.inverse, names)
            if wrong is not None:
                self.problems.append(wrong)
                return None
        self.renames += self.forward.count(path) + self.forward.count(text)
        return public_path, public_text.encode("utf-8")

    def packages(self) -> list[_Package]:
        roots = sorted(p.rsplit("/", 1)[0] for p in self.tree if p.count("/") == 1
                       and p.endswith("/" + PACKAGE_MANIFEST))  # fmt: skip
        found: list[_Package] = []
        for root in roots:
            files = {
                out[0]: out[1]
                for path, data in self.tree.items()
                if path.startswith(root + "/")
                for out in [self.public(path, data)]
                if out is not None
            }
            built = self._manifest(root, files)
            if built is not None:
                found.append(built)
        return found

    def _manifest(self, root: str, files: dict[str, bytes]) -> _Package | None:
        name = self.forward(root)
        path = f"{name}/{PACKAGE_MANIFEST}"
        if path not in files:
            return None
        text = files[path].decode("utf-8")
        try:
            manifest = PackageManifest.model_validate(yaml.safe_load(text))
        except (yaml.YAMLError, ValidationError) as exc:
            self.problems.append(
                Problem(f"{root}/{PACKAGE_MANIFEST}", 0, f"not a package manifest: {exc}")
            )
            return None
        if manifest.name != name:
            self.problems.append(
                Problem(
                    f"{root}/{PACKAGE_MANIFEST}",
                    pack.first_line_of(text, "name:"),
                    f"the package is named {manifest.name!r} but its directory gives {name!r}",
                )
            )
            return None
        inner = {p.removeprefix(name + "/"): d for p, d in files.items()}
        return _Package(name, manifest, f"{root}/{PACKAGE_MANIFEST}", text, inner)


def derive(
    source_dir: Path,
    map_path: Path,
    wheel: WheelPin,
    commit: str | None = None,
    say: Say = _quiet,
) -> Derived:
    """The pack from this source and map, or PackError naming every problem."""
    map_text = _read_map(map_path)
    rename_map, problems = pack.parse_map(map_text, map_path.name)
    tree = read_tree(source_dir)
    say(f"source: {len(tree)} files; map: {len(rename_map.renames)} renames")
    build = _Build(tree, rename_map)
    build.problems.extend(problems)
    version = _public_version(build)
    packages = build.packages()
    say(f"renamed and round-tripped {len(packages)} packages")
    order = _order(build, packages, wheel)
    values, context_problems = context_values(tree, build.forward)
    build.problems.extend(context_problems)
    identity = Identity(
        internal_names=tuple(rename_map.forward),
        internal_domains=rename_map.internal_domains,
        context_values=values,
    )
    archives = {p.name: _archive(p.name, p.files) for p in packages}
    entries = tuple(_entry(p, archives[p.name]) for p in packages)
    source = Source(digest=_source_digest(tree, map_text), commit=commit)
    manifest = PackManifest(
        public_version=version, source=source, wheel=wheel, packages=entries,
        install_order=tuple(order), renames=build.renames,
    )  # fmt: skip
    out = _output_files(manifest, archives, {p.name: p.version for p in entries})
    build.problems.extend(_leak_gate(packages, out, identity, build.inverse))
    if build.problems:
        raise PackError(tuple(sorted(set(build.problems))))
    say(f"leak gate passed over {sum(len(p.files) for p in packages)} files")
    return Derived(manifest, out)


def _read_map(map_path: Path) -> str:
    try:
        return map_path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise PackError(
            (Problem(str(map_path), 0, f"cannot read the rename map: {exc}"),)
        ) from None


def _public_version(build: _Build) -> str:
    data = build.tree.get(SOURCE_MANIFEST)
    if data is None:
        build.problems.append(Problem(SOURCE_MANIFEST, 0, "missing: it names the public version"))
        return "public-0"
    public = build.public(SOURCE_MANIFEST, data)
    if public is None:
        return "public-0"
    try:
        return SourceManifest.model_validate(yaml.safe_load(public[1])).public_version
    except (yaml.YAMLError, ValidationError) as exc:
        build.problems.append(Problem(SOURCE_MANIFEST, 0, f"not a source manifest: {exc}"))
        return "public-0"


def _order(build: _Build, packages: list[_Package], wheel: WheelPin) -> list[str]:
    manifests = {p.name: (p.manifest, p.manifest_path, p.manifest_text) for p in packages}
    build.problems.extend(pack.dependency_problems(manifests, [wheel.name]))
    build.problems.extend(
        Problem(p.manifest_path, pack.first_line_of(p.manifest_text, "name:"),
                f"a package may not be named {wheel.name!r}: that is the pinned wheel's name")
        for p in packages
        if p.name == wheel.name
    )  # fmt: skip
    graph: dict[str, tuple[str, ...]] = {p.name: p.manifest.depends for p in packages}
    graph[wheel.name] = ()
    order, cycle = pack.install_order(graph)
    if cycle is not None:
        first = next(p for p in packages if p.name == cycle[0])
        line = pack.dependency_line(first.manifest_text, cycle[1])
        build.problems.append(
            Problem(first.manifest_path, line, "a dependency cycle: " + " -> ".join(cycle))
        )
    return order


def _leak_gate(
    packages: list[_Package], out: Mapping[str, bytes], identity: Identity, inverse: Renamer
) -> list[Problem]:
    """Every leak in the public output, named at its source file's line (a rename never
    changes the lines) so that it is fixed where it was written."""
    problems: list[Problem] = []
    for package in packages:
        for path, data in sorted(package.files.items()):
            public = f"{package.name}/{path}"
            found = pack.leaks(public, data.decode("utf-8"), identity)
            problems += [Problem(inverse(public), p.line, p.message) for p in found]
    problems.extend(pack.leaks(PACK_JSON, out[PACK_JSON].decode("utf-8"), identity))
    return problems


def _source_digest(tree: Mapping[str, bytes], map_text: str) -> str:
    files = {path: pack.sha256(data) for path, data in tree.items()}
    files["<rename map>"] = pack.sha256(map_text.encode("utf-8"))
    return pack.code_digest(files)


def _entry(package: _Package, archive: bytes) -> PackageEntry:
    m = package.manifest
    return PackageEntry(
        name=m.name, version=m.version, depends=m.depends,
        archive=f"{PACKAGES}/{m.name}-{m.version}.tar.gz", sha256=pack.sha256(archive),
        files={p: pack.sha256(d) for p, d in sorted(package.files.items())},
    )  # fmt: skip


def _archive(name: str, files: Mapping[str, bytes]) -> bytes:
    """A reproducible archive: sorted entries, a fixed time, owner and mode (scripts
    executable), gzip without a name or time."""
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.GNU_FORMAT) as tar:
        for path in sorted(files):
            info = tarfile.TarInfo(f"{name}/{path}")
            info.size = len(files[path])
            info.mtime = ARCHIVE_MTIME
            info.mode = 0o755 if path.startswith("scripts/") else 0o644
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            tar.addfile(info, io.BytesIO(files[path]))
    return gzip.compress(raw.getvalue(), compresslevel=9, mtime=0)


def _output_files(
    manifest: PackManifest, archives: Mapping[str, bytes], versions: Mapping[str, str]
) -> dict[str, bytes]:
    out = {f"{PACKAGES}/{n}-{versions[n]}.tar.gz": data for n, data in archives.items()}
    out[PACK_JSON] = (json.dumps(manifest.model_dump(mode="json"), indent=2) + "\n").encode()
    out[SUMS] = "".join(f"{pack.sha256(d)}  {p}\n" for p, d in sorted(out.items())).encode()
    return out


# -- writing, verifying ------------------------------------------------------------------------


def write_pack(derived: Derived, out_dir: Path) -> None:
    """Write the pack into ``out_dir`` (new or empty), all files or none."""
    if out_dir.exists() and (not out_dir.is_dir() or any(out_dir.iterdir())):
        raise PackError(
            (Problem(str(out_dir), 0, "exists and is not an empty directory: remove it or "
                     "choose another --out"),)
        )  # fmt: skip
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", dir=out_dir.parent))
    try:
        for path, data in derived.files.items():
            target = staging / path
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)
            target.chmod(0o644)
        for folder in (staging, staging / PACKAGES):
            folder.chmod(0o755)
        with contextlib.suppress(FileNotFoundError):
            out_dir.rmdir()
        staging.rename(out_dir)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


def read_manifest(pack_dir: Path) -> PackManifest:
    path = pack_dir / PACK_JSON
    try:
        return PackManifest.model_validate_json(path.read_bytes())
    except OSError as exc:
        raise PackError((Problem(str(path), 0, f"cannot be read: {exc.strerror}"),)) from None
    except ValidationError as exc:
        raise PackError((Problem(str(path), 0, f"not a pack manifest: {exc}"),)) from None


def verify(
    pack_dir: Path, source_dir: Path, map_path: Path, wheel: WheelPin, say: Say = _quiet
) -> list[Problem]:
    """Every difference between the pack and the pack derived again from the source, the
    map and ``wheel`` (the running Outloop), with the source's own commit."""
    commit = source_commit(source_dir, map_path)
    again = derive(source_dir, map_path, wheel, commit, say)
    have = read_tree(pack_dir)
    try:
        problems = _input_problems(read_manifest(pack_dir), again.manifest)
    except PackError as exc:
        problems = [p for p in exc.problems if isinstance(p, Problem)]
    want = set(again.files)
    problems += [Problem(p, 0, "missing from the pack") for p in sorted(want - set(have))]
    problems += [Problem(p, 0, "not part of the pack") for p in sorted(set(have) - want)]
    for path in sorted(set(have) & want):
        if have[path] != again.files[path]:
            problems.append(_first_difference(path, have[path], again.files[path]))
    problems += sum_problems(pack_dir, have)
    return problems


def _input_problems(shipped: PackManifest, derived: PackManifest) -> list[Problem]:
    """What the pack says about its inputs that the source and the running code do not."""
    problems: list[Problem] = []
    if shipped.wheel != derived.wheel:
        problems.append(
            Problem(PACK_JSON, 0, f"it pins outloop {shipped.wheel.version} (code "
                    f"{shipped.wheel.code_sha256[:12]}); the running Outloop is "
                    f"{derived.wheel.version} (code {derived.wheel.code_sha256[:12]})")
        )  # fmt: skip
    if shipped.source != derived.source:
        problems.append(
            Problem(PACK_JSON, 0, f"it names the source {shipped.source.model_dump()}; the "
                    f"source given is {derived.source.model_dump()}")
        )  # fmt: skip
    return problems


def _first_difference(path: str, have: bytes, want: bytes) -> Problem:
    if path.endswith(".tar.gz"):
        try:
            mine, theirs = unpack(have), unpack(want)
        except (OSError, tarfile.TarError, EOFError, PackError):
            return Problem(path, 0, "differs from the derived pack and is not a readable archive")
        for inner in sorted(set(mine) | set(theirs)):
            if mine.get(inner) != theirs.get(inner):
                return _first_difference(
                    f"{path}!{inner}", mine.get(inner, b""), theirs.get(inner, b"")
                )
        return Problem(path, 0, "differs from the derived pack (its archive bytes)")
    mine_lines, want_lines = have.splitlines(), want.splitlines()
    for number, (a, b) in enumerate(zip(mine_lines, want_lines, strict=False), start=1):
        if a != b:
            return Problem(path, number, "differs from the derived pack")
    return Problem(path, min(len(mine_lines), len(want_lines)) + 1, "differs from the derived pack")


def sum_problems(pack_dir: Path, have: Mapping[str, bytes]) -> list[Problem]:
    """SHA256SUMS must list every other file of the pack, each with its checksum."""
    sums = have.get(SUMS)
    if sums is None:
        return [Problem(SUMS, 0, "missing: the pack's checksums")]
    listed: dict[str, str] = {}
    problems: list[Problem] = []
    for number, line in enumerate(sums.decode("utf-8", "replace").splitlines(), start=1):
        digest, _, path = line.partition("  ")
        if len(digest) != 64 or not path:
            problems.append(Problem(SUMS, number, "not a 'sha256  path' line"))
            continue
        listed[path] = digest
        if path not in have:
            problems.append(Problem(SUMS, number, f"lists {path}, which is not in the pack"))
        elif pack.sha256(have[path]) != digest:
            problems.append(Problem(path, 0, f"its SHA-256 is not the one {SUMS} lists"))
    problems += [
        Problem(p, 0, f"not listed in {SUMS}") for p in sorted(set(have) - set(listed) - {SUMS})
    ]
    return problems


def unpack(archive: bytes) -> dict[str, bytes]:
    """An archive's regular files by path; anything else (links, devices, a path leaving the
    archive) is refused."""
    found: dict[str, bytes] = {}
    with tarfile.open(fileobj=io.BytesIO(archive), mode="r:gz") as tar:
        for member in tar.getmembers():
            path = PurePosixPath(member.name)
            if not member.isfile() or path.is_absolute() or ".." in path.parts:
                raise PackError((Problem(member.name, 0, "not a plain file inside the archive"),))
            extracted = tar.extractfile(member)
            assert extracted is not None
            found[member.name] = extracted.read()
    return found


# -- installing ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Installed:
    release: str
    path: Path
    previous: str | None
    order: tuple[str, ...]


def checked_pack(pack_dir: Path) -> tuple[PackManifest, dict[str, dict[str, bytes]]]:
    """The pack's manifest and each package's files, after every checksum, the file list,
    the dependencies and the order were checked; PackError naming each problem."""
    have = read_tree(pack_dir)
    problems = sum_problems(pack_dir, have)
    if problems:
        raise PackError(tuple(problems))
    manifest = read_manifest(pack_dir)
    contents: dict[str, dict[str, bytes]] = {}
    for entry in manifest.packages:
        data = have.get(entry.archive)
        if data is None or pack.sha256(data) != entry.sha256:
            problems.append(
                Problem(entry.archive, 0, f"missing or not the archive {PACK_JSON} names")
            )
            continue
        contents[entry.name] = _checked_files(entry, unpack(data), problems)
    extra = set(have) - {SUMS, PACK_JSON} - {e.archive for e in manifest.packages}
    problems += [Problem(p, 0, f"not a package {PACK_JSON} names") for p in sorted(extra)]
    problems += _order_problems(manifest)
    if problems:
        raise PackError(tuple(problems))
    return manifest, contents


def _checked_files(
    entry: PackageEntry, files: Mapping[str, bytes], problems: list[Problem]
) -> dict[str, bytes]:
    inner = {p.removeprefix(entry.name + "/"): d for p, d in files.items()}
    where = entry.archive
    if set(inner) != set(entry.files) or any(
        pack.sha256(d) != entry.files[p] for p, d in inner.items()
    ):
        problems.append(Problem(where, 0, f"its files are not the ones {PACK_JSON} lists"))
        return inner
    try:
        declared = PackageManifest.model_validate(yaml.safe_load(inner[PACKAGE_MANIFEST]))
    except (KeyError, yaml.YAMLError, ValidationError):
        problems.append(Problem(where, 0, f"holds no readable {PACKAGE_MANIFEST}"))
        return inner
    if (declared.name, declared.version, declared.depends) != (
        entry.name,
        entry.version,
        entry.depends,
    ):
        problems.append(Problem(where, 0, f"its {PACKAGE_MANIFEST} is not what {PACK_JSON} says"))
    return inner


def _order_problems(manifest: PackManifest) -> list[Problem]:
    names = {e.name for e in manifest.packages} | {manifest.wheel.name}
    problems: list[Problem] = []
    if sorted(manifest.install_order) != sorted(names):
        problems.append(
            Problem(PACK_JSON, 0, "its installation order does not list each package once")
        )
    place = {n: i for i, n in enumerate(manifest.install_order)}
    for entry in manifest.packages:
        for dep in entry.depends:
            if dep not in names:
                problems.append(
                    Problem(PACK_JSON, 0, f"{entry.name} depends on {dep!r}, which the pack lacks")
                )
            elif place.get(dep, -1) > place.get(entry.name, -1):
                problems.append(
                    Problem(PACK_JSON, 0, f"{entry.name} is installed before its dependency {dep}")
                )
    return problems


def install(
    pack_dir: Path,
    target: Path,
    running: tuple[str, Mapping[str, str]],
    accept_drift: bool = False,
    say: Say = _quiet,
) -> Installed:
    """Check everything, then install in order into a new release and switch ``current``
    to it in one rename: a failure anywhere leaves the previous installation as it was."""
    manifest, contents = checked_pack(pack_dir)
    files = sum(len(c) for c in contents.values())
    say(f"checked {len(manifest.packages)} archives and their {files} files")
    found = pack.drift(manifest, running[0], running[1])
    if found.status != "in_sync" and not accept_drift:
        raise PackError(
            (Problem(PACK_JSON, 0, "the pack pins another Outloop than the one running ("
                     + "; ".join(found.differences) + "): install that Outloop first, or "
                     "pass --accept-drift to install it anyway (tasks then show it drifted)"),)
        )  # fmt: skip
    release = manifest.release()
    previous = _previous(target)
    final = target / RELEASES / release
    if not final.is_dir():
        _stage(final, manifest, contents, say)
    _switch(target, final)
    return Installed(release, final, previous, manifest.install_order)


def _previous(target: Path) -> str | None:
    """The release ``current`` names; refused when ``current`` is something else (a
    directory or file an install did not make: never replaced)."""
    current = target / CURRENT
    if current.exists() and not current.is_symlink():
        raise PackError(
            (Problem(str(current), 0, "is not an installation's link: move it away first"),)
        )
    return current_release(target)


def _directory(path: Path) -> None:
    """``path`` and its missing parents, each readable by all (whatever the umask)."""
    missing = [p for p in (path, *path.parents) if not p.exists()]
    for folder in reversed(missing):
        folder.mkdir(exist_ok=True)
        folder.chmod(0o755)


def _stage(
    final: Path,
    manifest: PackManifest,
    contents: Mapping[str, Mapping[str, bytes]],
    say: Say,
) -> None:
    """Write the release beside its final place, synced, then rename it there."""
    _directory(final.parent)
    staging = Path(tempfile.mkdtemp(prefix=".staging-", dir=final.parent))
    staging.chmod(0o755)
    try:
        for step, name in enumerate(manifest.install_order, start=1):
            if name == manifest.wheel.name:
                pin = f"{name} {manifest.wheel.version}"
                say(f"{step}/{len(manifest.install_order)} {pin}: the running Outloop (pinned)")
                continue
            for path, data in sorted(contents[name].items()):
                out = staging / name / path
                _directory(out.parent)
                out.write_bytes(data)
                out.chmod(0o755 if path.startswith("scripts/") else 0o644)
            say(f"{step}/{len(manifest.install_order)} {name}: {len(contents[name])} files")
        (staging / PACK_JSON).write_text(
            json.dumps(manifest.model_dump(mode="json"), indent=2) + "\n"
        )
        (staging / PACK_JSON).chmod(0o644)
        _fsync_tree(staging)
        staging.rename(final)
        _fsync_directory(final.parent)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


def _fsync_tree(root: Path) -> None:
    for path in sorted(root.rglob("*"), reverse=True):
        if path.is_file():
            with path.open("rb") as f:
                os.fsync(f.fileno())


def _switch(target: Path, final: Path) -> None:
    """Point ``current`` at ``final`` in one rename (a reader sees the old or the new)."""
    link = target / f".{CURRENT}.{os.getpid()}"
    with contextlib.suppress(FileNotFoundError):
        link.unlink()
    link.symlink_to(Path(RELEASES) / final.name)
    link.replace(target / CURRENT)
    _fsync_directory(target)


def _fsync_directory(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def current_release(target: Path) -> str | None:
    current = target / CURRENT
    if not current.is_symlink():
        return None
    return current.readlink().name


def status(target: Path, running: tuple[str, Mapping[str, str]]) -> Drift:
    """The installed pack against the running code: what a task record shows."""
    current = target / CURRENT
    if current.is_symlink() and not current.exists():
        return pack.unknown_drift(f"the installed release {current.readlink()} is missing")
    if not current.exists():
        return pack.unknown_drift(f"no pack is installed in {target}")
    try:
        manifest = read_manifest(current)
    except PackError as exc:
        return pack.unknown_drift(str(exc))
    return pack.drift(manifest, running[0], running[1])


def code_files(roots: Iterable[Path]) -> dict[str, str]:
    """Each Python module of these package directories by its path from their parent."""
    files: dict[str, str] = {}
    for root in roots:
        for path in sorted(root.rglob("*.py")):
            if "__pycache__" not in path.parts:
                files[path.relative_to(root.parent).as_posix()] = pack.sha256(path.read_bytes())
    return files
