"""The vault's settings: read once by the composition root, and opened from them with an
error naming the variable to set whenever they cannot work."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent.domain.errors import ContextError
from agent.domain.secrets import CredentialRef, Secret
from managed_login import vault
from mcp_server.composition import Settings, open_vault, read_settings

KEY = "operator-key-not-to-be-shown"
REF = CredentialRef(
    workspace_id="ws-test-0001", mailbox_id="support@fabrikam.test", name="password"
)


def test_the_vault_settings_are_read_from_the_environment_and_never_show_the_key() -> None:
    settings = read_settings(
        data_dir=Path("/data"),
        environ={
            "OUTLOOP_VAULT_DIR": "/secrets/vault",
            "OUTLOOP_VAULT_BACKEND": "plain",
            "OUTLOOP_VAULT_KEY_FILE": "/secrets/vault.key",
            "OUTLOOP_VAULT_KEY": KEY,
        },
    )
    assert settings.vault_directory == Path("/secrets/vault")
    assert settings.vault_backend == "plain"
    assert settings.vault_key_file == Path("/secrets/vault.key")
    assert settings.vault_key is not None and settings.vault_key.reveal() == KEY
    assert KEY not in repr(settings) and KEY not in str(settings)


def test_by_default_the_vault_is_the_encrypted_file_in_the_data_dir_with_no_key() -> None:
    settings = read_settings(data_dir=Path("/data"), environ={"OUTLOOP_VAULT_KEY": ""})
    assert settings == Settings(data_dir=Path("/data"))
    assert settings.vault_directory == Path("/data/vault")
    assert settings.vault_backend == "file"


def test_a_plain_vault_opens_in_the_data_dir(tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path / "data", vault_backend="plain")
    open_vault(settings).set_secret(REF, Secret("s3cret"))
    assert open_vault(settings).secret(REF).reveal() == "s3cret"
    assert (tmp_path / "data" / "vault" / "index.json").is_file()


def test_the_encrypted_vault_opens_with_the_key_from_the_key_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # What reaches the vault, not the vault itself (its one test is in tests/managed_login).
    opened: list[tuple[Path, str, Secret | None]] = []
    monkeypatch.setattr(vault, "open_vault", lambda *given: opened.append(given))  # pyright: ignore[reportUnknownArgumentType, reportUnknownLambdaType]
    key_file = tmp_path / "vault.key"
    key_file.write_text(KEY + "\n", encoding="utf-8")
    open_vault(Settings(data_dir=tmp_path, vault_key_file=key_file))
    open_vault(Settings(data_dir=tmp_path, vault_key=Secret(KEY)))
    assert [(d, b, k.reveal() if k else None) for d, b, k in opened] == [
        (tmp_path / "vault", "file", KEY),
        (tmp_path / "vault", "file", KEY),
    ]


@pytest.mark.parametrize(
    ("settings", "says"),
    [
        (
            {"vault_backend": "keychain"},
            ["OUTLOOP_VAULT_BACKEND is 'keychain'", "'file'", "'plain'"],
        ),
        ({}, ["needs its key", "OUTLOOP_VAULT_KEY_FILE", "OUTLOOP_VAULT_BACKEND=plain"]),
        (
            {"vault_key": Secret(KEY), "vault_key_file": Path("/k")},
            ["both OUTLOOP_VAULT_KEY_FILE and OUTLOOP_VAULT_KEY"],
        ),
        (
            {"vault_backend": "plain", "vault_key": Secret(KEY)},
            ["'plain' (unencrypted) but a vault key is set"],
        ),
        (
            {"vault_key_file": Path("/nowhere/vault.key")},
            ["cannot read the vault key file /nowhere/vault.key"],
        ),
    ],
    ids=["unknown backend", "no key", "two keys", "plain with a key", "missing key file"],
)
def test_settings_that_cannot_open_a_vault_fail_naming_what_to_set(
    tmp_path: Path, settings: dict[str, object], says: list[str]
) -> None:
    with pytest.raises(ContextError) as raised:
        open_vault(Settings(data_dir=tmp_path, **settings))  # type: ignore[arg-type]
    for words in says:
        assert words in str(raised.value)
    assert KEY not in str(raised.value)
    assert not (tmp_path / "vault").exists()  # nothing opened, nothing created
