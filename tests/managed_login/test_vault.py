"""The keyring vault: secrets by reference, an index of names only, errors without values."""

from __future__ import annotations

import stat
import traceback
from pathlib import Path

import pytest

from agent.domain.errors import ContextError, InvalidRequest
from agent.domain.secrets import CredentialRef, Secret
from agent.ports import Vault
from agent.testing.leaks import Canary, scan_file, scan_text
from managed_login.vault import KeyringVault, open_vault, read_key_file

WORKSPACE = "ws-test-0001"
MAILBOX = "support@fabrikam.test"


def ref(
    name: str = "password", workspace: str = WORKSPACE, mailbox: str = MAILBOX
) -> CredentialRef:
    return CredentialRef(workspace_id=workspace, mailbox_id=mailbox, name=name)


@pytest.fixture
def vault(tmp_path: Path) -> KeyringVault:
    return open_vault(tmp_path / "vault", "plain")


def every_text_of(exc: BaseException) -> str:
    """The exception as a traceback shows it, with everything chained to it."""
    return "".join(traceback.format_exception(exc)) + repr(exc.__cause__) + repr(exc.__context__)


def as_port(vault: KeyringVault) -> Vault:
    return vault  # the type checker holds KeyringVault to the Vault port here


def test_the_keyring_vault_is_the_vault_port(vault: KeyringVault) -> None:
    assert as_port(vault) is vault


def test_a_secret_set_is_read_back_listed_and_deleted(vault: KeyringVault) -> None:
    vault.set_secret(ref(), Secret("correct horse battery staple"))
    assert vault.secret(ref()).reveal() == "correct horse battery staple"
    assert vault.has_secret(ref())
    assert vault.list_refs() == [ref()]
    assert vault.delete_secret(ref()) is True
    assert not vault.has_secret(ref())
    assert vault.list_refs() == []
    with pytest.raises(ContextError):
        vault.secret(ref())


def test_secrets_survive_reopening_the_vault(tmp_path: Path) -> None:
    open_vault(tmp_path / "vault", "plain").set_secret(ref(), Secret("s3cret"))
    reopened = open_vault(tmp_path / "vault", "plain")
    assert reopened.secret(ref()).reveal() == "s3cret"
    assert reopened.list_refs() == [ref()]


def test_setting_again_replaces_the_value_and_lists_the_ref_once(vault: KeyringVault) -> None:
    vault.set_secret(ref(), Secret("first"))
    vault.set_secret(ref(), Secret("second"))
    assert vault.secret(ref()).reveal() == "second"
    assert vault.list_refs() == [ref()]


def test_refs_differing_in_any_part_or_only_in_case_are_separate_secrets(
    vault: KeyringVault,
) -> None:
    refs = [
        ref("password"),
        ref("Password"),
        ref("password", mailbox="billing@fabrikam.test"),
        ref("password", workspace="ws-other-0002"),
    ]
    for i, r in enumerate(refs):
        vault.set_secret(r, Secret(f"value-{i}"))
    assert [vault.secret(r).reveal() for r in refs] == [f"value-{i}" for i in range(len(refs))]
    assert sorted(vault.list_refs(), key=str) == sorted(refs, key=str)


def test_listing_one_workspace_gives_only_its_refs(vault: KeyringVault) -> None:
    vault.set_secret(ref("password"), Secret("a"))
    vault.set_secret(ref("totp"), Secret("b"))
    vault.set_secret(ref("password", workspace="ws-other-0002"), Secret("c"))
    assert vault.list_refs(WORKSPACE) == [ref("password"), ref("totp")]
    assert vault.list_refs("ws-other-0002") == [ref("password", workspace="ws-other-0002")]
    assert vault.list_refs("ws-none-0003") == []


def test_a_missing_secret_names_its_ref_and_the_command_that_stores_it(
    vault: KeyringVault,
) -> None:
    with pytest.raises(ContextError) as raised:
        vault.secret(ref("totp"))
    message = str(raised.value)
    assert f"{WORKSPACE}/{MAILBOX}/totp" in message
    assert f"outloop vault set {WORKSPACE} {MAILBOX} totp" in message


def test_deleting_a_secret_that_is_not_there_says_there_was_none(vault: KeyringVault) -> None:
    assert vault.delete_secret(ref()) is False
    vault.set_secret(ref("totp"), Secret("kept"))
    assert vault.delete_secret(ref()) is False
    assert vault.secret(ref("totp")).reveal() == "kept"


