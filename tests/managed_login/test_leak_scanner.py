"""The leak scanner finds a planted canary in every form it looks for, fails on what it
cannot read, and never shows the canary: a scan that cannot find a leak would pass silently.

Each test plants its own canary (never the session's) in its own scan root."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import IO
from urllib.parse import quote, quote_plus

import pytest

from agent.testing import leaks
from agent.testing.leaks import RANDOM_PART, Canary, scan_text, scan_tree
from managed_login.vault import open_vault
from tests.leak_canary import CANARY_REF

ROOT = Path(__file__).resolve().parents[2]


def _b64_run(canary: Canary, offset: int, encode: Callable[[bytes], bytes]) -> str:
    """The canary's base64 inside a longer base64 run, starting ``offset`` bytes in."""
    return encode(os.urandom(30 + offset) + canary.value.encode() + os.urandom(30)).decode()


FORMS: dict[str, tuple[Callable[[Canary], str], str]] = {
    "plain": (lambda c: c.value, "plain"),
    "JSON-escaped": (lambda c: json.dumps({"password": c.value}), "JSON-escaped"),
    "JSON-escaped UTF-8": (
        lambda c: json.dumps({"password": c.value}, ensure_ascii=False),
        "JSON-escaped (UTF-8)",
    ),
    "URL-encoded": (
        lambda c: f"https://idp.test/login?pw={quote(c.value, safe='')}",
        "URL-encoded",
    ),
    "URL-encoded form": (lambda c: f"user=a&pw={quote_plus(c.value)}", "URL-encoded (form)"),
    "URL-encoded keeping slashes": (lambda c: quote(c.value), RANDOM_PART),
    "Python repr": (lambda c: repr(c.value), RANDOM_PART),
    "base64 offset 0": (lambda c: _b64_run(c, 0, base64.b64encode), "base64"),
    "base64 offset 1": (lambda c: _b64_run(c, 1, base64.b64encode), "base64"),
    "base64 offset 2": (lambda c: _b64_run(c, 2, base64.b64encode), "base64"),
    "URL-safe base64": (lambda c: _b64_run(c, 1, base64.urlsafe_b64encode), "base64"),
    "base64 wrapped over lines": (lambda c: _b64_run(c, 2, base64.encodebytes), "base64"),
}


@pytest.mark.parametrize("form", sorted(FORMS))
def test_the_scan_finds_the_canary_written_to_a_file_in_each_form(
    tmp_path: Path, form: str
) -> None:
    canary = Canary.plant()
    write, expected = FORMS[form]
    root = tmp_path / "scan-root"
    (root / "deep" / "er").mkdir(parents=True)
    (root / "clean.txt").write_text("nothing to see", encoding="utf-8")
    leaked = root / "deep" / "er" / "leak.log"
    leaked.write_text(f"prefix {write(canary)} suffix\n", encoding="utf-8")
    report = scan_tree(canary, root)
    assert not report.clean
    assert {(f.where, f.form.split(" (")[0]) for f in report.findings} == {
        (str(leaked), expected.split(" (")[0])
    }, form


def test_a_canary_straddling_the_read_chunks_of_a_large_file_is_found(tmp_path: Path) -> None:
    canary = Canary.plant()
    big = tmp_path / "big.bin"
    half = len(canary.value) // 2
    big.write_bytes(b"x" * (leaks.CHUNK - half) + canary.value.encode() + b"x" * 100)
    assert [f.form for f in scan_tree(canary, tmp_path).findings] == ["plain"]


