"""``outloop vault set|list|delete``: values come in only through a hidden prompt or stdin,
and no command ever prints one."""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest
from click.testing import CliRunner

from agent.domain.secrets import CredentialRef
from agent.testing.leaks import Canary, scan_text
from managed_login.vault import open_vault
from mcp_server.cli import main
from tests.test_cli import OUTLOOP, TIMEOUT

WORKSPACE = "ws-test-0001"
MAILBOX = "support@fabrikam.test"
REF = CredentialRef(workspace_id=WORKSPACE, mailbox_id=MAILBOX, name="password")


@dataclass(frozen=True)
class Done:
    """How a command ended: its exit code and what it wrote on stdout and stderr."""

    returncode: int
    stdout: str
    stderr: str


VAULT_SETTINGS = ("OUTLOOP_VAULT_DIR", "OUTLOOP_VAULT_KEY", "OUTLOOP_VAULT_KEY_FILE")


@dataclass(frozen=True)
class VaultCli:
    """Runs ``outloop vault`` in this process (click's runner, its own stdin) with a plain
    vault in tmp_path."""

    data_dir: Path
    backend: str = "plain"

    def __call__(self, *args: str, stdin: str | None = None) -> Done:
        env: dict[str, str | None] = {
            k: None for k in (*os.environ, *VAULT_SETTINGS) if k.startswith("OUTLOOP_")
        }
        env.update({"OUTLOOP_DATA_DIR": str(self.data_dir), "OUTLOOP_VAULT_BACKEND": self.backend})
        done = CliRunner().invoke(main, ["vault", *args], input=stdin, env=env)
        return Done(done.exit_code, done.stdout, done.stderr)

    def stored(self, ref: CredentialRef = REF) -> str | None:
        vault = open_vault(self.data_dir / "vault", "plain")
        return vault.secret(ref).reveal() if vault.has_secret(ref) else None


@pytest.fixture
def vault_cli(tmp_path: Path) -> VaultCli:
    return VaultCli(data_dir=tmp_path / "data")


def shown(done: Done | subprocess.CompletedProcess[str]) -> str:
    return done.stdout + done.stderr


def test_a_value_piped_with_stdin_is_stored_listed_and_deleted_and_never_printed(
    vault_cli: VaultCli,
) -> None:
    canary = Canary.plant()
    runs = [vault_cli("set", WORKSPACE, MAILBOX, "password", "--stdin", stdin=canary.value + "\n")]
    assert runs[-1].returncode == 0, runs[-1].stderr
    assert runs[-1].stdout == f"stored {REF}\n"
    assert vault_cli.stored() == canary.value  # the final line break is not part of it
    runs.append(vault_cli("list"))
    assert runs[-1].stdout == f"{WORKSPACE}\t{MAILBOX}\tpassword\n"
    runs.append(vault_cli("delete", WORKSPACE, MAILBOX, "password"))
    assert runs[-1].stdout == f"deleted {REF}\n"
    assert vault_cli.stored() is None
    for done in runs:
        assert scan_text(canary, shown(done), "the command's output") == []


def test_setting_an_existing_secret_says_it_was_replaced(vault_cli: VaultCli) -> None:
    vault_cli("set", WORKSPACE, MAILBOX, "password", "--stdin", stdin="first")
    done = vault_cli("set", WORKSPACE, MAILBOX, "password", "--stdin", stdin="second")
    assert done.stdout == f"replaced {REF}\n"
    assert vault_cli.stored() == "second"


@pytest.mark.parametrize(
    "given",
    [["{value}"], ["--value={value}"], ["--value", "{value}"], ["--", "{value}"]],
    ids=["positional", "option=", "option", "after --"],
)
def test_a_value_given_as_an_argument_is_refused_without_echoing_it(
    vault_cli: VaultCli, given: list[str]
) -> None:
    canary = Canary.plant()
    args = [a.format(value=canary.value) for a in given]
    done = vault_cli("set", WORKSPACE, MAILBOX, "password", *args, stdin="")
    assert done.returncode == 2
    assert "never given on the command line" in done.stderr
    assert scan_text(canary, shown(done), "the refusal") == []
    assert vault_cli.stored() is None


