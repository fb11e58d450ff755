"""A mailbox password fetched from the vault reaches no MCP result, error, log record or
file, even through a sign-in that logs around it and fails with it.

The password is the session's leak canary (tests/leak_canary.py): every result and error
here goes through the leak watch, every log record is scanned as it is emitted, and the
session's end scans every file these servers wrote.
"""

from __future__ import annotations

import hmac
import logging
from pathlib import Path

import pytest
from mcp import Client
from mcp.shared.exceptions import MCPError
from mcp.types import CallToolResult

from agent.domain.context import MailboxBinding
from agent.domain.errors import AuthenticationExpired
from agent.domain.secrets import REDACTED, CredentialRef
from agent.ports import Credentials, MailProvider
from agent.testing import FrozenClock
from mcp_server.composition import Settings
from mcp_server.server import build_server
from tests.leak_canary import LeakWatch, WatchedClient
from tests.mcp.conftest import CLIENT, MAILBOX, OperatorStation, station_context, submitting

pytestmark = pytest.mark.anyio

WORKSPACE = "ws-test-0001"
logger = logging.getLogger("tests.mcp.careless_sign_in")


class CarelessSignIn:
    """An adapter's sign-in as carelessly as it can be written short of unwrapping the
    secret outside the hand-over: it logs each secret (``%s`` and ``%r``), puts it in the
    error it raises, and logs that error with its traceback. The identity provider takes
    the value at the hand-over (``reveal()``), and accepts it or not."""

    def __init__(self, credentials: Credentials, *, accepts: bool) -> None:
        self.credentials = credentials
        self.accepts = accepts

    def __call__(self, workspace_id: str, binding: MailboxBinding) -> MailProvider:
        for name in binding.credentials:
            ref = CredentialRef(workspace_id=workspace_id, mailbox_id=binding.mailbox_id, name=name)
            secret = self.credentials.secret(ref)
            logger.debug("signing in %s with %s (%r)", ref, secret, secret)
            handed_over = secret.reveal().encode()  # the hand-over to the identity provider
            if not hmac.compare_digest(handed_over, handed_over if self.accepts else b""):
                try:
                    raise AuthenticationExpired(f"sign-in of {ref} with {secret} was refused")
                except AuthenticationExpired:
                    logger.exception("sign-in failed for %s using %s", ref, secret)
                    raise
        return submitting(workspace_id, binding)


def with_credentials(names: str) -> str:
    """The station's context, its mailbox naming these credentials."""
    return station_context(WORKSPACE).replace(
        "path: Maildir}", f"path: Maildir, credentials: [{names}]}}", 1
    )


@pytest.fixture
def operator(tmp_path: Path) -> OperatorStation:
    return OperatorStation(root=tmp_path / "station", clock=FrozenClock())


def watched(
    operator: OperatorStation, sign_in: CarelessSignIn, leak_watch: LeakWatch
) -> tuple[Client, LeakWatch]:
    server = build_server(
        Settings(data_dir=operator.data_dir), clock=operator.clock, providers=sign_in
    )
    return Client(server), leak_watch


async def test_a_refused_sign_in_is_an_access_gap_that_shows_no_password(
    operator: OperatorStation,
    canary_credentials: Credentials,
    leak_watch: LeakWatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    operator.register(with_credentials("password"))
    operator.deliver(sender=CLIENT)
    sign_in = CarelessSignIn(canary_credentials, accepts=False)
    client, watch = watched(operator, sign_in, leak_watch)
    caplog.set_level(logging.DEBUG, logger=logger.name)
    async with client:
        tools = WatchedClient(client, watch)
        scanned = await tools.call_tool("intake", {"mailbox_id": MAILBOX})
        access = await tools.call_tool("access_status", {"workspace_id": WORKSPACE})
    assert isinstance(scanned, CallToolResult) and scanned.structured_content
    [gap] = scanned.structured_content["access_errors"]
    assert f"{WORKSPACE}/{MAILBOX}/password" in gap and REDACTED in gap
    assert isinstance(access, CallToolResult) and access.structured_content
    [mailbox] = access.structured_content["mailboxes"]
    assert mailbox["ok"] is False and REDACTED in mailbox["detail"]
    # The sign-in did log the secret and its failure (redacted), with tracebacks.
    logged = [r for r in caplog.records if r.name == logger.name]
    assert {r.levelname for r in logged} == {"DEBUG", "ERROR"}
    assert all(REDACTED in r.getMessage() for r in logged)
    assert leak_watch.findings == []


async def test_a_secret_missing_from_the_vault_is_a_tool_error_naming_the_command(
    operator: OperatorStation, canary_credentials: Credentials, leak_watch: LeakWatch
) -> None:
    operator.register(with_credentials("password, totp"))
    sign_in = CarelessSignIn(canary_credentials, accepts=True)
    client, watch = watched(operator, sign_in, leak_watch)
    async with client:
        tools = WatchedClient(client, watch)
        try:
            result = await tools.call_tool("intake", {"mailbox_id": MAILBOX})
        except MCPError as error:
            text = error.message
        else:
            assert isinstance(result, CallToolResult) and result.is_error, result
            text = result.content[0].text  # type: ignore[union-attr]
    assert f"outloop vault set {WORKSPACE} {MAILBOX} totp" in text
    assert leak_watch.findings == []


async def test_an_accepted_sign_in_reads_the_mailbox_and_no_result_holds_the_password(
    operator: OperatorStation, canary_credentials: Credentials, leak_watch: LeakWatch
) -> None:
    operator.register(with_credentials("password"))
    operator.deliver(sender=CLIENT, subject="Quote request")
    sign_in = CarelessSignIn(canary_credentials, accepts=True)
    client, watch = watched(operator, sign_in, leak_watch)
    async with client:
        tools = WatchedClient(client, watch)
        scanned = await tools.call_tool("intake", {"mailbox_id": MAILBOX})
        assert isinstance(scanned, CallToolResult) and scanned.structured_content
        assert scanned.structured_content["access_errors"] == []
        [item] = scanned.structured_content["items"]
        await tools.call_tool("claim", {"run_id": item["run_id"], "item_ref": item["item_ref"]})
        await tools.call_tool("reconcile", {"run_id": item["run_id"]})
        access = await tools.call_tool("access_status", {"workspace_id": WORKSPACE})
    assert isinstance(access, CallToolResult) and access.structured_content
    assert access.structured_content["mailboxes"][0]["ok"] is True
    assert leak_watch.findings == []
