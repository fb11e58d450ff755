"""The send gate and the workflow guards (pure functions over verified evidence)."""

from __future__ import annotations

import sys
from datetime import UTC, datetime, timedelta
from types import FrameType
from typing import Any

import pytest

from agent.domain.approval import ApprovalDecision, ApprovalRequest, Decision
from agent.domain.context import WorkspaceContext, parse_context
from agent.domain.gates import (
    Blocker,
    DraftFacts,
    draft_digest,
    evaluate_send,
    foreign_markers,
    release_guard,
    unaccepted_attachments,
)
from agent.domain.recipients import Communication
from agent.domain.records import TaskAmendment
from agent.domain.reporting import apply_amendment
from agent.domain.states import TaskState
from agent.domain.task import NextAction, Task
from tests.conftest import context_yaml

T0 = datetime(2026, 11, 30, 9, 0, tzinfo=UTC)
CLIENT = "dana.levi@contoso.test"
APPROVER = "noa.bar@fabrikam.test"


def ctx(extra: str = "", workspace_id: str = "ws-test-0001", **kw: Any) -> WorkspaceContext:
    return parse_context(context_yaml(workspace_id, extra=extra, **kw))


def task(**changes: Any) -> Task:
    base = Task(
        task_id="task-1",
        workspace_id="ws-test-0001",
        work_key="wk",
        provider="memory",
        mailbox_id="support@fabrikam.test",
        provider_thread_id="thread-1",
        title="Quote",
        original_subject="Quote",
        received_at=T0,
        first_seen_at=T0,
        updated_at=T0,
        state=TaskState.DRAFT_READY,
        approval_requests=(REQUEST,),
        sender_identity=CLIENT,
        client_send_policy="draft_for_internal_approval",
        next_action=NextAction(description="reply", owner=APPROVER),
    )
    return base.model_copy(update=changes)


DRAFT = DraftFacts(
    draft_id="d1",
    digest=draft_digest("Re: Quote", "<p>Price 10</p>", "Price 10"),
    subject="Re: Quote",
    text="Price 10",
)


REQUEST = ApprovalRequest(
    draft_id="d1",
    draft_digest=DRAFT.digest,
    internet_message_id="<req@x>",
    provider_thread_id="t-approval",
    approvers=(APPROVER,),
    sent_at=T0,
    recipients=(CLIENT,),
)


def approved(digest: str = DRAFT.digest, request: str = "<req@x>") -> ApprovalDecision:
    return ApprovalDecision(
        decision=Decision.APPROVED,
        draft_id="d1",
        draft_digest=digest,
        approver=APPROVER,
        evidence_message_id="<ok@x>",
        request_message_id=request,
        reason="explicit approval",
        decided_at=T0,
    )


def blockers(result: Any) -> set[Blocker]:
    return {r.blocker for r in result.reasons}


def test_a_client_send_without_approval_is_pending_and_names_what_is_missing() -> None:
    result = evaluate_send(ctx(), task(), DRAFT, to=[CLIENT])
    assert not result.ready and result.communication is Communication.CLIENT_FACING
    assert blockers(result) == {Blocker.APPROVAL_MISSING}
    [reason] = result.reasons
    assert "d1" in reason.detail and reason.owner == APPROVER


def test_an_approval_of_this_exact_draft_makes_the_client_send_ready() -> None:
    ok = task(approval_decisions=(approved(),), state=TaskState.APPROVED_TO_SEND)
    result = evaluate_send(ctx(), ok, DRAFT, to=[CLIENT])
    assert result.ready and result.approval_basis is not None and APPROVER in result.approval_basis


def test_an_approval_covers_only_the_recipients_the_approver_saw() -> None:
    ok = task(approval_decisions=(approved(),), state=TaskState.APPROVED_TO_SEND)
    other_client = parse_context(
        context_yaml().replace(
            "contacts:\n",
            "contacts:\n  - {address: cfo@contoso.test, side: client, verified_by: crm}\n",
        )
    )
    result = evaluate_send(other_client, ok, DRAFT, to=["cfo@contoso.test"])
    assert not result.ready and {r.blocker for r in result.reasons} == {Blocker.APPROVAL_MISSING}
    assert "cfo@contoso.test" in result.reasons[0].detail
    # Internal recipients in Cc need no approval.
    assert evaluate_send(ctx(), ok, DRAFT, to=[CLIENT], cc=[APPROVER]).ready


def test_an_approval_counts_only_while_the_task_is_approved_to_send() -> None:
    for state in (TaskState.DRAFT_READY, TaskState.WAITING_INTERNAL_APPROVAL):
        stale = task(approval_decisions=(approved(),), state=state)
        assert not evaluate_send(ctx(), stale, DRAFT, to=[CLIENT]).ready


