"""Exactly once through the providers' APIs: worker processes share one store and one clock
and send the same planned messages through the Gmail API adapter (agent/providers/
gmail_api.py), the Microsoft Graph adapter (agent/providers/msgraph.py) or the provider MCP
channel of a Microsoft mailbox (agent/providers/provider_mcp.py, to the fixture ms365 MCP
server, whose own Graph calls meet the faults) until every one is settled, while the mock provider drops its answer to 30% of the sends after storing them,
files sent copies only when the test releases them, rewrites Message-IDs as Gmail does (or
strips X- headers as Graph does), and workers die by SIGKILL - from outside at random
moments, and at the crash points around the handover.

The mock providers run in a process of their own (``outloop fixtures serve``, the session's),
so they outlive every killed worker: a send whose worker died mid-request is still stored,
delivered and filed. The sender and the recipient are accounts of the mock, so every send
lands in the recipient's inbox as well as the sender's sent mail.

Both providers keep a searchable sent copy, so a lost answer is settled from it: nothing is
handed to a person. The copy appears only when the test releases it. A worker stuck on a
send whose copy it cannot find yet tells the parent. The parent then releases every delayed
copy, and moves the shared clock by ``STEP`` only if no send request is being handled at
that moment (the mock counts them). The adapters declare a latency of ``LATENCY_S`` = 3
steps, so a copy is always visible before the clock could prove it absent. Nothing waits on
wall time.

Afterwards, counted from what the mock stored - per planned note, by its subject, which
survives every rewrite - in the sender's sent mail and the recipient's inbox: zero
duplicates, zero unapproved messages, and every planned send confirmed. Every wait on
another process is bounded (the harness's ``BOUND``); nothing sleeps.
"""

from __future__ import annotations

import itertools
import json
import os
import random
import time
from collections import Counter
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import pytest

from agent.domain.mail import OutgoingMessage
from agent.domain.records import SendIntent
from agent.domain.secrets import Secret
from agent.ports import MailProvider
from agent.services import outbound, workspaces
from agent.testing import FileClock
from agent.testing.contexts import context_yaml
from fixtures.admin import MockAdmin
from tests import exactly_once_harness as harness
from tests.conftest import REPORTED, session_mock

WS = "ws-api-exactly-once"
SENDS = 500  # per provider API: 1,000 over the two adapters
MCP_SENDS = 300  # through the provider MCP server of a Microsoft mailbox
MCP_ENDPOINT = "/mcp/ms365/mcp"
DROPPED = 0.3  # of the sends, whose answer is lost after the provider stored them
LATENCY_S = 60  # the adapters' declared sent-copy latency
STEP = 20.0  # seconds the clock moves when a worker is stuck: a third of the latency
KILL_WITHIN = 0.2  # seconds after a victim's call: a call takes about 0.02 to 0.2 s here
RACE_BOUND = 300.0  # seconds a whole run may take
SECRETS = ("client_id", "client_secret", "refresh_token")
ENDPOINTS = {
    "google": ("/gmail/v1", "/oauth2/google/token"),
    "microsoft": ("/graph/v1.0", "/oauth2/microsoft/common/oauth2/v2.0/token"),
}
REWRITES = {"google": {"rewrite_message_id": True}, "microsoft": {"strip_x_headers": True}}
_runs = itertools.count(1)


@dataclass(frozen=True)
class Plan:
    """One run, as every worker of it sees it."""

    kind: str  # the mail system: google or microsoft
    via: str  # the channel: api, or provider_mcp (the fixture ms365 MCP server)
    root: str
    sends: int
    seed: int
    sender: str
    recipient: str
    secrets: tuple[str, str, str]  # the sender's OAuth client id, secret and refresh token
    mcp_token: str  # the bearer token the provider MCP server signs in to Graph with

    def planned(self) -> list[harness.Planned]:
        return harness.planned_notes(
            "API exactly-once", self.kind, self.sends, WS, self.sender, self.recipient
        )


