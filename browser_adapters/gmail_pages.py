"""Gmail's page objects: every locator the Gmail web adapter uses, by role and accessible
name as the app shows them to a screen reader (the thread and message ids are Gmail's own
``data-`` attributes)."""

from __future__ import annotations

import re

from playwright.async_api import Locator, Page

TITLES = {"inbox": "Inbox", "sent": "Sent Mail", "drafts": "Drafts"}
"""Each list's name (its grid's accessible name)."""
EMPTY = re.compile(
    r"^(No conversations in .*\.|You don't have any saved drafts\.|No messages matched .*)$"
)
SEND = "Send (Ctrl-Enter)"


class GmailPage:
    """Gmail's one page: the account button, the lists, a conversation, Settings."""

    def __init__(self, page: Page) -> None:
        self.page = page
        self.main = page.get_by_role("main")
        self.account = page.get_by_role("button", name=re.compile(r"^Google Account: "))
        self.compose = page.get_by_role("button", name="Compose", exact=True)
        self.empty = self.main.get_by_text(EMPTY)
        self.messages = self.main.get_by_role("listitem").and_(
            self.main.locator("[data-legacy-message-id]")
        )
        self.saved = page.get_by_role("status").get_by_text(
            "Your changes have been saved.", exact=True
        )
        self.save_settings = page.get_by_role("button", name="Save Changes", exact=True)
        self.older_disabled = self.main.get_by_role("button", name="Older", disabled=True)

    def rows(self, folder: str) -> Locator:
        """The rows of a list (``inbox``, ``sent``, ``drafts``), newest first."""
        return self.main.get_by_role("grid", name=TITLES[folder]).get_by_role("row")

    def heading(self, thread_number: int) -> Locator:
        """A conversation's subject heading, for the thread (``thread-f:<decimal>``)."""
        return self.main.get_by_role("heading", level=2).and_(
            self.main.locator(f'[data-thread-perm-id="thread-f:{thread_number}"]')
        )

    def message(self, message_id: str) -> Locator:
        """A message of the open conversation, by its id (the API's)."""
        return self.messages.and_(self.main.locator(f'[data-legacy-message-id="{message_id}"]'))

    def reply(self, message: Locator) -> Locator:
        return message.get_by_role("button", name="Reply", exact=True)

    def choice(self, group: str, name: str) -> Locator:
        """A radio button of a Settings group ("Mark conversation as read:")."""
        return self.page.get_by_role("radiogroup", name=group).get_by_role(
            "radio", name=name, exact=True
        )


class OriginalPage:
    """ "Show original": the message's headers Gmail sums up and its exact bytes."""

    def __init__(self, page: Page) -> None:
        self.page = page
        self.title = page.get_by_role("heading", name="Original Message", exact=True)
        self.download = page.get_by_role("link", name="Download Original", exact=True)
        self.missing = page.get_by_text("Message not found.", exact=True)


class GmailComposer:
    """A composer: the "Reply" under a conversation, or a "New Message" or saved draft's
    window."""

    def __init__(self, root: Locator) -> None:
        self.root = root
        self.to = root.get_by_role("combobox", name="To recipients", exact=True)
        self.cc = root.get_by_role("combobox", name="Cc recipients", exact=True)
        self.to_chips = root.get_by_role("list", name="To recipients list").get_by_role("listitem")
        self.cc_chips = root.get_by_role("list", name="Cc recipients list").get_by_role("listitem")
        self.subject = root.get_by_role("textbox", name="Subject", exact=True)
        self.body = root.get_by_role("textbox", name="Message Body", exact=True)
        self.send = root.get_by_role("button", name=SEND, exact=True)
        self.discard = root.get_by_role("button", name="Discard draft", exact=True)
        self.status = root.get_by_role("status")
        self.attach = root.locator("input[type=file]")
        self.attached = root.get_by_role("list", name="Attachments").get_by_role("listitem")

    @classmethod
    def reply(cls, page: Page) -> GmailComposer:
        return cls(page.get_by_role("main").get_by_role("region", name="Reply", exact=True))

    @classmethod
    def window(cls, page: Page) -> GmailComposer:
        """The composer window open on the page (Compose, or a saved draft): the dialog
        with a message body."""
        body = page.get_by_role("textbox", name="Message Body", exact=True)
        return cls(page.get_by_role("dialog").filter(has=body))

    def chips(self, field: str) -> Locator:
        return self.to_chips if field == "to" else self.cc_chips

    def field(self, name: str) -> Locator:
        return self.to if name == "to" else self.cc

    def remove(self, address: str) -> Locator:
        return self.root.get_by_role("button", name=f"Remove {address}", exact=True)