def test_a_tree_without_the_canary_is_clean(tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_text("nothing", encoding="utf-8")
    (tmp_path / "b.bin").write_bytes(os.urandom(4096))
    assert scan_tree(Canary.plant(), tmp_path).clean


def test_the_file_skipped_as_the_vaults_own_is_not_a_finding(tmp_path: Path) -> None:
    canary = Canary.plant()
    vault_file = tmp_path / "vault.cfg"
    vault_file.write_text(canary.value, encoding="utf-8")
    assert scan_tree(canary, tmp_path, skip=[vault_file]).clean


def test_an_unreadable_file_fails_the_scan(tmp_path: Path) -> None:
    # The suite runs as root, where file modes do not stop a read: the opener refuses.
    (tmp_path / "locked.db").write_bytes(b"data")
    (tmp_path / "open.txt").write_text("fine", encoding="utf-8")

    def refusing(path: Path) -> IO[bytes]:
        if path.name == "locked.db":
            raise PermissionError(13, "Permission denied", str(path))
        return path.open("rb")

    report = scan_tree(Canary.plant(), tmp_path, opener=refusing)
    assert not report.clean
    assert report.findings == []
    assert report.unreadable == [f"{tmp_path / 'locked.db'} (Permission denied)"]


def test_a_file_named_after_the_canary_is_a_finding_that_does_not_show_it(
    tmp_path: Path,
) -> None:
    canary = Canary.plant()
    token = canary.token.decode()
    (tmp_path / f"cache-{token}.json").write_text("{}", encoding="utf-8")
    report = scan_tree(canary, tmp_path)
    assert [f.form for f in report.findings] == [RANDOM_PART]
    assert all(token not in line for line in report.lines())


def test_a_canary_shows_redacted_and_a_report_never_holds_it(tmp_path: Path) -> None:
    canary = Canary.plant()
    (tmp_path / "leak.txt").write_text(canary.value, encoding="utf-8")
    assert repr(canary) == "Canary([redacted])"
    lines = scan_tree(canary, tmp_path).lines()
    assert lines
    assert all(scan_text(canary, line, "report") == [] for line in lines)


# -- the session plugin, end to end in a pytest of its own --------------------------------

CLEAN_SESSION = """
    def test_signs_in(canary_credentials, canary_ref):
        assert canary_credentials.secret(canary_ref)
    """
LEAKY_SESSION = """
    import json
    import logging


    def test_logs_the_password(canary_credentials, canary_ref):
        value = canary_credentials.secret(canary_ref).reveal()
        logging.getLogger("careless").debug("password is %s", value)


    def test_writes_the_password(canary_credentials, canary_ref, tmp_path):
        value = canary_credentials.secret(canary_ref).reveal()
        (tmp_path / "session.json").write_text(json.dumps({"pw": value}))


    def test_fails_showing_the_password(canary_credentials, canary_ref):
        value = canary_credentials.secret(canary_ref).reveal()
        assert value == "something else"


    class Result:
        def __init__(self, text):
            self.text = text

        def model_dump_json(self):
            return json.dumps({"content": [{"type": "text", "text": self.text}]})


    def test_returns_the_password(canary_credentials, canary_ref, leak_watch):
        value = canary_credentials.secret(canary_ref).reveal()
        leak_watch.check_result("the MCP result of sign_in", Result(value.encode().hex()))
        leak_watch.check_result("the MCP result of login", Result(value))
    """
FOUND_IN = [
    "a log record of careless (DEBUG) in test_inner.py::test_logs_the_password: the canary, plain",
    "session.json: the canary, JSON-escaped",
    "the call report of test_inner.py::test_fails_showing_the_password",
    "the MCP result of login: the canary, JSON-escaped",
]


def _inner_session(tmp_path: Path, tests: str) -> tuple[subprocess.CompletedProcess[str], str]:
    """A pytest session of its own, running only the leak canary plugin over ``tests``; its
    output and the canary it planted."""
    (tmp_path / "pytest.ini").write_text("[pytest]\n", encoding="utf-8")
    (tmp_path / "test_inner.py").write_text(textwrap.dedent(tests), encoding="utf-8")
    basetemp = tmp_path / "basetemp"
    command = [sys.executable, "-m", "pytest", "-p", "tests.leak_canary", "-p", "no:cacheprovider"]
    command += [f"--basetemp={basetemp}", "-c", "pytest.ini", "test_inner.py"]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        command, capture_output=True, text=True, cwd=tmp_path, env=env, timeout=120, check=False
    )
    planted = open_vault(basetemp / "leak-canary" / "vault", "plain").secret(CANARY_REF).reveal()
    return done, planted


def _leak_canary_section(output: str) -> str:
    """The leak canary's section of a session's output, up to the next section: what
    follows it (pytest's own failure summary, in full when it runs on CI) is pytest's."""
    lines = output[output.index("= leak canary =") :].splitlines()
    end = next((i for i, line in enumerate(lines[1:], 1) if line.startswith("=")), len(lines))
    return "\n".join(lines[:end])


def test_a_session_that_leaks_nothing_passes_with_the_canary_in_its_vault(tmp_path: Path) -> None:
    done, planted = _inner_session(tmp_path, CLEAN_SESSION)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "leak canary" not in done.stdout
    assert planted  # planted through the real vault, in the session's basetemp


def test_a_session_that_leaks_the_canary_fails_saying_where_but_not_what(tmp_path: Path) -> None:
    done, planted = _inner_session(tmp_path, LEAKY_SESSION)
    assert done.returncode == 1, done.stdout + done.stderr
    section = _leak_canary_section(done.stdout)
    for where in FOUND_IN:
        assert where in section, where
    assert "sign_in" not in section  # hex is no form of the canary
    assert planted not in section, "the report shows the canary itself"
