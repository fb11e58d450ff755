"""Lines the MCP SDK cannot read, sent to a real ``outloop serve`` over stdio: each request
gets a JSON-RPC error with its id (null when the line is not JSON), a host reply the SDK
cannot read fails the tool call that waited on it, and the server answers the next request.

The SDK's own stdio reader drops them, which would leave the host waiting forever: the server
answers them itself (see mcp_server/stdio.py).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import anyio
import pytest
from anyio.abc import Process
from anyio.streams.buffered import BufferedByteReceiveStream

from tests.mcp.conftest import CLIENT, MAILBOX, OperatorStation

pytestmark = pytest.mark.anyio

SERVE = [sys.executable, "-m", "mcp_server.cli", "serve"]
ANSWER_TIMEOUT = 30.0
"""Seconds any one answer may take (the first includes the server's start)."""

PARSE_ERROR, INVALID_REQUEST, INVALID_PARAMS = -32700, -32600, -32602
DEEP = 100_000


class RawHost:
    """A host that writes raw lines to the server's stdin and reads its answers."""

    def __init__(self, process: Process) -> None:
        assert process.stdin is not None and process.stdout is not None
        self._stdin = process.stdin
        self._stdout = BufferedByteReceiveStream(process.stdout)
        self.seen: list[dict[str, Any]] = []

    async def send_line(self, line: bytes) -> None:
        await self._stdin.send(line + b"\n")

    async def send(self, message: dict[str, Any]) -> None:
        await self.send_line(json.dumps(message).encode())

    async def next_message(self) -> dict[str, Any]:
        line = await self._stdout.receive_until(b"\n", 64 * 1024 * 1024)
        message: dict[str, Any] = json.loads(line)
        self.seen.append(message)
        return message

    async def answer(self, request_id: int | None) -> dict[str, Any]:
        """The answer (result or error) carrying ``request_id``, within ANSWER_TIMEOUT."""
        with anyio.fail_after(ANSWER_TIMEOUT):
            for message in self.seen:
                if _answers(message, request_id):
                    return message
            while True:
                message = await self.next_message()
                if _answers(message, request_id):
                    return message

    async def request(self, request_id: int, method: str, **params: Any) -> dict[str, Any]:
        await self.send({"jsonrpc": "2.0", "id": request_id, "method": method, "params": params})
        return await self.answer(request_id)

    async def call_tool(self, request_id: int, name: str, **arguments: Any) -> dict[str, Any]:
        """A tool call that must succeed; its structured content."""
        answer = await self.request(request_id, "tools/call", name=name, arguments=arguments)
        assert "result" in answer and not answer["result"].get("isError"), answer
        content: dict[str, Any] = answer["result"]["structuredContent"]
        return content


def _answers(message: dict[str, Any], request_id: int | None) -> bool:
    return "method" not in message and message.get("id") == request_id


@asynccontextmanager
async def raw_host(
    data_dir: Path, tmp_path: Path, capabilities: dict[str, Any] | None = None
) -> AsyncIterator[RawHost]:
    """``outloop serve`` over stdio, initialized (protocol 2025-11-25) by a raw host."""
    env = {k: v for k, v in os.environ.items() if k != "OUTLOOP_MCP_TOKEN"}
    with (tmp_path / "serve.stderr").open("wb") as stderr:
        async with await anyio.open_process(
            [*SERVE, "--data-dir", str(data_dir)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=stderr,
            env=env,
        ) as process:
            host = RawHost(process)
            hello = await host.request(
                1,
                "initialize",
                protocolVersion="2025-11-25",
                capabilities=capabilities or {},
                clientInfo={"name": "raw-host", "version": "0"},
            )
            assert "result" in hello, hello
            await host.send({"jsonrpc": "2.0", "method": "notifications/initialized"})
            yield host
            process.terminate()


async def assert_still_serving(host: RawHost, request_id: int = 100) -> None:
    """The server answers a request sent after the one it could not read."""
    answer = await host.request(request_id, "tools/list")
    assert "send" in {tool["name"] for tool in answer["result"]["tools"]}


def tools_call(request_id: int, params_json: str) -> bytes:
    head = f'{{"jsonrpc":"2.0","id":{request_id},"method":"tools/call","params":'
    return (head + params_json + "}").encode()


UNREADABLE_PARAMS = {
    "lone-surrogate": tools_call(7, '{"name":"get_task","arguments":{"task_id":"task-\\ud800-1"}}'),
    "lone-low-surrogate-in-a-key": tools_call(7, '{"name":"get_task","arguments":{"\\udc00":"x"}}'),
    "nested-100000-levels": tools_call(7, "[" * DEEP + "]" * DEEP),
    "nested-300-levels-in-an-argument": tools_call(
        7, '{"name":"get_task","arguments":{"task_id":' + "[" * 300 + "]" * 300 + "}}"
    ),
}


async def test_the_invalid_params_error_says_which_limit_the_request_broke(
    station: OperatorStation, tmp_path: Path
) -> None:
    async with raw_host(station.data_dir, tmp_path) as host:
        await host.send_line(UNREADABLE_PARAMS["lone-surrogate"])
        surrogate = await host.answer(7)
        await host.send_line(tools_call(8, "[" * DEEP + "]" * DEEP))
        deep = await host.answer(8)
    assert "lone UTF-16 surrogate" in surrogate["error"]["message"]
    assert "deeper than the 200 levels" in deep["error"]["message"]


UNREADABLE_ENVELOPES = {
    "lone-surrogate-in-the-method": b'{"jsonrpc":"2.0","id":9,"method":"tools/\\ud800list"}',
    "jsonrpc-1.0": b'{"jsonrpc":"1.0","id":9,"method":"tools/list"}',
    "method-not-a-string": b'{"jsonrpc":"2.0","id":9,"method":7}',
    "deep-method": b'{"jsonrpc":"2.0","id":9,"method":' + b"[" * DEEP + b"]" * DEEP + b"}",
}


NOT_JSON = {
    "cut-short": b'{"jsonrpc":"2.0","id":10,"method":"tools/list"',
    "deep-and-never-closed": tools_call(10, "[" * DEEP).rstrip(b"}"),
    "not-json-at-all": b"hello, server",
}


def _with_id(line: bytes, old: int, new: int) -> bytes:
    return line.replace(f'"id":{old},'.encode(), f'"id":{new},'.encode(), 1)


async def test_every_line_the_sdk_cannot_read_is_answered_and_the_server_keeps_serving(
    station: OperatorStation, tmp_path: Path
) -> None:
    """One server takes every kind of unreadable line in turn: a request whose params the
    SDK cannot read gets Invalid params with its id, one whose envelope it cannot read gets
    Invalid Request with its id, a line that is not JSON gets a parse error with id null;
    after each, the next request is answered."""
    cases: list[tuple[str, bytes, int | None, int]] = []
    for number, (name, line) in enumerate(UNREADABLE_PARAMS.items(), start=200):
        cases.append((name, _with_id(line, 7, number), number, INVALID_PARAMS))
    for number, (name, line) in enumerate(UNREADABLE_ENVELOPES.items(), start=300):
        cases.append((name, _with_id(line, 9, number), number, INVALID_REQUEST))
    cases += [(name, line, None, PARSE_ERROR) for name, line in NOT_JSON.items()]
    async with raw_host(station.data_dir, tmp_path) as host:
        for index, (name, line, request_id, code) in enumerate(cases):
            await host.send_line(line)
            answer = await host.answer(request_id)
            assert answer["error"]["code"] == code, (name, answer)
            if code == INVALID_PARAMS:
                assert answer["error"]["message"].startswith("Invalid params:"), name
            host.seen.remove(answer)  # the next parse error (id null) is a new answer
            await assert_still_serving(host, request_id=1000 + index)


async def test_a_host_reply_the_sdk_cannot_read_fails_the_tool_call_waiting_for_it(
    station: OperatorStation, tmp_path: Path
) -> None:
    """render asks the host's model (sampling); a reply with a lone surrogate in its text
    ends the render call with an error instead of leaving it waiting."""
    station.clock.moment = datetime.now(UTC) - timedelta(minutes=1)
    station.deliver(sender=CLIENT, body="Please send the Q4 quote.")
    async with raw_host(station.data_dir, tmp_path, capabilities={"sampling": {}}) as host:
        scanned = await host.call_tool(2, "intake", mailbox_id=MAILBOX)
        [item] = scanned["items"]
        claimed = await host.call_tool(3, "claim", run_id=item["run_id"], item_ref=item["item_ref"])
        task_id = claimed["task_id"]
        for request_id, state in enumerate(("EXECUTING", "VERIFYING", "DRAFT_READY"), start=4):
            await host.call_tool(
                request_id, "transition_task", task_id=task_id, state=state, evidence="work"
            )
        await host.send(
            {
                "jsonrpc": "2.0",
                "id": 20,
                "method": "tools/call",
                "params": {"name": "render", "arguments": {"task_id": task_id, "language": "en"}},
            }
        )
        with anyio.fail_after(ANSWER_TIMEOUT):
            sampling = await host.next_message()
            while sampling.get("method") != "sampling/createMessage":
                sampling = await host.next_message()
        reply = json.dumps(
            {
                "jsonrpc": "2.0",
                "id": sampling["id"],
                "result": {
                    "role": "assistant",
                    "content": {"type": "text", "text": "PLACEHOLDER"},
                    "model": "host-model",
                },
            }
        ).replace("PLACEHOLDER", "The quote \\ud800 is ready.")
        await host.send_line(reply.encode())
        rendered = await host.answer(20)
        failed = "error" in rendered or rendered["result"].get("isError")
        assert failed, rendered
        assert "lone UTF-16 surrogate" in json.dumps(rendered), rendered
        await assert_still_serving(host)
