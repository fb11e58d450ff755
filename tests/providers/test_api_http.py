"""The API channels' HTTP client: each failure a provider documents becomes the core's error
(reads retried within their bounds, the named wait honoured; a send made once, and a failure
told apart by whether the request could have been taken), and no more requests run at once
than the mailbox allows."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime

import anyio
import httpx
import pytest
import stamina

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
from agent.providers.api_http import ApiClient, ApiFailure, retry_after

Handler = Callable[[httpx.Request], httpx.Response]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def retries() -> Iterator[None]:
    stamina.set_testing(True, attempts=4)
    yield
    stamina.set_testing(True, attempts=1)


class _NoAuth(httpx.Auth):
    pass


def _reader(response: httpx.Response) -> ApiFailure:
    body = response.json() if response.content else {}
    reason = str(body.get("reason", ""))
    return ApiFailure(str(body.get("message", "")), reason, rate_limited=reason == "rateLimited")


def _client(handler: Handler, parallel: int = 8) -> ApiClient:
    return ApiClient(
        base_url="https://api.invalid/v1",
        auth=_NoAuth(),
        mailbox_id="ops@fabrikam.test",
        read_error=_reader,
        parallel=parallel,
        transport=httpx.MockTransport(handler),
    )


def _answering(*responses: httpx.Response) -> tuple[Handler, list[httpx.Request]]:
    seen: list[httpx.Request] = []
    queue = list(responses)

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return queue.pop(0) if len(queue) > 1 else queue[0]

    return handler, seen


def _status(code: int, reason: str = "", headers: dict[str, str] | None = None) -> httpx.Response:
    return httpx.Response(
        code, json={"message": f"status {code}", "reason": reason}, headers=headers
    )


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("code", "reason", "error"),
    [
        (401, "", AuthenticationExpired),
        (403, "", AccessRefused),
        (403, "rateLimited", Throttled),
        (404, "", NotFound),
        (429, "", Throttled),
        (400, "", ProviderError),
        (500, "", TransientFailure),
        (503, "", TransientFailure),
    ],
)
async def test_a_read_s_failure_becomes_the_core_s_error_naming_the_mailbox(
    code: int, reason: str, error: type[Exception]
) -> None:
    handler, _ = _answering(_status(code, reason))
    client = _client(handler)
    with pytest.raises(error) as raised:
        await client.call("GET", "users/me/profile")
    assert "ops@fabrikam.test" in str(raised.value) and f"status {code}" in str(raised.value)
    await client.aclose()


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("code", "reason", "error"),
    [
        (401, "", AuthenticationExpired),
        (403, "", AccessRefused),
        (429, "", Throttled),
        (400, "", NotHandedOver),
        (404, "", NotHandedOver),
    ],
)
async def test_a_send_the_provider_refused_handed_nothing_over(
    code: int, reason: str, error: type[Exception]
) -> None:
    handler, seen = _answering(_status(code, reason))
    client = _client(handler)
    with pytest.raises(NotHandedOver) as raised:
        await client.call("POST", "messages/send", json={}, once=True)
    assert isinstance(raised.value, error)
    assert len(seen) == 1 and "nothing was handed over" in str(raised.value)
    await client.aclose()


@pytest.mark.anyio
@pytest.mark.parametrize("code", [500, 502, 503, 504])
async def test_a_send_answered_5xx_may_have_gone_out_and_is_never_retried(
    code: int, retries: None
) -> None:
    handler, seen = _answering(_status(code, headers={"Retry-After": "0"}))
    client = _client(handler)
    with pytest.raises(OutcomeUnknown):
        await client.call("POST", "messages/send", json={}, once=True)
    assert len(seen) == 1
    await client.aclose()


@pytest.mark.anyio
async def test_a_send_that_never_connected_is_not_handed_over_and_one_cut_after_is_unknown() -> (
    None
):
    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("refused", request=request)

    def cut(request: httpx.Request) -> httpx.Response:
        raise httpx.ReadError("connection reset", request=request)

    refused, lost = _client(refuse), _client(cut)
    with pytest.raises(NotHandedOver):
        await refused.call("POST", "send", once=True)
    with pytest.raises(OutcomeUnknown):
        await lost.call("POST", "send", once=True)
    await refused.aclose()
    await lost.aclose()


@pytest.mark.anyio
async def test_reads_are_retried_through_429s_and_5xx_and_then_answer(retries: None) -> None:
    handler, seen = _answering(
        _status(429, headers={"Retry-After": "0"}),
        _status(503),
        httpx.Response(200, json={"ok": True}),
    )
    client = _client(handler)
    assert await client.json("GET", "users/me/profile") == {"ok": True}
    assert len(seen) == 3
    await client.aclose()


@pytest.mark.anyio
async def test_a_wait_longer_than_the_longest_is_not_waited_for_here(retries: None) -> None:
    handler, seen = _answering(_status(429, headers={"Retry-After": "3600"}))
    client = _client(handler)
    with pytest.raises(Throttled) as raised:
        await client.call("GET", "users/me/messages")
    assert raised.value.retry_after == 3600 and len(seen) == 1
    await client.aclose()


@pytest.mark.anyio
async def test_no_more_requests_run_at_once_than_the_mailbox_allows() -> None:
    running = 0
    most = 0

    async def slow(request: httpx.Request) -> httpx.Response:
        nonlocal running, most
        running += 1
        most = max(most, running)
        await anyio.lowlevel.checkpoint()
        await anyio.lowlevel.checkpoint()
        running -= 1
        return httpx.Response(200, json={})

    client = ApiClient(
        base_url="https://api.invalid/v1",
        auth=_NoAuth(),
        mailbox_id="ops@fabrikam.test",
        read_error=_reader,
        parallel=3,
        transport=httpx.MockTransport(slow),
    )
    async with anyio.create_task_group() as group:
        for n in range(20):
            group.start_soon(client.call, "GET", f"messages/{n}")
    assert most == 3
    await client.aclose()


def test_retry_after_reads_seconds_and_http_dates_and_ignores_garbage() -> None:
    assert retry_after("7") == 7.0
    later = datetime.now(UTC) + timedelta(seconds=90)
    waited = retry_after(format_datetime(later, usegmt=True))
    assert waited is not None and 80 <= waited <= 91
    assert retry_after(format_datetime(datetime(2000, 1, 1, tzinfo=UTC), usegmt=True)) == 0.0
    assert retry_after("soon") is None and retry_after(None) is None and retry_after("") is None


@pytest.mark.anyio
async def test_an_answer_that_is_not_json_is_a_provider_error_and_after_a_send_unknown() -> None:
    handler, _ = _answering(httpx.Response(200, text="<html>a proxy's sign-in page</html>"))
    client = _client(handler)
    with pytest.raises(ProviderError, match="not JSON") as read:
        await client.json("GET", "users/me/profile")
    assert not isinstance(read.value, OutcomeUnknown)
    with pytest.raises(OutcomeUnknown, match="not JSON"):
        await client.json("POST", "messages/send", json={}, once=True)
    await client.aclose()


@pytest.mark.anyio
async def test_an_answer_the_client_cannot_decode_is_a_provider_error_not_a_crash() -> None:
    def garbled(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, headers={"Content-Encoding": "gzip"}, content=b"not gzip")

    client = _client(garbled)
    with pytest.raises(ProviderError, match="could not be read"):
        await client.json("GET", "users/me/profile")
    with pytest.raises(OutcomeUnknown, match="could not be read"):
        await client.json("POST", "messages/send", json={}, once=True)
    await client.aclose()
