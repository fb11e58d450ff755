"""The provider MCP channel (``agent.providers.provider_mcp``) against the fixture mail MCP
server of the ms365 dialect (``fixtures/mail_mcp_ms365.py``, Softeria's ms-365-mcp-server
tool shapes over the mock Graph): the MailProvider contract and the lifecycle core through
it together with the Graph API channel of the same mailbox (so a message read through
either is one occurrence, and a send through one is settled through the other), and what
only this channel shows - the server's own tool names mapped, a server that lacks a tool or
cannot be started, tool results that are not what they claim, the stdio transport.

The contract suites run on a mock server of this module's own, reset before each test (the
contract's mailbox is the account itself); the other tests use the session's server with an
account of their own."""

from __future__ import annotations

import hashlib
import json
import sys
import uuid
from collections.abc import AsyncIterator, Iterator, Mapping
from datetime import timedelta
from typing import Any, ClassVar

import pytest

from agent.domain.context import ApiAccess, MailboxBinding, ProviderMcpAccess
from agent.domain.envelope import Address
from agent.domain.errors import NotHandedOver, ProviderError, TransientFailure, Unsupported
from agent.domain.mail import Channel, Handover, MarkerKind, OutgoingMessage
from agent.domain.secrets import Secret
from agent.ports import MailProvider
from agent.providers.api_http import oauth_api_client
from agent.providers.msgraph import BASE_URL, GraphMailProvider, read_error, token_url
from agent.providers.provider_mcp import McpServer, ProviderMcpProvider, open_provider_mcp
from agent.providers.shapes import GraphDraft
from agent.testing.channel_contract import ChannelLifecycleContract
from agent.testing.providers import (
    MAILBOX,
    Fault,
    MailboxHooks,
    MailProviderContract,
    envelopes,
    raw_message,
    read_all,
)
from fixtures.admin import MockAdmin
from tests.conftest import session_mock
from tests.providers.private_mock import PrivateMock

LATENCY = timedelta(seconds=60)
TOKEN_PATH = "/oauth2/microsoft/common/oauth2/v2.0/token"
ENDPOINT = "/mcp/ms365/mcp"


def _immutable(rest_id: str) -> str:
    """The mock's immutable id of a message a REST id names (Graph's default ids, which
    the ms365 tools use, change when a message moves; the mock's insert a folder tag)."""
    return rest_id[:-6] + rest_id[-4:]


class McpAccount:
    """One Microsoft account of a mock server, its secrets in a vault of its own, reached
    through the fixture MCP server and through the Graph API."""

    def __init__(self, admin: MockAdmin, address: str) -> None:
        self.admin = admin
        self.address = address.lower()
        made = admin.account(self.address, provider="microsoft")
        self.vault = {
            "oauth_client_id": made["client_id"],
            "oauth_client_secret": made["client_secret"],
            "oauth_refresh_token": made["refresh_token"],
            "mcp_token": made["access_token"],
        }
        self.drafts: dict[str, list[str]] = {}
        """The drafts made for each of our Message-IDs, by their immutable ids."""

    def read(self, name: str) -> Secret:
        return Secret(self.vault[name])

    def write(self, name: str, value: Secret) -> None:
        self.vault[name] = value.reveal()

    def access(self, **fields: Any) -> ProviderMcpAccess:
        return ProviderMcpAccess(
            url=self.admin.base_url + ENDPOINT, token="mcp_token", timeout_seconds=20, **fields
        )

    def mcp(self, *, page_size: int = 3, **fields: Any) -> ProviderMcpProvider:
        access = self.access(**fields)
        return _RecordingMcp(
            self.drafts,
            McpServer(access, self.address, self.read),
            self.address,
            tools=access.tools,
            sent_copy_latency=LATENCY,
            timeout=20,
            page_size=page_size,
        )

    def api(self, *, page_size: int = 3) -> GraphMailProvider:
        api = oauth_api_client(
            ApiAccess(
                base_url=self.admin.base_url + "/graph/v1.0",
                token_url=self.admin.base_url + TOKEN_PATH,
                timeout_seconds=20,
            ),
            self.address,
            base_url=BASE_URL,
            token_url=token_url("common"),
            read_error=read_error,
            read=self.read,
            write=self.write,
            reconnect="outloop connect",
        )
        return _RecordingApi(
            self.drafts, api, self.address, sent_copy_latency=LATENCY, page_size=page_size
        )

    def deliver(self, raw: bytes) -> dict[str, Any]:
        return self.admin.deliver(self.address, raw)

    def stored(self, folder: str | None = None) -> list[dict[str, Any]]:
        return self.admin.stored(self.address, folder)

    def snapshot(self) -> dict[str, str]:
        return {
            f"{m['folder']}/{m['id']}": hashlib.sha256(
                json.dumps([m["categories"], m["is_read"], m["raw_base64"]]).encode()
            ).hexdigest()
            for m in self.stored()
        }

    def sent_copies(self, message_id: str) -> int:
        drafts = set(self.drafts.get(message_id, []))
        filed = sum(1 for m in self.stored("sent") if m["id"] in drafts)
        pending = self.admin.call("GET", "/_admin/faults")["delayed"]
        return filed + sum(1 for p in pending if p["id"] in drafts)


