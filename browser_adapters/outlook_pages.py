"""Outlook on the web's page objects: every locator the adapter uses, by role and
accessible name as the app shows them to a screen reader (the item and conversation ids are
the app's own ``data-`` attributes and URLs)."""

from __future__ import annotations

import re

from playwright.async_api import Locator, Page

EDITOR = "Message body, press Alt+F10 to exit"


class MailPage:
    """A page of the mail app: the folder list, the message list and the reading pane."""

    def __init__(self, page: Page) -> None:
        self.page = page
        self.message_list = page.get_by_role("listbox", name="Message list")
        self.rows = self.message_list.get_by_role("option")
        self.empty = page.get_by_text("We didn't find anything to show here.", exact=True)
        self.account = page.get_by_role("button", name=re.compile(r"^Account manager for "))
        self.account_card = page.get_by_role("dialog", name="Account manager")
        self.reading = page.get_by_role("main", name="Reading Pane")
        self.items = self.reading.locator("[data-item-id]")
        self.shown_item = self.reading.locator("[data-item-id]:not(.collapsed)")
        self.more_actions = self.reading.get_by_role("menuitem", name="More actions")
        self.view_source = page.get_by_role("menuitem", name="View message source")
        self.source = page.get_by_role("dialog", name="Message source").locator("pre")
        self.reply = self.reading.get_by_role("menuitem", name="Reply", exact=True)
        self.search = page.get_by_role("searchbox", name="Search")
        self.new_mail = page.get_by_role("button", name="New mail", exact=True)


class Composer:
    """The composer of a new message, a reply or a draft."""

    def __init__(self, page: Page) -> None:
        root = page.get_by_role("region", name="Compose")
        self.root = root
        self.to = root.get_by_role("textbox", name="To", exact=True)
        self.cc = root.get_by_role("textbox", name="Cc", exact=True)
        self.to_chips = root.get_by_role("list", name="To recipients").get_by_role("listitem")
        self.cc_chips = root.get_by_role("list", name="Cc recipients").get_by_role("listitem")
        self.subject = root.get_by_role("textbox", name="Add a subject")
        self.body = root.get_by_role("textbox", name=EDITOR)
        self.send = root.get_by_role("button", name="Send", exact=True)
        self.discard = root.get_by_role("button", name="Discard", exact=True)
        self.status = root.get_by_role("status")
        self.attach = root.get_by_label("Attach file", exact=True).and_(
            root.locator("input[type=file]")
        )
        self.attached = root.get_by_role("list", name="Attachments").get_by_role("listitem")

    def chips(self, field: str) -> Locator:
        return self.to_chips if field == "to" else self.cc_chips

    def field(self, name: str) -> Locator:
        return self.to if name == "to" else self.cc

    def remove(self, address: str) -> Locator:
        return self.root.get_by_role("button", name=f"Remove {address}", exact=True)
