"""OAuth 2.0 for the API channels: an opaque credential the channel's HTTP client applies.

A mailbox's OAuth client (id and secret) and refresh token live in the vault, named by
reference. ``OAuthCredential`` is an ``httpx.Auth``: the HTTP client asks it to sign each
request, and the adapter never sees a token. It follows the refresh-token grant as Google
(https://developers.google.com/identity/protocols/oauth2/web-server#offline) and the
Microsoft identity platform (https://learn.microsoft.com/entra/identity-platform/
v2-oauth2-auth-code-flow#refresh-the-access-token) document it:

- the access token is kept in memory only, and refreshed shortly before it expires or when
  a request is answered 401;
- a refresh token the endpoint rotates (Microsoft returns a new one with each refresh) is
  written back to the vault, so the next process starts from the newest;
- the refresh token is read from the vault at each refresh, so one another worker rotated,
  or an operator replaced with ``outloop connect``, is used without a restart;
- ``invalid_grant`` (expired or revoked) and ``invalid_client`` are
  ``AuthenticationExpired`` naming the mailbox and the command that connects it again.

Refreshes of one credential are serialized (one lock per credential); workers in other
processes may refresh the same mailbox at the same time, and both tokens they get are valid.
"""

from __future__ import annotations

import time
from collections.abc import AsyncGenerator, Callable
from dataclasses import dataclass

import anyio
import httpx
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from agent.domain.errors import AuthenticationExpired, Throttled, TransientFailure
from agent.domain.secrets import Secret

EARLY_REFRESH_SECONDS = 60.0
"""An access token is refreshed this long before the expiry the endpoint gave."""

SecretReader = Callable[[str], Secret]
"""Reads one of the mailbox's secrets from the vault by name."""
SecretWriter = Callable[[str, Secret], None]
"""Stores one of the mailbox's secrets in the vault by name."""


@dataclass(frozen=True)
class OAuthNames:
    """The vault names of a mailbox's OAuth secrets."""

    client_id: str = "oauth_client_id"
    client_secret: str = "oauth_client_secret"  # noqa: S105 - a vault name, not a secret
    refresh_token: str = "oauth_refresh_token"  # noqa: S105 - a vault name, not a secret


class _TokenResponse(BaseModel):
    """https://datatracker.ietf.org/doc/html/rfc6749#section-5.1"""

    model_config = ConfigDict(frozen=True, extra="ignore")

    access_token: str = Field(min_length=1)
    expires_in: float = Field(default=3600.0, gt=0)
    refresh_token: str | None = None
    token_type: str = "Bearer"  # noqa: S105 - the token type, not a token


class _TokenError(BaseModel):
    """https://datatracker.ietf.org/doc/html/rfc6749#section-5.2"""

    model_config = ConfigDict(frozen=True, extra="ignore")

    error: str
    error_description: str = ""


@dataclass
class _Access:
    token: Secret
    expires_at: float


