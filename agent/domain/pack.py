"""The public pack: pure rules of a derivation by exact renames.

The public pack is the internal source with a closed list of exact identifier renames
applied, nothing else. An identifier is matched whole: the characters around it may not
continue an identifier (letters, digits, ``_``, ``-``), so ``harbor`` is renamed in
``harbor.execution.claim`` and ``harbor://`` but not inside ``harbor-ops``; where names
nest, the longest wins. Every file must come back to its source through the inverse map.

What the build refuses is found here as ``Problem`` values naming a file and a line: a map
that collides or reads two ways in reverse, a file that does not round-trip, a dependency
that does not resolve, a cycle, and anything in the output that leaks the source's
identity (a registry row, an address outside the reserved example domains, an internal
domain, an internal identifier, a name or address of the source's workspace contexts).
"""

from __future__ import annotations

import hashlib
import heapq
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import cast

import yaml as yaml_module
from pydantic import BaseModel, ConfigDict, Field, model_validator

IDENT = "A-Za-z0-9_-"
"""Characters that continue an identifier: a rename never matches next to one."""
PUBLIC_VERSION = re.compile(r"public-\d+(?:\.\d+)*(?:-(?:alpha|beta|rc)\.\d+)?")
"""The public version's form (seed 000: ``public-2.3-rc.4``)."""
PACKAGE_VERSION = re.compile(r"\d+(?:\.\d+)*(?:[-+][0-9A-Za-z.-]+)?")
RESERVED_DOMAINS = ("example.com", "example.net", "example.org")
RESERVED_TLDS = ("example", "test", "invalid")
FILE_SUFFIXES = frozenset({"png", "jpg", "jpeg", "gif", "svg", "webp", "ico", "pdf", "css", "js"})
"""What ends an asset's name (``logo@2x.png``), not an address."""
"""RFC 2606 and 6761: the only mail domains a public file may show."""
ADDRESS = re.compile(
    r"[A-Za-z0-9._%+-]+@((?:[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?\.)+[A-Za-z]{2,})"
)
WHEEL_KIND = "wheel"
PACKAGE_KIND = "package"


@dataclass(frozen=True, order=True)
class Problem:
    """Why a build or a check fails, at a file and line (line 0: the file as a whole)."""

    path: str
    line: int
    message: str

    def __str__(self) -> str:
        where = f"{self.path}:{self.line}" if self.line else self.path
        return f"{where}: {self.message}"


# -- the rename map -----------------------------------------------------------------------


@dataclass(frozen=True)
class Rename:
    internal: str
    public: str
    line: int


@dataclass(frozen=True)
class RenameMap:
    """A closed list of exact renames and the internal domains the output may never name."""

    source: str
    renames: tuple[Rename, ...]
    internal_domains: tuple[str, ...] = ()

    @property
    def forward(self) -> dict[str, str]:
        return {r.internal: r.public for r in self.renames}

    @property
    def inverse(self) -> dict[str, str]:
        return {r.public: r.internal for r in self.renames}


_NAME = re.compile(rf"[{IDENT}](?:[^\s]*[{IDENT}])?")
_DOMAIN_LINE = "@internal-domain"


def parse_map(text: str, source: str) -> tuple[RenameMap, list[Problem]]:
    """The map's lines: ``internal -> public``, ``@internal-domain NAME``, ``#`` comments."""
    renames: list[Rename] = []
    domains: list[str] = []
    problems: list[Problem] = []
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        if line.startswith(_DOMAIN_LINE):
            domain = line.removeprefix(_DOMAIN_LINE).strip().lower()
            if not domain or " " in domain:
                problems.append(Problem(source, number, "write '@internal-domain NAME'"))
            domains.append(domain)
            continue
        parts = [p.strip() for p in line.split("->")]
        if len(parts) != 2 or not all(_NAME.fullmatch(p) for p in parts):
            problems.append(
                Problem(
                    source,
                    number,
                    "write 'internal -> public': two names without spaces, each starting "
                    "and ending with a letter, digit, '_' or '-'",
                )
            )
            continue
        renames.append(Rename(parts[0], parts[1], number))
    found = RenameMap(source, tuple(renames), tuple(domains))
    return found, problems + map_problems(found)


