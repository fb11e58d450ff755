"""The vault: each mailbox's secrets in one keyring file, on a backend pinned in code.

``KeyringVault`` implements ``agent.ports.Vault`` over a keyring backend chosen here and
never over keyring's auto-detected default (which, on a headless server, is either the
failing backend or one that prompts on a terminal nobody watches):

- ``file``: keyrings.cryptfile's ``CryptFileKeyring`` (Argon2id and AES-GCM), its file in
  the vault directory, opened with the operator's key. The key is set in code; the library
  ignores its environment variable. Every read or write costs about a second (Argon2id).
- ``plain``: keyrings.alt's ``PlaintextKeyring`` (base64, file mode 0600), for tests and
  throwaway demo vaults only.

Each secret is the keyring entry of service ``outloop/<workspace>/<mailbox>/<name>``, user
``value``: the whole reference is in the service name because the file backends fold user
names to lower case (``Password`` and ``password`` would be one entry). Keyring cannot list
its entries, so the vault keeps its own index of references (names only, never a value)
beside the keyring file, replaced atomically, mode 0600. A value is written before its
index entry and deleted before it, under a lock on the directory, so the index lists
exactly the stored secrets unless a process died between the two writes (running the same
command again mends it).

Nothing here reads the environment: ``open_vault`` takes the directory, backend and key the
composition root read. No error message, and no exception chained to one, carries a value:
a failure of the backend is reported by its type only (its own text may quote the file).
"""

from __future__ import annotations

import fcntl
import json
import os
import tempfile
from collections.abc import Callable, Generator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Literal, Protocol, TypeVar, cast, get_args

from keyring.errors import PasswordDeleteError
from keyrings.alt.file import PlaintextKeyring  # pyright: ignore[reportMissingTypeStubs]
from keyrings.cryptfile.cryptfile import (  # pyright: ignore[reportMissingTypeStubs]
    CryptFileKeyring,
)
from pydantic import ValidationError

from agent.domain.errors import ContextError, InvalidRequest
from agent.domain.secrets import CredentialRef, Secret

__all__ = [
    "BACKENDS",
    "Backend",
    "KeyringVault",
    "open_vault",
    "read_key_file",
    "set_command",
]

Backend = Literal["file", "plain"]
BACKENDS: tuple[Backend, ...] = get_args(Backend)

SERVICE_PREFIX = "outloop"
USERNAME = "value"
INDEX_FILE = "index.json"
LOCK_FILE = ".lock"
KEYRING_FILES: dict[Backend, str] = {
    "file": "secrets.encrypted.cfg",
    "plain": "secrets.plain.cfg",
}

T = TypeVar("T")


class _Keyring(Protocol):
    """The three calls the vault makes of a keyring backend."""

    def get_password(self, service: str, username: str) -> str | None: ...

    def set_password(self, service: str, username: str, password: str) -> None: ...

    def delete_password(self, service: str, username: str) -> None: ...


def set_command(ref: CredentialRef) -> str:
    """The command an operator runs to store ``ref``."""
    return f"outloop vault set {ref.workspace_id} {ref.mailbox_id} {ref.name}"


