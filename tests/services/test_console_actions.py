"""A person's actions in the console, enforced in the core: accepting or rejecting an agent's
learning proposal, acknowledging a sign-in challenge, releasing a held send and settling a
send no channel could settle. Each is refused, changing nothing, unless an operator of the
workspace gives it with what it rests on."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from agent.domain.dispositions import GateKind
from agent.domain.errors import (
    AuthChallengeUnresolved,
    ContextError,
    GateRefused,
    InvalidRequest,
)
from agent.domain.mail import Marker, MarkerKind
from agent.domain.records import ProposalState, SendAttempt, SendIntent, SendState
from agent.services import challenges, console, learning, workspaces
from agent.testing import FrozenClock
from agent.testing.contexts import context_yaml
from tests.services.gates_world import APPROVER, CLIENT, MAILBOX, World

pytestmark = pytest.mark.anyio

OPERATOR = "ori.gal@fabrikam.test"
OPERATOR_LINE = (
    "  - {address: ori.gal@fabrikam.test, name: Ori Gal, side: internal, roles: [operator]}\n"
)
NEW_CONTACT = "- {address: lior.ben@contoso.test, name: Lior Ben, side: client, verified_by: crm}\n"
"""A contact entry as the stored context's block list holds one."""
WHERE = "127.0.0.1 (session s-1)"


def with_operator(text: str) -> str:
    return text.replace("contacts:\n", "contacts:\n" + OPERATOR_LINE, 1)


@pytest.fixture
def ops(make_world: object) -> World:
    return make_world(with_operator(context_yaml()))  # type: ignore[operator]


def proposal(world: World) -> str:
    return learning.submit(
        world.store, world.workspace_id, kind="new_contact",
        summary="Lior Ben writes for Contoso", detail="signs as Contoso procurement",
        evidence=("<m1@contoso.test>",), clock=world.clock,
    ).proposal_id  # fmt: skip


def context_text(world: World) -> str:
    row = world.store.get_workspace(world.workspace_id)
    assert row is not None and row.context_text is not None
    return row.context_text


def with_new_contact(world: World) -> str:
    return context_text(world).replace("contacts:\n", "contacts:\n" + NEW_CONTACT, 1)


# -- learning proposals --------------------------------------------------------------------


async def test_accepting_a_proposal_writes_the_checked_context_after_showing_its_diff(
    ops: World,
) -> None:
    pid = proposal(ops)
    change = learning.preview_change(ops.store, ops.data_dir, pid, with_new_contact(ops))
    added = [line for line in change.diff.splitlines() if line.startswith("+")]
    assert added[0].startswith("+++ ") and added[1] == "+- address: lior.ben@contoso.test"
    assert not [line for line in change.diff.splitlines() if line.startswith("-")][1:]
    ops.clock.advance(minutes=2)
    decided, row = learning.accept(
        ops.store, ops.data_dir, pid, text=with_new_contact(ops), base_sha256=change.base_sha256,
        by=OPERATOR, where=WHERE, now=ops.clock.now(),
    )  # fmt: skip
    assert decided.state is ProposalState.ACCEPTED and decided.decided_by == OPERATOR
    assert decided.decided_at == ops.clock.now() and WHERE in (decided.decision_note or "")
    live = workspaces.load_context(ops.store, ops.workspace_id)
    assert "lior.ben@contoso.test" in {c.address for c in live.contacts}
    assert row.context_sha256 != change.base_sha256
    assert ops.data_dir.context_file(ops.workspace_id).read_text(encoding="utf-8") == (
        row.context_text
    )
    with pytest.raises(InvalidRequest, match=f"was accepted by {OPERATOR}"):
        learning.reject(
            ops.store, pid, reason="late", by=OPERATOR, where=WHERE, now=ops.clock.now()
        )


@pytest.mark.parametrize(
    ("edit", "error", "why"),
    [
        (lambda t: t + "mailboxes: [\n", ContextError, "not valid YAML"),
        (lambda t: t.replace("timezone: Asia/Jerusalem", "timezone: Mars/Base"), ContextError,
         "timezone"),
        (lambda t: t.replace("ws-test-0001", "ws-other-0002"), ContextError,
         "names workspace ws-other-0002"),
        (lambda t: t, InvalidRequest, "the one ws-test-0001 has now"),
        (lambda t: t.replace("licence: active", "licence: suspended"), InvalidRequest,
         "does not change grants"),
        (lambda t: t.replace("    token_url: null", "    token_url: https://evil.example/token"),
         InvalidRequest, "does not change mailboxes"),
    ],
)  # fmt: skip
async def test_a_proposal_change_the_update_checks_refuse_is_not_written(
    ops: World, edit: object, error: type[Exception], why: str
) -> None:
    pid = proposal(ops)
    before = context_text(ops)
    text = edit(before)  # type: ignore[operator]
    with pytest.raises(error, match=why):
        learning.accept(
            ops.store, ops.data_dir, pid, text=text, base_sha256="x", by=OPERATOR, where=WHERE,
            now=ops.clock.now(),
        )  # fmt: skip
    assert context_text(ops) == before
    assert ops.store.get_proposal(pid).state is ProposalState.QUEUED  # type: ignore[union-attr]


