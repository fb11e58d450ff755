"""``outloop workspace bootstrap``: a clean install starts with zero tenant rows, registers only
the workspace being installed, and only after every mailbox it binds answered live and proved
to be the bound one (Dovecot over IMAP, the mock Gmail API and Microsoft Graph). A wrong
mailbox, a mailbox that does not answer, a credential missing from the vault and a second
bootstrap each say what to fix and write no registry row."""

from __future__ import annotations

import json
import os
import socket
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
from click.testing import CliRunner

from agent.domain.secrets import CredentialRef, Secret
from agent.services import schedule
from agent.services.workspaces import DataDir
from agent.storage.sqlite import SqliteStore
from agent.testing.contexts import context_yaml
from managed_login.vault import open_vault
from mcp_server.cli import main
from tests.conftest import session_dovecot, session_mock

WS = "ws-bootstrap-0001"
PASSWORD = "dovecot-pw-1"
API_NAMES = ("oauth_client_id", "oauth_client_secret", "oauth_refresh_token")
ENDPOINTS = {
    "google": ("/gmail/v1", "/oauth2/google/token"),
    "microsoft": ("/graph/v1.0", "/oauth2/microsoft/common/oauth2/v2.0/token"),
}


@dataclass
class Install:
    """A clean data directory, a context file for one workspace, and its vault."""

    root: Path
    mailbox: str
    provider: str

    @property
    def data_dir(self) -> Path:
        return self.root / "data"

    def write_context(self, mailbox_fields: str, mailbox: str | None = None) -> Path:
        text = context_yaml(
            WS,
            mailbox=mailbox or self.mailbox,
            provider=self.provider,
            mailbox_fields=mailbox_fields,
        )
        path = self.root / "context.yaml"
        path.write_text(text, encoding="utf-8")
        return path

    def store_secret(self, name: str, value: str, mailbox: str | None = None) -> None:
        vault = open_vault(self.data_dir / "vault", "plain")
        ref = CredentialRef(workspace_id=WS, mailbox_id=mailbox or self.mailbox, name=name)
        vault.set_secret(ref, Secret(value))

    def bootstrap(self, context: Path, *extra: str) -> tuple[int, str]:
        env: dict[str, str | None] = {k: None for k in os.environ if k.startswith("OUTLOOP_")}
        env.update({"OUTLOOP_DATA_DIR": str(self.data_dir), "OUTLOOP_VAULT_BACKEND": "plain"})
        done = CliRunner().invoke(
            main, ["workspace", "bootstrap", "--context", str(context), *extra], env=env
        )
        return done.exit_code, done.stdout + done.stderr

    def rows(self) -> list[str]:
        store = SqliteStore(DataDir(self.data_dir).database)
        try:
            return [r.workspace_id for r in store.list_workspaces()]
        finally:
            store.close()


def _closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _imap_fields(user: str, port: int | None = None) -> str:
    dovecot = session_dovecot()
    return (
        f"server: {{imap: {{host: {dovecot.host}, port: {port or dovecot.imap_port}, "
        f"security: none}}, smtp: {{host: {dovecot.host}, port: 1, security: none}}, "
        f"username: '{user}'}}"
    )


def _imap_user() -> str:
    user = f"boot-{uuid.uuid4().hex[:10]}@fabrikam.test"
    session_dovecot().add_user(user, PASSWORD)
    return user


def _api_fields(provider: str, base: str | None = None) -> str:
    admin = session_mock()
    api, token = ENDPOINTS[provider]
    base = base or admin.base_url
    return f"api: {{base_url: '{base}{api}', token_url: '{admin.base_url}{token}'}}"


def _api_account(install: Install, provider: str, address: str | None = None) -> None:
    """A mock account at ``address`` (default the bound mailbox), its OAuth values stored
    for the bound mailbox."""
    account = session_mock().account(address or install.mailbox, provider)
    values = (account["client_id"], account["client_secret"], account["refresh_token"])
    for name, value in zip(API_NAMES, values, strict=True):
        install.store_secret(name, value)


Setup = Callable[[Install], Path]


def imap_ok(install: Install) -> Path:
    install.mailbox = _imap_user()
    install.store_secret("password", PASSWORD)
    return install.write_context(_imap_fields(install.mailbox))


def api_ok(install: Install) -> Path:
    install.mailbox = f"boot-{uuid.uuid4().hex[:10]}@fabrikam.test"
    _api_account(install, install.provider)
    return install.write_context(_api_fields(install.provider))