class KeyringVault:
    """``agent.ports.Vault`` over one pinned keyring file backend, with an index of names.
    Open one with ``open_vault``."""

    def __init__(self, directory: Path, backend: Backend, keyring: _Keyring) -> None:
        self.directory = directory
        self.backend: Backend = backend
        self._keyring = keyring

    @property
    def keyring_file(self) -> Path:
        """The keyring's file: the only place a value is written."""
        return self.directory / KEYRING_FILES[self.backend]

    @property
    def index_file(self) -> Path:
        """The index of references (names only)."""
        return self.directory / INDEX_FILE

    def secret(self, ref: CredentialRef) -> Secret:
        """The secret, or ``ContextError`` naming ``ref`` and the command that stores it."""
        with self._locked(fcntl.LOCK_SH):
            value = _guarded(f"read {ref}", lambda: self._keyring.get_password(*_entry(ref)))
        if value is None:
            raise ContextError(
                f"no secret {ref} in the vault at {self.directory}; store it with "
                f"'{set_command(ref)}'"
            )
        return Secret(value)

    def has_secret(self, ref: CredentialRef) -> bool:
        """Whether the index lists ``ref`` (no value is decrypted to answer)."""
        with self._locked(fcntl.LOCK_SH):
            return ref in self._read_index()

    def set_secret(self, ref: CredentialRef, value: Secret) -> None:
        """Store (or replace) the value of ``ref``. An empty value is refused."""
        if not value:
            raise InvalidRequest(f"an empty value is not a secret: nothing stored for {ref}")
        with self._locked(fcntl.LOCK_EX):
            _guarded(
                f"store {ref}", lambda: self._keyring.set_password(*_entry(ref), value.reveal())
            )
            refs = self._read_index()
            if ref not in refs:
                self._write_index([*refs, ref])

    def delete_secret(self, ref: CredentialRef) -> bool:
        """Forget the secret; False when there was none."""
        with self._locked(fcntl.LOCK_EX):
            had_value = _guarded(f"delete {ref}", lambda: self._delete(ref))
            refs = self._read_index()
            if ref in refs:
                self._write_index([r for r in refs if r != ref])
            return had_value or ref in refs

    def list_refs(self, workspace_id: str | None = None) -> list[CredentialRef]:
        """Every stored reference (of one workspace if given), sorted. Never a value."""
        with self._locked(fcntl.LOCK_SH):
            refs = self._read_index()
        return [r for r in refs if workspace_id is None or r.workspace_id == workspace_id]

    def _delete(self, ref: CredentialRef) -> bool:
        try:
            self._keyring.delete_password(*_entry(ref))
        except PasswordDeleteError:
            return False
        return True

    def _locked(self, kind: int) -> AbstractContextManager[None]:
        return _locked(self.directory, kind)

    def _read_index(self) -> list[CredentialRef]:
        return _read_index(self.index_file, self.backend)

    def _write_index(self, refs: list[CredentialRef]) -> None:
        _write_index(self.index_file, self.backend, refs)


def open_vault(directory: Path, backend: Backend, key: Secret | None = None) -> KeyringVault:
    """The vault in ``directory`` (created, mode 0700, if missing) on ``backend``: ``file``
    opens the encrypted file with ``key`` (a wrong key fails here, before anything is
    read); ``plain`` takes no key. A directory is opened only with the backend it was
    created with."""
    _check_key(backend, key)
    _make_directory(directory)
    with _locked(directory, fcntl.LOCK_EX):  # two first uses create one file
        index = directory / INDEX_FILE
        _read_index(index, backend)  # refuses a vault of the other backend
        keyring_file = directory / KEYRING_FILES[backend]
        # _check_key: there is a key exactly when the backend is the encrypted file.
        keyring = _plain(keyring_file) if key is None else _encrypted(keyring_file, key)
        if not index.exists():  # the directory says which backend it was created with
            _write_index(index, backend, [])
    return KeyringVault(directory, backend, keyring)


def _check_key(backend: Backend, key: Secret | None) -> None:
    """Refuse a backend this module does not know, or a key the backend cannot use."""
    if backend not in BACKENDS:
        raise ContextError(f"unknown vault backend {backend!r}; use 'file' or 'plain'")
    if backend == "plain" and key is not None:
        raise ContextError("a plain vault is not encrypted and takes no key")
    if backend == "file" and key is None:
        raise ContextError("the encrypted vault needs its key")
    if key is not None and not key.reveal().strip():
        raise ContextError("the vault key is empty")


