"""The leak scanner finds a planted canary in every form it looks for, fails on what it
cannot read, and never shows the canary: a scan that cannot find a leak would pass silently.

Each test plants its own canary (never the session's) in its own scan root."""

from __future__ import annotations

import base64
import email.quoprimime
import json
import os
import quopri
import re
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import IO
from urllib.parse import quote, quote_plus

import pytest

from agent.testing import leaks
from agent.testing.leaks import (
    RANDOM_PART,
    Canary,
    TotpCodes,
    TotpSeed,
    Value,
    scan_text,
    scan_tree,
)
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


# -- quoted-printable, arbitrary values, authenticator seeds and codes --------------------


def _soft_wrapped(encoded: bytes, width: int, newline: bytes) -> bytes:
    """Quoted-printable text broken into lines of ``width`` with soft line breaks (never
    inside an ``=XX`` escape), as a mail encoder writes long lines."""
    out, line = b"", b""
    i = 0
    while i < len(encoded):
        step = 3 if encoded[i : i + 1] == b"=" else 1
        if len(line) + step > width:
            out += line + b"=" + newline
            line = b""
        line += encoded[i : i + step]
        i += step
    return out + line


QP_FORMS: dict[str, tuple[Callable[[bytes], bytes], str]] = {
    "body": (quopri.encodestring, "quoted-printable"),
    "body, spaces encoded": (lambda b: quopri.encodestring(b, quotetabs=True), "quoted-printable"),
    "body, lower case hex": (
        lambda b: re.sub(rb"=[0-9A-F]{2}", lambda m: m.group().lower(), quopri.encodestring(b)),
        "quoted-printable",
    ),
    "header (RFC 2047)": (
        lambda b: email.quoprimime.header_encode(b, "utf-8").encode(),
        "quoted-printable (header)",
    ),
    "soft line breaks (CRLF)": (
        lambda b: _soft_wrapped(quopri.encodestring(b), 7, b"\r\n"),
        "quoted-printable",
    ),
    "soft line breaks (LF)": (
        lambda b: _soft_wrapped(quopri.encodestring(b), 11, b"\n"),
        "quoted-printable",
    ),
}


@pytest.mark.parametrize("form", sorted(QP_FORMS))
def test_the_scan_finds_the_canary_quoted_printable(tmp_path: Path, form: str) -> None:
    canary = Canary.plant()
    encode, expected = QP_FORMS[form]
    leaked = tmp_path / "message.eml"
    leaked.write_bytes(b"Subject: x\r\n\r\nbefore " + encode(canary.value.encode()) + b" after\r\n")
    report = scan_tree(canary, tmp_path)
    assert [(f.where, f.form) for f in report.findings] == [(str(leaked), expected)], form


def test_an_ascii_only_canary_leaves_out_its_accent_and_is_found_the_same() -> None:
    canary = Canary.plant(ascii_only=True)
    assert canary.value.isascii() and " " in canary.value and "\\" in canary.value
    assert [f.form for f in scan_text(canary, json.dumps(canary.value), "t")] == ["JSON-escaped"]


PASSWORD = 'Pässwort "7"/\\x+&%= ~~~ end'  # no random part: every form is a pattern of its own

VALUE_FORMS: dict[str, tuple[Callable[[str], bytes], str]] = {
    "plain": (lambda v: v.encode(), "plain"),
    "JSON-escaped": (lambda v: json.dumps({"pw": v}).encode(), "JSON-escaped"),
    "JSON-escaped UTF-8": (
        lambda v: json.dumps({"pw": v}, ensure_ascii=False).encode(),
        "JSON-escaped (UTF-8)",
    ),
    "URL-encoded": (lambda v: b"pw=" + quote(v, safe="").encode(), "URL-encoded"),
    "URL-encoded form": (lambda v: b"pw=" + quote_plus(v).encode(), "URL-encoded (form)"),
    "URL-encoded keeping slashes": (lambda v: quote(v).encode(), "URL-encoded (keeping /)"),
    "Python repr": (lambda v: repr({"pw": v}).encode(), "Python repr"),
    "quoted-printable": (lambda v: quopri.encodestring(v.encode()), "quoted-printable"),
    "quoted-printable over soft breaks": (
        lambda v: _soft_wrapped(quopri.encodestring(v.encode()), 9, b"\r\n"),
        "quoted-printable",
    ),
    "base64 offset 1": (
        lambda v: base64.b64encode(b"x" + v.encode() + b"yz"),
        "base64",
    ),
    "base64 offset 2, wrapped": (
        lambda v: base64.encodebytes(os.urandom(59) + v.encode() + os.urandom(40)),
        "base64",
    ),
    "URL-safe base64": (
        lambda v: base64.urlsafe_b64encode(b"\xff\xfe" + v.encode()),
        "base64 (URL-safe)",
    ),
}


