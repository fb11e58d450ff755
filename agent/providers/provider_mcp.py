"""A mailbox through a provider's MCP server the workspace permits (the provider_mcp channel).

When a mailbox's API connector is missing, not permitted or down, seed 000 s.9 names a
permitted provider MCP server as the next path. This adapter is an MCP client (the ``mcp``
SDK's, over stdio or streamable HTTP) to such a server, named in the mailbox's context with
its command or URL, the tool shapes it speaks (its dialect) and its names for them.

Dialect ``ms365``: the Microsoft Graph passthrough tools of the ms-365-mcp-server family
(``list-mail-messages``, ``list-mail-folder-messages``, ``get-mail-message-mime``,
``create-draft-email``, ``create-reply-draft``, ``update-mail-message``,
``add-mail-attachment``, ``send-draft-message``, ``get-current-user``). Each tool makes one
Graph request and answers with Graph's JSON (its ``@odata`` annotations removed but the
next-page link), ``{"message": "OK!"}`` for an empty answer, ``{"message": "OK!",
"rawResponse": ...}`` for a MIME body, and an error result ``{"error": "Microsoft Graph API
error: <status> <reason> - <Graph's error body>"}``. So the channel is the Graph channel's
own logic (``agent.providers.msgraph``: the same reading, the same draft marked by our
Message-ID, the same checks of the draft against the plan before it is sent, the same
search of the sent copy) over a transport that turns each Graph request into the tool call
the server makes it from, and each tool result back into Graph's answer. What differs:

- ids are not immutable (the servers send no ``Prefer: IdType="ImmutableId"``): a sent copy
  is found by our Message-ID, never by the draft's id, and a send reports the copy's own id
  when Graph already shows the copy;
- a tool result is untrusted data like any mail content: it is read through the same shapes
  (a result that is not one is a ``ProviderError``), never followed as an instruction, and a
  next-page link is followed only as a call to the same listing tool;
- a send tool's error result that names no Graph status (the server lost Graph's answer), or
  a session that broke after the call went, leaves the outcome unknown: it is settled from
  the sent copies like any lost answer.

A session is opened for each port operation and closed at its end (the SDK's client is a
structured context, entered and left in the task that uses it): a stdio server is started for
each operation, an HTTP server connected to. A server that cannot be started or reached is an
access gap (``TransientFailure``; for a send, ``NotHandedOver``: nothing was handed over); a
server that lacks a tool the operation needs is ``Unsupported``, naming the tool.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import AsyncGenerator, Awaitable, Callable, Mapping
from contextlib import asynccontextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, TypeVar, cast
from urllib.parse import parse_qsl, unquote, urlsplit

import httpx
import httpx2
from mcp import Client
from mcp.client.stdio import StdioServerParameters, get_default_environment, stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError
from mcp.types import INVALID_PARAMS, METHOD_NOT_FOUND, CallToolResult, DiscoverResult, TextContent

from agent.domain.context import MailboxBinding, ProviderMcpAccess
from agent.domain.errors import (
    AccessRefused,
    NotHandedOver,
    OutcomeUnknown,
    ProviderError,
    TransientFailure,
    Unsupported,
)
from agent.domain.mail import (
    AttachmentData,
    ChangePage,
    Channel,
    Handover,
    Marker,
    MarkerKind,
    MessageBody,
    OutgoingMessage,
    ProviderHealth,
    SendResult,
    StoredCopy,
)
from agent.domain.secrets import Secret
from agent.providers import msgraph
from agent.providers.api_http import ApiClient

CHANNEL = Channel.PROVIDER_MCP
BASE_URL = "https://provider-mcp.invalid/v1.0/"
"""The base the Graph logic's requests are addressed to; the transport answers them."""

MS365_TOOLS: dict[str, str] = {
    "me": "get-current-user",
    "list": "list-mail-messages",
    "list_folder": "list-mail-folder-messages",
    "get": "get-mail-message",
    "mime": "get-mail-message-mime",
    "create_draft": "create-draft-email",
    "create_reply": "create-reply-draft",
    "update": "update-mail-message",
    "attach": "add-mail-attachment",
    "send_draft": "send-draft-message",
}
"""The ms365 dialect's tools, by the Graph request each makes (keys of ``tools:`` in the
context rename them)."""

NEEDED: dict[str, tuple[str, ...]] = {
    "read": ("list_folder", "mime"),
    "send": ("list", "create_draft", "create_reply", "update", "attach", "send_draft"),
    "find": ("list", "mime"),
    "health": ("me",),
}
"""The tools each kind of operation needs."""