class _RecordingMcp(ProviderMcpProvider):
    def __init__(self, drafts: dict[str, list[str]], *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._drafts = drafts

    async def _draft_for(self, message: OutgoingMessage, handover: Handover) -> GraphDraft:
        draft = await super()._draft_for(message, handover)
        self._drafts.setdefault(message.internet_message_id, []).append(_immutable(draft.id))
        return draft


class _RecordingApi(GraphMailProvider):
    def __init__(self, drafts: dict[str, list[str]], *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._drafts = drafts

    async def _draft_for(self, message: OutgoingMessage, handover: Handover) -> GraphDraft:
        draft = await super()._draft_for(message, handover)
        self._drafts.setdefault(message.internet_message_id, []).append(draft.id)
        return draft


_private = PrivateMock("provider-mcp")


@pytest.fixture(scope="module", autouse=True)
def _stop_private_mock() -> Iterator[None]:
    yield
    _private.stop()


class OnMcpMock(MailboxHooks):
    """The contract's mailbox as a Microsoft account of this module's mock server, through
    the provider MCP server first and the Graph API second."""

    faults: ClassVar[frozenset[Fault]] = frozenset({Fault.LOST_ACK, Fault.LATE_SENT_COPY})
    cannot: ClassVar[Mapping[Fault, str]] = {
        Fault.EXPIRED_CURSOR: "the channel reads Graph's receivedDateTime order through the "
        "listing tool, and a position in time never expires",
        Fault.NO_SENT_COPY: "a draft sent with send-draft-message is filed in Sent Items as "
        "Graph documents",
        Fault.DROPPED_MESSAGE_ID: "the draft is given our Message-ID as its internetMessageId "
        "through create-reply-draft and update-mail-message, and Graph keeps it",
    }
    channels: ClassVar[tuple[str, ...]] = ("provider_mcp", "api")
    account: McpAccount
    built: list[MailProvider]

    def setup_mailbox(self) -> None:
        admin = _private.admin()
        admin.reset()
        self.account = McpAccount(admin, MAILBOX)
        self.held_for = timedelta(0)

    @pytest.fixture(autouse=True)
    async def _close_channels(self, anyio_backend: str) -> AsyncIterator[None]:
        del anyio_backend
        self.built = []
        yield
        for provider in self.built:
            await provider.aclose()

    def build(
        self, *, channel: str | None = None, markers: tuple[MarkerKind, ...] | None = None
    ) -> MailProvider:
        del markers  # both channels mark copies by our Message-ID only
        provider: MailProvider = self.account.api() if channel == "api" else self.account.mcp()
        self.built.append(provider)
        return provider

    def deliver(self, raw: bytes) -> None:
        self.account.deliver(raw)

    def flip(self, fault: Fault) -> None:
        if fault is Fault.LOST_ACK:
            self.account.admin.faults(drop_send_ack=1)
        elif fault is Fault.LATE_SENT_COPY:
            self.account.admin.faults(delay_sent_copy_seconds=3600)
            self.held_for = timedelta(0)
        else:
            raise AssertionError(f"{fault} is declared impossible")

    def advance(self, delta: timedelta) -> None:
        self.held_for += delta
        if self.held_for >= LATENCY * 3 / 4:
            self.account.admin.faults(release_delayed=True)

    def snapshot(self) -> Mapping[str, str]:
        return self.account.snapshot()

    def sent_copies(self, message_id: str) -> int:
        return self.account.sent_copies(message_id)

    def context_fields(self) -> str:
        base = self.account.admin.base_url
        return (
            "channels: [api, provider_mcp], "
            f"api: {{base_url: '{base}/graph/v1.0', token_url: '{base}{TOKEN_PATH}'}}, "
            f"provider_mcp: {{url: '{base}{ENDPOINT}', token: mcp_token}}"
        )


class TestProviderMcp(OnMcpMock, MailProviderContract): ...


class TestCoreOnProviderMcp(OnMcpMock, ChannelLifecycleContract): ...


# -- what only this channel shows (the session's mock server, an account per test) ---------


class TestProviderMcpOnly:
    @pytest.fixture(autouse=True)
    def _account(self) -> Iterator[None]:
        self.admin = session_mock()
        self.account = McpAccount(self.admin, f"ops-{uuid.uuid4().hex[:12]}@fabrikam.test")
        yield
        self.admin.clear_faults()

    @pytest.fixture
    def anyio_backend(self) -> str:
        return "asyncio"

    def binding(self, **access: Any) -> MailboxBinding:
        return MailboxBinding(
            mailbox_id=self.account.address,
            provider="microsoft",
            channels=(Channel.PROVIDER_MCP,),
            provider_mcp=ProviderMcpAccess(**access),
        )

    @pytest.mark.anyio
    async def test_the_servers_own_tool_names_are_used_when_the_context_maps_them(self) -> None:
        renamed = self.account.mcp(tools={"mime": "no-such-mime-tool"})
        health = await renamed.health()
        assert health.ok  # health needs only the current user
        self.account.deliver(raw_message(1))
        with pytest.raises(
            Unsupported, match=r"offers no tool no-such-mime-tool.*provider_mcp\.tools"
        ):
            await renamed.changes(None)
        await renamed.aclose()

    @pytest.mark.anyio
    async def test_a_server_that_cannot_be_started_is_an_access_gap_and_a_send_is_not_handed_over(
        self,
    ) -> None:
        binding = self.binding(command=("/nonexistent/ms-365-mcp-server",))
        provider = open_provider_mcp(binding, read=self.account.read)
        health = await provider.health()
        assert not health.ok and "could not be reached" in health.detail
        with pytest.raises(TransientFailure, match="could not be reached"):
            await provider.changes(None)
        message = OutgoingMessage(
            provider_thread_id="",
            sender=Address(address=self.account.address),
            to=(Address(address="dana@contoso.test"),),
            subject="Your invoice",
            text="Attached.",
            internet_message_id="<ours-9@fabrikam.test>",
        )
        handover = Handover(
            message=message,
            channel="provider_mcp",
            recipients=(("to", ("dana@contoso.test",)), ("cc", ())),
        )
        with pytest.raises(NotHandedOver, match="nothing was handed over"):
            await provider.send(handover)
        await provider.aclose()

    @pytest.mark.anyio
    async def test_the_stdio_transport_reads_the_same_mailbox(self) -> None:
        self.account.deliver(raw_message(1))
        binding = self.binding(
            command=(
                sys.executable, "-m", "fixtures.mail_mcp", "--dialect", "ms365",
                "--api-base", self.admin.base_url,
            ),
            env={"MS365_MCP_OAUTH_TOKEN": "mcp_token"},
        )  # fmt: skip
        provider = open_provider_mcp(binding, read=self.account.read)
        items, _ = await read_all(provider)
        [envelope] = envelopes(items)
        assert envelope.internet_message_id == "<c1@contoso.test>"
        assert envelope.provider == "microsoft"
        health = await provider.health()
        assert health.ok and "provider MCP server" in health.detail
        await provider.aclose()

    @pytest.mark.anyio
    async def test_a_google_mailbox_is_not_reached_through_the_ms365_tools(self) -> None:
        binding = MailboxBinding(
            mailbox_id="ops@contoso.test",
            provider="google",
            channels=(Channel.PROVIDER_MCP,),
            provider_mcp=ProviderMcpAccess(url=self.admin.base_url + ENDPOINT),
        )
        with pytest.raises(Unsupported, match="reach a Microsoft mailbox"):
            open_provider_mcp(binding, read=self.account.read)

    @pytest.mark.anyio
    async def test_a_missing_server_is_a_missing_connector_named_in_the_error(self) -> None:
        binding = MailboxBinding(
            mailbox_id="ops@contoso.test", provider="microsoft", channels=(Channel.PROVIDER_MCP,)
        )
        with pytest.raises(ProviderError, match="no server is named"):
            open_provider_mcp(binding, read=self.account.read)
