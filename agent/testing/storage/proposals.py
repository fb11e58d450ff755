"""The Proposals role: the operator's queue of learning proposals."""

from __future__ import annotations

import pytest

from agent.domain.errors import InvalidRequest
from agent.domain.records import LearningProposal, ProposalState
from agent.ports import EmbeddedStore
from agent.testing import FrozenClock
from agent.testing.storage.base import WS, StoreContract, register


class ProposalsContract(StoreContract):
    """The Proposals role: the operator's queue of learning proposals."""

    def test_a_learning_proposal_is_queued_once_in_submission_order(
        self, store: EmbeddedStore, clock: FrozenClock
    ) -> None:
        register(store, WS)

        def proposal(n: int) -> LearningProposal:
            return LearningProposal(
                proposal_id=f"lp-{n}",
                workspace_id=WS,
                kind="new_contact",
                summary=f"add contact {n}",
                detail="seen in three threads",
                evidence=(f"<m{n}@contoso.test>",),
                submitted_at=clock.advance(minutes=1),
            )

        assert store.add_proposal(proposal(1)).created
        assert store.add_proposal(proposal(2)).created
        repeat = store.add_proposal(proposal(1))
        assert not repeat.created and repeat.summary == "add contact 1"
        listed = store.list_proposals(WS)
        assert [p.proposal_id for p in listed] == ["lp-1", "lp-2"]
        assert listed[0].state is ProposalState.QUEUED
        assert listed[0].evidence == ("<m1@contoso.test>",)
        assert store.list_proposals("ws-other") == []

    def test_a_proposal_is_decided_once_with_who_when_and_why(
        self, store: EmbeddedStore, clock: FrozenClock
    ) -> None:
        register(store, WS)
        queued = store.add_proposal(
            LearningProposal(
                proposal_id="lp-1",
                workspace_id=WS,
                kind="rule",
                summary="quote in shekels",
                detail="",
                submitted_at=clock.now(),
            )
        )
        assert store.get_proposal("lp-1") == queued.model_copy(update={"created": False})
        at = clock.advance(minutes=5)
        decided = store.decide_proposal("lp-1", ProposalState.REJECTED, "op@x.test", "no", at)
        assert decided is not None and decided.state is ProposalState.REJECTED
        assert (decided.decided_by, decided.decided_at, decided.decision_note) == (
            "op@x.test",
            at,
            "no",
        )
        again = store.decide_proposal("lp-1", ProposalState.ACCEPTED, "other@x.test", "", at)
        assert again is None
        assert store.get_proposal("lp-1") == decided
        assert store.decide_proposal("lp-unknown", ProposalState.ACCEPTED, "o", "", at) is None
        assert store.get_proposal("lp-unknown") is None

    def test_accepting_a_proposal_writes_the_context_in_the_same_transaction_or_nothing(
        self, store: EmbeddedStore, clock: FrozenClock
    ) -> None:
        register(store, WS)
        store.add_proposal(
            LearningProposal(
                proposal_id="lp-1", workspace_id=WS, kind="rule", summary="s", detail="",
                submitted_at=clock.now(),
            )
        )  # fmt: skip
        before = store.get_workspace(WS)
        assert before is not None
        at = clock.advance(minutes=1)
        row = before.model_copy(
            update={"context_sha256": "b" * 64, "context_text": "new", "updated_at": at}
        )
        with pytest.raises(InvalidRequest, match="changed since that diff was shown"):
            store.accept_proposal("lp-1", "op@x.test", "n", at, row, "0" * 64)
        assert store.get_workspace(WS) == before
        assert store.get_proposal("lp-1").state is ProposalState.QUEUED  # type: ignore[union-attr]
        other = row.model_copy(update={"workspace_id": "ws-other"})
        assert store.accept_proposal("lp-1", "o", "n", at, other, "0" * 64) is None
        accepted = store.accept_proposal("lp-1", "op@x.test", "n", at, row, before.context_sha256)
        assert accepted is not None and accepted.state is ProposalState.ACCEPTED
        assert store.get_workspace(WS) == row
        again = store.accept_proposal("lp-1", "op@x.test", "n", at, row, row.context_sha256)
        assert again is None
