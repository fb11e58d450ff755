"""The stdio transport: the MCP SDK's own, plus an answer for every line it cannot read.

The SDK's reader (``stdin_reader`` in ``mcp.server.stdio.stdio_server``) parses each line
with pydantic-core's JSON parser. When that fails it puts the ``ValidationError`` on the read
stream, and the server's dispatcher (``JSONRPCDispatcher._dispatch`` in
``mcp.shared.jsonrpc_dispatcher``) logs it at debug level and drops it: the host waits for
that request's id forever. The parser refuses lines that are JSON-RPC all the same: a lone
UTF-16 surrogate escape (``"\\ud800"``), nesting deeper than about 200 levels, and the SDK's
models refuse others (a wrong ``jsonrpc`` version, a ``method`` that is not a string).

The rule: the line is read again here, with the too-deep part cut off, and

- not JSON even so: -32700 Parse error, id null (JSON-RPC 2.0, 5.1);
- a request whose envelope (``jsonrpc``, ``id``, ``method``) the SDK reads on its own:
  -32602 Invalid params with its id (a request has no other member than ``params``);
- any other request with an id that can be sent back: -32600 Invalid Request with that id;
  without one, id null;
- a notification: no answer (JSON-RPC never answers one); it is logged;
- the host's reply to one of the server's requests (sampling) with a readable id: that
  request fails with the error instead, so the tool call waiting on it ends.

A lone surrogate is an Invalid params error, not a parse error: JSON's grammar lets
``"\\ud800"`` through, but the string it stands for is not Unicode text (it has no UTF-8
form), so no tool can take it and no answer could carry it back, while the envelope reads
fine and the host needs its id to stop waiting.
"""

from __future__ import annotations

import contextvars
import json
import logging
import re
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Literal, Protocol, Self, cast

import anyio
from mcp.server import MCPServer
from mcp.server.stdio import stdio_server
from mcp.shared.message import SessionMessage
from mcp.types import (
    INVALID_PARAMS,
    INVALID_REQUEST,
    PARSE_ERROR,
    ErrorData,
    JSONRPCError,
    JSONRPCRequest,
    RequestId,
    jsonrpc_message_adapter,
)
from pydantic import ValidationError
from pydantic_core import ErrorDetails

logger = logging.getLogger(__name__)

SDK_MAX_DEPTH = 200
"""How deep the SDK's JSON parser nests (pydantic-core refuses 202 levels of arrays)."""

_STRUCTURE = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"|[\[\]{}]')
"""A whole JSON string (skipped, so brackets in it never count) or one bracket."""

_ENVELOPE = ("jsonrpc", "id", "method")


@dataclass(frozen=True)
class Judgement:
    """What becomes of one line the SDK could not read: ``answer`` sends ``error`` to the
    host, ``reply`` hands it to the server as the reply to its own request, ``drop`` logs
    ``reason`` and nothing more."""

    action: Literal["answer", "reply", "drop"]
    reason: str
    error: JSONRPCError | None = None


def _error(request_id: RequestId | None, code: int, message: str) -> JSONRPCError:
    return JSONRPCError(jsonrpc="2.0", id=request_id, error=ErrorData(code=code, message=message))


def _answer(request_id: RequestId | None, code: int, message: str) -> Judgement:
    return Judgement("answer", message, _error(request_id, code, message))


def _shed_depth(line: str) -> tuple[str, bool] | None:
    """The line with every array or object deeper than ``SDK_MAX_DEPTH`` levels replaced by
    ``null``, and whether one was; None when a deep one never closes (not JSON)."""
    kept: list[str] = []
    depth, resume = 0, 0
    cutting = False
    for match in _STRUCTURE.finditer(line):
        token = match.group()
        if token in ("[", "{"):
            depth += 1
            if depth == SDK_MAX_DEPTH + 1:
                kept += [line[resume : match.start()], "null"]
                cutting = True
        elif token in ("]", "}"):
            if depth == SDK_MAX_DEPTH + 1:
                resume, cutting = match.end(), False
            depth -= 1
    if cutting:
        return None
    if not kept:
        return line, False
    return "".join([*kept, line[resume:]]), True


