"""How a console identity signs in: a password or a one-time sign-in link, both kept in the
vault as digests only (a password's scrypt digest; a link's SHA-256 digest with its
expiry), never in a context file. Who is an identity, and what they see, is the core's
(agent/services/console.py). Secrets are unwrapped here only, to be hashed."""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
from collections import deque
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from agent.domain.errors import GateRefused
from agent.domain.secrets import CredentialRef, Secret
from agent.ports import Registry, Vault
from agent.services.console import live_contexts, visible_workspaces

VAULT_SCOPE = "console"
"""The vault's workspace name for console credentials (they belong to no one workspace)."""
PASSWORD = "password"  # noqa: S105 - the name of the vault entry, not a password
SIGN_IN_LINK = "sign-in-link"
LINK_TTL = timedelta(minutes=30)
MIN_PASSWORD_CHARS = 12
SCRYPT = {"n": 2**14, "r": 8, "p": 1}
MAX_ADDRESS_CHARS = 254


def _ref(address: str, name: str) -> CredentialRef:
    return CredentialRef(workspace_id=VAULT_SCOPE, mailbox_id=address.strip().lower(), name=name)


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode("ascii")


def password_digest(password: Secret, salt: bytes | None = None) -> str:
    salt = salt or secrets.token_bytes(16)
    digest = hashlib.scrypt(password.reveal().encode(), salt=salt, dklen=32, **SCRYPT)
    return f"scrypt${_b64(salt)}${_b64(digest)}"


_UNKNOWN = "scrypt$" + base64.urlsafe_b64encode(bytes(16)).decode() + "$unknown"
"""What an address without a password is checked against, so that it takes as long."""


def _matches(password: Secret, stored: str) -> bool:
    try:
        kind, salt, _ = stored.split("$")
        expected = password_digest(password, base64.urlsafe_b64decode(salt))
    except ValueError:
        return False
    return kind == "scrypt" and hmac.compare_digest(expected, stored)


def set_password(store: Registry, vault: Vault, address: str, password: Secret) -> None:
    """Store an identity's password as its scrypt digest (the password itself nowhere)."""
    _require_identity(store, address)
    if len(password.reveal()) < MIN_PASSWORD_CHARS:
        raise GateRefused(f"a console password has at least {MIN_PASSWORD_CHARS} characters")
    vault.set_secret(_ref(address, PASSWORD), Secret(password_digest(password)))


def invite(store: Registry, vault: Vault, address: str, now: datetime) -> Secret:
    """A one-time sign-in token for ``address``, valid for LINK_TTL; only its digest is
    kept. A new invitation replaces an unused one."""
    _require_identity(store, address)
    token = secrets.token_urlsafe(32)
    digest = hashlib.sha256(token.encode()).hexdigest()
    expires = (now + LINK_TTL).isoformat()
    vault.set_secret(_ref(address, SIGN_IN_LINK), Secret(f"{digest}|{expires}"))
    return Secret(token)


def _require_identity(store: Registry, address: str) -> None:
    if not visible_workspaces(live_contexts(store), address):
        raise GateRefused(
            f"{address.strip().lower()} is not a console identity: no registered workspace's "
            "context lists it as an internal contact with an approval or operator role"
        )


@dataclass
class Attempts:
    """Failed sign-ins per address and client together, limited to ``limit`` per
    ``window``: a stranger's failures never lock out the owner signing in from elsewhere.
    The clock is the caller's."""

    limit: int = 5
    window: timedelta = timedelta(minutes=5)
    _failures: dict[str, deque[datetime]] = field(default_factory=dict[str, deque[datetime]])

    def blocked(self, key: str, now: datetime) -> bool:
        return len(self._recent(key, now)) >= self.limit

    def failed(self, key: str, now: datetime) -> None:
        found = self._recent(key, now)
        found.append(now)
        self._failures[key] = found

    def succeeded(self, key: str) -> None:
        self._failures.pop(key, None)

    def _recent(self, key: str, now: datetime) -> deque[datetime]:
        found = self._failures.get(key, deque())
        while found and found[0] <= now - self.window:
            found.popleft()
        if not found:
            self._failures.pop(key, None)
        return found


def sign_in_password(
    store: Registry, vault: Vault, address: str, password: Secret
) -> list[str] | None:
    """The workspaces the identity sees when the password is its own, else None."""
    if len(address) > MAX_ADDRESS_CHARS:
        return None
    ref = _ref(address, PASSWORD)
    stored = vault.secret(ref).reveal() if vault.has_secret(ref) else _UNKNOWN
    if not _matches(password, stored) or stored is _UNKNOWN:
        return None  # the digest is computed either way: the time tells no address apart
    return visible_workspaces(live_contexts(store), address) or None


def sign_in_link(
    store: Registry, vault: Vault, address: str, token: Secret, now: datetime
) -> list[str] | None:
    """The workspaces the identity sees when the token is its unused, unexpired link; the
    link is spent either way once it matched."""
    ref = _ref(address, SIGN_IN_LINK)
    if not vault.has_secret(ref):
        return None
    digest, _, expires = vault.secret(ref).reveal().partition("|")
    offered = hashlib.sha256(token.reveal().encode()).hexdigest()
    if not hmac.compare_digest(offered, digest):
        return None
    vault.delete_secret(ref)
    if datetime.fromisoformat(expires) < now:
        return None
    return visible_workspaces(live_contexts(store), address) or None