@dataclass
class _Live:
    """The session of the operation under way, and whether it asked for a send."""

    client: Client
    sent: bool = False


_SESSION: ContextVar[_Live | None] = ContextVar("provider_mcp_session", default=None)
_GRAPH_ERROR = re.compile(r"Graph API (?:scope )?error:\s*(\d{3})\b[^-]*?-\s*(.*)\Z", re.S)
_SCOPE_ERROR = re.compile(r"Graph API scope error\b", re.I)
"""The ms365 servers' wording of a 403 about permissions, with or without the status."""
NOT_RUN = frozenset({METHOD_NOT_FOUND, INVALID_PARAMS})
"""JSON-RPC errors a server answers before running a tool (any other may come after)."""
_LARGEST_RESULT = 64 * 1024 * 1024
"""A tool result larger than this is refused (a message's MIME is far smaller)."""

SecretReader = Callable[[str], Secret]
T = TypeVar("T")


class McpServer:
    """The provider MCP server of one mailbox: how a session to it is opened."""

    def __init__(self, access: ProviderMcpAccess, mailbox_id: str, read: SecretReader) -> None:
        self._access = access
        self._mailbox_id = mailbox_id
        self._read = read
        self._http: httpx2.AsyncClient | None = None
        self._mode = "auto"
        self._discovered: DiscoverResult | None = None
        """The protocol era the server spoke the first time (``auto`` probes it: one more
        round trip, which later sessions skip)."""

    def __repr__(self) -> str:
        where = self._access.url or (self._access.command[0] if self._access.command else "")
        return f"McpServer(mailbox={self._mailbox_id!r}, server={where!r})"

    @property
    def shown(self) -> str:
        """The server as an operator knows it (never a secret: the context holds none)."""
        return self._access.url or " ".join(self._access.command[:1])

    @asynccontextmanager
    async def session(self) -> AsyncGenerator[Client]:
        """A session to the server, closed on leaving."""
        timeout = self._access.timeout_seconds
        if self._access.url is not None:
            if self._http is None:  # kept for the channel's life: making one costs ~50 ms
                self._http = httpx2.AsyncClient(timeout=timeout)
            if self._access.token is not None:  # read at each session: a rotated one is used
                bearer = f"Bearer {self._read(self._access.token).reveal()}"
                self._http.headers["Authorization"] = bearer
            transport = streamable_http_client(
                self._access.url, http_client=self._http, terminate_on_close=True
            )
            async with self._client(transport) as client:
                yield client
            return
        command, *args = self._access.command
        env = {**get_default_environment(), **self._server_env()}
        params = StdioServerParameters(command=command, args=args, env=env)
        # The server's own log is not ours to keep (it may say anything about its sign-in).
        with open(os.devnull, "w", encoding="utf-8") as errlog:  # noqa: PTH123, ASYNC230
            async with self._client(stdio_client(params, errlog=errlog)) as client:
                yield client

    @asynccontextmanager
    async def _client(self, transport: Any) -> AsyncGenerator[Client]:
        """A client session in the protocol era the server spoke before (else probed)."""
        client = Client(
            transport,
            read_timeout_seconds=self._access.timeout_seconds,
            mode=self._mode,
            prior_discover=self._discovered,
        )
        async with client:
            if self._mode == "auto":
                session = client.session
                if session.discover_result is not None:
                    self._mode = client.protocol_version or "auto"
                    self._discovered = session.discover_result
                elif session.initialize_result is not None:
                    self._mode = "legacy"
            yield client

    async def aclose(self) -> None:
        if self._http is not None:
            await self._http.aclose()
            self._http = None

    def _server_env(self) -> dict[str, str]:
        return {var: self._read(name).reveal() for var, name in self._access.env.items()}