@pytest.fixture(params=["imap", "google", "microsoft"])
def install(request: pytest.FixtureRequest, tmp_path: Path) -> Install:
    return Install(tmp_path, "", request.param)


def _ok(install: Install) -> Path:
    return imap_ok(install) if install.provider == "imap" else api_ok(install)


def test_a_clean_install_has_zero_rows_and_registers_only_its_own_workspace(
    install: Install,
) -> None:
    context = _ok(install)
    assert install.rows() == []
    code, shown = install.bootstrap(context)
    assert code == 0, shown
    assert "runtime_operational" in shown and f"verified {install.mailbox}" in shown
    assert install.rows() == [WS]
    store = SqliteStore(DataDir(install.data_dir).database)
    try:
        row = store.get_workspace(WS)
        assert row is not None and row.schedule_minute is not None
        [binding] = store.bindings_for_mailbox(install.provider, install.mailbox)
        assert binding.workspace_id == WS
    finally:
        store.close()
    recorded = schedule.read_recorded(DataDir(install.data_dir).tenant_config(WS), WS)
    assert recorded is not None and recorded.choice.minute == row.schedule_minute
    assert recorded.expression == row.schedule_expression


def test_a_second_bootstrap_of_the_same_workspace_writes_nothing_and_says_what_to_run(
    install: Install,
) -> None:
    context = _ok(install)
    assert install.bootstrap(context)[0] == 0
    before = (DataDir(install.data_dir).tenant_config(WS)).read_text(encoding="utf-8")
    code, shown = install.bootstrap(context)
    assert code == 1
    assert "already registered" in shown and "outloop workspace update" in shown
    assert install.rows() == [WS]
    assert DataDir(install.data_dir).tenant_config(WS).read_text(encoding="utf-8") == before


def test_a_mailbox_that_signs_in_as_another_is_refused_and_nothing_is_registered(
    install: Install,
) -> None:
    if install.provider == "imap":
        other = _imap_user()
        install.mailbox = f"bound-{uuid.uuid4().hex[:8]}@fabrikam.test"
        install.store_secret("password", PASSWORD)
        context = install.write_context(_imap_fields(other))
    else:
        install.mailbox = f"bound-{uuid.uuid4().hex[:8]}@fabrikam.test"
        other = f"other-{uuid.uuid4().hex[:8]}@fabrikam.test"
        _api_account(install, install.provider, address=other)
        context = install.write_context(_api_fields(install.provider))
    code, shown = install.bootstrap(context)
    assert code == 1, shown
    assert "nothing was registered" in shown and other in shown and install.mailbox in shown
    assert install.rows() == []
    assert not DataDir(install.data_dir).tenant_config(WS).exists()


def test_a_mailbox_that_does_not_answer_is_refused_and_nothing_is_registered(
    install: Install,
) -> None:
    port = _closed_port()
    if install.provider == "imap":
        install.mailbox = _imap_user()
        install.store_secret("password", PASSWORD)
        context = install.write_context(_imap_fields(install.mailbox, port))
    else:
        install.mailbox = f"boot-{uuid.uuid4().hex[:10]}@fabrikam.test"
        _api_account(install, install.provider)
        context = install.write_context(_api_fields(install.provider, f"http://127.0.0.1:{port}"))
    code, shown = install.bootstrap(context)
    assert code == 1, shown
    assert "nothing was registered" in shown and install.mailbox in shown
    assert install.rows() == []


def test_a_credential_missing_from_the_vault_is_named_with_the_command_that_stores_it(
    install: Install,
) -> None:
    install.mailbox = f"boot-{uuid.uuid4().hex[:10]}@fabrikam.test"
    if install.provider == "imap":
        context = install.write_context(_imap_fields(install.mailbox))
        missing = "password"
    else:
        account = session_mock().account(install.mailbox, install.provider)
        install.store_secret("oauth_client_id", account["client_id"])
        context = install.write_context(_api_fields(install.provider))
        missing = "oauth_client_secret"
    code, shown = install.bootstrap(context)
    assert code == 1, shown
    assert f"outloop vault set {WS} {install.mailbox} {missing}" in shown
    assert install.rows() == []


def test_a_refused_bootstrap_with_json_prints_the_refusal_as_json(install: Install) -> None:
    context = _ok(install)
    assert install.bootstrap(context)[0] == 0
    code, shown = install.bootstrap(context, "--json")
    assert code == 1
    report = json.loads(shown[: shown.rindex("}") + 1])
    assert report["runtime_operational"] is False and report["registered"] is False
    assert "already registered" in report["error"]
