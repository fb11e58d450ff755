"""The public pack's pure rules: the rename map, whole-identifier renames, the round trip,
the installation order, the leak gate and drift."""

from __future__ import annotations

import pytest

from agent.domain import pack
from agent.domain.pack import Identity, Renamer, WheelPin

MAP = """\
# internal -> public
harbor                 -> outloop
harbor-email-lifecycle -> outloop-email-lifecycle
harbor.internal        -> outloop.example
wiki.harbor.internal   -> docs.outloop.example
hbx_receipt_ack        -> receipt_ack
hb_evaluate            -> evaluate_guards
@internal-domain harbor.internal
"""


def parsed(text: str) -> tuple[pack.RenameMap, list[str]]:
    found, problems = pack.parse_map(text, "map.txt")
    return found, [str(p) for p in problems]


def test_a_map_reads_its_renames_and_internal_domains() -> None:
    found, problems = parsed(MAP)
    assert problems == []
    assert found.forward["harbor-email-lifecycle"] == "outloop-email-lifecycle"
    assert found.internal_domains == ("harbor.internal",)
    assert [r.line for r in found.renames][:2] == [2, 3]


@pytest.mark.parametrize(
    ("lines", "expected"),
    [
        (
            "a-name -> public-one\nb-name -> public-one\n",
            "map.txt:2: 'b-name' and 'a-name' (line 1) would collide",
        ),
        (
            "alpha -> beta\nbeta -> gamma\n",
            "map.txt:1: 'beta' is a public name and an internal one: ambiguous in reverse",
        ),
        ("alpha -> beta\nalpha -> gamma\n", "map.txt:2: 'alpha' is renamed twice (line 1)"),
        ("alpha -> alpha\n", "map.txt:1: 'alpha' is renamed to itself"),
        (
            "harbor -> harbor-public\n",
            "map.txt:1: the public name 'harbor-public' contains the internal 'harbor'",
        ),
        ("just one name\n", "map.txt:1: write 'internal -> public'"),
        ("-> nothing\n", "map.txt:1: write 'internal -> public'"),
    ],
)
def test_a_map_that_cannot_be_inverted_or_would_leak_is_refused_at_its_line(
    lines: str, expected: str
) -> None:
    _, problems = parsed(lines)
    assert any(p.startswith(expected) for p in problems), problems


def test_renames_match_whole_identifiers_and_the_longest_name_wins() -> None:
    found, _ = parsed(MAP)
    forward = Renamer(found.forward)
    text = (
        "harbor-email-lifecycle uses harbor://skills and harbor.execution.claim\n"
        "see https://wiki.harbor.internal/runbooks and mail.harbor.internal\n"
        "hbx_receipt_ack: false  # not hbx_receipt_ack_extra nor harbor-ops nor harbors\n"
        "def hb_evaluate(): return hb_evaluate_all()\n"
    )
    assert forward(text) == (
        "outloop-email-lifecycle uses outloop://skills and outloop.execution.claim\n"
        "see https://docs.outloop.example/runbooks and mail.outloop.example\n"
        "receipt_ack: false  # not hbx_receipt_ack_extra nor harbor-ops nor harbors\n"
        "def evaluate_guards(): return hb_evaluate_all()\n"
    )
    assert Renamer(found.inverse)(forward(text)) == text


def test_a_source_line_already_holding_a_public_name_does_not_round_trip() -> None:
    found, _ = parsed(MAP)
    source = "first line\nrun harbor, or outloop if you prefer\n"
    public = Renamer(found.forward)(source)
    problem = pack.round_trip_problem(
        "SKILL.md", source, public, Renamer(found.inverse), found.inverse
    )
    assert problem is not None
    assert problem.line == 2
    assert "already says 'outloop'" in str(problem) and "collide" in str(problem)


def test_a_clean_source_round_trips() -> None:
    found, _ = parsed(MAP)
    source = "harbor-email-lifecycle\nhbx_receipt_ack: true\n"
    public = Renamer(found.forward)(source)
    assert (
        pack.round_trip_problem("a", source, public, Renamer(found.inverse), found.inverse) is None
    )


def test_the_installation_order_puts_dependencies_first_and_breaks_ties_by_name() -> None:
    graph = {"zeta": ["base"], "alpha": ["base"], "base": [], "top": ["zeta", "alpha"]}
    order, cycle = pack.install_order(graph)
    assert cycle is None
    assert order == ["base", "alpha", "zeta", "top"]
    shuffled = dict(reversed(list(graph.items())))
    assert pack.install_order(shuffled)[0] == order


def test_a_dependency_cycle_is_named() -> None:
    order, cycle = pack.install_order({"a": ["b"], "b": ["c"], "c": ["a"], "d": []})
    assert order == ["d"]
    assert cycle == ["a", "b", "c", "a"]