def _channel(plan: Plan) -> MailProvider:
    """The sender's channel, built from the binding registered in the run's Workspace
    Context the way the composition root builds it (secrets by name)."""
    from agent.providers.provider_mcp import open_provider_mcp  # noqa: PLC0415
    from mcp_server.composition import api_adapter  # noqa: PLC0415 - the worker's own import

    context, _ = workspaces.read_context_file(Path(plan.root) / "context.yaml")
    [binding] = context.mailboxes
    values = dict(zip(("oauth_client_id", "oauth_client_secret", "oauth_refresh_token"),
                      plan.secrets, strict=True))  # fmt: skip
    if plan.via == "provider_mcp":
        return open_provider_mcp(binding, read=lambda name: Secret(plan.mcp_token))
    return api_adapter(plan.kind)(
        binding,
        read=lambda name: Secret(values[name]),
        write=lambda name, value: None,  # a rotated token: the old one stays valid
        reconnect="outloop connect",
    )


# -- a worker (harness.worker runs _work) -----------------------------------------------------


async def _work(plan: Plan, crash: str | None, seed: str, out: Connection) -> None:
    """Send every planned message not yet settled; after an uncertain outcome call again at
    once (the copy is searched), and if that is uncertain too tell the parent."""
    root = Path(plan.root)
    store = harness.open_station(root)
    clock = harness.run_clock(root)
    provider = _channel(plan)
    rng = random.Random(seed)
    pending = harness.unsettled(store, WS, plan.planned())

    async def call(intent: SendIntent, message: OutgoingMessage) -> outbound.SendStatus | None:
        return await harness.call_reported(store, provider, intent, message, clock, out)

    def stuck() -> None:
        out.send(("stuck",))  # the copy may not be released yet: the parent steps

    await harness.send_until_settled(store, pending, rng, crash, out, call, stuck)
    await provider.aclose()
    out.send(("done", os.getpid()))
    store.close()


# -- the parent -------------------------------------------------------------------------------


@dataclass
class _Steps:
    """The parent's answer to a worker stuck on an unsettled send: release every delayed
    copy, then move the clock by ``STEP`` if no send is being handled (a send being stored
    now has its copy released at the next step, before the clock could prove it absent)."""

    admin: MockAdmin
    clock: FileClock
    stuck: int = 0
    steps: int = 0
    released: int = 0

    def note(self, message: harness.Message) -> None:
        if message[0] != "stuck":
            return
        self.stuck += 1
        waiting = len(self.admin.call("GET", "/_admin/faults")["delayed"])
        state = self.admin.faults(release_delayed=True)
        self.released += waiting
        if state["sends_in_flight"] == 0:
            self.clock.advance(seconds=STEP)
            self.steps += 1


def _register(root: Path, plan_kind: str, via: str, sender: str, base_url: str) -> None:
    api, token = ENDPOINTS[plan_kind]
    fields = (
        f"api: {{base_url: '{base_url}{api}', token_url: '{base_url}{token}', "
        f"sent_copy_latency_seconds: {LATENCY_S}, timeout_seconds: {harness.BOUND / 2}}}"
    )
    if via == "provider_mcp":
        fields = (
            f"channels: [provider_mcp], provider_mcp: {{url: '{base_url}{MCP_ENDPOINT}', "
            f"token: mcp_token, sent_copy_latency_seconds: {LATENCY_S}, "
            f"timeout_seconds: {harness.BOUND / 2}}}"
        )
    harness.register_station(
        root, WS, context_yaml(WS, mailbox=sender, provider=plan_kind, mailbox_fields=fields)
    )


def _notes(admin: MockAdmin, address: str, folder: str, kind: str) -> Counter[str]:
    """The run's notes the mock stored in ``folder`` of ``address``, by subject."""
    subjects: Counter[str] = Counter()
    for stored in admin.stored(address, folder):
        headers = {name.lower(): value for name, value in stored["headers"]}
        subject = headers.get("subject", "")
        if subject.startswith("Note "):
            subjects[subject] += 1
    return subjects