@pytest.mark.parametrize("form", sorted(VALUE_FORMS))
def test_the_scan_finds_an_arbitrary_secret_value_in_each_form(form: str) -> None:
    write, expected = VALUE_FORMS[form]
    found = scan_text(Value(PASSWORD, "the password"), b"<" + write(PASSWORD) + b">", "t")
    assert [(f.what, f.form) for f in found] == [("the password", expected)], form


def test_a_near_miss_of_an_arbitrary_value_is_not_a_finding() -> None:
    value = Value(PASSWORD, "the password")
    near = [PASSWORD[:-1], PASSWORD.upper(), PASSWORD.replace("ä", "a")]
    for text in near:
        for write, _ in VALUE_FORMS.values():
            assert scan_text(value, write(text), "t") == [], text
    with pytest.raises(ValueError, match="by chance"):
        Value("short")


SEED = "JBSWY3DPEHPK3PXPJBSWY3DPEHPK3PXQ"
SEED_FORMS: dict[str, tuple[bytes, str]] = {
    "as given": (f"secret={SEED}&issuer=x".encode(), "plain"),
    "lower case": (f'"{SEED.lower()}"'.encode(), "plain (lower case)"),
    "in groups": (" ".join(SEED[i : i + 4] for i in range(0, 32, 4)).encode(), "plain (in groups)"),
    "its key in hex": (base64.b32decode(SEED).hex().encode(), "its key in hex"),
    "its key in base64": (base64.b64encode(b"k" + base64.b32decode(SEED)), "its key in base64"),
    "split by a soft line break": (
        f"{SEED[:10]}=\r\n{SEED[10:]}".encode(),
        "quoted-printable",
    ),
    "base64": (base64.b64encode(f"otpauth://totp/x?secret={SEED}".encode()), "base64"),
}


@pytest.mark.parametrize("form", sorted(SEED_FORMS))
def test_the_scan_finds_an_authenticator_seed_in_each_form(form: str) -> None:
    text, expected = SEED_FORMS[form]
    found = scan_text(TotpSeed(SEED), text, "t")
    assert [(f.what, f.form) for f in found] == [("the TOTP seed", expected)], form


def test_another_seed_is_no_finding() -> None:
    other = "JBSWY3DPEHPK3PXPKBSWY3DPEHPK3PXQ"  # one letter off
    for text, _ in SEED_FORMS.values():
        assert scan_text(TotpSeed(other), text, "t") == []


