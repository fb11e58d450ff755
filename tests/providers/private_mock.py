"""A test module's own mock provider server, for the contract suites: they need the
contract's mailbox (``agent.testing.providers.MAILBOX``) as the account itself, which the
session's shared server can hold only once, so each test resets this one."""

from __future__ import annotations

import tempfile
from pathlib import Path

from fixtures.admin import MockAdmin, MockServer


class PrivateMock:
    """Started on first use; the module's fixture stops it when the module ends."""

    def __init__(self, name: str) -> None:
        self._name = name
        self._server: MockServer | None = None

    def admin(self) -> MockAdmin:
        if self._server is None:
            log = Path(tempfile.mkdtemp(prefix=f"outloop-{self._name}-mock-")) / "log"
            self._server = MockServer(log)
            self._server.start()
        assert self._server.admin is not None
        return self._server.admin

    def stop(self) -> None:
        if self._server is not None:
            self._server.stop()
            self._server = None