def map_problems(rename_map: RenameMap) -> list[Problem]:
    """A map that is not one-to-one, chains, or would leak through its own public names."""
    problems: list[Problem] = []
    by_internal: dict[str, Rename] = {}
    by_public: dict[str, Rename] = {}
    internals = {r.internal for r in rename_map.renames}
    at = rename_map.source
    for r in rename_map.renames:
        if r.internal == r.public:
            problems.append(Problem(at, r.line, f"{r.internal!r} is renamed to itself"))
        if r.internal in by_internal:
            first = by_internal[r.internal].line
            problems.append(Problem(at, r.line, f"{r.internal!r} is renamed twice (line {first})"))
        if r.public in by_public:
            other = by_public[r.public]
            problems.append(
                Problem(
                    at,
                    r.line,
                    f"{r.internal!r} and {other.internal!r} (line {other.line}) would collide as "
                    f"{r.public!r}: the inverse could not tell them apart",
                )
            )
        if r.public in internals and r.public != r.internal:
            problems.append(
                Problem(
                    at,
                    r.line,
                    f"{r.public!r} is a public name and an internal one: ambiguous in reverse",
                )
            )
        for leaked in sorted(n for n in internals if n != r.public and mentions(r.public, n)):
            problems.append(
                Problem(
                    at, r.line, f"the public name {r.public!r} contains the internal {leaked!r}"
                )
            )
        by_internal.setdefault(r.internal, r)
        by_public.setdefault(r.public, r)
    return problems


def mentions(text: str, name: str) -> bool:
    """Whether ``text`` shows ``name`` as a word of its own, in any case: what a reader
    would see (looser than a rename's match: ``harbor-ops`` shows ``harbor``)."""
    return _mention_pattern(name).search(text) is not None


def _mention_pattern(name: str) -> re.Pattern[str]:
    return re.compile(rf"(?<![A-Za-z0-9]){re.escape(name)}(?![A-Za-z0-9])", re.IGNORECASE)


class Renamer:
    """The map applied as exact, whole-identifier renames, longest name first."""

    def __init__(self, renames: Mapping[str, str]) -> None:
        self._renames = dict(renames)
        names = sorted(self._renames, key=lambda n: (-len(n), n))
        self._pattern = (
            re.compile(rf"(?<![{IDENT}])(?:{'|'.join(re.escape(n) for n in names)})(?![{IDENT}])")
            if names
            else None
        )

    def __call__(self, text: str) -> str:
        if self._pattern is None:
            return text
        return self._pattern.sub(lambda m: self._renames[m.group(0)], text)

    def count(self, text: str) -> int:
        return 0 if self._pattern is None else len(self._pattern.findall(text))


def round_trip_problem(
    path: str, source: str, public: str, inverse: Renamer, public_names: Iterable[str]
) -> Problem | None:
    """None when the inverse map gives the source back, else the first line it does not."""
    back = inverse(public)
    if back == source:
        return None
    src_lines, back_lines = source.splitlines(), back.splitlines()
    for number, (want, got) in enumerate(zip(src_lines, back_lines, strict=False), start=1):
        if want != got:
            return Problem(path, number, _why_not_back(want, public_names))
    shorter = min(len(src_lines), len(back_lines)) + 1
    return Problem(path, shorter, "the inverse map does not give this file back")


def _why_not_back(line: str, public_names: Iterable[str]) -> str:
    clashes = sorted(
        n for n in public_names if re.search(rf"(?<![{IDENT}]){re.escape(n)}(?![{IDENT}])", line)
    )
    if clashes:
        shown = ", ".join(repr(n) for n in clashes)
        return (
            f"the source already says {shown}, a public name of the map: its rename would "
            "collide, and the inverse map would not give this line back"
        )
    return "the renames do not invert here: the inverse map gives another line back"


def first_line_of(text: str, needle: str) -> int:
    """The first line of ``text`` that holds ``needle`` (0 when none does)."""
    for number, line in enumerate(text.splitlines(), start=1):
        if needle in line:
            return number
    return 0


