"""The HTTP side of the API channels (Gmail API, Microsoft Graph): one client per channel.

``ApiClient`` sends a channel's requests with its opaque credential, bounded in how many run
at once, and turns each answer the provider documents as a failure into the core's errors:

- 401 (after the credential refreshed once): ``AuthenticationExpired``;
- 403: ``AccessRefused`` (a missing scope, another user's mailbox), unless the provider's
  reason says it is a rate limit (Gmail answers some with 403 ``rateLimitExceeded``);
- 404: ``NotFound`` (the caller may read it as an expired cursor);
- 429, and a 5xx that names a ``Retry-After``: ``Throttled`` with that wait;
- another 5xx or a lost connection: ``TransientFailure``;
- anything else: a plain ``ProviderError`` quoting the provider's message.

Reads are retried by ``agent.providers.retry`` (the named wait honoured). A send is made
once (``once=True``) and never retried here: a failure before the request could reach the
provider (a refused connection) or that it refused (any 4xx: a 429, an expired
authorization, a bad request) is ``NotHandedOver``, and one after which it may have been
taken (a 5xx, a lost answer) is ``OutcomeUnknown``, settled from the sent copies.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from typing import Any, TypeVar

import anyio
import httpx

from agent.domain.context import ApiAccess
from agent.domain.errors import (
    AccessRefused,
    AuthenticationExpired,
    NotFound,
    NotHandedOver,
    OutcomeUnknown,
    ProviderError,
    Throttled,
    TransientFailure,
)
from agent.providers.oauth import OAuthCredential, OAuthNames, SecretReader, SecretWriter
from agent.providers.retry import with_retries

T = TypeVar("T")


@dataclass(frozen=True)
class ApiFailure:
    """What a provider's error body says: its message and its machine-readable reason."""

    message: str
    reason: str = ""
    rate_limited: bool = False
    """The provider's reason names a rate or quota limit (a throttle, whatever the status)."""


ErrorReader = Callable[[httpx.Response], ApiFailure]
"""Reads a provider's error body (Google's JSON error format, Graph's error resource)."""


class SendThrottled(NotHandedOver, Throttled):
    """A send the provider refused with a rate limit before taking it: nothing went out."""


class SendUnauthorized(NotHandedOver, AuthenticationExpired):
    """A send refused because the mailbox's authorization is no longer valid: nothing went
    out, and nothing will until the mailbox is connected again."""


class SendForbidden(NotHandedOver, AccessRefused):
    """A send the provider or a policy refuses (a missing scope): nothing went out."""


class ApiClient:
    """A channel's requests to one provider API, signed by ``auth``."""

    def __init__(
        self,
        *,
        base_url: str,
        auth: httpx.Auth,
        mailbox_id: str,
        read_error: ErrorReader,
        timeout: float = 30.0,
        parallel: int = 8,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.mailbox_id = mailbox_id
        self._read_error = read_error
        self._limit = anyio.CapacityLimiter(parallel)
        self._http = httpx.AsyncClient(
            base_url=base_url.rstrip("/") + "/",
            auth=auth,
            timeout=timeout,
            transport=transport,
            limits=httpx.Limits(max_connections=parallel, max_keepalive_connections=parallel),
        )

    def __repr__(self) -> str:
        return f"ApiClient(mailbox={self.mailbox_id!r})"

    async def call(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, Any] | None = None,
        json: Any = None,
        headers: Mapping[str, str] | None = None,
        once: bool = False,
    ) -> httpx.Response:
        """The provider's successful answer to one request (``path`` relative to the base
        URL, or an absolute URL the provider gave, such as a next-page link)."""
        if once:
            return await self._send_once(method, path, params, json, headers)
        return await self._call_retried(method, path, params, json, headers)

    async def json(
        self, method: str, path: str, **kwargs: Any
    ) -> Any:  # the JSON body; the adapter validates it with its shapes
        response = await self.call(method, path, **kwargs)
        try:
            return response.json() if response.content else None
        except ValueError:
            said = (
                f"mailbox {self.mailbox_id}: the provider answered {response.status_code} with a "
                "body that is not JSON"
            )
            if kwargs.get("once"):
                raise OutcomeUnknown(f"{said}; the send may have been taken") from None
            raise ProviderError(said) from None

    async def aclose(self) -> None:
        await self._http.aclose()

    @with_retries
    async def _call_retried(
        self,
        method: str,
        path: str,
        params: Mapping[str, Any] | None,
        json: Any,
        headers: Mapping[str, str] | None,
    ) -> httpx.Response:
        try:
            response = await self._request(method, path, params, json, headers)
        except httpx.TransportError as exc:
            raise TransientFailure(
                f"mailbox {self.mailbox_id}: the provider could not be reached "
                f"({type(exc).__name__}); the call is tried again"
            ) from None
        except httpx.HTTPError as exc:  # an answer the client cannot read (decoding, redirects)
            raise ProviderError(
                f"mailbox {self.mailbox_id}: the provider's answer could not be read "
                f"({type(exc).__name__})"
            ) from None
        return self._checked(response, once=False)

    async def _send_once(
        self,
        method: str,
        path: str,
        params: Mapping[str, Any] | None,
        json: Any,
        headers: Mapping[str, str] | None,
    ) -> httpx.Response:
        try:
            response = await self._request(method, path, params, json, headers)
        except (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout) as exc:
            raise NotHandedOver(
                f"mailbox {self.mailbox_id}: the provider could not be reached "
                f"({type(exc).__name__}); nothing was handed over"
            ) from None
        except httpx.TransportError as exc:
            raise OutcomeUnknown(
                f"mailbox {self.mailbox_id}: the connection was lost after the request was "
                f"sent ({type(exc).__name__}); it may have been taken"
            ) from None
        except httpx.HTTPError as exc:  # an answer the client cannot read: it was sent
            raise OutcomeUnknown(
                f"mailbox {self.mailbox_id}: the provider's answer could not be read "
                f"({type(exc).__name__}); it may have been taken"
            ) from None
        except (AuthenticationExpired, Throttled, TransientFailure) as exc:
            # The credential failed to sign the request (its refresh was refused or could
            # not be made): the request never left.
            raise before_handover(exc) from None
        return self._checked(response, once=True)

    async def _request(
        self,
        method: str,
        path: str,
        params: Mapping[str, Any] | None,
        json: Any,
        headers: Mapping[str, str] | None,
    ) -> httpx.Response:
        async with self._limit:
            return await self._http.request(method, path, params=params, json=json, headers=headers)

    def _checked(self, response: httpx.Response, *, once: bool) -> httpx.Response:
        status = response.status_code
        if status < 300:
            return response
        failure = self._read_error(response)
        said = f"mailbox {self.mailbox_id}: the provider answered {status} ({failure.message})"
        wait = retry_after(response.headers.get("retry-after"))
        if status == 429 or failure.rate_limited or (status >= 500 and wait is not None):
            if once and status < 500:
                raise SendThrottled(f"{said}; nothing was handed over", wait)
            if not once:
                raise Throttled(said, wait)
        if status >= 500:
            if once:
                raise OutcomeUnknown(f"{said}; the send may have been taken")
            raise TransientFailure(said)
        raise _send_refusal(status, said) if once else _refusal(status, said)


