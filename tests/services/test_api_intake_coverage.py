"""Intake through the providers' APIs (the mock Gmail API and Microsoft Graph) records every
message exactly once, whatever the provider does while it reads: Gmail's history expired
mid-scan and between runs, mail arriving between Graph's pages, storms of 429s and 503s.
A revoked refresh token is an access gap with a health record naming ``outloop connect``,
and the workspace's other mailbox goes on.

Each test compares what the provider shows (the mailbox's inbox as the mock stores it) with
what the runs recorded (one claimed occurrence per message, clean reconciliations) and
reports both."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import stamina

from agent.domain.context import ApiAccess
from agent.domain.execution import ClaimOutcome
from agent.domain.mail import ChangePage
from agent.domain.secrets import Secret
from agent.ports import EmbeddedStore, MailProvider
from agent.providers import gmail_api, msgraph
from agent.providers.api_http import oauth_api_client
from agent.services import intake, workspaces
from agent.testing import FrozenClock
from agent.testing.contexts import context_yaml
from agent.testing.faults import Passthrough
from agent.testing.providers import raw_message
from fixtures.admin import MockAdmin
from tests.conftest import session_mock
from tests.services import coverage

KINDS = ("google", "microsoft")
ENDPOINTS = {
    "google": ("/gmail/v1", "/oauth2/google/token"),
    "microsoft": ("/graph/v1.0", "/oauth2/microsoft/common/oauth2/v2.0/token"),
}


class Interrupting(Passthrough):
    """A channel with something done to the provider after each page it read."""

    def __init__(self, inner: MailProvider, after_page: Callable[[int], None]) -> None:
        super().__init__(inner)
        self._after_page = after_page
        self._pages = 0

    async def changes(self, cursor: str | None) -> ChangePage:
        page = await super().changes(cursor)
        self._pages += 1
        self._after_page(self._pages)
        return page


class Mailbox:
    """One mock account of ``kind``, and the messages delivered to it."""

    def __init__(self, admin: MockAdmin, kind: str) -> None:
        self.admin, self.kind = admin, kind
        self.address = f"coverage-{uuid.uuid4().hex[:10]}@fabrikam.test"
        account = admin.account(self.address, kind)
        self.secrets = {
            "oauth_client_id": account["client_id"],
            "oauth_client_secret": account["client_secret"],
            "oauth_refresh_token": account["refresh_token"],
        }
        self.delivered = 0

    def deliver(self, count: int) -> None:
        for _ in range(count):
            self.admin.deliver(self.address, raw_message(1000 + self.delivered))
            self.delivered += 1

    def shown(self) -> list[str]:
        return [m["id"] for m in self.admin.stored(self.address, "inbox")]

    def channel(
        self, after_page: Callable[[int], None] = lambda _: None, page_size: int = 4
    ) -> MailProvider:
        base, token = ENDPOINTS[self.kind]
        access = ApiAccess(
            base_url=self.admin.base_url + base, token_url=self.admin.base_url + token
        )
        module = gmail_api if self.kind == "google" else msgraph
        client = oauth_api_client(
            access,
            self.address,
            base_url=access.base_url or "",
            token_url=access.token_url or "",
            read_error=module.read_error,
            read=lambda name: Secret(self.secrets[name]),
            write=lambda name, value: self.secrets.__setitem__(name, value.reveal()),
            reconnect=f"outloop connect --workspace ws-api-0001 --mailbox {self.address}",
        )
        provider_class = (
            gmail_api.GmailApiProvider if self.kind == "google" else msgraph.GraphMailProvider
        )
        return Interrupting(provider_class(client, self.address, page_size=page_size), after_page)


@pytest.fixture
def admin() -> Iterator[MockAdmin]:
    mock = session_mock()
    yield mock
    mock.clear_faults()


@pytest.fixture(params=KINDS)
def box(request: pytest.FixtureRequest, admin: MockAdmin) -> Mailbox:
    return Mailbox(admin, str(request.param))


@pytest.fixture
def workspace(
    station_store: EmbeddedStore, data_dir: workspaces.DataDir, box: Mailbox, tmp_path: Path
) -> str:
    text = context_yaml("ws-api-0001", mailbox=box.address, provider=box.kind)
    source = tmp_path / "context.yaml"
    source.write_text(text, encoding="utf-8")
    return workspaces.add_workspace(
        station_store, data_dir, source, FrozenClock().now()
    ).workspace_id


def _check(name: str, box: Mailbox, results: list[intake.RunResult], gaps: int = 0) -> None:
    coverage.check(
        f"{box.kind} intake coverage {name}",
        box.shown(),
        box.delivered,
        results,
        gaps,
        shows="provider_shows",
    )


@pytest.mark.anyio
async def test_mail_arriving_between_pages_of_a_scan_is_recorded_exactly_once(
    station_store: EmbeddedStore, data_dir: workspaces.DataDir, workspace: str, box: Mailbox
) -> None:
    box.deliver(9)
    arriving = box.channel(after_page=lambda n: box.deliver(2) if n <= 3 else None)
    results = await coverage.runs(station_store, data_dir, workspace, [arriving, box.channel()])
    _check("mail arriving mid-scan", box, results)


@pytest.mark.anyio
@pytest.mark.parametrize("box", ["google"], indirect=True)  # Gmail's history expires
async def test_history_expired_mid_scan_and_between_runs_is_recorded_exactly_once(
    station_store: EmbeddedStore,
    data_dir: workspaces.DataDir,
    workspace: str,
    box: Mailbox,
    admin: MockAdmin,
) -> None:
    box.deliver(6)
    first = await coverage.runs(station_store, data_dir, workspace, [box.channel()])
    box.deliver(6)

    def expire(page: int) -> None:
        if page == 1:
            admin.faults(expire_history=box.address)
            box.deliver(2)

    results = first + await coverage.runs(
        station_store, data_dir, workspace, [box.channel(after_page=expire)]
    )
    admin.faults(expire_history=box.address)
    box.deliver(3)
    results += await coverage.runs(station_store, data_dir, workspace, [box.channel()])
    _check("history expired mid-scan and between runs", box, results)


@pytest.mark.anyio
@pytest.mark.parametrize("status", [429, 503])
async def test_a_storm_of_throttling_and_unavailable_answers_loses_and_doubles_nothing(
    station_store: EmbeddedStore,
    data_dir: workspaces.DataDir,
    workspace: str,
    box: Mailbox,
    admin: MockAdmin,
    status: int,
) -> None:
    box.deliver(12)
    prefix = "/gmail" if box.kind == "google" else "/graph"
    storm = [{"status": status, "count": 9, "retry_after": 0, "path_prefix": prefix}]
    stamina.set_testing(True, attempts=4)  # the waits the provider names are honoured (0 s)
    met: list[int] = []
    try:
        results: list[intake.RunResult] = []
        for _ in range(2):  # a storm over each of two runs
            admin.faults(errors=storm)
            results += await coverage.runs(station_store, data_dir, workspace, [box.channel()])
            met.append(9 - int(admin.call("GET", "/_admin/faults")["errors"][0]["count"]))
        admin.faults(errors=[])
        # Whatever the storms left unread, the next run reads, once.
        results += await coverage.runs(station_store, data_dir, workspace, [box.channel()])
    finally:
        stamina.set_testing(True, attempts=1)
    gaps = sum(len(r.access_errors) for r in results)
    assert met[0] > 0, "the storm was met"
    _check(f"{status} storm", box, results, gaps=gaps)
    assert gaps <= 2


@pytest.mark.anyio
async def test_a_revoked_refresh_token_is_a_named_access_gap_and_the_other_mailbox_goes_on(
    station_store: EmbeddedStore,
    data_dir: workspaces.DataDir,
    box: Mailbox,
    admin: MockAdmin,
    tmp_path: Path,
) -> None:
    other = Mailbox(admin, box.kind)
    text = (
        context_yaml("ws-api-0002", mailbox=box.address, provider=box.kind)
        .replace(
            f"  - {{mailbox_id: {box.address}, provider: {box.kind}}}",
            f"  - {{mailbox_id: {box.address}, provider: {box.kind}}}\n"
            f"  - {{mailbox_id: {other.address}, provider: {box.kind}}}",
        )
        .replace(f"mailboxes: [{box.address}]", f"mailboxes: [{box.address}, {other.address}]")
    )
    assert other.address in text
    source = tmp_path / "context.yaml"
    source.write_text(text, encoding="utf-8")
    workspace = workspaces.add_workspace(
        station_store, data_dir, source, FrozenClock().now()
    ).workspace_id
    box.deliver(3)
    other.deliver(2)
    admin.faults(revoke_tokens=box.address)
    revoked = box.channel()
    going_on = other.channel()
    channels = {box.address: revoked, other.address: going_on}
    result = await intake.run_cycle(
        store=station_store,
        data_dir=data_dir,
        workspace_id=workspace,
        provider_for=lambda _w, binding: channels[binding.mailbox_id],
        clock=FrozenClock(),
    )
    await revoked.aclose()
    await going_on.aclose()
    [gap] = result.access_errors
    assert box.address in gap and "outloop connect --workspace ws-api-0001" in gap
    for value in box.secrets.values():
        assert value not in gap
    health = " ".join(h.detail for h in station_store.list_health())
    assert "refresh token was refused" in health
    claimed = [i for i in result.items if i.claim is ClaimOutcome.CLAIMED]
    assert len(claimed) == 2, "the other mailbox's mail was claimed"
    assert result.reconciliation is not None and result.reconciliation.clean
