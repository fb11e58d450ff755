"""OAuth from the vault, against the mock providers' token endpoints: access tokens refreshed
on expiry and on a 401 and kept in memory only, a rotated refresh token written back, a
revoked one named with the command that fixes it, and two workers refreshing one mailbox at
once."""

from __future__ import annotations

import logging
import multiprocessing
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest

from agent.domain.context import ApiAccess
from agent.domain.errors import AuthenticationExpired, TransientFailure
from agent.domain.secrets import CredentialRef, Secret
from agent.providers.api_http import ApiClient, ApiFailure, oauth_api_client
from agent.providers.oauth import OAuthCredential
from fixtures.admin import MockAdmin
from managed_login.vault import KeyringVault, open_vault
from tests.conftest import session_mock

PROVIDERS = {
    "google": ("/gmail/v1", "/oauth2/google/token", "users/me/profile"),
    "microsoft": ("/graph/v1.0", "/oauth2/microsoft/common/oauth2/v2.0/token", "me"),
}
NAMES = ("oauth_client_id", "oauth_client_secret", "oauth_refresh_token")
WORKSPACE = "ws-oauth"


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def admin() -> Iterator[MockAdmin]:
    mock = session_mock()
    yield mock
    mock.clear_faults()


class Mailbox:
    """One mock account whose OAuth secrets live in a real (plain file) vault."""

    def __init__(self, admin: MockAdmin, provider: str, vault_dir: Path) -> None:
        self.admin = admin
        self.provider = provider
        self.address = f"oauth-{uuid.uuid4().hex[:10]}@{provider}.test"
        self.account = admin.account(self.address, provider)
        self.vault_dir = vault_dir
        vault = self.vault()
        for name, key in zip(NAMES, ("client_id", "client_secret", "refresh_token"), strict=True):
            vault.set_secret(self.ref(name), Secret(self.account[key]))

    def vault(self) -> KeyringVault:
        return open_vault(self.vault_dir, "plain")

    def ref(self, name: str) -> CredentialRef:
        return CredentialRef(workspace_id=WORKSPACE, mailbox_id=self.address, name=name)

    def client(self, vault: KeyringVault | None = None) -> ApiClient:
        store = vault or self.vault()
        base, token, _ = PROVIDERS[self.provider]
        return oauth_api_client(
            ApiAccess(base_url=self.admin.base_url + base, token_url=self.admin.base_url + token),
            self.address,
            base_url="https://unused.invalid",
            token_url="https://unused.invalid",
            read_error=lambda response: ApiFailure(response.text[:200]),
            read=lambda name: store.secret(self.ref(name)),
            write=lambda name, value: store.set_secret(self.ref(name), value),
            reconnect=f"outloop connect --workspace {WORKSPACE} --mailbox {self.address}",
        )

    @property
    def profile_path(self) -> str:
        return PROVIDERS[self.provider][2]

    def secrets(self) -> list[str]:
        vault = self.vault()
        return [vault.secret(self.ref(name)).reveal() for name in NAMES]


def credential_of(client: ApiClient) -> OAuthCredential:
    auth = client._http.auth  # pyright: ignore[reportPrivateUsage]
    assert isinstance(auth, OAuthCredential)
    return auth


@pytest.mark.anyio
@pytest.mark.parametrize("provider", sorted(PROVIDERS))
async def test_tokens_expiring_mid_run_are_refreshed_without_the_caller_seeing_it(
    admin: MockAdmin, provider: str, tmp_path: Path
) -> None:
    mailbox = Mailbox(admin, provider, tmp_path)
    client = mailbox.client()
    try:
        for _ in range(3):
            await client.json("GET", mailbox.profile_path)
            admin.faults(expire_tokens=True)
        await client.json("GET", mailbox.profile_path)
        # The first call refreshed (no token is kept on disk), and each expiry one more.
        assert credential_of(client).refreshes == 4
    finally:
        await client.aclose()


@pytest.mark.anyio
async def test_a_rotated_refresh_token_is_written_back_and_the_next_process_starts_from_it(
    admin: MockAdmin, tmp_path: Path
) -> None:
    mailbox = Mailbox(admin, "microsoft", tmp_path)
    first = mailbox.secrets()[2]
    client = mailbox.client()
    try:
        await client.json("GET", mailbox.profile_path)
    finally:
        await client.aclose()
    rotated = mailbox.secrets()[2]
    assert rotated != first
    fresh = mailbox.client()  # a new process: nothing in memory, the vault's newest token
    try:
        await fresh.json("GET", mailbox.profile_path)
    finally:
        await fresh.aclose()
    assert mailbox.secrets()[2] not in (first, rotated)


@pytest.mark.anyio
async def test_a_refresh_token_google_does_not_rotate_is_left_as_it_was(
    admin: MockAdmin, tmp_path: Path
) -> None:
    mailbox = Mailbox(admin, "google", tmp_path)
    before = mailbox.secrets()
    client = mailbox.client()
    try:
        await client.json("GET", mailbox.profile_path)
    finally:
        await client.aclose()
    assert mailbox.secrets() == before


