"""``outloop bench mcp``: the latency of ``gate_check`` and ``get_task`` through the MCP server,
in process and over a real stdio subprocess, against the SDK's bare no-op tool measured the
same way in the same run.

The station is a scratch data directory with one registered workspace, one claimed task and
one rendered draft (set up through the server's own tools, as a host would). Each figure is
the latency of one call as the client sees it; p50 and p99 over ``calls`` calls after a
warm-up. The target is a p50 within 2x of the no-op baseline on the same transport.
"""

from __future__ import annotations

import mailbox
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from email.message import EmailMessage
from email.policy import SMTP
from email.utils import format_datetime, make_msgid
from pathlib import Path
from typing import Any

import anyio
from mcp import Client
from mcp.client.stdio import StdioServerParameters
from mcp.server import MCPServer
from mcp.types import ToolAnnotations

from agent.services import workspaces
from agent.services.clock import SystemClock
from agent.storage.sqlite import SqliteStore

TARGET_RATIO = 2.0
WORKSPACE = "ws-bench-mcp"
MAILBOX = "support@fabrikam.test"
CLIENT = "dana.levi@contoso.test"
CONTEXT = f"""\
workspace_id: {WORKSPACE}
label: MCP benchmark
timezone: Asia/Jerusalem
language: en
calendar: {{weekend: [fri, sat], holidays: []}}
mailboxes:
  - {{mailbox_id: {MAILBOX}, provider: maildir, path: Maildir}}
contacts:
  - {{address: {CLIENT}, name: Dana Levi, side: client, verified_by: crm-record}}
  - {{address: noa.bar@fabrikam.test, name: Noa Bar, side: internal,
     roles: [approver, client_manager], verified_by: directory}}
approval: {{roles: [approver], standing: []}}
default_cc: []
escalation_contact: noa.bar@fabrikam.test
unresolved_queue: unresolved
receipt_ack: false
reminder_business_days: 2
grants: {{licence: active, mailboxes: [{MAILBOX}]}}
client_send_policy: draft_for_internal_approval
classification: {{task_owner_evidence: false}}
kpis: {{official: {{first_response_hours: 8}}}}
task_board: {{provider: embedded, project_id: bench, intake_location_id: inbox}}
attachments: {{accepted: [pdf]}}
"""

NOOP_SERVER = """\
from mcp.server import MCPServer
from mcp.types import ToolAnnotations

server = MCPServer("noop", log_level="WARNING")


@server.tool(annotations=ToolAnnotations(read_only_hint=True, destructive_hint=False,
    idempotent_hint=True, open_world_hint=False))
async def noop() -> str:
    return "ok"


server.run()
"""

Call = Callable[[], Awaitable[Any]]


def bare_server() -> MCPServer[Any]:
    """The SDK's bare server with one no-op tool: the baseline."""
    server: MCPServer[Any] = MCPServer("noop", log_level="WARNING")

    @server.tool(
        annotations=ToolAnnotations(
            read_only_hint=True, destructive_hint=False, idempotent_hint=True, open_world_hint=False
        )
    )
    async def noop() -> str:  # pyright: ignore[reportUnusedFunction]
        return "ok"

    return server


def prepare_station(root: Path) -> Path:
    """A data directory with the benchmark workspace and one client request in its Maildir."""
    contexts = root / "contexts"
    contexts.mkdir(parents=True, exist_ok=True)
    box = mailbox.Maildir(str(contexts / "Maildir"), create=True)
    msg = EmailMessage(policy=SMTP)
    msg["From"] = f"Dana Levi <{CLIENT}>"
    msg["To"] = MAILBOX
    msg["Subject"] = "Quote request"
    msg["Date"] = format_datetime(SystemClock().now())
    msg["Message-ID"] = make_msgid(domain="contoso.test")
    msg.set_content("Could you send the Q4 quote?")
    box.add(msg.as_bytes())
    (contexts / "context.yaml").write_text(CONTEXT, encoding="utf-8")
    data = root / "data"
    data.mkdir(exist_ok=True)
    store = SqliteStore(workspaces.DataDir(data).database)
    try:
        workspaces.add_workspace(
            store, workspaces.DataDir(data), contexts / "context.yaml", SystemClock().now()
        )
    finally:
        store.close()
    return data


