"""``outloop connect``: an operator stores a Gmail or Microsoft 365 mailbox's OAuth client and
refresh token, and the command proves them by signing in to the (mock) provider's API. Values
come in only through hidden prompts or stdin, and are never printed."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from click.testing import CliRunner

from agent.domain.secrets import CredentialRef
from agent.testing.contexts import context_yaml
from fixtures.admin import MockAdmin
from managed_login.vault import open_vault
from mcp_server.cli import main
from tests.conftest import session_mock

WORKSPACE = "ws-connect-0001"
NAMES = ("oauth_client_id", "oauth_client_secret", "oauth_refresh_token")
ENDPOINTS = {
    "google": ("/gmail/v1", "/oauth2/google/token"),
    "microsoft": ("/graph/v1.0", "/oauth2/microsoft/common/oauth2/v2.0/token"),
}


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
    """A data directory with one workspace whose mailbox is a mock account."""

    data_dir: Path
    admin: MockAdmin
    provider: str
    address: str
    values: tuple[str, str, str]

    def outloop(self, *args: str, stdin: str | None = None) -> Done:
        env: dict[str, str | None] = {k: None for k in os.environ if k.startswith("OUTLOOP_")}
        env.update({"OUTLOOP_DATA_DIR": str(self.data_dir), "OUTLOOP_VAULT_BACKEND": "plain"})
        done = CliRunner().invoke(main, list(args), input=stdin, env=env)
        return Done(done.exit_code, done.stdout, done.stderr)

    def connect(self, stdin: str | None = None, *extra: str) -> Done:
        return self.outloop(
            "connect", "--workspace", WORKSPACE, "--mailbox", self.address, *extra, stdin=stdin
        )

    def stored(self) -> list[str | None]:
        vault = open_vault(self.data_dir / "vault", "plain")
        refs = [
            CredentialRef(workspace_id=WORKSPACE, mailbox_id=self.address, name=n) for n in NAMES
        ]
        return [vault.secret(r).reveal() if vault.has_secret(r) else None for r in refs]


@pytest.fixture
def admin() -> Iterator[MockAdmin]:
    mock = session_mock()
    yield mock
    mock.clear_faults()


def _station(tmp_path: Path, admin: MockAdmin, provider: str) -> Station:
    address = f"connect-{uuid.uuid4().hex[:10]}@fabrikam.test"
    account = admin.account(address, provider)
    api, token = ENDPOINTS[provider]
    fields = f"api: {{base_url: '{admin.base_url}{api}', token_url: '{admin.base_url}{token}'}}"
    text = context_yaml(WORKSPACE, mailbox=address, provider=provider, mailbox_fields=fields)
    context = tmp_path / "context.yaml"
    context.write_text(text, encoding="utf-8")
    values = (account["client_id"], account["client_secret"], account["refresh_token"])
    station = Station(tmp_path / "data", admin, provider, address, values)
    added = station.outloop("workspace", "add", "--context", str(context))
    assert added.returncode == 0, added.shown
    return station


@pytest.mark.parametrize("provider", ["google", "microsoft"])
def test_connect_stores_the_three_values_signs_in_and_prints_none_of_them(
    tmp_path: Path, admin: MockAdmin, provider: str
) -> None:
    station = _station(tmp_path, admin, provider)
    done = station.connect("\n".join(station.values) + "\n", "--stdin")
    assert done.returncode == 0, done.shown
    assert "connected:" in done.stdout and station.address in done.shown
    stored = station.stored()
    assert stored[:2] == list(station.values[:2])
    if provider == "microsoft":  # the check's refresh rotated the token, written back
        assert stored[2] not in (None, station.values[2])
    else:
        assert stored[2] == station.values[2]
    for value in (*station.values, *(v for v in stored if v)):
        assert value not in done.shown


def test_connect_at_hidden_prompts_stores_what_was_typed(tmp_path: Path, admin: MockAdmin) -> None:
    station = _station(tmp_path, admin, "google")
    done = station.connect("\n".join(station.values) + "\n")
    assert done.returncode == 0, done.shown
    assert station.stored() == list(station.values)
    assert "OAuth client id" in done.shown
    for value in station.values:
        assert value not in done.shown


def test_a_revoked_refresh_token_fails_the_check_naming_what_to_do(
    tmp_path: Path, admin: MockAdmin
) -> None:
    station = _station(tmp_path, admin, "microsoft")
    admin.faults(revoke_tokens=station.address)
    done = station.connect("\n".join(station.values), "--stdin")
    assert done.returncode == 1
    assert "refresh token was refused" in done.stderr and "nothing was stored" in done.stderr
    assert f"outloop connect --workspace {WORKSPACE} --mailbox {station.address}" in done.stderr
    assert station.stored() == [None, None, None]
    for value in station.values:
        assert value not in done.shown


def test_values_that_do_not_sign_in_leave_the_stored_ones_as_they_were(
    tmp_path: Path, admin: MockAdmin
) -> None:
    station = _station(tmp_path, admin, "google")
    assert station.connect("\n".join(station.values), "--stdin").returncode == 0
    mistyped = (*station.values[:2], "not-the-refresh-token")
    done = station.connect("\n".join(mistyped), "--stdin")
    assert done.returncode == 1 and "nothing was stored" in done.stderr
    assert station.stored() == list(station.values)


def test_without_the_check_the_values_are_stored_and_nothing_is_asked_of_the_provider(
    tmp_path: Path, admin: MockAdmin
) -> None:
    station = _station(tmp_path, admin, "google")
    admin.faults(revoke_tokens=station.address)  # a check would fail: none is made
    done = station.connect("\n".join(station.values), "--stdin", "--no-check")
    assert done.returncode == 0, done.shown
    assert "connected" not in done.stdout and station.stored() == list(station.values)


def test_two_lines_on_stdin_store_nothing_and_say_three_are_read(
    tmp_path: Path, admin: MockAdmin
) -> None:
    station = _station(tmp_path, admin, "google")
    done = station.connect("\n".join(station.values[:2]), "--stdin")
    assert done.returncode == 2
    assert "reads 3 lines" in done.stderr and "nothing stored" in done.stderr
    assert station.stored() == [None, None, None]


def test_a_mailbox_the_workspace_does_not_have_is_refused_naming_its_mailboxes(
    tmp_path: Path, admin: MockAdmin
) -> None:
    station = _station(tmp_path, admin, "google")
    done = station.outloop(
        "connect", "--workspace", WORKSPACE, "--mailbox", "nobody@fabrikam.test", "--stdin",
        stdin="a\nb\nc\n",
    )  # fmt: skip
    assert done.returncode == 1
    assert "has no mailbox nobody@fabrikam.test" in done.stderr and station.address in done.stderr


def test_an_imap_mailbox_is_refused_pointing_at_its_password_instead(tmp_path: Path) -> None:
    text = context_yaml(
        WORKSPACE,
        mailbox="ops@fabrikam.test",
        provider="imap",
        mailbox_fields="server: {imap: {host: imap.fabrikam.test}, smtp: {host: smtp.fabrikam.test}}",
    )
    context = tmp_path / "context.yaml"
    context.write_text(text, encoding="utf-8")
    station = Station(tmp_path / "data", session_mock(), "imap", "ops@fabrikam.test", ("", "", ""))
    assert station.outloop("workspace", "add", "--context", str(context)).returncode == 0
    done = station.connect("a\nb\nc\n", "--stdin")
    assert done.returncode == 1
    assert "'imap' mailbox" in done.stderr and "outloop vault set" in done.stderr


def test_connect_has_help_naming_where_the_values_come_from() -> None:
    done = CliRunner().invoke(main, ["connect", "--help"])
    assert done.exit_code == 0
    assert "--stdin" in done.stdout and "hidden prompts" in done.stdout


@pytest.mark.parametrize("provider", ["google", "microsoft"])
def test_another_account_s_values_are_refused_and_nothing_is_stored(
    tmp_path: Path, admin: MockAdmin, provider: str
) -> None:
    station = _station(tmp_path, admin, provider)
    other = admin.account(f"personal-{uuid.uuid4().hex[:10]}@contoso.test", provider)
    values = (other["client_id"], other["client_secret"], other["refresh_token"])
    done = station.connect("\n".join(values), "--stdin")
    assert done.returncode == 1
    assert "another account's" in done.stderr and "nothing was stored" in done.stderr
    assert station.stored() == [None, None, None]
