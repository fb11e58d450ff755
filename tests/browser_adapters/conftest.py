"""What the Outlook on the web tests share: each module's own mock server (the account is
its ``MAILBOX``, reset for every test) and the account's adapters, closed after the test."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from tests.browser_adapters.outlook_mock import OutlookAccount, WebClock
from tests.providers.private_mock import PrivateMock


@pytest.fixture(scope="module")
def private_mock(request: pytest.FixtureRequest) -> Iterator[PrivateMock]:
    mock = PrivateMock(request.module.__name__.rpartition(".")[2])
    yield mock
    mock.stop()


@pytest.fixture
async def account(
    private_mock: PrivateMock, tmp_path: Path, request: pytest.FixtureRequest, anyio_backend: str
) -> AsyncIterator[OutlookAccount]:
    """The module's ``MAILBOX`` as a Microsoft account of its mock, with nothing in it."""
    del anyio_backend
    admin = private_mock.admin()
    admin.reset()
    mailbox: str = request.module.MAILBOX
    found = OutlookAccount(admin, mailbox, tmp_path / "browser", WebClock(admin))
    yield found
    await found.aclose()