class OAuthCredential(httpx.Auth):
    """Signs requests with a mailbox's access token, refreshing it from the vault's refresh
    token when needed. Every text form of it names the mailbox and nothing else."""

    def __init__(
        self,
        *,
        token_url: str,
        mailbox_id: str,
        read: SecretReader,
        write: SecretWriter,
        reconnect: str,
        names: OAuthNames | None = None,
        scopes: tuple[str, ...] = (),
        timeout: float = 30.0,
        transport: httpx.AsyncBaseTransport | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._token_url = token_url
        self._mailbox = mailbox_id
        self._read = read
        self._write = write
        self._reconnect = reconnect
        self._names = names or OAuthNames()
        self._scopes = scopes
        self._timeout = timeout
        self._transport = transport
        self._clock = clock
        self._access: _Access | None = None
        self._lock = anyio.Lock()
        self.refreshes = 0
        """How many refreshes this credential made (for tests and health)."""

    def __repr__(self) -> str:
        return f"OAuthCredential(mailbox={self._mailbox!r})"

    async def async_auth_flow(
        self, request: httpx.Request
    ) -> AsyncGenerator[httpx.Request, httpx.Response]:
        used = await self._current()
        request.headers["Authorization"] = f"Bearer {used.token.reveal()}"
        response = yield request
        if response.status_code == 401:
            fresh = await self._refresh(stale=used)
            request.headers["Authorization"] = f"Bearer {fresh.token.reveal()}"
            yield request

    def forget(self) -> None:
        """Drop the access token held in memory (the next request refreshes)."""
        self._access = None

    async def _current(self) -> _Access:
        access = self._access
        if access is not None and self._clock() < access.expires_at:
            return access
        return await self._refresh(stale=access)

    async def _refresh(self, *, stale: _Access | None) -> _Access:
        async with self._lock:
            if self._access is not None and self._access is not stale:
                return self._access  # another request refreshed while this one waited
            self._access = await self._grant()
            self.refreshes += 1
            return self._access

    async def _grant(self) -> _Access:
        refresh_token = self._read(self._names.refresh_token)
        response = await self._post(refresh_token)
        if response.status_code != 200:
            failure = self._failure(response)
            if failure.error == "invalid_grant" and self._read(self._names.refresh_token) != (
                refresh_token
            ):
                # Another worker rotated the token while this one refreshed: use the newest.
                return await self._grant()
            raise self._refused(response.status_code, failure)
        try:
            answer = _TokenResponse.model_validate_json(response.content)
        except ValidationError:
            raise TransientFailure(
                f"mailbox {self._mailbox}: the token endpoint answered 200 without a usable "
                "access token; it is asked again on the next call"
            ) from None
        if answer.refresh_token and answer.refresh_token != refresh_token.reveal():
            self._write(self._names.refresh_token, Secret(answer.refresh_token))
        lifetime = max(answer.expires_in - EARLY_REFRESH_SECONDS, answer.expires_in / 2)
        return _Access(Secret(answer.access_token), self._clock() + lifetime)

    async def _post(self, refresh_token: Secret) -> httpx.Response:
        form = {
            "grant_type": "refresh_token",
            "refresh_token": refresh_token.reveal(),
            "client_id": self._read(self._names.client_id).reveal(),
            "client_secret": self._read(self._names.client_secret).reveal(),
        }
        if self._scopes:
            form["scope"] = " ".join(self._scopes)
        try:
            async with httpx.AsyncClient(
                timeout=self._timeout, transport=self._transport
            ) as client:
                return await client.post(self._token_url, data=form)
        except httpx.HTTPError as exc:
            raise TransientFailure(
                f"mailbox {self._mailbox}: the OAuth token endpoint could not be reached "
                f"({type(exc).__name__}); it is tried again on the next call"
            ) from None

    def _failure(self, response: httpx.Response) -> _TokenError:
        try:
            return _TokenError.model_validate_json(response.content)
        except ValidationError:
            return _TokenError(error=f"http_{response.status_code}")

    def _refused(self, status: int, failure: _TokenError) -> Exception:
        if status == 429:
            return Throttled(f"mailbox {self._mailbox}: the OAuth token endpoint is throttling")
        if status >= 500:
            return TransientFailure(
                f"mailbox {self._mailbox}: the OAuth token endpoint failed ({status}); it is "
                "tried again on the next call"
            )
        error = failure.error[:60]
        said = " ".join(failure.error_description.split())[:200]
        what = {
            "invalid_grant": "its refresh token was refused (expired or revoked)",
            "invalid_client": "its OAuth client id or secret was refused",
        }.get(error, f"the token endpoint refused the refresh ({error})")
        fix = f"connected again with '{self._reconnect}'"
        if error in {"invalid_request", "invalid_scope", "unauthorized_client"}:
            fix = "the mailbox's api block (tenant, token_url, scopes) is fixed in its context"
        return AuthenticationExpired(
            f"mailbox {self._mailbox}: {what}{f': {said}' if said else ''}; nothing is read or "
            f"sent through it until {fix}"
        )
