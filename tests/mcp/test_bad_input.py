"""Bad calls: malformed, oversized, mistyped, missing or extra arguments, unknown tools,
resources and ids. Each one is a tool error whose sentence says what to fix (a resource: a
JSON-RPC error; approval evidence never judged on the task or another task's draft: a
refusal saying why); the server keeps answering and the store is left as it was."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
from mcp import Client
from mcp.shared.exceptions import MCPError
from mcp.types import CallToolResult

from mcp_server.runtime import REFUSED
from mcp_server.server import RESOURCE_NOT_FOUND
from tests.mcp.conftest import (
    APPROVER,
    CLIENT,
    COLLEAGUE,
    MAILBOX,
    OperatorStation,
    call,
    intake_and_claim,
    to_draft_ready,
    tool_error,
)

pytestmark = pytest.mark.anyio

WS = "ws-test-0001"
LONG_ID = "x" * 10_000


@dataclass(frozen=True)
class Scene:
    """One claimed task in DRAFT_READY with one rendered English draft."""

    run_id: str
    item_ref: str
    task_id: str
    draft_id: str
    digest: str


async def scene(client: Client, station: OperatorStation) -> Scene:
    station.deliver(sender=CLIENT, subject="Quote request")
    found, [claim] = await intake_and_claim(client)
    [item] = found["items"]
    task_id = claim["task_id"]
    await to_draft_ready(client, task_id)
    draft = await call(
        client, "render", task_id=task_id, body_markdown="Hello Dana, it is $100.", language="en"
    )
    return Scene(item["run_id"], item["item_ref"], task_id, draft["draft_id"], draft["digest"])


def snapshot(station: OperatorStation, task_id: str) -> dict[str, Any]:
    """What a bad call must not change: the store's rows, the task, runs, proposals, and
    every file of the Maildir (the inbox and the sent copies)."""
    store = station.store()
    try:
        task = store.get_task(task_id)
        state = {
            "counts": store.counts(),
            "task": task.model_dump_json() if task is not None else None,
            "runs": store.list_runs(),
            "proposals": [p.proposal_id for p in store.list_proposals(WS)],
        }
    finally:
        store.close()
    state["maildir"] = sorted(
        str(p.relative_to(station.maildir)) for p in station.maildir.rglob("*") if p.is_file()
    )
    return state


async def still_answers(client: Client, task_id: str) -> dict[str, Any]:
    """The server answers ordinary calls; the task as it sees it."""
    task = await call(client, "get_task", task_id=task_id)
    queue = await call(client, "list_queue", workspace_id=WS)
    assert task_id in [t["task_id"] for t in queue["tasks"]]
    return task


@dataclass(frozen=True)
class Attempt:
    """One bad call, with what the server showed and stored before and after it."""

    outcome: CallToolResult | MCPError
    seen_before: dict[str, Any]
    seen_after: dict[str, Any]
    stored_before: dict[str, Any]
    stored_after: dict[str, Any]


async def attempt(
    client: Client, station: OperatorStation, task_id: str, tool: str, arguments: dict[str, Any]
) -> Attempt:
    seen = await still_answers(client, task_id)
    stored = snapshot(station, task_id)
    outcome: CallToolResult | MCPError
    try:
        outcome = await client.call_tool(tool, arguments)
    except MCPError as exc:
        outcome = exc
    return Attempt(
        outcome, seen, await still_answers(client, task_id), stored, snapshot(station, task_id)
    )


def assert_harmless_tool_error(done: Attempt, says: tuple[str, ...]) -> str:
    """A tool error (never a JSON-RPC error or refusal) naming ``says``; the server showed
    and stored the same before and after the call. Its text."""
    outcome = done.outcome
    assert not isinstance(outcome, MCPError), (
        f"a JSON-RPC error (code {outcome.code}, data {outcome.data}) instead of a tool "
        f"error: {outcome.message}"
    )
    assert outcome.is_error, f"the call unexpectedly succeeded: {outcome.structured_content}"
    content = outcome.content[0]
    assert content.type == "text"
    text = content.text
    for words in says:
        assert words.lower() in text.lower(), (words, text)
    assert len(text) < 3000, "the error must not echo an oversized argument back"
    assert done.seen_after == done.seen_before
    assert done.stored_after == done.stored_before
    return text


Args = Callable[[Scene], dict[str, Any]]


def recipients(n: int) -> list[str]:
    return [f"person{i}@contoso.test" for i in range(n)]


# -- malformed, oversized, mistyped, missing and null arguments -----------------------------

MALFORMED: list[Any] = [
    # oversized
    pytest.param(
        "render",
        lambda s: {"task_id": s.task_id, "body_markdown": "x" * 100_001},
        ("body_markdown", "100000"),
        id="render-body-over-100000-chars",
    ),
    pytest.param(
        "get_task", lambda s: {"task_id": LONG_ID}, ("task_id", "200"), id="get_task-10000-char-id"
    ),
    pytest.param(
        "send",
        lambda s: {"task_id": s.task_id, "draft_id": LONG_ID, "to": [CLIENT]},
        ("draft_id",),
        id="send-10000-char-draft-id",
    ),
    pytest.param(
        "claim",
        lambda s: {"run_id": LONG_ID, "item_ref": s.item_ref},
        ("run_id",),
        id="claim-10000-char-run-id",
    ),
    pytest.param(
        "reconcile", lambda s: {"run_id": LONG_ID}, ("run_id",), id="reconcile-10000-char-run-id"
    ),
    pytest.param(
        "list_queue",
        lambda s: {"workspace_id": LONG_ID},
        ("workspace_id",),
        id="list_queue-10000-char-workspace-id",
    ),
    pytest.param(
        "read_back",
        lambda s: {"send_id": LONG_ID},
        ("send_id", "4000"),
        id="read_back-10000-char-send-id",
    ),
    pytest.param(
        "record_approval",
        lambda s: {"task_id": s.task_id, "reply_message_id": LONG_ID},
        ("reply_message_id",),
        id="record_approval-10000-char-message-id",
    ),
    pytest.param(
        "gate_check",
        lambda s: {"task_id": s.task_id, "draft_id": s.draft_id, "to": recipients(51)},
        ("to", "50"),
        id="gate_check-51-recipients",
    ),
    pytest.param(
        "send",
        lambda s: {"task_id": s.task_id, "draft_id": s.draft_id, "to": recipients(51)},
        ("to", "50"),
        id="send-51-recipients",
    ),
    pytest.param(
        "send",
        lambda s: {
            "task_id": s.task_id,
            "draft_id": s.draft_id,
            "to": [CLIENT],
            "cc": recipients(51),
        },
        ("cc", "50"),
        id="send-51-cc",
    ),
    pytest.param(
        "request_approval",
        lambda s: {"task_id": s.task_id, "draft_id": s.draft_id, "to": recipients(51)},
        ("to", "50"),
        id="request_approval-51-recipients",
    ),
    pytest.param(
        "submit_learning",
        lambda s: {"workspace_id": WS, "kind": "rule", "summary": "s" * 301},
        ("summary", "300"),
        id="submit_learning-summary-over-300",
    ),
    pytest.param(
        "submit_learning",
        lambda s: {"workspace_id": WS, "kind": "rule", "summary": "s", "detail": "d" * 5001},
        ("detail", "5000"),
        id="submit_learning-detail-over-5000",
    ),
    pytest.param(
        "submit_learning",
        lambda s: {
            "workspace_id": WS,
            "kind": "rule",
            "summary": "s",
            "evidence": [f"<m{i}@x.test>" for i in range(21)],
        },
        ("evidence", "20"),
        id="submit_learning-21-evidence",
    ),
    pytest.param(
        "transition_task",
        lambda s: {"task_id": s.task_id, "state": "EXECUTING", "evidence": "e" * 2001},
        ("evidence", "2000"),
        id="transition_task-evidence-over-2000",
    ),
    # addresses that smuggle a header or a second recipient
    pytest.param(
        "send",
        lambda s: {
            "task_id": s.task_id,
            "draft_id": s.draft_id,
            "to": ["dana.levi@contoso.test\r\nBcc: mallory@evil.test"],
        },
        ("to",),
        id="send-address-with-newline",
    ),
    pytest.param(
        "gate_check",
        lambda s: {
            "task_id": s.task_id,
            "draft_id": s.draft_id,
            "to": [CLIENT],
            "cc": ["noa.bar@fabrikam.test\nmallory@evil.test"],
        },
        ("cc",),
        id="gate_check-cc-with-newline",
    ),
    pytest.param(
        "send",
        lambda s: {
            "task_id": s.task_id,
            "draft_id": s.draft_id,
            "to": ["dana.levi@contoso.test,mallory@evil.test"],
        },
        ("to",),
        id="send-address-with-comma",
    ),
    pytest.param(
        "request_approval",
        lambda s: {
            "task_id": s.task_id,
            "draft_id": s.draft_id,
            "cc": ["dana.levi@contoso.test;mallory@evil.test"],
        },
        ("cc",),
        id="request_approval-address-with-semicolon",
    ),
    pytest.param(
        "send",
        lambda s: {
            "task_id": s.task_id,
            "draft_id": s.draft_id,
            "to": ["Dana <dana.levi@contoso.test>"],
        },
        ("to",),
        id="send-display-name-address",
    ),
    pytest.param(
        "intake",
        lambda s: {"mailbox_id": "support@fabrikam.test\nmallory@evil.test"},
        ("mailbox_id",),
        id="intake-mailbox-with-newline",
    ),
    pytest.param(
        "get_task", lambda s: {"task_id": "task\x00-1"}, ("task_id",), id="get_task-control-char"
    ),
    pytest.param("get_task", lambda s: {"task_id": ""}, ("task_id",), id="get_task-empty-id"),
    pytest.param(
        "transition_task",
        lambda s: {"task_id": s.task_id, "state": "EXECUTING", "evidence": ""},
        ("evidence",),
        id="transition_task-empty-evidence",
    ),
    pytest.param(
        "render",
        lambda s: {"task_id": s.task_id, "body_markdown": ""},
        ("body_markdown",),
        id="render-empty-body",
    ),
    pytest.param(
        "render",
        lambda s: {"task_id": s.task_id, "body_markdown": "Hi", "language": "english"},
        ("language",),
        id="render-bad-language-tag",
    ),
    # wrong types
    pytest.param("get_task", lambda s: {"task_id": 5}, ("task_id",), id="get_task-int-id"),
    pytest.param(
        "gate_check",
        lambda s: {"task_id": s.task_id, "draft_id": s.draft_id, "to": CLIENT},
        ("to",),
        id="gate_check-to-as-string",
    ),
    pytest.param(
        "send",
        lambda s: {"task_id": s.task_id, "draft_id": s.draft_id, "to": [5]},
        ("to",),
        id="send-to-int",
    ),
    pytest.param(
        "render",
        lambda s: {"task_id": s.task_id, "body_markdown": ["Hello"]},
        ("body_markdown",),
        id="render-body-as-list",
    ),
    pytest.param(
        "transition_task",
        lambda s: {"task_id": s.task_id, "state": 3, "evidence": "e"},
        ("state",),
        id="transition_task-state-int",
    ),
    pytest.param(
        "submit_learning",
        lambda s: {"workspace_id": WS, "kind": "rule", "summary": "s", "evidence": "<m@x>"},
        ("evidence",),
        id="submit_learning-evidence-as-string",
    ),
    pytest.param(
        "claim",
        lambda s: {"run_id": s.run_id, "item_ref": {"ref": s.item_ref}},
        ("item_ref",),
        id="claim-item-ref-as-object",
    ),
    # missing required arguments
    pytest.param("get_task", lambda s: {}, ("task_id",), id="get_task-missing-id"),
    pytest.param("intake", lambda s: {}, ("mailbox_id",), id="intake-missing-mailbox"),
    pytest.param(
        "send",
        lambda s: {"task_id": s.task_id, "draft_id": s.draft_id},
        ("to",),
        id="send-missing-to",
    ),
    pytest.param(
        "render", lambda s: {"task_id": s.task_id}, ("body_markdown",), id="render-missing-body"
    ),
    pytest.param(
        "transition_task",
        lambda s: {"task_id": s.task_id, "state": "EXECUTING"},
        ("evidence",),
        id="transition_task-missing-evidence",
    ),
    pytest.param(
        "report",
        lambda s: {"task_id": s.task_id, "evidence": "done"},
        ("outcome",),
        id="report-missing-outcome",
    ),
    pytest.param(
        "claim", lambda s: {"run_id": s.run_id}, ("item_ref",), id="claim-missing-item-ref"
    ),
    # null where a string (or a list) is required
    pytest.param("get_task", lambda s: {"task_id": None}, ("task_id",), id="get_task-null-id"),
    pytest.param(
        "render",
        lambda s: {"task_id": s.task_id, "body_markdown": None},
        ("body_markdown",),
        id="render-null-body",
    ),
    pytest.param(
        "send",
        lambda s: {"task_id": s.task_id, "draft_id": None, "to": [CLIENT]},
        ("draft_id",),
        id="send-null-draft",
    ),
    pytest.param(
        "claim",
        lambda s: {"run_id": None, "item_ref": s.item_ref},
        ("run_id",),
        id="claim-null-run",
    ),
    pytest.param(
        "transition_task",
        lambda s: {"task_id": s.task_id, "state": "EXECUTING", "evidence": None},
        ("evidence",),
        id="transition_task-null-evidence",
    ),
    pytest.param(
        "gate_check",
        lambda s: {"task_id": s.task_id, "draft_id": s.draft_id, "to": [CLIENT], "cc": None},
        ("cc",),
        id="gate_check-null-cc",
    ),
    # values outside the allowed set
    pytest.param(
        "transition_task",
        lambda s: {"task_id": s.task_id, "state": "APPROVED_TO_SEND", "evidence": "approved"},
        ("state",),
        id="transition_task-to-a-server-state",
    ),
    pytest.param(
        "transition_task",
        lambda s: {"task_id": s.task_id, "state": "CLIENT_REPLY_SENT", "evidence": "sent"},
        ("state",),
        id="transition_task-to-client-reply-sent",
    ),
    pytest.param(
        "report",
        lambda s: {"task_id": s.task_id, "outcome": "done", "evidence": "x"},
        ("outcome",),
        id="report-unknown-outcome",
    ),
    pytest.param(
        "submit_learning",
        lambda s: {"workspace_id": WS, "kind": "policy", "summary": "s"},
        ("kind",),
        id="submit_learning-unknown-kind",
    ),
]


@pytest.mark.parametrize(("tool", "args", "says"), MALFORMED)
async def test_a_malformed_argument_is_a_tool_error_naming_it_and_changes_nothing(
    station: OperatorStation, tool: str, args: Args, says: tuple[str, ...]
) -> None:
    async with station.client() as client:
        s = await scene(client, station)
        done = await attempt(client, station, s.task_id, tool, args(s))
    assert_harmless_tool_error(done, says)


async def test_submit_learning_with_a_nul_byte_is_a_validation_error_and_queues_nothing(
    station: OperatorStation,
) -> None:
    async with station.client() as client:
        text = await tool_error(
            client,
            "submit_learning",
            workspace_id=station.workspace_id,
            kind="rule",
            summary="Quote in USD",
            detail="before\x00after",
        )
    assert "validation error" in text.lower(), text
    store = station.store()
    try:
        assert store.list_proposals(station.workspace_id) == []
    finally:
        store.close()


# -- unknown ids ----------------------------------------------------------------------------

UNKNOWN: list[Any] = [
    pytest.param(
        "get_task",
        lambda s: {"task_id": "task-nope"},
        ("task-nope", "list_queue"),
        id="get_task-task",
    ),
    pytest.param(
        "transition_task",
        lambda s: {"task_id": "task-nope", "state": "EXECUTING", "evidence": "e"},
        ("task-nope", "list_queue"),
        id="transition_task-task",
    ),
    pytest.param(
        "report",
        lambda s: {"task_id": "task-nope", "outcome": "completed", "evidence": "e"},
        ("task-nope", "list_queue"),
        id="report-task",
    ),
    pytest.param(
        "render",
        lambda s: {"task_id": "task-nope", "body_markdown": "Hello"},
        ("task-nope", "list_queue"),
        id="render-task",
    ),
    pytest.param(
        "record_approval",
        lambda s: {"task_id": "task-nope", "standing_class": "receipt-confirmation"},
        ("task-nope", "list_queue"),
        id="record_approval-task",
    ),
    pytest.param(
        "gate_check",
        lambda s: {"task_id": "task-nope", "draft_id": s.draft_id, "to": [CLIENT]},
        ("task-nope",),
        id="gate_check-task",
    ),
    pytest.param(
        "gate_check",
        lambda s: {"task_id": s.task_id, "draft_id": "draft-nope", "to": [CLIENT]},
        ("draft-nope", "call render"),
        id="gate_check-draft",
    ),
    pytest.param(
        "send",
        lambda s: {"task_id": s.task_id, "draft_id": "draft-nope", "to": [CLIENT]},
        ("draft-nope", "call render"),
        id="send-draft",
    ),
    pytest.param(
        "send",
        lambda s: {"task_id": "task-nope", "draft_id": s.draft_id, "to": [CLIENT]},
        ("task-nope",),
        id="send-task",
    ),
    pytest.param(
        "request_approval",
        lambda s: {"task_id": s.task_id, "draft_id": "draft-nope"},
        ("draft-nope", "call render"),
        id="request_approval-draft",
    ),
    pytest.param(
        "claim",
        lambda s: {"run_id": "run-nope", "item_ref": s.item_ref},
        ("run-nope", "call intake"),
        id="claim-run",
    ),
    pytest.param(
        "claim",
        lambda s: {"run_id": s.run_id, "item_ref": "maildir:nope"},
        ("maildir:nope", "item_ref intake returned"),
        id="claim-item",
    ),
    pytest.param(
        "reconcile",
        lambda s: {"run_id": "run-nope"},
        ("run-nope", "run_id intake returned"),
        id="reconcile-run",
    ),
    pytest.param(
        "read_back",
        lambda s: {"send_id": "reply|draft-nope|to=dana.levi@contoso.test|cc="},
        ("send_id send returned",),
        id="read_back-send",
    ),
    pytest.param(
        "list_queue",
        lambda s: {"workspace_id": "ws-nope"},
        ("ws-nope", "outloop workspace add"),
        id="list_queue-workspace",
    ),
    pytest.param(
        "access_status",
        lambda s: {"workspace_id": "ws-nope"},
        ("ws-nope", "outloop workspace add"),
        id="access_status-workspace",
    ),
    pytest.param(
        "submit_learning",
        lambda s: {"workspace_id": "ws-nope", "kind": "rule", "summary": "a rule"},
        ("ws-nope", "outloop workspace add"),
        id="submit_learning-workspace",
    ),
    pytest.param(
        "intake",
        lambda s: {"mailbox_id": "nobody@fabrikam.test"},
        ("nobody@fabrikam.test", "outloop workspace add"),
        id="intake-unbound-mailbox",
    ),
]


@pytest.mark.parametrize(("tool", "args", "says"), UNKNOWN)
async def test_an_unknown_id_is_a_tool_error_saying_what_to_do_and_changes_nothing(
    station: OperatorStation, tool: str, args: Args, says: tuple[str, ...]
) -> None:
    async with station.client() as client:
        s = await scene(client, station)
        done = await attempt(client, station, s.task_id, tool, args(s))
    assert_harmless_tool_error(done, says)


async def test_claim_of_a_run_from_an_earlier_server_process_is_read_from_the_store(
    station: OperatorStation,
) -> None:
    async with station.client() as first:
        s = await scene(first, station)
        station.deliver(sender=CLIENT, subject="Second request")
        found = await call(first, "intake", mailbox_id=MAILBOX)
    [unclaimed] = [i for i in found["items"] if i["item_ref"] != s.item_ref]
    async with station.client() as restarted:
        claimed = await call(
            restarted, "claim", run_id=found["run_id"], item_ref=unclaimed["item_ref"]
        )
        unknown = await attempt(
            restarted,
            station,
            s.task_id,
            "claim",
            {"run_id": "run-0000", "item_ref": unclaimed["item_ref"]},
        )
    assert claimed["outcome"] == "CLAIMED" and claimed["task_id"] is not None
    assert_harmless_tool_error(unknown, ("run-0000", "call intake again"))


async def test_read_back_of_an_approval_request_is_a_tool_error(station: OperatorStation) -> None:
    async with station.client() as client:
        s = await scene(client, station)
        await call(client, "request_approval", task_id=s.task_id, draft_id=s.draft_id)
        store = station.store()
        try:  # the approval request's own ledger entry
            [key] = [r.key for r in store.list_sends(WS) if r.kind == "approval_request"]
        finally:
            store.close()
        done = await attempt(client, station, s.task_id, "read_back", {"send_id": key})
    assert_harmless_tool_error(done, ("send_id send returned",))


# -- arguments the schema does not name -----------------------------------------------------

EXTRA: list[Any] = [
    pytest.param(
        "send",
        lambda s: {"task_id": s.task_id, "draft_id": s.draft_id, "to": [CLIENT], "approved": True},
        ("approved",),
        id="send-approved-true",
    ),
    pytest.param(
        "send",
        lambda s: {
            "task_id": s.task_id,
            "draft_id": s.draft_id,
            "to": [COLLEAGUE],
            "bcc": ["mallory@evil.test"],
        },
        ("bcc",),
        id="send-internal-with-bcc",
    ),
    pytest.param(
        "gate_check",
        lambda s: {
            "task_id": s.task_id,
            "draft_id": s.draft_id,
            "to": [CLIENT],
            "recipient_class": "internal",
        },
        ("recipient_class",),
        id="gate_check-recipient-class",
    ),
    pytest.param(
        "record_approval",
        lambda s: {
            "task_id": s.task_id,
            "standing_class": "receipt-confirmation",
            "approved_by": APPROVER,
        },
        ("approved_by",),
        id="record_approval-approved-by",
    ),
    pytest.param(
        "request_approval",
        lambda s: {
            "task_id": s.task_id,
            "draft_id": s.draft_id,
            "approvers": ["mallory@evil.test"],
        },
        ("approvers",),
        id="request_approval-approvers",
    ),
    pytest.param(
        "transition_task",
        lambda s: {"task_id": s.task_id, "state": "EXECUTING", "evidence": "e", "force": True},
        ("force",),
        id="transition_task-force",
    ),
    pytest.param(
        "render",
        lambda s: {"task_id": s.task_id, "body_markdown": "Hi", "subject": "Invoice overdue"},
        ("subject",),
        id="render-subject",
    ),
    pytest.param(
        "intake",
        lambda s: {"mailbox_id": MAILBOX, "workspace_id": WS},
        ("workspace_id",),
        id="intake-workspace-id",
    ),
    pytest.param(
        "get_task",
        lambda s: {"task_id": s.task_id, "state": "COMPLETED"},
        ("state",),
        id="get_task-state",
    ),
]


@pytest.mark.parametrize(("tool", "args", "says"), EXTRA)
async def test_an_argument_the_schema_does_not_name_is_refused_and_changes_nothing(
    station: OperatorStation, tool: str, args: Args, says: tuple[str, ...]
) -> None:
    async with station.client() as client:
        s = await scene(client, station)
        done = await attempt(client, station, s.task_id, tool, args(s))
    text = assert_harmless_tool_error(done, says)
    assert "extra inputs are not permitted" in text.lower()


async def test_an_internal_send_that_would_go_is_not_sent_when_it_carries_an_extra_argument(
    station: OperatorStation,
) -> None:
    async with station.client() as client:
        s = await scene(client, station)
        gate = await call(
            client, "gate_check", task_id=s.task_id, draft_id=s.draft_id, to=[COLLEAGUE]
        )
        done = await attempt(
            client,
            station,
            s.task_id,
            "send",
            {"task_id": s.task_id, "draft_id": s.draft_id, "to": [COLLEAGUE], "priority": "high"},
        )
    assert gate["ready"] is True  # without the extra argument this send would go
    assert_harmless_tool_error(done, ("priority",))
    assert not any("Sent" in path for path in done.stored_after["maildir"])


# -- calls the caller can fix, and calls the server refuses -------------------------------------
# Evidence that is not one piece and a blank draft are the caller's mistakes: tool errors that
# say what to do. Approval evidence the server never judged on the task is a refusal (-32010,
# kind policy). Like every bad call they change nothing.

FIXABLE_CALLS: list[Any] = [
    pytest.param(
        "record_approval",
        lambda s: {"task_id": s.task_id},
        ("exactly one",),
        id="record_approval-no-evidence",
    ),
    pytest.param(
        "record_approval",
        lambda s: {
            "task_id": s.task_id,
            "reply_message_id": "<r@fabrikam.test>",
            "standing_class": "receipt-confirmation",
        },
        ("exactly one",),
        id="record_approval-both-evidence",
    ),
    pytest.param(
        "render",
        lambda s: {"task_id": s.task_id, "body_markdown": "   \n\t "},
        ("empty",),
        id="render-blank-body",
    ),
]


@pytest.mark.parametrize(("tool", "args", "says"), FIXABLE_CALLS)
async def test_a_call_the_caller_can_fix_is_a_tool_error_and_changes_nothing(
    station: OperatorStation, tool: str, args: Args, says: tuple[str, ...]
) -> None:
    async with station.client() as client:
        s = await scene(client, station)
        done = await attempt(client, station, s.task_id, tool, args(s))
    assert_harmless_tool_error(done, says)


REFUSED_CALLS: list[Any] = [
    pytest.param(
        "record_approval",
        lambda s: {"task_id": s.task_id, "reply_message_id": "<made-up@fabrikam.test>"},
        ("no approver's reply", "intake"),
        id="record_approval-reply-not-taken-in",
    ),
]


def assert_harmless_refusal(done: Attempt, says: tuple[str, ...]) -> MCPError:
    """A refusal (-32010) saying ``says``; the server showed and stored the same before
    and after the call."""
    outcome = done.outcome
    assert isinstance(outcome, MCPError), f"not refused: {outcome}"
    assert outcome.code == REFUSED
    assert isinstance(outcome.data, dict)
    assert outcome.data["refused"] == "policy"
    for words in says:
        assert words.lower() in outcome.message.lower(), (words, outcome.message)
    assert done.seen_after == done.seen_before
    assert done.stored_after == done.stored_before
    return outcome


@pytest.mark.parametrize(("tool", "args", "says"), REFUSED_CALLS)
async def test_a_refused_call_says_why_and_changes_nothing(
    station: OperatorStation, tool: str, args: Args, says: tuple[str, ...]
) -> None:
    async with station.client() as client:
        s = await scene(client, station)
        done = await attempt(client, station, s.task_id, tool, args(s))
    assert_harmless_refusal(done, says)


@pytest.mark.parametrize("tool", ["gate_check", "send", "request_approval"])
async def test_a_draft_rendered_for_another_task_is_refused_and_changes_nothing(
    station: OperatorStation, tool: str
) -> None:
    async with station.client() as client:
        s = await scene(client, station)
        station.deliver(sender=CLIENT, subject="Another request")
        found = await call(client, "intake", mailbox_id=MAILBOX)
        [other] = [i for i in found["items"] if i["item_ref"] != s.item_ref]
        claim = await call(client, "claim", run_id=other["run_id"], item_ref=other["item_ref"])
        other_task = claim["task_id"]
        await to_draft_ready(client, other_task)
        arguments: dict[str, Any] = {"task_id": other_task, "draft_id": s.draft_id}
        if tool != "request_approval":
            arguments["to"] = [CLIENT]
        done = await attempt(client, station, other_task, tool, arguments)
    assert_harmless_refusal(done, (s.draft_id, "another task"))


# -- unknown tools and resources ------------------------------------------------------------


@pytest.mark.parametrize("name", ["approve", "send_email", "delete_task", ""])
async def test_an_unknown_tool_is_a_tool_error_and_changes_nothing(
    station: OperatorStation, name: str
) -> None:
    async with station.client() as client:
        s = await scene(client, station)
        done = await attempt(client, station, s.task_id, name, {"task_id": s.task_id})
    assert_harmless_tool_error(done, ("unknown tool",))


@pytest.mark.parametrize(
    ("uri", "says"),
    [
        pytest.param("outloop://skills/nope", "unknown resource", id="skill"),
        pytest.param("outloop://tasks/task-nope", "list_queue", id="task"),
        pytest.param("outloop://workspaces/ws-nope/context", "outloop workspace add", id="ws"),
        pytest.param("outloop://workspaces/ws-test-0001/secrets", "unknown resource", id="other"),
        pytest.param("file:///etc/passwd", "unknown resource", id="file"),
    ],
)
async def test_an_unknown_resource_is_an_error_naming_it_and_changes_nothing(
    station: OperatorStation, uri: str, says: str
) -> None:
    async with station.client() as client:
        s = await scene(client, station)
        seen = await still_answers(client, s.task_id)
        before = snapshot(station, s.task_id)
        with pytest.raises(MCPError) as caught:
            await client.read_resource(uri, cache_mode="bypass")
        after = await still_answers(client, s.task_id)
    assert says in caught.value.message.lower()
    assert caught.value.code != REFUSED
    if uri.startswith(("outloop://tasks/", "outloop://workspaces/ws-nope")):
        assert caught.value.code == RESOURCE_NOT_FOUND
    assert after == seen
    assert snapshot(station, s.task_id) == before


async def test_every_bad_call_in_a_row_leaves_the_server_answering_and_the_store_unchanged(
    station: OperatorStation,
) -> None:
    """One session takes every malformed, unknown-id and extra-argument call in turn."""
    async with station.client() as client:
        s = await scene(client, station)
        seen = await still_answers(client, s.task_id)
        before = snapshot(station, s.task_id)
        answered: list[bool] = []
        for case in (*MALFORMED, *UNKNOWN, *EXTRA, *REFUSED_CALLS):
            tool, args, _ = case.values
            try:
                result = await client.call_tool(tool, args(s))
            except MCPError:  # the per-case tests say which kind of error each must be
                answered.append(False)
            else:
                answered.append(result.is_error)
            await call(client, "list_queue", workspace_id=WS)
        after = await still_answers(client, s.task_id)
    assert len(answered) == len(MALFORMED) + len(UNKNOWN) + len(EXTRA) + len(REFUSED_CALLS)
    assert after == seen
    assert snapshot(station, s.task_id) == before
