"""The whole lifecycle over a real stdio subprocess and over streamable HTTP with a bearer
token; HTTP refuses requests without it and refuses to start where it would be exposed."""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import IO

import anyio
import httpx2
import pytest
from mcp import Client
from mcp.client.stdio import StdioServerParameters
from mcp.client.streamable_http import streamable_http_client

from tests.mcp.conftest import MAILBOX, OperatorStation
from tests.mcp.lifecycle import drive_lifecycle

pytestmark = pytest.mark.anyio

SERVE = [sys.executable, "-m", "mcp_server.cli", "serve"]
READY_TIMEOUT = 60.0


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "OUTLOOP_MCP_TOKEN"}
    env.update(extra)
    return env


def _ready_line(stream: IO[str], proc: subprocess.Popen[str]) -> dict[str, str]:
    """The server's JSON ready line (readline blocks until it is written or the pipe ends)."""
    line = stream.readline()
    if not line:
        raise AssertionError(f"the server exited ({proc.wait(5)}) before it was ready")
    return json.loads(line)


@contextmanager
def http_server(
    data_dir: Path, *args: str, **env: str
) -> Iterator[tuple[str, subprocess.Popen[str]]]:
    proc = subprocess.Popen(
        [*SERVE, "--transport", "http", "--port", "0", "--data-dir", str(data_dir), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=_env(**env),
    )
    try:
        assert proc.stdout is not None
        ready = _ready_line(proc.stdout, proc)
        yield ready["url"], proc
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        for pipe in (proc.stdout, proc.stderr):
            if pipe is not None:
                pipe.close()


@asynccontextmanager
async def _bearer(url: str, token: str) -> AsyncIterator[Client]:
    """A client that sends the bearer token (the HTTP client is ours to close)."""
    async with (
        httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}) as http,
        Client(streamable_http_client(url, http_client=http)) as client,
    ):
        yield client


async def test_the_whole_lifecycle_runs_over_a_real_stdio_subprocess(
    station: OperatorStation,
) -> None:
    params = StdioServerParameters(
        command=SERVE[0],
        args=[*SERVE[1:], "--data-dir", str(station.data_dir)],
        env=_env(),
    )
    with anyio.fail_after(READY_TIMEOUT):
        async with Client(params) as client:
            done = await drive_lifecycle(client, station, wall_clock=True)
    assert done["sent"]["delivered"] is False


async def test_the_whole_lifecycle_runs_over_http_with_a_bearer_token(
    station: OperatorStation,
) -> None:
    token = secrets.token_urlsafe(32)
    with http_server(station.data_dir, OUTLOOP_MCP_TOKEN=token) as (url, proc):
        with anyio.fail_after(READY_TIMEOUT):
            async with _bearer(url, token) as client:
                done = await drive_lifecycle(client, station, wall_clock=True)
        assert done["sent"]["delivered"] is False
        proc.terminate()
        _, stderr = proc.communicate(timeout=15)
    assert proc.returncode == 0, stderr  # SIGTERM stops it cleanly
    assert token not in stderr


async def test_http_refuses_requests_without_the_token_or_with_a_wrong_one(
    station: OperatorStation,
) -> None:
    token = secrets.token_urlsafe(32)
    station.deliver(sender="dana.levi@contoso.test")
    with http_server(station.data_dir, OUTLOOP_MCP_TOKEN=token) as (url, proc):
        body = {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}}
        headers = {"Accept": "application/json, text/event-stream"}
        async with httpx2.AsyncClient() as raw:
            missing = await raw.post(url, json=body, headers=headers)
            wrong = await raw.post(
                url, json=body, headers={**headers, "Authorization": "Bearer " + "x" * 43}
            )
        assert missing.status_code == 401 and wrong.status_code == 401
        with anyio.fail_after(READY_TIMEOUT), pytest.raises(Exception):  # noqa: B017
            async with _bearer(url, "not-" + token) as client:
                await client.call_tool("intake", {"mailbox_id": MAILBOX})
        # Nothing ran: the refused calls started no run and created no task.
        store = station.store()
        try:
            assert store.list_runs() == [] and store.counts()["tasks"] == 0
        finally:
            store.close()
        assert proc.poll() is None  # still serving


async def test_http_refuses_a_forged_host_header(station: OperatorStation) -> None:
    token = secrets.token_urlsafe(32)
    with http_server(station.data_dir, OUTLOOP_MCP_TOKEN=token) as (url, _):
        async with httpx2.AsyncClient() as raw:
            forged = await raw.post(
                url,
                json={"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}},
                headers={
                    "Accept": "application/json, text/event-stream",
                    "Authorization": f"Bearer {token}",
                    "Host": "attacker.example:80",
                },
            )
    assert forged.status_code in {403, 421}


def _start(data_dir: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*SERVE, "--transport", "http", "--port", "0", "--data-dir", str(data_dir), *args],
        capture_output=True,
        text=True,
        env=_env(**env),
        timeout=60,
        check=False,
    )


def test_http_without_a_token_refuses_to_start(station: OperatorStation) -> None:
    done = _start(station.data_dir)
    assert done.returncode != 0 and "OUTLOOP_MCP_TOKEN" in done.stderr


def test_a_non_loopback_address_without_a_token_refuses_to_start(station: OperatorStation) -> None:
    done = _start(station.data_dir, "--host", "0.0.0.0")
    assert done.returncode != 0 and "token" in done.stderr


def test_insecure_no_auth_is_refused_off_loopback(station: OperatorStation) -> None:
    done = _start(station.data_dir, "--host", "0.0.0.0", "--insecure-no-auth")
    assert done.returncode != 0 and "loopback" in done.stderr


def test_a_short_token_is_refused(station: OperatorStation) -> None:
    done = _start(station.data_dir, OUTLOOP_MCP_TOKEN="short")
    assert done.returncode != 0 and "at least" in done.stderr
    assert "short" not in done.stderr  # the error never repeats the token


async def test_insecure_no_auth_serves_loopback_and_warns_loudly(station: OperatorStation) -> None:
    with http_server(station.data_dir, "--insecure-no-auth") as (url, proc):
        with anyio.fail_after(READY_TIMEOUT):
            async with Client(url) as client:
                tools = await client.list_tools()
        assert "send" in {t.name for t in tools.tools}
        proc.terminate()
        _, stderr = proc.communicate(timeout=15)
    assert "WITHOUT AUTHENTICATION" in stderr