def _refusal(status: int, said: str) -> ProviderError:
    if status == 401:
        return AuthenticationExpired(f"{said}; the access token was refused after a refresh")
    if status == 403:
        return AccessRefused(said)
    if status == 404:
        return NotFound(said)
    return ProviderError(said)


def before_handover(exc: ProviderError) -> NotHandedOver:
    """A send's failure before the provider took anything (a read the send needed, a
    refused token refresh), as the send's ``NotHandedOver`` of the same kind."""
    if isinstance(exc, NotHandedOver):
        return exc
    said = f"{exc}; nothing was handed over"
    if isinstance(exc, AuthenticationExpired):
        return SendUnauthorized(said)
    if isinstance(exc, AccessRefused):
        return SendForbidden(said)
    if isinstance(exc, Throttled):
        return SendThrottled(said, exc.retry_after)
    return NotHandedOver(said)


async def gather(ids: Sequence[str], fetch: Callable[[str], Awaitable[T]]) -> list[T | None]:
    """``fetch`` of each id, at once (the client bounds how many run), in the ids' order;
    None for a message removed since it was listed. The first failure stops the rest."""
    found: list[T | None] = [None] * len(ids)
    failed: list[ProviderError] = []

    async def one(index: int, message_id: str, scope: anyio.CancelScope) -> None:
        try:
            found[index] = await fetch(message_id)
        except NotFound:
            return
        except ProviderError as exc:
            failed.append(exc)
            scope.cancel()

    async with anyio.create_task_group() as group:
        for index, message_id in enumerate(ids):
            group.start_soon(one, index, message_id, group.cancel_scope)
    if failed:
        raise failed[0]
    return found


def _send_refusal(status: int, said: str) -> NotHandedOver:
    """A send's 4xx: the provider refused the request, so nothing went out."""
    said = f"{said}; nothing was handed over"
    if status == 401:
        return SendUnauthorized(f"{said}: the access token was refused after a refresh")
    if status == 403:
        return SendForbidden(said)
    return NotHandedOver(said)


def retry_after(value: str | None) -> float | None:
    """A ``Retry-After`` header's wait in seconds (delta-seconds or an HTTP date, RFC 9110
    10.2.3); None when absent or unreadable."""
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        moment = parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return max((moment - datetime.now(UTC)).total_seconds(), 0.0)


def oauth_api_client(
    access: ApiAccess,
    mailbox_id: str,
    *,
    base_url: str,
    token_url: str,
    read_error: ErrorReader,
    read: SecretReader,
    write: SecretWriter,
    reconnect: str,
    transport: httpx.AsyncBaseTransport | None = None,
) -> ApiClient:
    """A channel's client for one mailbox, signed with its OAuth secrets from the vault
    (names from ``access``); ``base_url`` and ``token_url`` are the provider's defaults,
    which ``access`` may override (the local mock providers, a sovereign cloud)."""
    credential = OAuthCredential(
        token_url=access.token_url or token_url,
        mailbox_id=mailbox_id,
        read=read,
        write=write,
        reconnect=reconnect,
        names=OAuthNames(access.client_id, access.client_secret, access.refresh_token),
        scopes=access.scopes,
        timeout=access.timeout_seconds,
        transport=transport,
    )
    return ApiClient(
        base_url=access.base_url or base_url,
        auth=credential,
        mailbox_id=mailbox_id,
        read_error=read_error,
        timeout=access.timeout_seconds,
        parallel=access.parallel,
        transport=transport,
    )
