"""What the web app adapters' tests share: each module's own mock server (the account is
its ``MAILBOX``, reset for every test; a Microsoft one unless its ``ACCOUNT`` is
``GmailAccount``) and the account's adapters, closed after the test.

A module's tests start signed in from the session the test before left (one managed login
per module), unless the module is about signing in (``STARTS_SIGNED_OUT = True``)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from tests.browser_adapters.kept_sessions import KeptSessions
from tests.browser_adapters.outlook_mock import OutlookAccount, WebClock
from tests.providers.private_mock import PrivateMock


@pytest.fixture(scope="module")
def private_mock(request: pytest.FixtureRequest) -> Iterator[PrivateMock]:
    mock = PrivateMock(request.module.__name__.rpartition(".")[2])
    yield mock
    mock.stop()


@pytest.fixture(scope="module")
def kept_sessions() -> KeptSessions:
    return KeptSessions()


@pytest.fixture
async def account(
    private_mock: PrivateMock,
    kept_sessions: KeptSessions,
    tmp_path: Path,
    request: pytest.FixtureRequest,
    anyio_backend: str,
) -> AsyncIterator[OutlookAccount]:
    """The module's ``MAILBOX`` as a Microsoft account of its mock, with nothing in it."""
    del anyio_backend
    admin = private_mock.admin()
    signed_out = getattr(request.module, "STARTS_SIGNED_OUT", False)
    if signed_out:
        admin.reset()
    else:
        kept_sessions.reset(admin, tmp_path / "browser")
    mailbox: str = request.module.MAILBOX
    kind: type[OutlookAccount] = getattr(request.module, "ACCOUNT", OutlookAccount)
    found = kind(admin, mailbox, tmp_path / "browser", WebClock(admin))
    yield found
    await found.aclose()
    if not signed_out:
        kept_sessions.keep(found.state_dir)
