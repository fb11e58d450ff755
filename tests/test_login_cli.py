"""``outloop login`` and ``outloop run --access browser``: an operator signs a Microsoft
mailbox's browser channel in with managed login (the worker's password and authenticator
secret from the vault, never shown), and runs a headless browser cycle on its session."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import pytest
from click.testing import CliRunner

from agent.domain.secrets import CredentialRef, Secret
from agent.testing.contexts import context_yaml
from agent.testing.providers import raw_message
from browser_adapters import webmail
from fixtures.admin import MockAdmin
from managed_login.totp import Codes
from managed_login.vault import open_vault
from mcp_server.cli import main
from tests.browser import chromium_executable
from tests.browser_adapters.outlook_mock import SECRET, WebClock
from tests.conftest import session_mock

WORKSPACE = "ws-login-0001"


@dataclass(frozen=True)
class Done:
    returncode: int
    stdout: str
    stderr: str

    @property
    def shown(self) -> str:
        return self.stdout + self.stderr


@dataclass(frozen=True)
class Station:
    data_dir: Path
    admin: MockAdmin
    address: str

    def outloop(self, *args: str) -> Done:
        env: dict[str, str | None] = {k: None for k in os.environ if k.startswith("OUTLOOP_")}
        env.update(
            {
                "OUTLOOP_DATA_DIR": str(self.data_dir),
                "OUTLOOP_VAULT_BACKEND": "plain",
                "OUTLOOP_BROWSER_EXECUTABLE": chromium_executable(),
            }
        )
        done = CliRunner().invoke(main, list(args), env=env)
        return Done(done.exit_code, done.stdout, done.stderr)

    def login(self, *extra: str) -> Done:
        return self.outloop("login", "--workspace", WORKSPACE, *extra)


@pytest.fixture
def admin() -> Iterator[MockAdmin]:
    mock = session_mock()
    yield mock
    mock.clear_faults()


@pytest.fixture
def station(tmp_path: Path, admin: MockAdmin, monkeypatch: pytest.MonkeyPatch) -> Station:
    """A workspace whose Microsoft mailbox permits only the browser channel, its worker's
    password and authenticator secret in the vault; the codes' clock is the test's."""
    address = f"login-{uuid.uuid4().hex[:10]}@fabrikam.test"
    admin.account(address, "microsoft")
    clock = WebClock(admin)
    monkeypatch.setattr(webmail, "Codes", partial(Codes, clock=clock, sleep=clock.sleep))
    fields = f"channels: [browser], browser: {{url: '{admin.base_url}/web/outlook/mail/'}}"
    context = tmp_path / "context.yaml"
    context.write_text(
        context_yaml(WORKSPACE, mailbox=address, provider="microsoft", mailbox_fields=fields),
        encoding="utf-8",
    )
    found = Station(tmp_path / "data", admin, address)
    added = found.outloop("workspace", "add", "--context", str(context))
    assert added.returncode == 0, added.shown
    vault = open_vault(found.data_dir / "vault", "plain")
    for name, value in (("password", "pw-" + address), ("totp", SECRET)):
        ref = CredentialRef(workspace_id=WORKSPACE, mailbox_id=address, name=name)
        vault.set_secret(ref, Secret(value))
    return found


def test_login_signs_the_browser_in_and_then_finds_it_signed_in_showing_no_secret(
    station: Station,
) -> None:
    done = station.login()
    assert done.returncode == 0, done.shown
    assert f"{station.address}: signed in as {station.address}" in done.stdout
    assert "account, password, code, stay_signed_in, arrived" in done.stdout
    again = station.login("--mailbox", station.address)
    assert again.returncode == 0, again.shown
    assert "already signed in" in again.stdout
    for shown in (done.shown, again.shown):
        assert "pw-" + station.address not in shown and SECRET not in shown


def test_login_at_a_challenge_exits_5_with_the_code_and_the_headed_command(
    station: Station,
) -> None:
    station.admin.faults(web_challenge="approve_sign_in")
    done = station.login()
    assert done.returncode == 5, done.shown
    assert "AUTH_CHALLENGE_UNRESOLVED" in done.stderr
    assert f"outloop login --workspace {WORKSPACE} --mailbox {station.address} --headed" in (
        done.stderr
    )
    station.admin.faults(web_challenge=None)  # a person resolved it; nobody said so yet
    run = station.outloop("run", "--workspace", WORKSPACE, "--once", "--access", "browser")
    assert (
        run.returncode == 4
        and "does not sign in again until an operator acknowledges it" in run.shown
    )
    resolved = station.login()
    assert resolved.returncode == 0, resolved.shown
    assert "the approve_sign_in challenge is resolved" in resolved.stdout
    run = station.outloop("run", "--workspace", WORKSPACE, "--once", "--access", "browser")
    assert run.returncode == 0, run.shown


def test_login_of_a_mailbox_that_does_not_permit_the_browser_says_what_to_add(
    station: Station,
) -> None:
    done = station.login("--mailbox", "nobody@fabrikam.test")
    assert done.returncode == 1
    assert "has no mailbox nobody@fabrikam.test" in done.stderr


def test_run_with_the_browser_reads_the_mailbox_through_outlook_on_the_web(
    station: Station,
) -> None:
    station.admin.deliver(station.address, raw_message(1))
    done = station.outloop("run", "--workspace", WORKSPACE, "--once", "--access", "browser")
    assert done.returncode == 0, done.shown
    assert "scanned 1 = " in done.stdout and "(clean)" in done.stdout
    [stored] = station.admin.stored(station.address, "inbox")
    assert stored["is_read"] is False  # read through the web app, marked read by nothing


@pytest.mark.slow
def test_login_reads_the_worker_secrets_from_the_encrypted_keyring(
    tmp_path: Path, admin: MockAdmin, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The real encrypted file backend (Argon2id and AES-GCM), its key in a file only its
    owner reads, end to end: the secrets stored with ``outloop vault set`` sign the browser
    in, and neither the vault's file nor the output shows them."""
    address = f"crypt-{uuid.uuid4().hex[:10]}@fabrikam.test"
    admin.account(address, "microsoft")
    clock = WebClock(admin)
    monkeypatch.setattr(webmail, "Codes", partial(Codes, clock=clock, sleep=clock.sleep))
    fields = f"channels: [browser], browser: {{url: '{admin.base_url}/web/outlook/mail/'}}"
    context = tmp_path / "context.yaml"
    context.write_text(
        context_yaml(WORKSPACE, mailbox=address, provider="microsoft", mailbox_fields=fields),
        encoding="utf-8",
    )
    key_file = tmp_path / "vault.key"
    key_file.write_text("a long operator passphrase for the test vault\n", encoding="utf-8")
    key_file.chmod(0o600)
    env: dict[str, str | None] = {k: None for k in os.environ if k.startswith("OUTLOOP_")}
    env.update(
        {
            "OUTLOOP_DATA_DIR": str(tmp_path / "data"),
            "OUTLOOP_VAULT_BACKEND": "file",
            "OUTLOOP_VAULT_KEY_FILE": str(key_file),
            "OUTLOOP_BROWSER_EXECUTABLE": chromium_executable(),
        }
    )

    def outloop(*args: str, stdin: str | None = None) -> Done:
        done = CliRunner().invoke(main, list(args), input=stdin, env=env)
        return Done(done.exit_code, done.stdout, done.stderr)

    assert outloop("workspace", "add", "--context", str(context)).returncode == 0
    password = "pw-" + address
    for name, value in (("password", password), ("totp", SECRET)):
        stored = outloop("vault", "set", WORKSPACE, address, name, "--stdin", stdin=value)
        assert stored.returncode == 0, stored.shown
    done = outloop("login", "--workspace", WORKSPACE)
    assert done.returncode == 0, done.shown
    assert f"{address}: signed in as {address}" in done.stdout
    for path in (tmp_path / "data" / "vault").iterdir():
        data = path.read_bytes()
        assert password.encode() not in data and SECRET.encode() not in data
    assert password not in done.shown and SECRET not in done.shown
