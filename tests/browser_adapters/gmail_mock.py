"""A Google mailbox of a mock server of the module's own, reached through Gmail on the web
in headless Chromium: what the Gmail web adapter's tests share."""

from __future__ import annotations

from collections.abc import Callable
from typing import ClassVar

from browser_adapters.gmail import GmailWeb
from browser_adapters.session import Browsers, MailboxBrowser
from managed_login.flow import WorkerSignIn
from tests.browser_adapters.outlook_mock import OutlookAccount

APP = "/web/gmail/mail/u/0/"


class GmailAccount(OutlookAccount):
    """One Google account of the mock, and adapters reaching it through Gmail on the web."""

    PROVIDER: ClassVar[str] = "google"

    def build(  # pyright: ignore[reportIncompatibleMethodOverride]
        self, *, page_size: int = 3, worker: Callable[[], WorkerSignIn] | None = None
    ) -> GmailWeb:
        browsers = Browsers(self.settings())
        self.browsers.append(browsers)
        return GmailWeb(
            MailboxBrowser(browsers, "ws-test", self.address),
            self.address,
            self.admin.base_url + APP,
            worker or self.worker,
            workspace_id="ws-test",
            page_size=page_size,
        )