def test_list_prints_references_only_and_filters_by_workspace(vault_cli: VaultCli) -> None:
    canary = Canary.plant()
    for workspace, name in (
        (WORKSPACE, "password"),
        (WORKSPACE, "totp"),
        ("ws-other-0002", "password"),
    ):
        vault_cli("set", workspace, MAILBOX, name, "--stdin", stdin=canary.value)
    every = vault_cli("list")
    assert every.stdout.splitlines() == [
        f"ws-other-0002\t{MAILBOX}\tpassword",
        f"{WORKSPACE}\t{MAILBOX}\tpassword",
        f"{WORKSPACE}\t{MAILBOX}\ttotp",
    ]
    other = vault_cli("list", "--workspace", "ws-other-0002")
    assert other.stdout.splitlines() == [f"ws-other-0002\t{MAILBOX}\tpassword"]
    for done in (every, other):
        assert scan_text(canary, shown(done), "the listing") == []


def test_an_empty_vault_lists_nothing_and_says_how_to_store_a_secret(vault_cli: VaultCli) -> None:
    done = vault_cli("list")
    assert done.returncode == 0
    assert "no secrets stored" in done.stdout and "outloop vault set" in done.stdout


def test_delete_says_when_there_was_nothing_to_delete(vault_cli: VaultCli) -> None:
    done = vault_cli("delete", WORKSPACE, MAILBOX, "password")
    assert done.returncode == 0
    assert done.stdout == f"no secret {REF} was stored; nothing deleted\n"


@pytest.mark.parametrize("stdin", ["", "\n"], ids=["nothing", "a line break"])
def test_an_empty_value_is_refused_and_nothing_stored(vault_cli: VaultCli, stdin: str) -> None:
    done = vault_cli("set", WORKSPACE, MAILBOX, "password", "--stdin", stdin=stdin)
    assert done.returncode == 2
    assert "the value is empty" in done.stderr
    assert vault_cli.stored() is None


def test_a_reference_that_cannot_name_a_secret_is_refused(vault_cli: VaultCli) -> None:
    done = vault_cli("set", WORKSPACE, MAILBOX, "pass word", "--stdin", stdin="x")
    assert done.returncode == 2
    assert "does not name a secret" in done.stderr


def test_the_encrypted_vault_without_a_key_fails_saying_what_to_set(vault_cli: VaultCli) -> None:
    encrypted = VaultCli(vault_cli.data_dir, backend="file")
    done = encrypted("set", WORKSPACE, MAILBOX, "password", "--stdin", stdin="x")
    assert done.returncode == 1
    assert "OUTLOOP_VAULT_KEY_FILE" in done.stderr and "OUTLOOP_VAULT_BACKEND=plain" in done.stderr


def _prompted(vault_cli: VaultCli, typed: str) -> Done:
    """``vault set`` at its hidden prompt, typing ``typed``."""
    return vault_cli("set", WORKSPACE, MAILBOX, "password", stdin=typed)


def test_the_hidden_prompt_asks_twice_and_never_echoes_the_value(vault_cli: VaultCli) -> None:
    canary = Canary.plant()
    done = _prompted(vault_cli, f"{canary.value}\n{canary.value}\n")
    assert done.returncode == 0, done.stderr
    assert f"Value of {REF}" in done.stdout and f"stored {REF}" in done.stdout
    assert "Repeat for confirmation" in done.stdout
    assert scan_text(canary, shown(done), "the prompt") == []
    assert vault_cli.stored() == canary.value


def test_a_confirmation_that_differs_is_asked_for_again(vault_cli: VaultCli) -> None:
    canary = Canary.plant()
    done = _prompted(vault_cli, f"typo\n{canary.value}\n{canary.value}\n{canary.value}\n")
    assert done.returncode == 0, done.stderr
    assert "do not match" in shown(done)
    assert scan_text(canary, shown(done), "the prompt") == []
    assert vault_cli.stored() == canary.value


def test_the_installed_command_stores_a_piped_value_and_never_prints_it(tmp_path: Path) -> None:
    # Once as a real process: the console script, its own stdin and environment.
    canary = Canary.plant()
    env = {k: v for k, v in os.environ.items() if not k.startswith("OUTLOOP_")}
    env.update({"OUTLOOP_DATA_DIR": str(tmp_path / "data"), "OUTLOOP_VAULT_BACKEND": "plain"})
    done = subprocess.run(
        [*OUTLOOP, "vault", "set", WORKSPACE, MAILBOX, "password", "--stdin"],
        input=canary.value + "\n",
        capture_output=True,
        text=True,
        encoding="utf-8",
        env={**env, "PYTHONIOENCODING": "utf-8"},
        timeout=TIMEOUT,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert scan_text(canary, shown(done), "the command's output") == []
    assert VaultCli(tmp_path / "data").stored() == canary.value
