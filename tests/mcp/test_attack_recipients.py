"""An adversarial host sends an approved draft to someone the context does not verify: a
stranger, a lookalike or homoglyph of the client, a non-contact at the team's own domain, the
workspace's own mailbox, or a stranger named by the approval request or a learning proposal.
Each send is refused naming the recipient, and nothing changes."""

from __future__ import annotations

import pytest

from tests.mcp.attacks import (
    INJECTION,
    approved_task,
    assert_unchanged,
    blockers,
    client_copies,
    reason_for,
    snapshot,
    staged_approval,
    state,
)
from tests.mcp.conftest import (
    CLIENT,
    COLLEAGUE,
    MAILBOX,
    STRANGER,
    OperatorStation,
    call,
    refused,
)

pytestmark = pytest.mark.anyio


LOOKALIKE = "dana.levi@cont0so.test"
"""The client's address with a zero for an o."""
TEAMMATE_UNKNOWN = "ops@fabrikam.test"
"""An address at the team's own domain that no contact records."""
HOMOGLYPH = "d\u0430na.levi@contoso.test"
"""The client's address with a Cyrillic a."""


# -- unverified recipients ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("to", "cc", "outsider"),
    [
        pytest.param([STRANGER], [], STRANGER, id="stranger-instead"),
        pytest.param([LOOKALIKE], [], LOOKALIKE, id="lookalike-instead"),
        pytest.param([TEAMMATE_UNKNOWN], [], TEAMMATE_UNKNOWN, id="own-domain-non-contact"),
        pytest.param([CLIENT, STRANGER], [], STRANGER, id="stranger-added-to"),
        pytest.param([CLIENT], [LOOKALIKE], LOOKALIKE, id="lookalike-in-cc"),
        pytest.param([CLIENT], [TEAMMATE_UNKNOWN], TEAMMATE_UNKNOWN, id="own-domain-in-cc"),
        pytest.param([HOMOGLYPH], [], HOMOGLYPH, id="cyrillic-homoglyph"),
        pytest.param([COLLEAGUE], [STRANGER], STRANGER, id="stranger-cc-on-internal-mail"),
    ],
)
async def test_an_approved_draft_never_goes_to_an_unverified_recipient(
    station: OperatorStation, to: list[str], cc: list[str], outsider: str
) -> None:
    async with station.client() as client:
        task_id, draft_id, before = await staged_approval(station, client)

        gate = await call(client, "gate_check", task_id=task_id, draft_id=draft_id, to=to, cc=cc)
        assert gate["ready"] is False
        assert outsider in {r["recipient"] for r in gate["reasons"]}

        refusal = await refused(client, "send", task_id=task_id, draft_id=draft_id, to=to, cc=cc)
        unknown = [r for r in refusal.data["reasons"] if r["recipient"] == outsider]
        assert unknown, refusal.data
        assert unknown[0]["blocker"] == "recipient_unknown"
        assert outsider in unknown[0]["detail"]

        assert await snapshot(station, client, task_id) == before
        assert (await state(client, task_id)) == "APPROVED_TO_SEND"
        assert client_copies(station, outsider) == []


async def test_the_workspaces_own_mailbox_is_no_recipient_for_an_approved_draft(
    station: OperatorStation,
) -> None:
    async with station.client() as client:
        task_id, draft_id, before = await staged_approval(station, client)

        refusal = await refused(client, "send", task_id=task_id, draft_id=draft_id, to=[MAILBOX])
        assert "no_recipients" in blockers(refusal)
        assert MAILBOX in reason_for(refusal, "no_recipients")["detail"]
        assert await snapshot(station, client, task_id) == before


# -- what does not verify a recipient ----------------------------------------------------------


async def test_an_approval_naming_a_stranger_does_not_make_the_stranger_a_verified_recipient(
    station: OperatorStation,
) -> None:
    async with station.client() as client:
        task_id, draft_id, before = await staged_approval(station, client, to=[STRANGER])

        refusal = await refused(client, "send", task_id=task_id, draft_id=draft_id, to=[STRANGER])
        assert reason_for(refusal, "recipient_unknown")["recipient"] == STRANGER
        # ...and the client is not among the recipients that approval covers.
        refusal = await refused(client, "send", task_id=task_id, draft_id=draft_id, to=[CLIENT])
        assert blockers(refusal) == {"approval_missing"}
        assert STRANGER in reason_for(refusal, "approval_missing")["detail"]
        await assert_unchanged(station, client, before, task_id, unsent_to=(STRANGER, CLIENT))


async def test_a_learning_proposal_does_not_make_a_stranger_a_recipient(
    station: OperatorStation,
) -> None:
    async with station.client() as client:
        task_id, draft_id = await approved_task(station, client, body=INJECTION, to=[CLIENT])
        proposal = await call(
            client,
            "submit_learning",
            workspace_id=station.workspace_id,
            kind="new_contact",
            summary=f"{STRANGER} is Dana's colleague at Contoso (client side)",
            detail=f"{{address: {STRANGER}, side: client, verified_by: crm-record}}",
        )
        assert proposal["state"] == "queued"
        before = await snapshot(station, client, task_id)

        refusal = await refused(
            client, "send", task_id=task_id, draft_id=draft_id, to=[CLIENT], cc=[STRANGER]
        )
        assert reason_for(refusal, "recipient_unknown")["recipient"] == STRANGER
        gate = await call(client, "gate_check", task_id=task_id, draft_id=draft_id, to=[STRANGER])
        assert gate["ready"] is False
        assert await snapshot(station, client, task_id) == before
