"""Intake reads only through channels that give every channel's key basis, and a store
written before the keys were channel-independent keeps its old occurrence keys."""

from __future__ import annotations

import pytest

from agent.domain.dispositions import Disposition
from agent.domain.envelope import legacy_occurrence_key
from agent.domain.execution import ClaimOutcome
from agent.domain.mail import Capabilities
from agent.domain.records import ClaimRequest, ReportRequest, TaskUpdate
from agent.domain.run import LedgerEntry
from agent.domain.states import TaskState
from agent.services import claim, classify, workspaces
from agent.services.holder import current_holder, holder_alive
from agent.testing import InMemoryProvider, make_envelope
from tests.conftest import context_yaml
from tests.services.conftest import Station

pytestmark = pytest.mark.anyio

MAILBOX = "support@fabrikam.test"


class NoKeyBasis(InMemoryProvider):
    """A channel that cannot show a message's Message-ID, sender and Date alike."""

    @property
    def capabilities(self) -> Capabilities:
        return super().capabilities.model_copy(update={"key_basis": False})


async def test_a_channel_without_the_key_basis_is_not_used_for_intake(station: Station) -> None:
    ws = station.register(context_yaml())
    box = NoKeyBasis(MAILBOX)
    box.deliver(make_envelope(mailbox_id=MAILBOX, message_no=1, thread_no=1))
    result = await station.cycle(ws, box)
    assert result.items == [] and station.store.list_tasks(ws) == []
    [error] = result.access_errors
    assert "cannot give the Message-ID, sender and Date" in error
    assert "not used for intake" in error


async def test_an_item_claimed_under_the_old_key_is_not_claimed_again(station: Station) -> None:
    ws = station.register(context_yaml())
    envelope = make_envelope(mailbox_id=MAILBOX, message_no=1, thread_no=1)
    # What a store written before the upgrade holds: the item claimed and done under the
    # key of its bytes' digest.
    old_key = legacy_occurrence_key(ws, envelope)
    now = station.clock.now()
    store = station.store
    store.start_run("run-old", ws, current_holder(), now)
    store.record_scanned(
        [LedgerEntry(run_id="run-old", item_ref="memory:old", occurrence_key=old_key)], now
    )
    request = ClaimRequest(
        key=old_key, service="email-intake", holder=current_holder(), run_id="run-old",
        item_ref="memory:old",
    )  # fmt: skip
    context = workspaces.load_context(store, ws)
    draft = claim.task_draft(context, envelope, old_key, classify.work_owner(context), now)
    assert store.claim(request, draft, now, holder_alive).outcome is ClaimOutcome.CLAIMED
    store.report(
        ReportRequest(
            key=old_key, holder=current_holder(), run_id="run-old", item_ref="memory:old",
            disposition=Disposition.QUEUED, task_update=TaskUpdate(state=TaskState.TASK_RESOLVED),
        ),
        now,
    )  # fmt: skip
    box = InMemoryProvider(MAILBOX)
    box.deliver(envelope)
    result = await station.cycle(ws, box)
    assert [i.disposition for i in result.items] == [Disposition.EXECUTION_ALREADY_DONE]
    assert len(store.list_tasks(ws)) == 1
    assert [e.occurrence_key for e in store.ledger(result.run_id)] == [old_key]
