"""Seed 000 section 12 acceptance scenarios 8, 9 and 11 on the API side, through the MCP
server, with a Microsoft mailbox of the session's mock providers reached through Microsoft
Graph and through the fixture provider MCP server (Softeria's ms-365-mcp-server tool shapes,
``fixtures/mail_mcp_ms365.py``) - the same mailbox either way.

- 9: Outlook without Graph: the context does not permit the Graph connector; the permitted
  provider MCP server is evaluated next and the whole lifecycle runs through it (intake,
  approval by the approver's reply, send inside the client's conversation, read-back).
- 8: a missing connector follows the canonical order: with no Graph connector (no OAuth
  secret in the vault) and no provider MCP server, the browser is reported as the next path;
  with Graph unreachable, the provider MCP server does the work; each step's reason is on
  record.
- 11: Graph refuses to send (403: the app has no Mail.Send): the refusal is recorded and never
  routed around through the provider MCP server; reads go on only where the context
  separately authorizes them (``reads_after_refusal``).
- A send whose answer Graph lost is settled from Graph's sent copy, read through the provider
  MCP server once Graph is no longer permitted, before that server may send it.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from mcp import Client

from agent.services import workspaces
from mcp_server.cli import main as outloop
from tests.conftest import context_yaml, session_mock
from tests.mcp.conftest import (
    APPROVER,
    CLIENT,
    COLLEAGUE_LINE,
    call,
    intake_and_claim,
    read_back_the_client_reply,
    reconcile_all,
    refused,
    to_draft_ready,
)
from tests.mcp.test_api_scenarios import (
    ENDPOINTS,
    ApiStation,
    approve_by_reply,
    ensure_people,
    parsed,
    request_approval,
    with_id,
)
from tests.mcp.test_imap_scenarios import CLIENT_NAME, MailServerTime
from tests.mcp.test_scenarios import HEBREW_BODY, HEBREW_SUBJECT

pytestmark = pytest.mark.anyio

WORKSPACE = "ws-test-0001"
MCP_ENDPOINT = "/mcp/ms365/mcp"
CLOSED_PORT_URL = "http://127.0.0.1:9/graph/v1.0"
"""An API base nothing listens on (the discard port): Graph unreachable."""


class RoutedStation(ApiStation):
    """A mailbox (Microsoft's unless ``kind`` says) whose context lists its permitted
    channels and names the provider MCP server (its bearer token in the vault as
    ``mcp_token``)."""

    channels: str = "[api, provider_mcp, browser]"
    mcp: bool = True
    api_base: str | None = None
    reads_after_refusal: bool = False

    def context(self) -> str:
        base, token = (self.admin.base_url + path for path in ENDPOINTS[self.kind])
        fields = [
            f"channels: {self.channels}",
            f"api: {{base_url: '{self.api_base or base}', token_url: '{token}'}}",
        ]
        if self.mcp:
            url = self.admin.base_url + MCP_ENDPOINT
            fields.append(f"provider_mcp: {{url: '{url}', token: mcp_token}}")
        if self.reads_after_refusal:
            fields.append("reads_after_refusal: true")
        text = context_yaml(
            self.workspace_id,
            mailbox=self.mailbox,
            provider=self.kind,
            mailbox_fields=", ".join(fields),
        )
        return text.replace("contacts:\n", "contacts:\n" + COLLEAGUE_LINE, 1)

    def vault_set(self, name: str, value: str) -> None:
        """``outloop vault set WS MAILBOX NAME --stdin``, as the operator runs it."""
        env: dict[str, str | None] = {k: None for k in os.environ if k.startswith("OUTLOOP_")}
        env["OUTLOOP_VAULT_BACKEND"] = "plain"
        args = ["vault", "set", self.workspace_id, self.mailbox, name, "--stdin"]
        done = CliRunner().invoke(
            outloop, [*args, "--data-dir", str(self.data_dir)], input=value, env=env
        )
        assert done.exit_code == 0, (done.output, done.exception)
        assert value not in done.output

    def connect_without_check(self, account: dict[str, Any]) -> None:
        env: dict[str, str | None] = {k: None for k in os.environ if k.startswith("OUTLOOP_")}
        env["OUTLOOP_VAULT_BACKEND"] = "plain"
        args = ["connect", "--workspace", self.workspace_id, "--mailbox", self.mailbox]
        values = "".join(f"{account[k]}\n" for k in ("client_id", "client_secret", "refresh_token"))
        done = CliRunner().invoke(
            outloop,
            [*args, "--stdin", "--no-check", "--data-dir", str(self.data_dir)],
            input=values,
            env=env,
        )
        assert done.exit_code == 0, (done.output, done.exception)

    def connect_both(self, account: dict[str, Any]) -> None:
        """Graph's OAuth secrets (``outloop connect``) and the MCP server's bearer token."""
        self.connect_without_check(account)
        self.vault_set("mcp_token", account["access_token"])

    def health(self) -> list[str]:
        """The station's health records about this mailbox's access, oldest first."""
        store = self.store()
        try:
            return [
                r.detail
                for r in store.list_health()
                if r.key == f"access {self.workspace_id} {self.mailbox}" or self.mailbox in r.key
            ]
        finally:
            store.close()


def routed_station(
    tmp_path: Path,
    *,
    scopes: list[str] | None = None,
    kind: type[RoutedStation] = RoutedStation,
    provider: str = "microsoft",
    **fields: Any,
) -> tuple[RoutedStation, dict[str, Any]]:
    """A registered workspace whose mailbox (of ``provider``) is a new account of the
    session's mock (``scopes``: the OAuth scopes its app holds), with ``fields`` set on the
    station before its context is written."""
    admin = session_mock()
    ensure_people(admin)
    mailbox = f"ops-{uuid.uuid4().hex[:10]}@fabrikam.test"
    extra = {"scopes": scopes} if scopes is not None else {}
    account = admin.account(mailbox, provider, **extra)
    station = kind(
        root=tmp_path / "station",
        clock=MailServerTime(),
        workspace_id=WORKSPACE,
        admin=admin,
        kind=provider,
        mailbox=mailbox,
    )
    for name, value in fields.items():
        setattr(station, name, value)
    station.register(station.context())
    station.inbox = station.inbox_state()
    return station, account


@pytest.fixture
def without_graph(tmp_path: Path) -> Iterator[RoutedStation]:
    """Outlook whose Graph connector the context does not permit: the provider MCP server
    and the browser are."""
    station, account = routed_station(tmp_path, channels="[provider_mcp, browser]")
    station.vault_set("mcp_token", account["access_token"])
    yield station
    assert station.inbox_state() == station.inbox
    assert station.stored("drafts") == []
    station.assert_sent_as_planned()


async def _drafted_reply(
    client: Client, station: RoutedStation
) -> tuple[dict[str, Any], str, dict[str, Any]]:
    """The client's request taken in and claimed, and a reply to it rendered: the intake,
    the task and the draft."""
    scanned, [claim] = await intake_and_claim(client, station.mailbox)
    task_id = claim["task_id"]
    await to_draft_ready(client, task_id)
    draft = await call(client, "render", task_id=task_id, body_markdown="We are on it.")
    return scanned, task_id, draft


async def _send_through(
    station: RoutedStation, client: Client, task_id: str, draft_id: str, channel: str
) -> dict[str, Any]:
    sent = await call(client, "send", task_id=task_id, draft_id=draft_id, to=[CLIENT])
    station.plan(sent["internet_message_id"], [CLIENT])
    assert sent["status"] == "sent" and sent["channel"] == channel, sent
    return sent


async def test_scenario_09_outlook_without_graph_works_through_the_permitted_provider_mcp_server(
    without_graph: RoutedStation,
) -> None:
    station = without_graph
    request_id = station.deliver(sender=CLIENT, sender_name=CLIENT_NAME, subject=HEBREW_SUBJECT)
    async with station.client() as client:
        access = await call(client, "access_status", workspace_id=station.workspace_id)
        [mailbox] = access["mailboxes"]
        states = {c["channel"]: c["state"] for c in mailbox["channels"]}
        assert states == {"api": "not_permitted", "provider_mcp": "usable", "browser": "not_tried"}
        assert mailbox["path"] == "provider_mcp" and mailbox["ok"] is True
        assert "provider MCP server" in mailbox["detail"]

        scanned, [claim] = await intake_and_claim(client, station.mailbox)
        assert claim["outcome"] == "CLAIMED" and claim["task_created"] is True
        task_id = claim["task_id"]
        await to_draft_ready(client, task_id)
        draft = await call(
            client, "render", task_id=task_id, body_markdown=HEBREW_BODY, language="he"
        )
        request = await request_approval(station, client, task_id, draft["draft_id"])
        for reconciliation in await reconcile_all(client, scanned):
            assert reconciliation["clean"], reconciliation
        await approve_by_reply(station, client, [request])
        sent = await _send_through(station, client, task_id, draft["draft_id"], "provider_mcp")
        await read_back_the_client_reply(client, task_id, sent)

    # In the client's conversation, answering her message, as Graph keeps it.
    stored = with_id(station.stored("sent"), sent["internet_message_id"])
    assert stored["thread_id"] == station.thread_of(request_id)
    [delivered] = station.copies_of(sent["internet_message_id"])
    assert delivered["In-Reply-To"] == request_id
    assert delivered["Subject"] == f"Re: {HEBREW_SUBJECT}"


async def test_scenario_08_with_no_connector_on_the_api_side_the_browser_is_the_next_path(
    tmp_path: Path,
) -> None:
    station, _ = routed_station(tmp_path, mcp=False)  # nothing connected, no MCP server named
    station.deliver(sender=CLIENT, subject="Quote request")
    async with station.client() as client:
        access = await call(client, "access_status", workspace_id=station.workspace_id)
        [mailbox] = access["mailboxes"]
        channels = {c["channel"]: c for c in mailbox["channels"]}
        assert [c["channel"] for c in mailbox["channels"]] == ["api", "provider_mcp", "browser"]
        assert channels["api"]["state"] == "gap"
        assert "outloop connect" in channels["api"]["reason"]
        assert channels["provider_mcp"]["state"] == "gap"
        assert "no server is named" in channels["provider_mcp"]["reason"]
        assert channels["browser"]["state"] == "gap"  # its worker's password is not stored
        assert "outloop vault set" in channels["browser"]["reason"]
        assert mailbox["ok"] is False and mailbox["path"] == "none"

        scanned = await call(client, "intake", mailbox_id=station.mailbox)
        [gap] = scanned["access_errors"]
        assert "no permitted channel can read" in gap
        assert "api:" in gap and "provider_mcp:" in gap and "browser:" in gap
        for reconciliation in await reconcile_all(client, scanned):
            assert reconciliation["clean"], reconciliation
    recorded = "\n".join(station.health())
    assert "channel api passed over: no connector" in recorded
    assert "channel provider_mcp passed over: no connector" in recorded
    assert "channel browser passed over" in recorded and "cannot be read from the vault" in recorded


async def test_an_unreachable_graph_is_an_access_gap_and_the_provider_mcp_server_reads_on(
    tmp_path: Path,
) -> None:
    station, account = routed_station(
        tmp_path, channels="[api, provider_mcp]", api_base=CLOSED_PORT_URL
    )
    station.connect_both(account)
    request_id = station.deliver(sender=CLIENT, subject="Quote request")
    async with station.client() as client:
        scanned, [claim] = await intake_and_claim(client, station.mailbox)
        assert scanned["access_errors"] == []
        assert claim["outcome"] == "CLAIMED"
        for reconciliation in await reconcile_all(client, scanned):
            assert reconciliation["clean"], reconciliation
    recorded = "\n".join(station.health())
    assert "channel api passed over: TransientFailure" in recorded
    assert "channel provider_mcp in use (was api)" in recorded
    store = station.store()
    try:
        [task] = store.list_tasks(station.workspace_id)
        assert [m.internet_message_id for m in task.messages] == [request_id]
    finally:
        store.close()


@pytest.mark.parametrize(
    "authorized", [False, True], ids=["reads-not-authorized", "reads-authorized"]
)
async def test_scenario_11_a_policy_refusal_is_not_routed_around_and_reads_go_on_only_if_authorized(
    tmp_path: Path, authorized: bool
) -> None:
    no_send = [
        "https://graph.microsoft.com/User.Read",
        "https://graph.microsoft.com/Mail.ReadWrite",
    ]
    station, account = routed_station(
        tmp_path, scopes=no_send, channels="[api, provider_mcp]", reads_after_refusal=authorized
    )
    station.connect_both(account)
    station.deliver(sender=CLIENT, subject="Quote request")
    async with station.client() as client:
        scanned, task_id, draft = await _drafted_reply(client, station)
        first = await refused(
            client, "request_approval", task_id=task_id, draft_id=draft["draft_id"]
        )
        assert first.data["refused"] == "policy"  # type: ignore[index]
        assert "403" in first.message and "nothing was handed over" in first.message
        assert "never routed around" in first.message
        for reconciliation in await reconcile_all(client, scanned):
            assert reconciliation["clean"], reconciliation

        access = await call(client, "access_status", workspace_id=station.workspace_id)
        [mailbox] = access["mailboxes"]
        assert mailbox["channels"][0]["state"] == "refused"
        assert mailbox["channels"][1]["state"] != "usable"  # never evaluated as a way round

        # Sending stays stopped, through every channel.
        again = await refused(
            client, "request_approval", task_id=task_id, draft_id=draft["draft_id"]
        )
        assert "go around it" in again.message

        # Reads go on only where the context separately authorizes them.
        station.deliver(sender=APPROVER, subject="Another question")
        reading = await call(client, "intake", mailbox_id=station.mailbox)
        if authorized:
            assert reading["access_errors"] == []
            subjects = [i["untrusted"]["subject"]["text"] for i in reading["items"]]
            assert subjects == ["Another question"]
        else:
            [stopped] = reading["access_errors"]
            assert "reads_after_refusal" in stopped
            assert reading["items"] == []
        await reconcile_all(client, reading)
    # Another server process of the station honours the refusal it kept in the store.
    async with station.client() as client:
        access = await call(client, "access_status", workspace_id=station.workspace_id)
        [mailbox] = access["mailboxes"]
        assert [c["state"] for c in mailbox["channels"]][:2] == ["refused", "not_tried"]
        again = await refused(
            client, "request_approval", task_id=task_id, draft_id=draft["draft_id"]
        )
        assert "go around it" in again.message
    recorded = "\n".join(station.health())
    assert "refused to send" in recorded and "not routed around" in recorded
    assert "provider_mcp in use" not in recorded
    assert station.stored("sent") == []


async def test_a_send_graph_lost_the_answer_to_is_settled_from_graphs_copy_before_the_provider_mcp_server_may_send(
    tmp_path: Path,
) -> None:
    station, account = routed_station(tmp_path, channels="[api, provider_mcp]")
    station.connect_both(account)
    station.deliver(sender=CLIENT, subject="Quote request")
    async with station.client() as client:
        scanned, task_id, draft = await _drafted_reply(client, station)
        request = await request_approval(station, client, task_id, draft["draft_id"])
        for reconciliation in await reconcile_all(client, scanned):
            assert reconciliation["clean"], reconciliation
        await approve_by_reply(station, client, [request])

        station.admin.faults(drop_send_ack=1)  # Graph takes the send and the answer is lost
        lost = await refused(
            client, "send", task_id=task_id, draft_id=draft["draft_id"], to=[CLIENT]
        )
        assert "outcome is not known yet" in lost.message

        # The operator no longer permits Graph: only the provider MCP server reaches the mailbox.
        station.channels = "[provider_mcp]"
        source = station.root / "contexts" / f"{station.workspace_id}.yaml"
        source.write_text(station.context(), encoding="utf-8")
        store = station.store()
        try:
            workspaces.update_workspace(
                store, workspaces.DataDir(station.data_dir), source, station.clock.now()
            )
        finally:
            store.close()

        settled = await call(
            client, "send", task_id=task_id, draft_id=draft["draft_id"], to=[CLIENT]
        )
        assert settled["status"] == "recovered", settled
        station.plan(settled["internet_message_id"], [CLIENT])
        again = await refused(
            client, "send", task_id=task_id, draft_id=draft["draft_id"], to=[CLIENT]
        )
        assert "never sent twice" in again.message
    copies = [
        m
        for m in station.stored("sent")
        if str(parsed(m)["Message-ID"]) == settled["internet_message_id"]
    ]
    assert len(copies) == 1  # Graph's copy, and no second send through the MCP server
    station.assert_sent_as_planned()