IDENTITY = Identity(
    internal_names=("harbor", "hbx_receipt_ack"),
    internal_domains=("harbor.internal",),
    context_values=(
        "Tidewater Freight",
        "yael.sharon@tidewater-freight.test",
        "tidewater-freight.test",
    ),
)


@pytest.mark.parametrize(
    ("text", "line", "kind"),
    [
        (
            "# Registry\n| Workspace label | Workspace ID |\n|---|---|\n| Acme | ws-1 |\n",
            4,
            "registry row",
        ),
        ("ok\nwrite to dana@contoso.com\n", 2, "outside the reserved example domains"),
        ("see https://wiki.harbor.internal/x\n", 1, "the internal domain 'harbor.internal'"),
        ("run Harbor-ops now\n", 1, "the internal identifier 'harbor'"),
        ("a\nb\nfor Tidewater Freight only\n", 3, "'Tidewater Freight', a name or address"),
        (
            "cc YAEL.SHARON@tidewater-freight.test\n",
            1,
            "a name or address of the source's workspace",
        ),
    ],
)
def test_the_leak_gate_finds_each_kind_of_leak_at_its_line(text: str, line: int, kind: str) -> None:
    found = pack.leaks("pkg/SKILL.md", text, IDENTITY)
    assert any(p.line == line and kind in p.message for p in found), found


def test_the_leak_gate_passes_reserved_domains_and_an_empty_registry() -> None:
    text = (
        "| Workspace label | Workspace ID | Intake project ID |\n|---|---|---|\n\n"
        "mail client@example.com, a@mail.example.org, b@host.test, c@x.invalid, d@corp.example\n"
    )
    assert pack.leaks("pkg/SKILL.md", text, IDENTITY) == []


def test_a_yaml_registry_with_entries_is_a_leak_and_an_empty_one_is_not() -> None:
    assert pack.leaks("c/defaults.yaml", "registry: []\nworkspaces: {max: 5}\n", IDENTITY) == []
    planted = pack.leaks(
        "c/defaults.yaml", "other: 1\nregistry:\n  - workspace_id: ws-9\n", IDENTITY
    )
    assert [p.line for p in planted] == [2]
    nested = pack.leaks("c/x.yaml", "items:\n  - workspaces:\n      ws-9: {label: A}\n", IDENTITY)
    assert [p.line for p in nested] == [2]
    as_json = pack.leaks("c/reg.json", '{"a": 1,\n "registry": [{"id": "ws-9"}]}', IDENTITY)
    assert [p.line for p in as_json] == [2]


def test_a_registry_in_a_fenced_block_or_a_table_without_outer_pipes_is_a_leak() -> None:
    fenced = "# Setup\n\n```yaml\nother: 1\nregistry: [ws-9]\n```\n"
    assert [p.line for p in pack.leaks("g/SKILL.md", fenced, IDENTITY)] == [5]
    bare = "Workspace label | Workspace ID\n--- | ---\nAcme | ws-1\n"
    assert [p.line for p in pack.leaks("g/SKILL.md", bare, IDENTITY)] == [3]


def test_an_asset_name_with_an_at_sign_is_not_an_address() -> None:
    assert pack.leaks("g/SKILL.md", "![logo](img/logo@2x.png)\n", IDENTITY) == []


def test_a_path_that_leaks_is_found_too() -> None:
    found = pack.leaks("pkg/harbor_notes.md", "clean\n", IDENTITY)
    assert [(p.line, "harbor" in p.message) for p in found] == [(0, True)]


def pin(version: str, files: dict[str, str]) -> pack.PackManifest:
    wheel = WheelPin(
        name="outloop", version=version, code_sha256=pack.code_digest(files), files=files
    )
    source = pack.Source(digest="0" * 64)
    return pack.PackManifest(
        public_version="public-2.3-rc.4", source=source, wheel=wheel, packages=(),
        install_order=("outloop",), renames=0,
    )  # fmt: skip


def test_drift_is_in_sync_only_when_the_running_code_is_the_pinned_code() -> None:
    files = {"agent/a.py": "1", "agent/b.py": "2"}
    assert pack.drift(pin("1.0", files), "1.0", files).status == "in_sync"
    drifted = pack.drift(pin("1.0", files), "1.1", {"agent/a.py": "9", "agent/c.py": "3"})
    assert drifted.status == "drifted"
    assert drifted.package_version == "public-2.3-rc.4"
    assert drifted.differences == (
        "the pack pins outloop 1.0; 1.1 runs",
        "changed agent/a.py",
        "added agent/c.py",
        "removed agent/b.py",
    )


def test_drift_names_at_most_a_few_differences_and_counts_the_rest() -> None:
    files = {f"agent/m{n}.py": "x" for n in range(30)}
    drifted = pack.drift(pin("1.0", files), "1.0", {})
    assert len(drifted.differences) == 11 and drifted.differences[-1] == "and 20 more"
