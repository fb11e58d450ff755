"""The composition root: settings read once from the command line's values and the
environment, and the station built from them."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from agent.domain.context import Endpoint, MailboxBinding, MailServer, Security
from agent.domain.errors import AuthenticationExpired, StoreError
from agent.domain.mail import Channel
from agent.domain.secrets import CredentialRef, Secret
from agent.providers.imap_smtp import ImapSmtpProvider
from mcp_server.composition import (
    DATABASE_URL_SETTING,
    Providers,
    Settings,
    open_station,
    open_vault,
    read_settings,
)

PASSWORD = "pw-not-to-be-shown"


@pytest.mark.parametrize(
    ("option", "environ", "expected"),
    [
        (Path("/opt/cli"), {"OUTLOOP_DATA_DIR": "/env", "XDG_DATA_HOME": "/xdg"}, "/opt/cli"),
        (None, {"OUTLOOP_DATA_DIR": "/env", "XDG_DATA_HOME": "/xdg"}, "/env"),
        (None, {"OUTLOOP_DATA_DIR": "", "XDG_DATA_HOME": "/xdg"}, "/xdg/outloop"),
        (None, {}, str(Path.home() / ".local" / "share" / "outloop")),
    ],
    ids=["option", "OUTLOOP_DATA_DIR", "XDG_DATA_HOME", "home"],
)
def test_the_data_dir_is_the_option_else_outloop_data_dir_else_the_xdg_data_directory(
    option: Path | None, environ: dict[str, str], expected: str
) -> None:
    assert read_settings(data_dir=option, environ=environ).data_dir == Path(expected)


def test_settings_hold_every_variable_read_and_never_show_the_database_url_or_the_token() -> None:
    url = f"postgresql://outloop:{PASSWORD}@db.internal/outloop"
    token = f"token-{PASSWORD}"
    settings = read_settings(
        data_dir=Path("/data"),
        environ={
            DATABASE_URL_SETTING: url,
            "OUTLOOP_MCP_TOKEN": token,
            "OUTLOOP_CRASHPOINT": "mid_reconcile:2",
        },
    )
    assert (settings.database_url, settings.mcp_token) == (url, token)
    assert settings.crashpoint == "mid_reconcile:2"
    assert PASSWORD not in repr(settings) and PASSWORD not in str(settings)


def test_unset_or_empty_variables_are_none() -> None:
    settings = read_settings(data_dir=Path("/data"), environ={DATABASE_URL_SETTING: ""})
    assert settings == Settings(data_dir=Path("/data"))


def test_without_a_database_url_the_station_is_sqlite_in_the_data_dir(tmp_path: Path) -> None:
    root = tmp_path / "new" / "data"
    station = open_station(Settings(data_dir=root))
    try:
        assert station.store.list_workspaces() == []
        assert station.data_dir.database.parent == root
        assert station.data_dir.database.is_file()
    finally:
        station.close()


def test_a_bad_database_url_fails_naming_the_setting(tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path, database_url=f"mysql://u:{PASSWORD}@h/db")
    with pytest.raises(StoreError) as raised:
        open_station(settings)
    assert DATABASE_URL_SETTING in str(raised.value)
    assert PASSWORD not in str(raised.value)


# -- which adapter reaches a mailbox ---------------------------------------------------------

IMAP_BINDING = {
    "mailbox_id": "Support@Fabrikam.test",
    "provider": "imap",
    "server": {
        "imap": {"host": "imap.fabrikam.test"},
        "smtp": {"host": "smtp.fabrikam.test", "security": "starttls"},
        "password": "imap-password",
    },
}


def test_an_imap_mailbox_is_reached_with_its_password_from_the_workspace_s_vault(
    tmp_path: Path,
) -> None:
    settings = Settings(data_dir=tmp_path, vault_backend="plain")
    ref = CredentialRef(
        workspace_id="ws-a", mailbox_id="support@fabrikam.test", name="imap-password"
    )
    open_vault(settings).set_secret(ref, Secret(PASSWORD))
    binding = MailboxBinding.model_validate(IMAP_BINDING)
    provider = Providers(settings)("ws-a", binding)
    assert isinstance(provider, ImapSmtpProvider)
    assert (provider.provider, provider.mailbox_id) == ("imap", "support@fabrikam.test")
    assert provider.capabilities.channel is Channel.IMAP
    with pytest.raises(AuthenticationExpired) as missing:  # another workspace's secret is not used
        Providers(settings)("ws-b", binding)
    assert "outloop vault set ws-b support@fabrikam.test imap-password" in str(missing.value)
    assert PASSWORD not in str(missing.value)


@pytest.mark.parametrize(
    ("server", "says"),
    [
        (None, "the imap channel needs server:"),
        (
            {"imap": {"host": "imap.fabrikam.test", "security": "none"}, "smtp": {"host": "s"}},
            "only for a server on this machine",
        ),
        (
            {"imap": {"host": "imap.fabrikam.test", "security": "starttls"}, "smtp": {"host": "s"}},
            "set imap.security to 'tls'",
        ),
        (
            {"imap": {"host": "i"}, "smtp": {"host": "s"}, "password": "not a name!"},
            "names a vault entry",
        ),
    ],
    ids=["no server", "clear text off this machine", "imap starttls", "password not a name"],
)
def test_an_imap_binding_that_cannot_work_is_refused_saying_what_to_change(
    server: dict[str, object] | None, says: str
) -> None:
    with pytest.raises(ValidationError) as refused:
        MailboxBinding.model_validate({**IMAP_BINDING, "server": server})
    assert says in str(refused.value)


def test_tls_ports_default_by_protocol_and_plain_text_is_allowed_on_loopback_only() -> None:
    server = MailServer.model_validate(IMAP_BINDING["server"])
    assert (server.imap.port_for("imap"), server.smtp.port_for("smtp")) == (993, 587)
    local = Endpoint(host="127.0.0.1", security=Security.NONE)
    assert local.port_for("imap") == 143