class GraphOverMcp(httpx.AsyncBaseTransport):
    """Answers the Graph requests of the Graph logic by calling the ms365 dialect's tools in
    the session the current operation opened."""

    def __init__(self, tools: Mapping[str, str], timeout: float) -> None:
        self._tools = tools
        self._timeout = timeout

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        live = _SESSION.get()
        if live is None:
            raise httpx.ConnectError("no provider MCP session is open", request=request)
        try:
            tool, name, arguments = self._route(request)
        except ValueError as exc:
            return _graph_error(request, 501, "notSupported", str(exc))
        if tool == "send_draft":
            live.sent = True
        try:
            result = await live.client.call_tool(
                name, arguments, read_timeout_seconds=self._timeout
            )
        except MCPError as exc:
            if exc.error.code in NOT_RUN:  # refused before the tool ran: no such tool, bad input
                return _graph_error(request, 400, "providerMcpRefused", f"{name}: {exc}"[:300])
            raise httpx.ReadError(  # timed out, closed, an HTTP error: the call may have run
                f"the provider MCP server's answer to {name} was lost ({_one_line(exc)})",
                request=request,
            ) from None
        except Exception as exc:  # the session broke: the call may have run
            raise httpx.ReadError(
                f"the provider MCP server's answer to {name} was lost ({type(exc).__name__})",
                request=request,
            ) from None
        return _graph_answer(request, name, result)

    def _route(self, request: httpx.Request) -> tuple[str, str, dict[str, Any]]:
        path = request.url.path.removeprefix(urlsplit(BASE_URL).path)
        parts = [unquote(p) for p in path.split("/")]
        method = request.method
        query = _odata(request.url.params.multi_items())
        body = json.loads(request.content) if request.content else None
        tool, args = _graph_call(method, parts, body)
        return tool, self._tools[tool], {**args, **query}


def _graph_call(method: str, parts: list[str], body: Any) -> tuple[str, dict[str, Any]]:
    """The dialect's tool for a Graph request (method and path segments) and its arguments."""
    match method, parts:
        case "GET", ["me"]:
            return "me", {}
        case "GET", ["me", "messages"]:
            return "list", {}
        case "GET", ["me", "mailFolders", folder, "messages"]:
            return "list_folder", {"mailFolderId": folder}
        case "GET", ["me", "messages", message_id, "$value"]:
            return "mime", {"messageId": message_id}
        case "GET", ["me", "messages", message_id]:
            return "get", {"messageId": message_id}
        case "POST", ["me", "messages"]:
            return "create_draft", {"body": body}
        case "POST", ["me", "messages", message_id, "createReply"]:
            return "create_reply", {"messageId": message_id, **({"body": body} if body else {})}
        case "PATCH", ["me", "messages", message_id]:
            return "update", {"messageId": message_id, "body": body}
        case "POST", ["me", "messages", message_id, "attachments"]:
            return "attach", {"messageId": message_id, "body": body}
        case "POST", ["me", "messages", message_id, "send"]:
            return "send_draft", {"messageId": message_id}
        case _:
            raise ValueError(f"no ms365 tool makes the Graph request {method} /{'/'.join(parts)}")


def _odata(items: list[tuple[str, str]]) -> dict[str, Any]:
    """Graph's query options as the tools take them: without the ``$``, numbers as numbers."""
    args: dict[str, Any] = {}
    for key, value in items:
        name = key.removeprefix("$")
        args[name] = int(value) if name in {"top", "skip"} and value.isdigit() else value
    return args


def _graph_answer(request: httpx.Request, tool: str, result: CallToolResult) -> httpx.Response:
    """The Graph answer a tool result stands for."""
    text = "".join(c.text for c in result.content if isinstance(c, TextContent))
    if len(text) > _LARGEST_RESULT:
        return _graph_error(request, 502, "providerMcpResult", f"{tool} answered too much")
    if result.is_error:
        return _graph_failure(request, tool, text)
    try:
        data = json.loads(text)
    except ValueError:
        return _graph_error(request, 502, "providerMcpResult", f"{tool} answered no JSON")
    if isinstance(data, dict):
        return _graph_success(request, data)  # pyright: ignore[reportUnknownArgumentType]
    return httpx.Response(200, json=data, request=request)


def _graph_success(request: httpx.Request, data: dict[str, Any]) -> httpx.Response:
    raw = data.get("rawResponse")
    if isinstance(raw, str) and data.get("message") == "OK!":
        return httpx.Response(
            200,
            content=raw.encode("utf-8", "surrogateescape"),
            headers={"Content-Type": "message/rfc822"},
            request=request,
        )
    if data in ({"message": "OK!"}, {"success": True}):
        return httpx.Response(202, request=request)
    link = data.get("@odata.nextLink")
    if isinstance(link, str):
        data = {**data, "@odata.nextLink": _own_link(link, request)}
    return httpx.Response(200, json=data, request=request)