def _is_text(value: object) -> bool:
    """Whether every string in ``value`` (keys too) is Unicode text: has a UTF-8 form."""
    try:
        json.dumps(value, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _reason(message: object, cut: bool, sdk_reason: str) -> str:
    if cut:
        return f"the message nests deeper than the {SDK_MAX_DEPTH} levels the MCP SDK reads"
    if not _is_text(message):
        return (
            "a string in the message holds a lone UTF-16 surrogate (such as \\ud800), which "
            "is not Unicode text"
        )
    return f"the MCP SDK refused the message ({sdk_reason})"


def _echoable_id(value: object) -> RequestId | None:
    """The id as the host sent it, when an answer can carry it: an integer or a string of
    Unicode text (JSON-RPC says null when it cannot be detected)."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, str) and _is_text(value):
        return value
    return None


def _readable_request(message: dict[str, object]) -> JSONRPCRequest | None:
    """The request as the SDK reads its envelope alone (``jsonrpc``, ``id``, ``method``)."""
    envelope = {key: message[key] for key in _ENVELOPE if key in message}
    try:
        parsed = jsonrpc_message_adapter.validate_json(json.dumps(envelope), by_name=False)
    except ValidationError:
        return None
    return parsed if isinstance(parsed, JSONRPCRequest) else None


def _judge_message(message: object, cut: bool, sdk_reason: str) -> Judgement:
    """The rule of this module's docstring, for a line that is JSON (``cut``: the part
    deeper than the SDK reads was cut off)."""
    if not isinstance(message, dict):
        return _answer(None, INVALID_REQUEST, "Invalid Request: not a JSON-RPC message object")
    fields = cast(dict[str, object], message)
    reason = _reason(fields, cut, sdk_reason)
    request_id = _echoable_id(fields.get("id"))
    if "method" in fields:
        if "id" not in fields:
            return Judgement("drop", f"a notification the MCP SDK could not read: {reason}")
        request = _readable_request(fields) if request_id is not None else None
        if request is not None:
            return _answer(request.id, INVALID_PARAMS, f"Invalid params: {reason}")
        return _answer(request_id, INVALID_REQUEST, f"Invalid Request: {reason}")
    if "result" in fields or "error" in fields:
        if request_id is None:
            return Judgement("drop", f"a reply without a usable id: {reason}")
        message_text = f"the host's reply to this request could not be read: {reason}"
        return Judgement("reply", message_text, _error(request_id, INVALID_REQUEST, message_text))
    return _answer(request_id, INVALID_REQUEST, f"Invalid Request: {reason}")


def _read_again(line: str) -> tuple[object, bool] | None:
    """The line parsed by the standard library with the too-deep part cut off, and whether
    a part was cut; None when it is not JSON even so."""
    shed = _shed_depth(line)
    if shed is None:
        return None
    try:
        return json.loads(shed[0]), shed[1]
    except (ValueError, RecursionError):
        return None


def _judge_line(line: str, sdk_reason: str) -> Judgement:
    """A line the SDK's JSON parser refused."""
    parsed = _read_again(line)
    if parsed is None:
        return _answer(None, PARSE_ERROR, f"Parse error: {sdk_reason}")
    message, cut = parsed
    return _judge_message(message, cut, sdk_reason)


def _is_top_level(error: ErrorDetails) -> bool:
    """Whether the error's input is the whole message: a wrong type for a union member, or
    a member's missing field (pydantic gives the object that lacks it)."""
    return len(error["loc"]) == 1 or (error["type"] == "missing" and len(error["loc"]) == 2)


def judge(exc: Exception) -> Judgement:
    """What to do about an exception the SDK's stdio reader put on the read stream instead
    of a message (it keeps the line, or the parsed message, as the error's input)."""
    if not isinstance(exc, ValidationError):
        return _answer(None, PARSE_ERROR, "Parse error: the MCP SDK could not read the line")
    errors = exc.errors(include_url=False)
    first = errors[0] if errors else None
    sdk_reason = first["msg"] if first is not None else str(exc)
    line = next((e["input"] for e in errors if e["type"] == "json_invalid"), None)
    if isinstance(line, str):
        return _judge_line(line, sdk_reason)
    message = next((e["input"] for e in errors if _is_top_level(e)), None)
    return _judge_message(message, False, sdk_reason)


class _SdkReadStream(Protocol):
    async def receive(self) -> SessionMessage | Exception: ...
    async def aclose(self) -> None: ...


class _SdkWriteStream(Protocol):
    async def send(self, item: SessionMessage, /) -> None: ...


class AnsweredReadStream:
    """The SDK's read stream without its exceptions: each line it could not read is judged
    (``judge``) and answered on the write stream, handed on as the reply to the server's
    request, or logged. The sender's context (``last_context``) passes through."""

    def __init__(self, inner: _SdkReadStream, answers: _SdkWriteStream) -> None:
        self._inner = inner
        self._answers = answers

    @property
    def last_context(self) -> contextvars.Context | None:
        context: contextvars.Context | None = getattr(self._inner, "last_context", None)
        return context

    async def receive(self) -> SessionMessage:
        while True:
            item = await self._inner.receive()
            if isinstance(item, SessionMessage):
                return item
            judgement = judge(item)
            logger.warning("a line the MCP SDK could not read: %s", judgement.reason)
            if judgement.error is None:
                continue
            if judgement.action == "reply":
                return SessionMessage(judgement.error)
            await self._send_answer(judgement.error)

    async def _send_answer(self, error: JSONRPCError) -> None:
        try:
            await self._answers.send(SessionMessage(error))
        except (anyio.ClosedResourceError, anyio.BrokenResourceError):
            logger.debug("the server is closing; no answer for request %r", error.id)

    async def aclose(self) -> None:
        await self._inner.aclose()

    def __aiter__(self) -> Self:
        return self

    async def __anext__(self) -> SessionMessage:
        try:
            return await self.receive()
        except anyio.EndOfStream:
            raise StopAsyncIteration from None

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc_val: BaseException | None,
        exc_tb: TracebackType | None,
    ) -> None:
        await self.aclose()


async def serve(server: MCPServer[Any]) -> None:
    """Serve over stdin and stdout exactly as ``MCPServer.run()`` does (the SDK's transport,
    its claim on fds 0 and 1 included), with every line the SDK cannot read answered."""
    # No public accessor exists for the low-level server; the SDK's own Client reaches it so.
    lowlevel = server._lowlevel_server  # pyright: ignore[reportPrivateUsage]
    async with stdio_server() as (read_stream, write_stream):
        await lowlevel.run(
            AnsweredReadStream(read_stream, write_stream),
            write_stream,
            lowlevel.create_initialization_options(),
        )