def dependency_line(text: str, name: str) -> int:
    """The line of a manifest that lists ``name`` as a dependency (its ``depends`` entry,
    matched as a whole name; 0 when none does)."""
    pattern = re.compile(rf"(?<![{IDENT}]){re.escape(name)}(?![{IDENT}])")
    inside = False
    for number, line in enumerate(text.splitlines(), start=1):
        if line.startswith("depends"):
            inside = True
        elif line[:1] not in (" ", "\t", "-", ""):
            inside = False
        if inside and pattern.search(line.partition("#")[0]):
            return number
    return 0


# -- packages, dependencies and the installation order ------------------------------------


NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]*$"
"""A package name: also a directory name, so never ``.``, ``..`` or a path."""


class PackageManifest(BaseModel):
    """A package's ``package.yaml``: its name, version and what it needs."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(pattern=NAME_PATTERN)
    version: str = Field(pattern=f"^{PACKAGE_VERSION.pattern}$")
    description: str = ""
    depends: tuple[str, ...] = ()


class SourceManifest(BaseModel):
    """The source tree's ``pack.yaml``."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    public_version: str = Field(pattern=f"^{PUBLIC_VERSION.pattern}$")


def dependency_problems(
    manifests: Mapping[str, tuple[PackageManifest, str, str]], available: Iterable[str]
) -> list[Problem]:
    """Every declared dependency must be a package of the distribution (or the pinned
    wheel). ``manifests``: package name -> (manifest, its path, its public text)."""
    known = set(manifests) | set(available)
    problems: list[Problem] = []
    for name in sorted(manifests):
        manifest, path, text = manifests[name]
        for dep in manifest.depends:
            if dep not in known:
                problems.append(
                    Problem(
                        path,
                        dependency_line(text, dep),
                        f"{name} depends on {dep!r}, which is not a package of this "
                        f"distribution (it has: {', '.join(sorted(known))})",
                    )
                )
            elif dep == name:
                problems.append(
                    Problem(path, dependency_line(text, dep), f"{name} depends on itself")
                )
    return problems


def install_order(graph: Mapping[str, Sequence[str]]) -> tuple[list[str], list[str] | None]:
    """Dependencies first, ties broken by name; and a cycle (its names, the first repeated at
    the end) when there is one."""
    needs = {name: {d for d in deps if d in graph and d != name} for name, deps in graph.items()}
    users: dict[str, set[str]] = {name: set() for name in graph}
    for name, deps in needs.items():
        for dep in deps:
            users[dep].add(name)
    ready = [name for name, deps in needs.items() if not deps]
    heapq.heapify(ready)
    order: list[str] = []
    waiting = {name: len(deps) for name, deps in needs.items()}
    while ready:
        name = heapq.heappop(ready)
        order.append(name)
        for user in sorted(users[name]):
            waiting[user] -= 1
            if waiting[user] == 0:
                heapq.heappush(ready, user)
    if len(order) == len(graph):
        return order, None
    return order, _a_cycle({n: needs[n] for n in graph if n not in order})


def _a_cycle(needs: Mapping[str, set[str]]) -> list[str]:
    """A cycle among nodes that all wait on one another (each has a dependency left)."""
    start = min(needs)
    path = [start]
    seen = {start: 0}
    while True:
        nxt = min(needs[path[-1]] & set(needs))
        if nxt in seen:
            return [*path[seen[nxt] :], nxt]
        seen[nxt] = len(path)
        path.append(nxt)


# -- the leak gate -------------------------------------------------------------------------


@dataclass(frozen=True)
class Identity:
    """What the output may never show: the source's internal names and domains, and the
    names and addresses of its workspace contexts."""

    internal_names: tuple[str, ...]
    internal_domains: tuple[str, ...]
    context_values: tuple[str, ...]


def reserved(domain: str) -> bool:
    domain = domain.lower().rstrip(".")
    if any(domain == d or domain.endswith("." + d) for d in RESERVED_DOMAINS):
        return True
    return domain.rsplit(".", 1)[-1] in RESERVED_TLDS


