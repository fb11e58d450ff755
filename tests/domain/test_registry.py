from __future__ import annotations

from agent.domain.context import parse_context
from agent.domain.envelope import Address
from agent.domain.registry import Candidate, ResolutionStatus, resolve_workspace
from agent.testing import make_envelope
from tests.conftest import context_yaml

SHARED = "shared@fabrikam.test"


def shared_candidate(workspace_id: str, bind_to: str) -> Candidate:
    context = parse_context(
        context_yaml(workspace_id, mailbox=SHARED, shared=True, bind_to=(bind_to,))
    )
    return Candidate(workspace_id, context.mailbox("memory", SHARED), context)


def envelope_to(*recipients: str):
    env = make_envelope(mailbox_id=SHARED, message_no=1, thread_no=1)
    return env.model_copy(update={"to": tuple(Address(address=r) for r in recipients)})


def test_a_mailbox_bound_to_no_workspace_is_unresolved() -> None:
    result = resolve_workspace(envelope_to(SHARED), [])
    assert result.status is ResolutionStatus.UNRESOLVED and result.workspace_id is None
    assert "bound to no workspace" in result.reason


def test_an_unshared_mailbox_resolves_its_one_workspace() -> None:
    context = parse_context(context_yaml("ws-one", mailbox=SHARED))
    cand = Candidate("ws-one", context.mailbox("memory", SHARED), context)
    result = resolve_workspace(envelope_to(SHARED), [cand])
    assert result.status is ResolutionStatus.RESOLVED and result.workspace_id == "ws-one"


def test_a_shared_mailbox_binds_by_exact_recipient_rules_only() -> None:
    cands = [
        shared_candidate("ws-a", "a@fabrikam.test"),
        shared_candidate("ws-b", "b@fabrikam.test"),
    ]
    assert resolve_workspace(envelope_to("b@fabrikam.test"), cands).workspace_id == "ws-b"
    # Resemblance is not a rule: a near-miss address binds nothing.
    near = resolve_workspace(envelope_to("a@fabrikam.test.evil"), cands)
    assert near.status is ResolutionStatus.UNRESOLVED and "matched 0 workspaces" in near.reason


def test_a_shared_mailbox_matching_several_workspaces_is_unresolved() -> None:
    cands = [
        shared_candidate("ws-a", "x@fabrikam.test"),
        shared_candidate("ws-b", "x@fabrikam.test"),
    ]
    result = resolve_workspace(envelope_to("x@fabrikam.test"), cands)
    assert result.status is ResolutionStatus.UNRESOLVED
    assert "matched 2 workspaces (ws-a, ws-b)" in result.reason


def test_a_registry_row_whose_context_names_another_workspace_is_not_verified() -> None:
    context = parse_context(context_yaml("ws-other", mailbox=SHARED))
    cand = Candidate("ws-one", context.mailbox("memory", SHARED), context)
    result = resolve_workspace(envelope_to(SHARED), [cand])
    assert result.status is ResolutionStatus.UNRESOLVED and "not verified" in result.reason


def test_a_context_that_no_longer_lists_the_mailbox_escalates_inside_the_workspace() -> None:
    context = parse_context(context_yaml("ws-one", mailbox="other@fabrikam.test"))
    cand = Candidate("ws-one", None, context)
    result = resolve_workspace(envelope_to(SHARED), [cand])
    assert result.status is ResolutionStatus.ESCALATE_IN_WORKSPACE
    assert result.workspace_id == "ws-one"


def test_an_unreadable_context_is_unresolved_with_the_reason() -> None:
    cand = Candidate("ws-one", None, None, "file is gone")
    result = resolve_workspace(envelope_to(SHARED), [cand])
    assert result.status is ResolutionStatus.UNRESOLVED and "file is gone" in result.reason