def test_an_empty_value_is_refused_and_nothing_is_stored(vault: KeyringVault) -> None:
    with pytest.raises(InvalidRequest):
        vault.set_secret(ref(), Secret(""))
    assert vault.list_refs() == []


def test_the_index_holds_the_names_and_never_a_value(vault: KeyringVault) -> None:
    canary = Canary.plant()
    vault.set_secret(ref(), Secret(canary.value))
    assert scan_file(canary, vault.index_file) == []
    assert "password" in vault.index_file.read_text(encoding="utf-8")
    # The value is in the keyring's file (base64, the plain backend), and only there.
    assert {f.form for f in scan_file(canary, vault.keyring_file)} == {"base64"}


def test_the_vault_files_are_private_to_their_owner(vault: KeyringVault) -> None:
    vault.set_secret(ref(), Secret("s3cret"))
    assert stat.S_IMODE(vault.directory.stat().st_mode) == 0o700
    for private in (vault.index_file, vault.keyring_file):
        assert stat.S_IMODE(private.stat().st_mode) == 0o600, private


def test_a_vault_is_opened_only_with_the_backend_it_was_created_with(tmp_path: Path) -> None:
    open_vault(tmp_path / "vault", "plain")
    with pytest.raises(ContextError, match="created with the 'plain' backend"):
        open_vault(tmp_path / "vault", "file", Secret("any key"))


@pytest.mark.parametrize(
    ("backend", "key", "says"),
    [
        ("file", None, "needs its key"),
        ("file", Secret("   "), "key is empty"),
        ("plain", Secret("a key"), "takes no key"),
        ("keychain", None, "unknown vault backend"),
    ],
)
def test_a_backend_without_the_key_it_needs_or_an_unknown_one_is_refused(
    tmp_path: Path, backend: str, key: Secret | None, says: str
) -> None:
    with pytest.raises(ContextError, match=says):
        open_vault(tmp_path / "vault", backend, key)  # type: ignore[arg-type]


def test_a_damaged_keyring_file_fails_without_quoting_it(vault: KeyringVault) -> None:
    # configparser's own errors quote the offending line: here, the value's base64.
    canary = Canary.plant()
    vault.set_secret(ref(), Secret(canary.value))
    vault.keyring_file.write_text(
        "".join(vault.keyring_file.read_text(encoding="utf-8").splitlines(keepends=True)[1:]),
        encoding="utf-8",
    )
    with pytest.raises(ContextError, match="could not read") as raised:
        vault.secret(ref())
    assert scan_text(canary, every_text_of(raised.value), "the error") == []


def test_the_key_file_gives_its_first_line_without_the_line_break(tmp_path: Path) -> None:
    key_file = tmp_path / "vault.key"
    key_file.write_text("a long passphrase\n", encoding="utf-8")
    assert read_key_file(key_file).reveal() == "a long passphrase"


@pytest.mark.parametrize(("content", "says"), [(None, "cannot read"), ("\n", "is empty")])
def test_a_missing_or_empty_key_file_is_refused_naming_it(
    tmp_path: Path, content: str | None, says: str
) -> None:
    key_file = tmp_path / "vault.key"
    if content is not None:
        key_file.write_text(content, encoding="utf-8")
    with pytest.raises(ContextError, match=says) as raised:
        read_key_file(key_file)
    assert str(key_file) in str(raised.value)


def test_the_encrypted_backend_round_trips_and_a_wrong_key_opens_nothing(tmp_path: Path) -> None:
    # The only test of the encrypted file: each of its operations costs about a second.
    canary = Canary.plant()
    key = Secret("operator's vault key")
    vault = open_vault(tmp_path / "vault", "file", key)
    vault.set_secret(ref(), Secret(canary.value))
    assert vault.secret(ref()).reveal() == canary.value
    assert vault.list_refs() == [ref()]
    assert stat.S_IMODE(vault.keyring_file.stat().st_mode) == 0o600
    for written in tmp_path.rglob("*"):
        if written.is_file():
            assert scan_file(canary, written) == [], written
    wrong_key = Canary.plant()
    with pytest.raises(ContextError, match="does not open") as raised:
        open_vault(tmp_path / "vault", "file", Secret(wrong_key.value))
    assert scan_text(wrong_key, every_text_of(raised.value), "the error") == []
    assert vault.delete_secret(ref()) is True
    assert vault.list_refs() == []