def leaks(path: str, text: str, identity: Identity) -> list[Problem]:
    """Everything in one public file (its path included) that would leak the source."""
    yaml = path.endswith((".yaml", ".yml", ".json"))
    problems = [Problem(path, n, m) for n, m in registry_rows(text, yaml=yaml)]
    for number, line in enumerate([path, *text.splitlines()]):
        problems.extend(Problem(path, number, m) for m in _line_leaks(line, identity))
    return problems


def _line_leaks(line: str, identity: Identity) -> list[str]:
    found: list[str] = []
    for match in ADDRESS.finditer(line):
        if match.group(1).rsplit(".", 1)[-1].lower() in FILE_SUFFIXES:
            continue
        if not reserved(match.group(1)):
            found.append(
                f"the address {match.group(0)!r} is outside the reserved example domains "
                "(example.com, example.net, example.org, .example, .test, .invalid)"
            )
    for domain in identity.internal_domains:
        if mentions(line, domain):
            found.append(f"the internal domain {domain!r}")
    for name in identity.internal_names:
        if mentions(line, name):
            found.append(f"the internal identifier {name!r} (a source name of the map)")
    for value in identity.context_values:
        if mentions(line, value):
            found.append(f"{value!r}, a name or address of the source's workspace contexts")
    return found


_SEPARATOR = re.compile(r"^[\s|:-]+$")
_FENCE = re.compile(r"^\s*(```|~~~)\s*([A-Za-z]*)")
REGISTRY_KEYS = frozenset({"registry", "workspaces"})
_EMPTY = "the public registry ships empty"


def registry_rows(text: str, yaml: bool = False) -> list[tuple[int, str]]:
    """Rows of a workspace registry: a Markdown table headed with ``Workspace ID`` that has
    rows, or (in a YAML or JSON file, or a fenced YAML/JSON block) a ``registry`` or
    ``workspaces`` key holding entries. The public registry is empty."""
    if yaml:
        return _structured_rows(text, 0)
    rows = _table_rows(text)
    for first, block in _fenced_blocks(text):
        rows += _structured_rows(block, first)
    return rows


def _table_rows(text: str) -> list[tuple[int, str]]:
    rows: list[tuple[int, str]] = []
    in_registry = False
    for number, line in enumerate(text.splitlines(), start=1):
        if "|" not in line:
            in_registry = False
            continue
        cells = [c.strip().lower() for c in line.strip().strip("|").split("|")]
        if in_registry and not _SEPARATOR.fullmatch(line) and any(cells):
            rows.append((number, f"a workspace registry row: {_EMPTY}"))
        elif "workspace id" in cells:
            in_registry = True
    return rows


def _fenced_blocks(text: str) -> list[tuple[int, str]]:
    """Each fenced YAML or JSON block with the line number before its first line."""
    blocks: list[tuple[int, str]] = []
    lines = text.splitlines()
    opened: tuple[int, str] | None = None
    for number, line in enumerate(lines, start=1):
        fence = _FENCE.match(line)
        if fence is None:
            continue
        if opened is None:
            opened = (number, fence.group(2).lower())
        else:
            if opened[1] in ("yaml", "yml", "json"):
                blocks.append((opened[0], "\n".join(lines[opened[0] : number - 1])))
            opened = None
    return blocks


def _structured_rows(text: str, offset: int) -> list[tuple[int, str]]:
    try:
        loaded: object = yaml_module.safe_load(text)
    except yaml_module.YAMLError:
        loaded = None
    keys = sorted(_registry_keys(loaded))
    rows: list[tuple[int, str]] = []
    for key in keys:
        line = _key_line(text, key)
        rows.append((offset + line, f"a workspace registry entry under {key!r}: {_EMPTY}"))
    return rows


def _registry_keys(node: object) -> set[str]:
    """The registry keys in a parsed document that hold entries (a non-empty list, or a
    mapping of mappings or lists)."""
    found: set[str] = set()
    if isinstance(node, dict):
        for key, value in cast("dict[object, object]", node).items():
            if str(key).lower() in REGISTRY_KEYS and _holds_entries(value):
                found.add(str(key))
            found |= _registry_keys(value)
    elif isinstance(node, list):
        for item in cast("list[object]", node):
            found |= _registry_keys(item)
    return found