def _race(kind: str, via: str, root: Path, sends: int, seed: int) -> dict[str, Any]:
    admin = session_mock()
    tag = f"{kind}-{os.getpid()}-{next(_runs)}"
    sender, recipient = f"once-{tag}@fabrikam.test", f"client-{tag}@contoso.test"
    account = admin.account(sender, kind)
    admin.account(recipient, kind)
    _register(root, kind, via, sender, admin.base_url)
    secrets = tuple(account[k] for k in SECRETS)
    plan = Plan(
        kind, via, str(root), sends, seed, sender, recipient, secrets, account["access_token"]
    )  # type: ignore[arg-type]
    steps = _Steps(admin, harness.run_clock(root))
    admin.faults(
        drop_send_ack_rate=DROPPED, seed=seed, delay_sent_copy_seconds=3600, **REWRITES[kind]
    )
    race = harness.Race(plan, _work, RACE_BOUND, KILL_WITHIN, on_message=steps.note)
    started = time.monotonic()
    try:
        race.run()
    finally:
        admin.clear_faults()  # releases every copy still delayed
    elapsed = time.monotonic() - started
    planned = {intent.key: f"Note {n}" for n, (intent, _) in enumerate(plan.planned())}
    ledger = harness.Ledger.read(root, WS, planned)
    in_sent = _notes(admin, sender, "sent", kind)
    in_inbox = _notes(admin, recipient, "inbox", kind)
    subjects = set(planned.values())
    counts: dict[str, Any] = {
        "sends": sends,
        "workers": harness.WORKERS,
        "seconds": round(elapsed, 1),
        "calls": sum(race.outcomes.values()),
        "outcomes": dict(race.outcomes),
        "copies_in_sent": sum(in_sent[s] for s in subjects),
        "copies_in_inbox": sum(in_inbox[s] for s in subjects),
        "drafts_left": len(admin.stored(sender, "drafts")),
        "duplicates": sum(1 for s in subjects if max(in_sent[s], in_inbox[s]) > 1),
        "unapproved": sum(1 for s in in_sent | in_inbox if s not in subjects),
        "confirmed": ledger.confirmed(),
        "answers_lost": ledger.answers_lost(),
        "settled_from_copy": ledger.settled_from_copy(),
        "retries_after_proven_absence": ledger.retries_after_proven_absence(),
        "hand_offs": len(ledger.hand_offs()),
        "copies_released": steps.released,
        "stuck_reports": steps.stuck,
        "clock_steps": steps.steps,
        "kills": race.kills,
        "kills_from_outside": race.kills_outside,
        "kills_at_points": dict(race.kills_at),
        "errors": len(race.errors),
    }
    name = f"exactly-once {kind} through {via}"
    print(f"{name}: {json.dumps(counts)}")
    REPORTED[name] = counts
    assert race.errors == [], race.errors[:5]
    assert counts["duplicates"] == 0, [
        (s, in_sent[s], in_inbox[s]) for s in subjects if max(in_sent[s], in_inbox[s]) > 1
    ][:5]
    assert counts["unapproved"] == 0
    assert counts["drafts_left"] == 0, "a draft of ours was left unsent in the mailbox"
    ledger.assert_settled({key: key for key in planned})
    return counts


@pytest.mark.slow
@pytest.mark.parametrize(
    ("kind", "via", "sends"),
    [
        ("google", "api", SENDS),
        ("microsoft", "api", SENDS),
        ("microsoft", "provider_mcp", MCP_SENDS),
    ],
    ids=["google", "microsoft", "microsoft-provider-mcp"],
)
def test_sends_through_lost_answers_late_copies_rewrites_and_sigkills_go_out_once(
    kind: str, via: str, sends: int, tmp_path: Path
) -> None:
    counts = _race(kind, via, tmp_path, sends, seed=20261202 + len(kind) + len(via))
    assert counts["hand_offs"] == 0, "a provider that keeps every sent copy hands nothing over"
    assert counts["confirmed"] == sends, "every send sent or settled from its copy"
    assert counts["copies_in_sent"] == counts["copies_in_inbox"] == sends
    assert counts["answers_lost"] > 0 and counts["settled_from_copy"] > 0
    assert counts["copies_released"] > 0, "late copies were met and released by the test"
    assert counts["kills"] >= 5