async def test_a_proposal_is_accepted_only_by_an_operator_and_against_the_context_shown(
    ops: World,
) -> None:
    pid = proposal(ops)
    before = context_text(ops)
    change = learning.preview_change(ops.store, ops.data_dir, pid, with_new_contact(ops))
    with pytest.raises(GateRefused, match="only an operator may accept"):
        learning.accept(
            ops.store, ops.data_dir, pid, text=with_new_contact(ops),
            base_sha256=change.base_sha256, by=APPROVER, where=WHERE, now=ops.clock.now(),
        )  # fmt: skip
    with pytest.raises(InvalidRequest, match="changed since that diff was shown"):
        learning.accept(
            ops.store, ops.data_dir, pid, text=with_new_contact(ops), base_sha256="0" * 64,
            by=OPERATOR, where=WHERE, now=ops.clock.now(),
        )  # fmt: skip
    assert context_text(ops) == before
    assert ops.store.get_proposal(pid).state is ProposalState.QUEUED  # type: ignore[union-attr]


async def test_a_rejection_records_why_and_leaves_the_context_alone(ops: World) -> None:
    pid = proposal(ops)
    before = context_text(ops)
    with pytest.raises(InvalidRequest, match="say why"):
        learning.reject(ops.store, pid, reason="  ", by=OPERATOR, where=WHERE, now=ops.clock.now())
    with pytest.raises(GateRefused, match="only an operator"):
        learning.reject(ops.store, pid, reason="no", by=CLIENT, where=WHERE, now=ops.clock.now())
    decided = learning.reject(
        ops.store, pid, reason="Lior left Contoso", by=OPERATOR, where=WHERE, now=ops.clock.now()
    )
    assert decided.state is ProposalState.REJECTED
    assert decided.decision_note == f"Lior left Contoso (from {WHERE})"
    assert context_text(ops) == before


# -- sign-in challenges --------------------------------------------------------------------


def keeper(world: World) -> challenges.Keeper:
    """The browser channel's challenges as one process of the station keeps them."""
    return challenges.Keeper(world.store, world.workspace_id, MAILBOX, "browser", world.clock)


PUSH = AuthChallengeUnresolved(
    "Microsoft asks to approve a sign-in request on the worker's phone",
    "approve it, or run `outloop login --headed`",
    challenge="push_approval",
)


async def test_a_kept_challenge_stops_every_process_until_an_operator_acknowledges_it(
    ops: World,
) -> None:
    keeper(ops).keep(PUSH)
    ops.clock.advance(hours=2)
    kept = keeper(ops).kept()  # another process of the station, later
    assert kept is not None and kept.challenge == "push_approval"
    assert kept.code == "AUTH_CHALLENGE_UNRESOLVED" and "--headed" in kept.action
    assert "does not sign in again until an operator acknowledges it" in str(kept)
    with pytest.raises(InvalidRequest, match="say what you did"):
        challenges.acknowledge(ops.store, ops.workspace_id, MAILBOX, "browser",
                               by=OPERATOR, evidence=" ", where=WHERE, now=ops.clock.now())  # fmt: skip
    with pytest.raises(GateRefused, match="only an operator"):
        challenges.acknowledge(ops.store, ops.workspace_id, MAILBOX, "browser",
                               by=APPROVER, evidence="done", where=WHERE, now=ops.clock.now())  # fmt: skip
    assert keeper(ops).kept() is not None  # a refused acknowledgement changes nothing
    done = challenges.acknowledge(
        ops.store, ops.workspace_id, MAILBOX, "browser", by=OPERATOR,
        evidence="approved the push on the worker phone", where=WHERE, now=ops.clock.now(),
    )  # fmt: skip
    assert not done.open and done.acknowledged_by == OPERATOR and WHERE in (done.evidence or "")
    assert keeper(ops).kept() is None
    [listed] = challenges.listed(ops.store, ops.workspace_id)
    assert listed == done
    with pytest.raises(InvalidRequest, match="no unresolved sign-in challenge"):
        challenges.acknowledge(ops.store, ops.workspace_id, MAILBOX, "browser",
                               by=OPERATOR, evidence="x", where=WHERE, now=ops.clock.now())  # fmt: skip
    ops.clock.advance(days=1)
    keeper(ops).keep(PUSH)  # met again later: open again
    assert keeper(ops).kept() is not None