async def _ok(client: Client, tool: str, arguments: dict[str, Any]) -> dict[str, Any]:
    result = await client.call_tool(tool, arguments)
    if result.is_error:
        raise RuntimeError(f"{tool} failed during the benchmark setup: {result}")
    return result.structured_content or {}


async def work_item(client: Client) -> tuple[str, str]:
    """Take the request in and draft a reply, through the tools: (task_id, draft_id)."""
    intake = await _ok(client, "intake", {"mailbox_id": MAILBOX})
    [item] = intake["items"]
    claimed = await _ok(client, "claim", {"run_id": intake["run_id"], "item_ref": item["item_ref"]})
    task_id = str(claimed["task_id"])
    for state in ("EXECUTING", "VERIFYING", "DRAFT_READY"):
        await _ok(
            client, "transition_task", {"task_id": task_id, "state": state, "evidence": "bench"}
        )
    draft = await _ok(
        client, "render", {"task_id": task_id, "body_markdown": "The Q4 quote is **$1,200**."}
    )
    await _ok(client, "reconcile", {"run_id": intake["run_id"]})
    return task_id, str(draft["draft_id"])


async def _latencies(call: Call, calls: int, warmup: int) -> list[float]:
    for _ in range(warmup):
        await call()
    out: list[float] = []
    for _ in range(calls):
        start = time.perf_counter()
        await call()
        out.append((time.perf_counter() - start) * 1000.0)
    return out


def _figures(samples: list[float]) -> dict[str, float]:
    ordered = sorted(samples)
    p99 = ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]
    return {"p50_ms": round(statistics.median(ordered), 3), "p99_ms": round(p99, 3)}


async def _measure(
    ours: Client, bare: Client, task_id: str, draft_id: str, calls: int, warmup: int
) -> dict[str, dict[str, float]]:
    async def noop() -> Any:
        return await bare.call_tool("noop", {})

    async def get_task() -> Any:
        return await ours.call_tool("get_task", {"task_id": task_id})

    async def gate_check() -> Any:
        return await ours.call_tool(
            "gate_check", {"task_id": task_id, "draft_id": draft_id, "to": [CLIENT]}
        )

    figures: dict[str, dict[str, float]] = {}
    for name, call in (("noop", noop), ("get_task", get_task), ("gate_check", gate_check)):
        figures[name] = _figures(await _latencies(call, calls, warmup))
    for name in ("get_task", "gate_check"):
        figures[name]["ratio_p50_to_noop"] = round(
            figures[name]["p50_ms"] / figures["noop"]["p50_ms"], 2
        )
    return figures


async def run(
    make_server: Callable[[Path], MCPServer[Any]],
    serve_command: list[str],
    scratch: Path,
    calls: int = 300,
    warmup: int = 30,
) -> dict[str, Any]:
    """Measure in process, then over stdio (``serve_command`` plus ``--data-dir``)."""
    data = prepare_station(scratch)
    async with Client(make_server(data)) as ours, Client(bare_server()) as bare:
        task_id, draft_id = await work_item(ours)
        in_process = await _measure(ours, bare, task_id, draft_id, calls, warmup)
    script = scratch / "noop_server.py"
    script.write_text(NOOP_SERVER, encoding="utf-8")
    ours_params = StdioServerParameters(
        command=serve_command[0], args=[*serve_command[1:], "--data-dir", str(data)]
    )
    bare_params = StdioServerParameters(command=sys.executable, args=[str(script)])
    with anyio.fail_after(300):
        async with Client(ours_params) as ours, Client(bare_params) as bare:
            stdio = await _measure(ours, bare, task_id, draft_id, calls, warmup)
    gate = in_process["gate_check"]
    noop = in_process["noop"]
    worst = max(
        figures[name]["ratio_p50_to_noop"]
        for figures in (in_process, stdio)
        for name in ("get_task", "gate_check")
    )
    return {
        "bench": "mcp",
        "rate_per_s": round(1000.0 / gate["p50_ms"], 1),
        "baseline_per_s": round(1000.0 / noop["p50_ms"], 1),
        "ratio": round(noop["p50_ms"] / gate["p50_ms"], 3),
        "p50_ms": gate["p50_ms"],
        "p99_ms": gate["p99_ms"],
        "calls": calls,
        "in_process": in_process,
        "stdio": stdio,
        "target_p50_ratio": TARGET_RATIO,
        "worst_p50_ratio": worst,
        "within_target": worst <= TARGET_RATIO,
    }
