"""A Google mailbox of a mock server of the module's own, reached through Gmail on the web
in headless Chromium: what the Gmail web adapter's tests share."""

from __future__ import annotations

from typing import ClassVar

from browser_adapters.gmail import GmailWeb
from browser_adapters.webmail import WebMail
from tests.browser_adapters.outlook_mock import OutlookAccount

APP = "/web/gmail/mail/u/0/"


class GmailAccount(OutlookAccount):
    """One Google account of the mock, and adapters reaching it through Gmail on the web."""

    PROVIDER: ClassVar[str] = "google"
    CHANNEL: ClassVar[type[WebMail]] = GmailWeb
    APP_PATH: ClassVar[str] = APP