def read_key_file(path: Path) -> Secret:
    """The vault key in ``path`` (one line; its line break is not part of the key)."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ContextError(
            f"cannot read the vault key file {path} ({type(exc).__name__})"
        ) from None
    key = text.rstrip("\r\n")
    if not key.strip():
        raise ContextError(f"the vault key file {path} is empty")
    return Secret(key)


def _entry(ref: CredentialRef) -> tuple[str, str]:
    """The keyring service and user name of ``ref``; no two references share one (the parts
    cannot hold '/')."""
    return f"{SERVICE_PREFIX}/{ref.workspace_id}/{ref.mailbox_id}/{ref.name}", USERNAME


def _guarded(action: str, call: Callable[[], T]) -> T:
    """Run a backend call; its failure becomes a ``ContextError`` naming only its type (a
    backend's own message may quote lines of its file)."""
    try:
        return call()
    except Exception as exc:  # any backend failure, reported without its text
        failure = type(exc).__name__
    raise ContextError(f"the vault could not {action} ({failure})")


def _plain(path: Path) -> _Keyring:
    keyring = PlaintextKeyring()
    # Set after construction, so no KEYRING_PROPERTY_* variable can move it.
    keyring.file_path = str(path)  # pyright: ignore[reportAttributeAccessIssue] - overridable
    return cast(_Keyring, keyring)


def _encrypted(path: Path, key: Secret) -> _Keyring:
    keyring = CryptFileKeyring()
    keyring.file_path = str(path)  # pyright: ignore[reportAttributeAccessIssue] - overridable
    if not _unlocked(keyring, key):
        raise ContextError(
            f"the key does not open the encrypted vault {path}; give the key it was created with"
        )
    return cast(_Keyring, keyring)


def _unlocked(keyring: CryptFileKeyring, key: Secret) -> bool:
    """Set the key (the library ignores its environment variable): this unlocks the file,
    or creates it. A wrong key fails inside the cipher, with one error or another."""
    try:
        keyring.keyring_key = key.reveal()
    except Exception:  # reported without its text
        return False
    return True


def _make_directory(directory: Path) -> None:
    if directory.is_dir():
        return
    try:
        directory.mkdir(parents=True, mode=0o700)
        directory.chmod(0o700)  # mkdir's mode is masked by the umask
    except OSError as exc:
        raise ContextError(f"cannot create the vault directory {directory}: {exc}") from exc


@contextmanager
def _locked(directory: Path, kind: int) -> Generator[None]:
    """Hold the directory's lock (shared to read, exclusive to write): the file backends
    rewrite their file in place, and the index is read, changed and replaced."""
    fd = os.open(directory / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, kind)
        yield
    finally:
        os.close(fd)


def _read_index(path: Path, backend: Backend) -> list[CredentialRef]:
    """The references the index lists; none when there is no index yet."""
    try:
        shown = json.loads(path.read_text(encoding="utf-8"))
        refs = [CredentialRef.model_validate(r) for r in shown["refs"]]
        created_with = shown["backend"]
    except FileNotFoundError:
        return []
    except (OSError, ValueError, KeyError, TypeError, ValidationError) as exc:
        raise ContextError(f"the vault index {path} is unreadable ({type(exc).__name__})") from exc
    if created_with != backend:
        raise ContextError(
            f"the vault at {path.parent} was created with the {created_with!r} backend; "
            f"open it with that backend, or give another vault directory"
        )
    return refs


def _write_index(path: Path, backend: Backend, refs: list[CredentialRef]) -> None:
    """The index: the backend and the references, sorted; never a value."""
    ordered = sorted(set(refs), key=lambda r: (r.workspace_id, r.mailbox_id, r.name))
    shown = {"backend": backend, "refs": [r.model_dump() for r in ordered]}
    _write_atomically(path, json.dumps(shown, indent=1) + "\n")


def _write_atomically(path: Path, text: str) -> None:
    """Replace ``path`` with ``text`` in one step; the file is mode 0600."""
    fd, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            out.write(text)
            out.flush()
            os.fsync(out.fileno())
        Path(temporary).replace(path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