CODE = "123456"
CODE_FOUND: dict[str, tuple[bytes, str]] = {
    "a whole token": (b"the code 123456 was typed", "whole token"),
    "at the end of a sentence": (b"typed 123456.", "whole token"),
    "a form value": (b"flowToken=x&otc=123456&rememberMFA=true", "form value"),
    "a JSON value": (b'{"otc": "123456"}', "form value"),
    "a JSON number": (b'{"otc": 123456}', "form value"),
    "after a colon": (b"code: 123456", "form value"),
    "URL-encoded": (b"q=otc%3D123456%26x", "URL-encoded"),
    "URL-encoded in quotes": (b"%22123456%22", "URL-encoded"),
    "quoted-printable": (b"otc=3D123456", "quoted-printable"),
    "split by a soft line break": (b"the code 123=\r\n456 was typed", "quoted-printable"),
    "JSON-escaped": (b'"{\\"otc\\": \\"123456\\"}"', "JSON-escaped"),
    "JSON unicode escape": (b"\\u0022123456\\u0022", "JSON-escaped"),
    "base64": (base64.b64encode(b'{"otc": "123456"}'), "base64"),
    "base64 at offset 1, wrapped": (
        base64.encodebytes(b"x" * 58 + b"otc=123456&remember=1" * 3),
        "base64",
    ),
    "URL-safe base64": (base64.urlsafe_b64encode(b"\xff\xfe\xfd otc=123456"), "base64 (URL-safe)"),
}
CODE_NOT_FOUND: dict[str, bytes] = {
    "inside an epoch timestamp": b"at 1800123456 the step",
    "in a millisecond timestamp": b'"ts": 1754123456789',
    "as a timestamp's fraction": b"1800000001.123456",
    "as an ISO time's microseconds": b"2027-01-15T08:00:01.123456Z",
    "before a decimal point": b"123456.5 seconds",
    "inside a hex id": b"id a123456b",
    "after letters": b"otc123456",
    "in a longer run of digits": b"1234567",
    "in base64 of a timestamp": base64.b64encode(b"ts=1800123456789"),
    "in base64 of a fraction": base64.b64encode(b"t=0.123456"),
}


@pytest.mark.parametrize("form", sorted(CODE_FOUND))
def test_the_scan_finds_a_totp_code_standing_alone(tmp_path: Path, form: str) -> None:
    text, expected = CODE_FOUND[form]
    (tmp_path / "trace.log").write_bytes(b"start\n" + text + b"\nend\n")
    report = scan_tree(TotpCodes([CODE, "654321"]), tmp_path)
    assert [(f.what, f.form) for f in report.findings] == [
        ("a TOTP code", f"{expected} (code 1 of 2)")
    ], form


@pytest.mark.parametrize("near_miss", sorted(CODE_NOT_FOUND))
def test_the_digits_of_a_code_inside_a_number_or_a_word_are_no_finding(near_miss: str) -> None:
    assert scan_text(TotpCodes([CODE]), CODE_NOT_FOUND[near_miss], "t") == [], near_miss


def test_a_code_across_the_read_chunks_is_found_once_and_its_context_kept(
    tmp_path: Path,
) -> None:
    codes = TotpCodes([CODE])
    across = tmp_path / "across.log"
    across.write_bytes(b"x" * (leaks.CHUNK - 3) + b" 123456 " + b"x" * 100)
    assert [f.form for f in scan_tree(codes, tmp_path).findings] == ["whole token (code 1 of 1)"]
    across.unlink()
    # The digit before the code ends the first chunk: the second chunk's overlap keeps it.
    number = tmp_path / "number.log"
    number.write_bytes(b"x" * (leaks.CHUNK - 1) + b"9123456 " + b"x" * 100)
    assert scan_tree(codes, tmp_path).clean
    # The overlap starts right at the code, its digit before it cut off: it was seen (and
    # passed over) with that digit in the chunk before.
    overlap = 4 * codes.longest
    number.write_bytes(b"x" * (leaks.CHUNK - overlap - 1) + b"9123456 " + b"x" * 1000)
    assert scan_tree(codes, tmp_path).clean


def test_a_scan_for_several_secrets_names_each_and_shows_none(tmp_path: Path) -> None:
    password, seed, codes = Canary.plant(), TotpSeed(SEED), TotpCodes([CODE])
    password.what = "the password"
    (tmp_path / "a.json").write_text(json.dumps({"pw": password.value, "otc": CODE}))
    (tmp_path / f"{SEED}.txt").write_text("setup key")
    report = scan_tree([password, seed, codes], tmp_path)
    assert sorted((Path(f.where).name, f.what, f.form) for f in report.findings) == [
        ("[the TOTP seed].txt (its name)", "the TOTP seed", "plain"),
        ("a.json", "a TOTP code", "form value (code 1 of 1)"),
        ("a.json", "the password", "JSON-escaped"),
    ]
    shown = "\n".join(report.lines())
    for secret in (password.token.decode(), SEED, CODE):
        assert secret not in shown
    assert "redacted" in repr(seed) and CODE not in repr(codes)
    with pytest.raises(ValueError, match="six digits"):
        TotpCodes(["12345"])