@pytest.mark.anyio
@pytest.mark.parametrize("provider", sorted(PROVIDERS))
async def test_a_revoked_refresh_token_names_the_mailbox_and_outloop_connect_and_no_secret(
    admin: MockAdmin, provider: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    mailbox = Mailbox(admin, provider, tmp_path)
    other = Mailbox(admin, provider, tmp_path)
    client, other_client = mailbox.client(), other.client()
    caplog.set_level(logging.DEBUG)
    try:
        await client.json("GET", mailbox.profile_path)
        admin.faults(revoke_tokens=mailbox.address)
        with pytest.raises(AuthenticationExpired) as raised:
            await client.json("GET", mailbox.profile_path)
        await other_client.json("GET", other.profile_path)  # another mailbox is unaffected
    finally:
        await client.aclose()
        await other_client.aclose()
    message = str(raised.value)
    assert mailbox.address in message
    assert f"outloop connect --workspace {WORKSPACE} --mailbox {mailbox.address}" in message
    for value in mailbox.secrets():
        assert value not in message
        assert value not in caplog.text
        assert value not in repr(raised.value.__context__)


@pytest.mark.anyio
async def test_a_wrong_client_secret_is_named_as_the_client_not_the_token(
    admin: MockAdmin, tmp_path: Path
) -> None:
    mailbox = Mailbox(admin, "google", tmp_path)
    mailbox.vault().set_secret(mailbox.ref("oauth_client_secret"), Secret("not-the-secret"))
    client = mailbox.client()
    try:
        with pytest.raises(AuthenticationExpired, match="client id or secret was refused"):
            await client.json("GET", mailbox.profile_path)
    finally:
        await client.aclose()


@pytest.mark.anyio
async def test_an_unreachable_token_endpoint_is_a_passing_failure_not_an_expiry(
    tmp_path: Path,
) -> None:
    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("refused", request=request)

    credential = OAuthCredential(
        token_url="https://token.invalid/token",
        mailbox_id="a@b.test",
        read=lambda name: Secret("value-of-" + name),
        write=lambda name, value: None,
        reconnect="outloop connect",
        transport=httpx.MockTransport(refuse),
    )
    flow = credential.async_auth_flow(httpx.Request("GET", "https://api.invalid/x"))
    with pytest.raises(TransientFailure, match="could not be reached"):
        await flow.__anext__()


def test_the_credential_and_the_client_show_the_mailbox_and_nothing_else(tmp_path: Path) -> None:
    mailbox = Mailbox(session_mock(), "google", tmp_path)
    client = mailbox.client()
    shown = repr(client) + repr(credential_of(client)) + str(vars(credential_of(client)))
    assert mailbox.address in repr(credential_of(client))
    for value in mailbox.secrets():
        assert value not in shown


def _worker(
    address: str, provider: str, vault_dir: str, base_url: str, rounds: int, sync: Any, out: Any
) -> None:
    """A worker process: each round, once the test expired every access token, one call."""
    mailbox = Mailbox.__new__(Mailbox)
    mailbox.admin, mailbox.provider, mailbox.address = MockAdmin(base_url), provider, address
    mailbox.vault_dir = Path(vault_dir)

    async def run() -> int:
        client = mailbox.client()
        try:
            for _ in range(rounds):
                sync.wait()  # the tokens were just expired: both workers refresh at once
                await client.json("GET", mailbox.profile_path)
                sync.wait()
            return credential_of(client).refreshes
        finally:
            await client.aclose()

    try:
        out.put(anyio.run(run))
    except Exception as exc:  # reported to the test, which fails naming it
        out.put(f"{type(exc).__name__}: {exc}")
        sync.abort()


@pytest.mark.parametrize("provider", sorted(PROVIDERS))
def test_two_workers_refreshing_one_mailbox_at_once_both_keep_working_and_the_vault_stays_valid(
    admin: MockAdmin, provider: str, tmp_path: Path
) -> None:
    mailbox = Mailbox(admin, provider, tmp_path)
    rounds = 10
    ctx = multiprocessing.get_context("spawn")
    sync, out = ctx.Barrier(3, timeout=60), ctx.Queue()
    args = (mailbox.address, provider, str(tmp_path), admin.base_url, rounds, sync, out)
    workers = [ctx.Process(target=_worker, args=args) for _ in range(2)]
    for worker in workers:
        worker.start()
    try:
        for _ in range(rounds):
            admin.faults(expire_tokens=True)
            sync.wait()
            sync.wait()
    finally:
        results = [out.get(timeout=60) for _ in workers]
        for worker in workers:
            worker.join(timeout=60)
    # Every round each worker met an expired token and refreshed it, alongside the other.
    assert results == [rounds, rounds], results

    async def afterwards() -> None:
        client = mailbox.client()  # whatever the vault holds now signs in
        try:
            await client.json("GET", mailbox.profile_path)
        finally:
            await client.aclose()

    anyio.run(afterwards)


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("error", "fix"),
    [
        ("invalid_request", "api block"),
        ("invalid_scope", "api block"),
        ("invalid_grant", "outloop connect"),
    ],
)
async def test_a_refused_refresh_quotes_the_endpoint_and_names_the_fix_that_applies(
    error: str, fix: str
) -> None:
    description = "AADSTS90002: Tenant 'fabrikam.invalid' not found.\r\nTrace ID: 1"

    def refuse(request: httpx.Request) -> httpx.Response:
        return httpx.Response(400, json={"error": error, "error_description": description})

    credential = OAuthCredential(
        token_url="https://login.invalid/token",
        mailbox_id="ops@fabrikam.test",
        read=lambda name: Secret("value-of-" + name),
        write=lambda name, value: None,
        reconnect="outloop connect --workspace ws --mailbox ops@fabrikam.test",
        transport=httpx.MockTransport(refuse),
    )
    flow = credential.async_auth_flow(httpx.Request("GET", "https://api.invalid/x"))
    with pytest.raises(AuthenticationExpired) as refused:
        await flow.__anext__()
    said = str(refused.value)
    assert "AADSTS90002: Tenant 'fabrikam.invalid' not found. Trace ID: 1" in said  # one line
    assert fix in said and "value-of-" not in said