def _own_link(link: str, asked: httpx.Request) -> str:
    """A next-page link the server gave, addressed to this transport if it asks the same
    listing again (its path under ``/v1.0/`` the one asked, its query Graph's ``$``
    options only), so it is followed as a call to the same tool with the same folder;
    anything else is left as given, and the Graph logic refuses to follow it."""
    parts = urlsplit(link)
    _, found, rest = parts.path.partition("/v1.0/")
    if not found or BASE_URL + rest != str(asked.url.copy_with(query=None)):
        return link
    options = [(k, v) for k, v in parse_qsl(parts.query, keep_blank_values=True) if k[:1] == "$"]
    return str(httpx.URL(BASE_URL + rest, params=options))


def _graph_failure(request: httpx.Request, tool: str, text: str) -> httpx.Response:
    """A tool's error result as Graph's answer: the status and error body it quotes, else
    a 502 (the server lost or could not make the Graph request: its outcome is unknown)."""
    said = text
    try:
        data: Any = json.loads(text)
    except ValueError:
        data = None
    error = cast("dict[str, Any]", data).get("error") if isinstance(data, dict) else None
    if isinstance(error, str):
        said = error
    found = _GRAPH_ERROR.search(said)
    if found is not None:
        status = int(found.group(1))
        body = found.group(2).strip().encode()
        return httpx.Response(
            status, content=body, headers={"Content-Type": "application/json"}, request=request
        )
    if _SCOPE_ERROR.search(said):  # a permission refusal, whatever status it names
        return _graph_error(request, 403, "ErrorAccessDenied", f"{tool}: {said}"[:300])
    return _graph_error(request, 502, "providerMcpError", f"{tool}: {said}"[:300])


def _graph_error(request: httpx.Request, status: int, code: str, message: str) -> httpx.Response:
    body = {"error": {"code": code, "message": " ".join(message.split())}}
    return httpx.Response(status, json=body, request=request)


class _NoAuth(httpx.Auth):
    """The server signs in to the provider by itself: requests carry no credential."""


class _Unreachable(TransientFailure):
    """The server could not be started or reached, or its session broke."""


class ProviderMcpProvider(msgraph.GraphMailProvider):
    """The MailProvider port on a Microsoft mailbox through a provider MCP server of the
    ms365 dialect (see the module)."""

    def __init__(
        self,
        server: McpServer,
        mailbox_id: str,
        *,
        tools: Mapping[str, str] | None = None,
        sent_copy_latency: timedelta = timedelta(seconds=120),
        timeout: float = 60.0,
        page_size: int = msgraph.PAGE_SIZE,
    ) -> None:
        self._tool_names = {**MS365_TOOLS, **(tools or {})}
        api = ApiClient(
            base_url=BASE_URL,
            auth=_NoAuth(),
            mailbox_id=mailbox_id,
            read_error=msgraph.read_error,
            timeout=timeout,
            transport=GraphOverMcp(self._tool_names, timeout),
        )
        super().__init__(
            api,
            mailbox_id,
            sent_copy_latency=sent_copy_latency,
            page_size=page_size,
            channel=CHANNEL,
            immutable_ids=False,
        )
        self._server = server
        self._offered: frozenset[str] | None = None

    def __repr__(self) -> str:
        return f"ProviderMcpProvider(mailbox={self.mailbox_id!r}, server={self._server.shown!r})"

    async def _in_session(self, kind: str, operation: Callable[[], Awaitable[T]]) -> T:
        """``operation`` in a session of its own (the current one when nested), with the
        tools ``kind`` needs. A server that cannot be started or reached, or a session that
        breaks, is ``_Unreachable``; a failure closing the session after the operation
        finished changes nothing."""
        if _SESSION.get() is not None:
            return await operation()
        done: list[T] = []
        try:
            async with self._server.session() as client:
                await self._check_tools(client, kind)
                token = _SESSION.set(_Live(client))
                try:
                    done.append(await operation())
                finally:
                    _SESSION.reset(token)
        except ProviderError:
            raise
        except Exception as exc:
            if done:
                return done[0]
            inner = _provider_error_in(exc)
            if inner is not None:
                raise inner from None
            raise _Unreachable(
                f"mailbox {self.mailbox_id}: the provider MCP server {self._server.shown} "
                f"could not be reached or its session broke ({_one_line(exc)})"
            ) from None
        return done[0]

    async def _check_tools(self, client: Client, kind: str) -> None:
        if self._offered is None:
            listed = await client.list_tools()
            self._offered = frozenset(t.name for t in listed.tools)
        missing = [
            self._tool_names[need]
            for need in NEEDED[kind]
            if self._tool_names[need] not in self._offered
        ]
        if missing:
            raise Unsupported(
                f"mailbox {self.mailbox_id}: the provider MCP server {self._server.shown} offers "
                f"no tool {', '.join(missing)} (needed to {kind}); if it names it otherwise, "
                "map it under provider_mcp.tools in the workspace context"
            )

    async def changes(self, cursor: str | None) -> ChangePage:
        parent = super()
        return await self._in_session("read", lambda: parent.changes(cursor))

    async def fetch_body(self, body_ref: str) -> MessageBody:
        parent = super()
        return await self._in_session("find", lambda: parent.fetch_body(body_ref))

    async def fetch_attachment(self, ref: str) -> AttachmentData:
        parent = super()
        return await self._in_session("find", lambda: parent.fetch_attachment(ref))

    async def prepare(self, message: OutgoingMessage) -> Handover:
        parent = super()
        return await self._in_session("send", lambda: parent.prepare(message))

    async def send(self, handover: Handover) -> SendResult:
        parent = super()
        live: list[_Live] = []

        async def sending() -> SendResult:
            current = _SESSION.get()
            assert current is not None
            live.append(current)
            result = await parent.send(handover)
            return await self._with_copy_id(result)

        try:
            return await self._in_session("send", sending)
        except Unsupported as exc:  # a tool it lacks: known before anything was asked
            raise NotHandedOver(f"{exc}; nothing was handed over") from None
        except _Unreachable as exc:
            if live and live[0].sent:
                raise OutcomeUnknown(f"{exc}; the send was asked for and may have gone") from None
            raise NotHandedOver(f"{exc}; nothing was handed over") from None

    async def _with_copy_id(self, result: SendResult) -> SendResult:
        """The result naming the sent copy by its own id when Graph shows it already: ids
        through this channel are not immutable, so the draft's id is not the copy's."""
        marker = Marker(kind=MarkerKind.MESSAGE_ID, value=result.internet_message_id)
        try:
            copy = await self._sent_copy(marker)
        except ProviderError:
            return result  # it went: only its id is not known yet
        return (
            result if copy is None else result.model_copy(update={"provider_message_id": copy.id})
        )

    async def find_sent(self, marker: Marker) -> StoredCopy | None:
        parent = super()
        return await self._in_session("find", lambda: parent.find_sent(marker))

    async def health(self) -> ProviderHealth:
        parent = super()
        try:
            found = await self._in_session("health", parent.health)
        except ProviderError as exc:
            return ProviderHealth(
                provider=self.provider,
                mailbox_id=self.mailbox_id,
                ok=False,
                detail=str(exc),
                refused=isinstance(exc, AccessRefused),
            )
        server = f"the provider MCP server {self._server.shown}"
        return found.model_copy(update={"detail": found.detail.replace("Microsoft Graph", server)})

    async def aclose(self) -> None:
        await super().aclose()
        await self._server.aclose()