def _holds_entries(value: object) -> bool:
    if isinstance(value, list):
        return bool(cast("list[object]", value))
    if isinstance(value, dict):
        values = cast("dict[object, object]", value).values()
        return any(isinstance(v, dict | list) for v in values)
    return False


def _key_line(text: str, key: str) -> int:
    pattern = re.compile(rf"""(?:^|[\s{{,"'-]){re.escape(key)}["']?\s*:""")
    for number, line in enumerate(text.splitlines(), start=1):
        if pattern.search(line):
            return number
    return 1


# -- the pack's manifest and drift ----------------------------------------------------------


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


class WheelPin(BaseModel):
    """The Outloop distribution the pack's helpers run on, pinned by version and by the
    digest of its code (each module's SHA-256, the same for a wheel and a checkout)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    kind: str = WHEEL_KIND
    name: str = Field(pattern=NAME_PATTERN)
    version: str
    code_sha256: str
    files: dict[str, str]

    @model_validator(mode="after")
    def _digest_is_of_the_files(self) -> WheelPin:
        if self.code_sha256 != code_digest(self.files):
            raise ValueError("code_sha256 is not the digest of the files it lists")
        return self


class PackageEntry(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    kind: str = PACKAGE_KIND
    name: str = Field(pattern=NAME_PATTERN)
    version: str = Field(pattern=f"^{PACKAGE_VERSION.pattern}$")
    depends: tuple[str, ...]
    archive: str
    sha256: str
    files: dict[str, str]
    """Each file's SHA-256, by its path inside the package."""


class Source(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    digest: str
    """The SHA-256 of the source tree and the map, file by file: the revision, always."""
    commit: str | None = None
    """The version-control commit, when the source is a clean checkout."""


class PackManifest(BaseModel):
    """``pack.json``: everything ``verify`` and ``install`` check."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    format: str = "outloop-pack/1"
    public_version: str = Field(pattern=f"^{PUBLIC_VERSION.pattern}$")
    source: Source
    wheel: WheelPin
    packages: tuple[PackageEntry, ...]
    install_order: tuple[str, ...]
    renames: int
    """How many renames the build applied (the map does real work)."""

    def release(self) -> str:
        """The installed release's name: the version and the manifest's own digest."""
        return f"{self.public_version}-{sha256(self.model_dump_json().encode())[:12]}"


def code_digest(files: Mapping[str, str]) -> str:
    lines = "".join(f"{digest}  {path}\n" for path, digest in sorted(files.items()))
    return sha256(lines.encode())


class Drift(BaseModel):
    """The installed pack against the running code."""

    model_config = ConfigDict(frozen=True)

    status: str = Field(description="in_sync, drifted or unknown")
    package_version: str | None = Field(description="the installed pack's public version")
    differences: tuple[str, ...] = Field(description="what differs (or why it is unknown)")


def drift(pack: PackManifest, version: str, files: Mapping[str, str], most: int = 10) -> Drift:
    """``in_sync`` when the running code is the pinned one, else ``drifted`` naming what
    differs: the version, then each module changed, added or removed."""
    pin = pack.wheel
    found: list[str] = []
    if pin.version != version:
        found.append(f"the pack pins outloop {pin.version}; {version} runs")
    changed = sorted(p for p in set(pin.files) & set(files) if pin.files[p] != files[p])
    added = sorted(set(files) - set(pin.files))
    removed = sorted(set(pin.files) - set(files))
    found += [f"changed {p}" for p in changed] + [f"added {p}" for p in added]
    found += [f"removed {p}" for p in removed]
    if not found:
        return Drift(status="in_sync", package_version=pack.public_version, differences=())
    shown = found[:most] + ([f"and {len(found) - most} more"] if len(found) > most else [])
    return Drift(status="drifted", package_version=pack.public_version, differences=tuple(shown))


def unknown_drift(why: str) -> Drift:
    return Drift(status="unknown", package_version=None, differences=(why,))
