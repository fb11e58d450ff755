"""The internal mail scenarios through the MCP server: the tool's envelope, its answers with
the unread lane in ``_meta``, bounces, limits, delayed mail across a server restart, the
unread resource and its update events, and one session over a real stdio process."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.types import CallToolResult, TextResourceContents

from agent.domain.internal_mail import ACTIONS
from agent.services.internal_mail import delivery
from mcp_server.composition import DATA_DIR_ENV, read_settings
from mcp_server.mail import UNREAD_URI
from mcp_server.server import build_server
from tests.mail_world import MailWorld, call, inbox_ids, tree

pytestmark = pytest.mark.anyio


@pytest.fixture
def world(tmp_path: Path) -> MailWorld:
    return MailWorld(tmp_path / "data")


@asynccontextmanager
async def server(world: MailWorld, **env: str) -> AsyncIterator[Client]:
    """An MCP client of a server acting as the mailbox ``agent`` of this world."""
    settings = read_settings(
        data_dir=world.data_dir, environ={"OUTLOOP_MAIL_POLL_SECONDS": "0.05", **env}
    )
    async with Client(build_server(settings, clock=world.clock)) as client:
        yield client


async def mail(
    client: Client, action: str, summarize: bool | None = None, **fields: Any
) -> CallToolResult:
    arguments: dict[str, Any] = {"action": action, "input": fields, "reasoning": "a test"}
    if summarize is not None:
        arguments["summarize"] = summarize
    return await client.call_tool("internal_mail", arguments)


def answer(result: CallToolResult) -> dict[str, Any]:
    assert not result.is_error, result.content
    assert result.structured_content is not None
    return result.structured_content


def code(result: CallToolResult) -> str:
    assert result.is_error and result.structured_content is not None
    return str(result.structured_content["code"])


def unread_lane(result: CallToolResult) -> dict[str, Any]:
    assert result.meta is not None
    return result.meta["agent_meta"]["notifications"]["persistent"]["email"]


async def test_unknown_root_fields_and_foreign_input_fields_are_refused_before_any_io(
    world: MailWorld,
) -> None:
    async with server(world) as client:
        async with client.listen(resource_subscriptions=[UNREAD_URI]) as events:
            await mail(client, "send", address="agent", message="note")
            await next_unread_update(events)  # the session's own write for it is done
        before = tree(world.data_dir / "mail")
        extra = await client.call_tool(
            "internal_mail", {"action": "check", "input": {}, "reasoning": "r", "folder": "x"}
        )
        assert extra.is_error
        foreign = await mail(client, "send", address="agent", message="m", query="x")
        assert code(foreign) == "INVALID_INPUT"
        assert foreign.meta is None or "agent_meta" not in foreign.meta
        summarize_inside = await client.call_tool(
            "internal_mail", {"action": "check", "input": {"summarize": True}, "reasoning": "r"}
        )
        assert code(summarize_inside) == "INVALID_INPUT"
        assert tree(world.data_dir / "mail") == before


async def test_a_send_between_the_server_and_an_operator_with_replies_both_ways(
    world: MailWorld,
) -> None:
    noa = world.box("ops/noa", "operator", name="Noa Bar", nickname="Noa")
    async with server(world) as client:
        sent = answer(
            await mail(client, "send", address="ops/noa", message="ready?", subject="Deploy")
        )
        assert sent["status"] == "sent"
        world.clock.advance(seconds=1)
        call(noa, "reply", email_id=inbox_ids(noa), message="go ahead")
        checked = await mail(client, "check")
        [entry] = unread_lane(checked)["entries"]
        assert (entry["message"], entry["sender_nickname"], entry["subject"]) == (
            "go ahead",
            "Noa",
            "Re: Deploy",
        )
        world.clock.advance(seconds=1)
        world.network.beat(noa.box, "test")
        replied = await mail(client, "reply", email_id=[entry["email_id"]], message="done")
        assert unread_lane(replied)["total"] == 0  # the reply marked it read
        assert answer(replied)["to"] == ["ops/noa"]
    newest = call(noa, "check").payload["emails"][0]
    assert newest["preview"] == "done"


async def test_limits_and_guards_hold_through_the_server(world: MailWorld) -> None:
    world.box("ops/noa", "operator")
    async with server(world) as client:
        assert answer(await mail(client, "send", address="ops/noa", message="x" * 50_000))
        assert code(await mail(client, "send", address="ops/noa", message="x" * 50_001)) == (
            "BODY_TOO_LONG"
        )
        for _ in range(2):
            answer(await mail(client, "send", address="ops/noa", message="again"))
        assert code(await mail(client, "send", address="ops/noa", message="again")) == (
            "DUPLICATE_SEND"
        )
        [sent, *_] = answer(await mail(client, "check", folder="sent"))["emails"]
        assert code(await mail(client, "delete", email_id=[sent["email_id"]])) == "NOT_PERMITTED"


async def test_a_stale_heartbeat_target_bounces_into_the_result_events(world: MailWorld) -> None:
    world.box("agents/helper")
    async with server(world) as client:
        world.clock.advance(seconds=121)
        result = await mail(client, "send", address="agents/helper", message="ping")
        assert answer(result)["status"] == "sent"
        assert result.meta is not None
        [bounce] = result.meta["agent_meta"]["events"]
        assert bounce["type"] == "email.bounce" and "heartbeat" in bounce["reason"]


async def test_a_delayed_self_send_is_delivered_once_by_the_next_server(world: MailWorld) -> None:
    async with server(world) as client:
        answer(await mail(client, "send", address="agent", message="capsule", delay=600))
    world.clock.advance(seconds=601)
    async with server(world) as client:  # what is due is delivered before it is read
        assert unread_lane(await mail(client, "check"))["total"] == 1
    async with server(world) as client:
        result = await mail(client, "check")
        assert [e["message"] for e in unread_lane(result)["entries"]] == ["capsule"]


async def test_the_server_keeps_delivering_after_a_courier_pass_fails_unexpectedly(
    world: MailWorld, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    failures: list[int] = []
    failed_twice = anyio.Event()

    def broken(*_: object) -> bool:  # runs in the session's worker thread
        failures.append(1)
        if len(failures) == 2:
            anyio.from_thread.run_sync(failed_twice.set)
        raise RuntimeError("a fault nobody planned for")

    async with server(world) as client:
        answer(await mail(client, "send", address="agent", message="capsule", delay=600))
        async with client.listen(resource_subscriptions=[UNREAD_URI]) as events:
            with monkeypatch.context() as fault:
                fault.setattr(delivery, "_deliver", broken)
                world.clock.advance(seconds=601)
                with anyio.fail_after(30):
                    await failed_twice.wait()
            await next_unread_update(events)  # the next pass delivered it
        assert unread_lane(await mail(client, "check"))["total"] == 1
    assert "a courier pass failed" in caplog.text


async def next_unread_update(events: AsyncIterator[object]) -> None:
    """Wait, within a bound, for the server to publish a change of the unread resource."""
    with anyio.fail_after(30):
        async for event in events:
            if getattr(event, "uri", None) == UNREAD_URI:
                return
    raise AssertionError("the server's updates ended before the unread resource changed")


async def test_settings_and_manual_answer_without_a_mailbox_lane(world: MailWorld) -> None:
    async with server(world) as client:
        settings = await mail(client, "settings")
        assert settings.meta is None or "agent_meta" not in settings.meta
        assert len(answer(settings)["settings"]) == 5
        manual = answer(await mail(client, "manual"))
        assert manual["manual"].startswith("---") and Path(manual["path"]).is_file()
        (world.data_dir / "mail" / "network.json").write_text("[]")
        assert code(await mail(client, "settings")) == "SETTINGS_UNAVAILABLE"


async def test_the_unread_lane_overflows_to_a_spill_file_past_its_limit(world: MailWorld) -> None:
    world.configure(settings={"unread.max_entries": 1})
    triage = world.box("triage")
    async with server(world) as client:
        for n in range(3):
            call(triage, "send", address="agent", message=f"m{n}")
        lane = unread_lane(await mail(client, "check"))
        assert lane["total"] == 3 and len(lane["entries"]) == 1
        assert lane["overflow"]["omitted"] == 2 and Path(lane["overflow"]["spill"]).is_file()


async def test_summarize_shortens_a_check_through_the_server(world: MailWorld) -> None:
    triage = world.box("triage", name="Triage")
    async with server(world) as client:
        call(triage, "send", address="agent", message="body words", subject="S")
        short = answer(await mail(client, "check", summarize=True))
        assert short["lines"] == ["Triage: S [unread]"] and "emails" not in short


async def test_the_unread_resource_shows_the_lane_and_is_updated_when_mail_arrives(
    world: MailWorld,
) -> None:
    triage = world.box("triage")
    async with server(world) as client:
        async with client.listen(resource_subscriptions=[UNREAD_URI]) as events:
            call(triage, "send", address="agent", message="news")
            await next_unread_update(events)
        mirror = world.data_dir / "mail" / "agent" / ".notification" / "email.json"
        assert json.loads(mirror.read_text())["unread"] == 1  # rewritten as the mail arrived
        contents = (await client.read_resource(UNREAD_URI)).contents
        text = next(c.text for c in contents if isinstance(c, TextResourceContents))
        assert '"news"' in text


async def test_the_tool_works_over_a_real_stdio_server_process(world: MailWorld) -> None:
    outloop = Path(sys.executable).with_name("outloop")
    env = {**os.environ, DATA_DIR_ENV: str(world.data_dir), "OUTLOOP_MAIL_AS": "agents/stdio"}
    params = StdioServerParameters(command=str(outloop), args=["serve"], env=env)
    async with Client(stdio_client(params)) as client:
        sent = await mail(client, "send", address="agents/stdio", message="over the wire")
        assert answer(sent)["status"] == "sent"
        [entry] = unread_lane(sent)["entries"]
        assert entry["message"] == "over the wire"
        assert code(await mail(client, "read", email_id=["nope"])) == "NOT_FOUND"
    heartbeat = world.data_dir / "mail" / "agents" / "stdio" / "heartbeat.json"
    assert not heartbeat.exists()  # the session's heartbeat goes when the server stops


async def test_the_tool_schema_offers_every_action_and_requires_the_envelope(
    world: MailWorld,
) -> None:
    async with server(world) as client:
        [tool] = [t for t in (await client.list_tools()).tools if t.name == "internal_mail"]
    schema = tool.input_schema
    assert set(schema["properties"]["action"]["enum"]) == set(ACTIONS)
    assert set(schema["required"]) == {"action", "input", "reasoning"}
    assert schema["additionalProperties"] is False
