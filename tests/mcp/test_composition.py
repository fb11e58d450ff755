"""The composition root: settings read once from the command line's values and the
environment, and the station built from them."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent.domain.errors import StoreError
from mcp_server.composition import DATABASE_URL_SETTING, Settings, open_station, read_settings

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