def test_a_later_change_request_or_reservation_voids_the_approval() -> None:
    first = approved().model_copy(update={"replied_at": T0})
    held = first.model_copy(
        update={"decision": Decision.HELD, "replied_at": T0 + timedelta(minutes=5)}
    )
    changes = first.model_copy(
        update={"decision": Decision.CHANGES_REQUESTED, "replied_at": T0 - timedelta(minutes=5)}
    )
    for decisions in ((first, held), (changes, first), (first, changes)):
        t = task(approval_decisions=decisions, state=TaskState.APPROVED_TO_SEND)
        assert not evaluate_send(ctx(), t, DRAFT, to=[CLIENT]).ready, decisions


def test_an_approval_of_another_draft_does_not_cover_this_one() -> None:
    other = approved(digest=draft_digest("Re: Quote", "<p>Price 12</p>", "Price 12"))
    result = evaluate_send(ctx(), task(approval_decisions=(other,)), DRAFT, to=[CLIENT])
    assert blockers(result) == {Blocker.APPROVAL_MISSING}


def test_a_standing_approval_covers_only_its_message_class() -> None:
    standing = (
        "approval: {roles: [approver], standing: "
        "[{scope: message_class, class: delivery_confirmation, granted_by: noa}]}\n"
    )
    text = context_yaml().replace("approval: {roles: [approver], standing: []}\n", standing)
    context = parse_context(text)
    covered = evaluate_send(
        context, task(message_class="delivery_confirmation"), DRAFT, to=[CLIENT]
    )
    assert covered.ready and "standing approval" in (covered.approval_basis or "")
    other = evaluate_send(context, task(message_class="refund"), DRAFT, to=[CLIENT])
    assert blockers(other) == {Blocker.APPROVAL_MISSING}


def test_unknown_and_conflicting_recipients_keep_the_send_pending_with_each_named() -> None:
    conflict = "default_cc: [dana.levi@contoso.test]\n"
    text = context_yaml().replace("default_cc: []\n", conflict)
    result = evaluate_send(
        parse_context(text),
        task(approval_decisions=(approved(),)),
        DRAFT,
        to=[CLIENT, "stranger@fabrikam.test"],
    )
    assert not result.ready
    named = {(r.blocker, r.recipient) for r in result.reasons}
    assert (Blocker.RECIPIENT_UNKNOWN, "stranger@fabrikam.test") in named
    assert (Blocker.RECIPIENT_CONFLICT, CLIENT) in named


def test_an_internal_reply_is_ready_without_approval_even_when_client_sends_are_disabled() -> None:
    disabled = parse_context(
        context_yaml().replace(
            "client_send_policy: draft_for_internal_approval", "client_send_policy: sends_disabled"
        )
    )
    internal = evaluate_send(disabled, task(), DRAFT, to=[APPROVER])
    assert internal.ready and internal.communication is Communication.INTERNAL
    ok = task(approval_decisions=(approved(),), state=TaskState.APPROVED_TO_SEND)
    client = evaluate_send(disabled, ok, DRAFT, to=[CLIENT])
    assert blockers(client) == {Blocker.SENDS_DISABLED}


def test_internal_only_communication_strips_every_recipient_not_verified_internal() -> None:
    result = evaluate_send(
        ctx(), task(), DRAFT, to=[APPROVER, CLIENT], cc=["x@unknown.test"], internal_only=True
    )
    assert result.ready and result.communication is Communication.INTERNAL
    assert [r.address for r in result.plan.to] == [APPROVER]
    assert {r.address for r in result.plan.removed} == {CLIENT, "x@unknown.test"}


def test_default_ccs_from_the_context_are_the_only_recipients_added() -> None:
    text = context_yaml().replace("default_cc: []\n", "default_cc: [ops.lead@fabrikam.test]\n")
    result = evaluate_send(parse_context(text), task(), DRAFT, to=[APPROVER])
    assert [r.address for r in result.plan.cc] == ["ops.lead@fabrikam.test"]
    assert result.plan.added_default_cc == ("ops.lead@fabrikam.test",)


def test_another_workspaces_client_data_in_a_draft_or_recipients_blocks_the_send() -> None:
    other = parse_context(
        context_yaml("ws-other-0002", mailbox="ops@tailspin.test").replace(
            "dana.levi@contoso.test", "avi@wingtip.test"
        )
    )
    markers = foreign_markers(ctx(), [ctx(), other])
    assert markers.addresses == frozenset({"avi@wingtip.test"})
    leaking = DRAFT.model_copy(update={"text": "As we told Avi (avi@wingtip.test) at wingtip.test"})
    result = evaluate_send(
        ctx(), task(approval_decisions=(approved(),)), leaking, to=[CLIENT], foreign=markers
    )
    assert Blocker.FOREIGN_CONTENT in blockers(result)
    to_foreign = evaluate_send(ctx(), task(), DRAFT, to=["avi@wingtip.test"], foreign=markers)
    assert Blocker.FOREIGN_RECIPIENT in blockers(to_foreign)