async def test_a_person_signing_the_mailbox_in_resolves_its_kept_challenge(ops: World) -> None:
    assert (
        challenges.signed_in(ops.store, ops.workspace_id, MAILBOX, "browser", ops.clock.now())
        is None
    )
    keeper(ops).keep(PUSH)
    resolved = challenges.signed_in(
        ops.store, ops.workspace_id, MAILBOX, "browser", ops.clock.now()
    )
    assert resolved is not None and resolved.acknowledged_by == "outloop login"
    assert keeper(ops).kept() is None
    other = challenges.Keeper(ops.store, ops.workspace_id, "other@fabrikam.test", "browser",
                              ops.clock)  # fmt: skip
    assert other.kept() is None


# -- a held send ---------------------------------------------------------------------------


async def test_a_send_the_preflight_held_is_released_by_an_operator_once_the_preflight_passes(
    make_world: object, tmp_path: object
) -> None:
    world: World = make_world(with_operator(context_yaml(licence="suspended")))  # type: ignore[operator]
    world.deliver(sender=CLIENT, thread=1, text="Can you send a quote?")
    await world.intake()
    task = world.only_task()
    assert GateKind.PREFLIGHT in {g.kind for g in task.open_gates}
    with pytest.raises(GateRefused, match="still fails"):
        console.release_hold(world.store, task.task_id, world.clock, by=OPERATOR, where=WHERE)
    assert world.task(task.task_id) == task
    path = world.data_dir.context_file(world.workspace_id)
    path.write_text(context_text(world).replace("licence: suspended", "licence: active"))
    workspaces.update_workspace(world.store, world.data_dir, path, world.clock.now())
    with pytest.raises(GateRefused, match="only an operator may release"):
        console.release_hold(world.store, task.task_id, world.clock, by=APPROVER, where=WHERE)
    world.clock.advance(minutes=1)
    released = console.release_hold(
        world.store, task.task_id, world.clock, by=OPERATOR, where=WHERE
    )
    assert GateKind.PREFLIGHT not in {g.kind for g in released.open_gates}
    assert "no longer held" in released.next_action.description
    [(_, _, event)] = world.store.task_events(task.task_id)[-1:]
    assert f"released by {OPERATOR}" in event and WHERE in event
    with pytest.raises(InvalidRequest, match="no held send"):
        console.release_hold(world.store, task.task_id, world.clock, by=OPERATOR, where=WHERE)


# -- a send no channel could settle --------------------------------------------------------


def with_person(world: World) -> str:
    now = datetime(2026, 11, 30, 9, tzinfo=UTC)
    marker = Marker(kind=MarkerKind.MESSAGE_ID, value="<s-1@fabrikam.test>")
    intent = SendIntent(
        key="reply|draft-1|client", workspace_id=world.workspace_id, kind="client_reply",
        task_id=None, internet_message_id="<s-1@fabrikam.test>", recipients=(CLIENT,),
        automated=False, holder="host/1/1/w", marker=marker,
    )  # fmt: skip
    world.store.begin_send(intent, now)
    attempt = SendAttempt(
        channel="browser", marker=marker, keeps_sent_copy=False, sent_copy_latency=timedelta(0)
    )
    world.store.attempt_send(intent.key, intent.holder, attempt, now)
    world.store.mark_uncertain(intent.key, intent.holder, "OutcomeUnknown: page closed", now)
    world.store.hand_to_person(intent.key, "the browser keeps no sent copy", now)
    return intent.key


async def test_a_send_is_settled_in_the_console_by_the_rule_of_sends_settle(ops: World) -> None:
    key = with_person(ops)
    clock = FrozenClock(datetime(2026, 11, 30, 10, tzinfo=UTC))
    with pytest.raises(GateRefused, match="only an operator may settle"):
        console.settle_send(ops.store, key, clock, sent=True, evidence="seen", by=APPROVER,
                            where=WHERE)  # fmt: skip
    with pytest.raises(InvalidRequest, match="needs the evidence"):
        console.settle_send(ops.store, key, clock, sent=True, evidence="", by=OPERATOR,
                            where=WHERE)  # fmt: skip
    assert ops.store.get_send(key).state is SendState.WITH_PERSON  # type: ignore[union-attr]
    settled = console.settle_send(
        ops.store, key, clock, sent=True, evidence="in Dana's inbox, 09:02", by=OPERATOR,
        where=WHERE,
    )  # fmt: skip
    assert settled.state is SendState.CONFIRMED
    last = ops.store.send_events(key)[-1]
    assert last.actor == f"{OPERATOR} (console, from {WHERE})"
    assert "in Dana's inbox" in last.detail
    with pytest.raises(InvalidRequest, match="only a send whose outcome is unknown"):
        console.settle_send(ops.store, key, clock, sent=False, evidence="x", by=OPERATOR,
                            where=WHERE)  # fmt: skip