def _provider_error_in(exc: BaseException) -> ProviderError | None:
    """The operation's own failure inside the group a session's task group raised."""
    if isinstance(exc, ProviderError):
        return exc
    if isinstance(exc, BaseExceptionGroup):
        group = cast("BaseExceptionGroup[BaseException]", exc)
        for inner in group.exceptions:
            found = _provider_error_in(inner)
            if found is not None:
                return found
    return None


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split())[:200]


def open_provider_mcp(binding: MailboxBinding, *, read: SecretReader) -> ProviderMcpProvider:
    """The provider MCP channel of ``binding``'s mailbox, signing in to its server with the
    vault entries its context names (``read``)."""
    access = binding.provider_mcp
    if access is None:
        raise ProviderError(
            f"mailbox {binding.mailbox_id}: the provider_mcp channel is permitted but no server "
            "is named; add provider_mcp: with its command: or url: to the workspace context"
        )
    if binding.provider != "microsoft":
        raise Unsupported(
            f"mailbox {binding.mailbox_id}: the {access.dialect} provider MCP tools reach a "
            f"Microsoft mailbox, not a {binding.provider!r} one"
        )
    unknown = sorted(set(access.tools) - set(MS365_TOOLS))
    if unknown:
        raise Unsupported(
            f"mailbox {binding.mailbox_id}: provider_mcp.tools renames {', '.join(unknown)}, "
            f"which the ms365 dialect has no tool for ({', '.join(MS365_TOOLS)})"
        )
    mailbox_id = binding.mailbox_id.lower()
    return ProviderMcpProvider(
        McpServer(access, mailbox_id, read),
        mailbox_id,
        tools=access.tools,
        sent_copy_latency=timedelta(seconds=access.sent_copy_latency_seconds),
        timeout=access.timeout_seconds,
    )