def test_a_task_of_another_workspace_or_a_closed_task_cannot_send() -> None:
    result = evaluate_send(
        ctx(workspace_id="ws-test-0002"), task(state=TaskState.COMPLETED), DRAFT, to=[APPROVER]
    )
    assert {Blocker.WRONG_WORKSPACE, Blocker.TASK_CLOSED} <= blockers(result)


def test_changes_requested_sends_the_work_back_instead_of_allowing_the_send() -> None:
    result = evaluate_send(ctx(), task(state=TaskState.CHANGES_REQUESTED), DRAFT, to=[CLIENT])
    assert blockers(result) == {Blocker.CHANGES_REQUESTED}


def test_the_requester_loop_must_be_closed_before_release_including_partial_results() -> None:
    waiting = task(requester=APPROVER)
    assert release_guard(waiting, closing=True) is not None
    assert release_guard(waiting, closing=False) is None
    assert release_guard(task(requester=APPROVER, requester_loop_closed=True), closing=True) is None
    assert release_guard(task(), closing=True) is None


def test_attachments_outside_the_accepted_formats_need_clarification() -> None:
    names = ["scan.PDF", "notes.docx", "payload.exe", "archive.tar.gz", "noextension"]
    assert unaccepted_attachments(ctx(), names) == ("payload.exe", "archive.tar.gz", "noextension")
    none_listed = parse_context(context_yaml().replace("attachments: {accepted: [pdf, docx]}", ""))
    assert unaccepted_attachments(none_listed, names) == ()


def test_gate_and_guards_touch_neither_a_store_nor_a_provider() -> None:
    """Every function called while the gate runs belongs to the domain, pydantic, or the
    standard library: no storage, provider, service or network code runs."""
    called: set[str] = set()

    def profile(frame: FrameType, event: str, arg: object) -> None:
        if event in {"call", "c_call"}:
            called.add(frame.f_globals.get("__name__", "?"))

    context = ctx()
    others = [ctx(workspace_id="ws-test-0002")]
    sys.setprofile(profile)
    try:
        markers = foreign_markers(context, others)
        evaluate_send(
            context, task(), DRAFT, to=[CLIENT, APPROVER], cc=["x@y.test"], foreign=markers
        )
        release_guard(task(requester=APPROVER), closing=True)
        unaccepted_attachments(context, ["a.exe"])
    finally:
        sys.setprofile(None)
    ours = {m for m in called if m.startswith(("agent", "mcp_server", "fixtures", "bench"))}
    assert ours and all(m.startswith("agent.domain.") for m in ours), sorted(ours)
    forbidden = {"sqlite3", "socket", "psycopg", "ssl", "http.client", "urllib.request"}
    assert not {m for m in called if m.split(".")[0] in forbidden}


def test_an_answer_to_an_older_approval_request_is_recorded_but_does_not_cover_the_new_draft() -> (
    None
):
    old_request = ApprovalRequest(
        draft_id="d0",
        draft_digest="0" * 64,
        internet_message_id="<old@x>",
        provider_thread_id="t",
        approvers=(APPROVER,),
        sent_at=T0 - timedelta(days=1),
    )
    stale = approved(digest="0" * 64, request="<old@x>")
    result = evaluate_send(
        ctx(),
        task(approval_requests=(old_request,), approval_decisions=(stale,)),
        DRAFT,
        to=[CLIENT],
    )
    assert blockers(result) == {Blocker.APPROVAL_MISSING}


@pytest.mark.parametrize("address", ["dana.levi@contoso.test\r\nBcc: x@evil.test", "a@b@c", ""])
def test_malformed_recipients_never_pass_the_gate(address: str) -> None:
    result = evaluate_send(ctx(), task(approval_decisions=(approved(),)), DRAFT, to=[address])
    assert not result.ready


def test_recording_the_same_approval_request_twice_keeps_one() -> None:
    amendment = TaskAmendment(event="approval requested", approval_request=REQUEST)
    once = apply_amendment(task(approval_requests=()), amendment, T0)
    twice = apply_amendment(once, amendment, T0)
    assert once.approval_requests == twice.approval_requests == (REQUEST,)


def test_an_approvers_change_request_outranks_a_standing_approval() -> None:
    standing = (
        "approval: {roles: [approver], standing: "
        "[{scope: message_class, class: delivery_confirmation, granted_by: noa}]}\n"
    )
    context = parse_context(
        context_yaml().replace("approval: {roles: [approver], standing: []}\n", standing)
    )
    changes = approved().model_copy(update={"decision": Decision.CHANGES_REQUESTED})
    kept_as_is = task(message_class="delivery_confirmation", approval_decisions=(changes,))
    assert not evaluate_send(context, kept_as_is, DRAFT, to=[CLIENT]).ready
