"""How the provider MCP channel reads what a server answers (``GraphOverMcp``): the answer
that is lost after a send was asked for is never taken as 'not sent', a permission refusal
in the ms365 servers' own wording is a refusal, and a next-page link is followed only as the
same listing. A scripted session stands in for the server, so each answer is exactly the
one under test."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, cast

import pytest
from mcp import Client
from mcp.shared.exceptions import MCPError
from mcp.types import (
    CONNECTION_CLOSED,
    INVALID_PARAMS,
    METHOD_NOT_FOUND,
    REQUEST_TIMEOUT,
    CallToolResult,
    TextContent,
)

from agent.domain.errors import (
    AccessRefused,
    NotHandedOver,
    OutcomeUnknown,
    TransientFailure,
)
from agent.providers import msgraph
from agent.providers.api_http import ApiClient
from agent.providers.provider_mcp import (
    _SESSION,  # pyright: ignore[reportPrivateUsage]
    BASE_URL,
    MS365_TOOLS,
    GraphOverMcp,
    _Live,  # pyright: ignore[reportPrivateUsage]
    _NoAuth,  # pyright: ignore[reportPrivateUsage]
)

pytestmark = pytest.mark.anyio

Answer = Callable[[str, dict[str, Any]], CallToolResult]


class ScriptedServer:
    """A session whose every tool call is answered by ``answer`` (or raises what it raises),
    noting the calls."""

    def __init__(self, answer: Answer) -> None:
        self.answer = answer
        self.calls: list[tuple[str, dict[str, Any]]] = []

    async def call_tool(
        self, name: str, arguments: dict[str, Any], read_timeout_seconds: float | None = None
    ) -> CallToolResult:
        del read_timeout_seconds
        self.calls.append((name, arguments))
        return self.answer(name, arguments)


def text(value: Any, *, error: bool = False) -> CallToolResult:
    body = value if isinstance(value, str) else json.dumps(value)
    return CallToolResult(content=[TextContent(type="text", text=body)], is_error=error)


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def api() -> ApiClient:
    return ApiClient(
        base_url=BASE_URL,
        auth=_NoAuth(),
        mailbox_id="ops@fabrikam.test",
        read_error=msgraph.read_error,
        timeout=5,
        transport=GraphOverMcp(MS365_TOOLS, 5),
    )


@contextmanager
def scripted(answer: Answer) -> Iterator[ScriptedServer]:
    """``answer`` as the session of the operation under way, for the ``with`` block."""
    server = ScriptedServer(answer)
    token = _SESSION.set(_Live(cast("Client", server)))
    try:
        yield server
    finally:
        _SESSION.reset(token)


def raising(code: int) -> Answer:
    def answer(name: str, arguments: dict[str, Any]) -> CallToolResult:
        raise MCPError(code, f"failure {code}")

    return answer


@pytest.mark.parametrize("code", [CONNECTION_CLOSED, REQUEST_TIMEOUT, -32000])
async def test_a_send_whose_answer_the_session_lost_is_unknown_never_not_sent(
    api: ApiClient, code: int
) -> None:
    with scripted(raising(code)) as server:
        with pytest.raises(OutcomeUnknown):
            await api.call("POST", "me/messages/AAMk1/send", once=True)
        assert server.calls == [("send-draft-message", {"messageId": "AAMk1"})]


@pytest.mark.parametrize("code", [METHOD_NOT_FOUND, INVALID_PARAMS])
async def test_a_send_the_server_refused_before_running_its_tool_was_not_handed_over(
    api: ApiClient, code: int
) -> None:
    with scripted(raising(code)) as _, pytest.raises(NotHandedOver):
        await api.call("POST", "me/messages/AAMk1/send", once=True)


async def test_a_read_whose_session_broke_is_a_transient_failure(api: ApiClient) -> None:
    with scripted(raising(CONNECTION_CLOSED)) as _, pytest.raises(TransientFailure):
        await api.call("GET", "me")


@pytest.mark.parametrize(
    "said",
    [
        'Microsoft Graph API scope error: 403 Forbidden - {"error": {"code": '
        '"ErrorAccessDenied", "message": "The token contains no permissions."}}',
        "Microsoft Graph API scope error - the app lacks Mail.Send",
        'Microsoft Graph API error: 403 Forbidden - {"error": {"code": "ErrorAccessDenied", '
        '"message": "Access is denied."}}',
    ],
    ids=["scope-with-status", "scope-without-status", "plain-403"],
)
async def test_a_permission_refusal_in_the_servers_wording_is_a_refusal(
    api: ApiClient, said: str
) -> None:
    with scripted(lambda name, arguments: text({"error": said}, error=True)):
        with pytest.raises(AccessRefused):
            await api.call("GET", "me/mailFolders/inbox/messages")
        with pytest.raises(AccessRefused) as raised:
            await api.call("POST", "me/messages/AAMk1/send", once=True)
        assert isinstance(raised.value, NotHandedOver)  # a refusal: nothing went


async def test_a_send_error_naming_no_graph_status_leaves_the_outcome_unknown(
    api: ApiClient,
) -> None:
    lost = text({"error": "fetch failed"}, error=True)
    with scripted(lambda name, arguments: lost), pytest.raises(OutcomeUnknown):
        await api.call("POST", "me/messages/AAMk1/send", once=True)


async def test_a_next_page_link_is_followed_only_as_the_same_listing_with_graphs_options(
    api: ApiClient,
) -> None:
    links = {
        "same": "https://graph.microsoft.com/v1.0/me/mailFolders/inbox/messages"
        "?$skip=10&$filter=a+eq+'b%26c'&mailFolderId=sentitems",
        "other-folder": "https://graph.microsoft.com/v1.0/me/mailFolders/sentitems/messages"
        "?$skip=10",
        "all-mail": "https://graph.microsoft.com/v1.0/me/messages?$skip=10",
    }
    answered: dict[str, str] = {}
    for name, link in links.items():
        with scripted(
            lambda tool, arguments, link=link: text({"value": [], "@odata.nextLink": link})
        ):
            response = await api.call("GET", "me/mailFolders/inbox/messages")
            answered[name] = response.json()["@odata.nextLink"]
    assert answered["other-folder"] == links["other-folder"]  # left as given: not followed
    assert answered["all-mail"] == links["all-mail"]
    with scripted(lambda tool, arguments: text({"value": []})) as server:
        await api.call("GET", answered["same"])
        [(tool, arguments)] = server.calls
        assert tool == "list-mail-folder-messages"
        assert arguments == {"mailFolderId": "inbox", "skip": 10, "filter": "a eq 'b&c'"}


async def test_a_mime_answer_is_handed_on_as_its_bytes(api: ApiClient) -> None:
    mime = "From: a@b.test\r\nSubject: =?utf-8?b?16nXnNeV150=?=\r\n\r\nשלום\r\n"
    with scripted(lambda tool, arguments: text({"message": "OK!", "rawResponse": mime})):
        response = await api.call("GET", "me/messages/AAMk1/$value")
        assert response.content == mime.encode("utf-8")
