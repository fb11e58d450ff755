"""Outlook on the web as a channel of a Microsoft mailbox (the ``browser`` channel).

It is the same mailbox Graph reaches, keyed the same way: a message by its Message-ID and
header fields (read from "View message source"), its thread by the conversation id every
channel shows (the message list's ``data-convid``, Graph's ``conversationId``). The web
app's item ids (REST ids in the URL) are this channel's provider ids only.

- Reading: the inbox's message list, one row per conversation, newest first; a
  conversation whose row changed since the cursor is opened, and each of its inbox items
  not read yet is read through its message source. The cursor keeps each read
  conversation's row and each read item (digests only).
- Opening an item marks it read unless the mailbox's "Mark as read" option says "Don't
  automatically mark items as read": the adapter sets that option once, before it opens
  anything (it changes no message).
- Sending: Reply on the parent, the recipient chips replaced with the plan's and checked
  against it before Send, the subject set, the rendered HTML inserted as HTML (never
  typed), Send pressed once. Our copy is marked by the send's body token and found in
  Sent Items through the app's search. Outlook appends the original below its
  ``appendonsend`` mark: the read-back is of what we wrote above it.
- Signed out (at the start, or in the middle of anything): managed login in a context of
  its own, the account re-verified before anything is read, then the step again.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, urlsplit

from playwright.async_api import Error as PlaywrightError
from playwright.async_api import Locator, Page

from agent.domain.context import MailboxBinding
from agent.domain.errors import (
    NotFound,
    ProviderError,
    TransientFailure,
    Unsupported,
)
from agent.domain.mail import (
    ChangePage,
    Marker,
    MarkerKind,
    OutgoingMessage,
    ScannedMessage,
    StoredCopy,
)
from agent.domain.secrets import Secret
from agent.providers import rfc822
from browser_adapters.outlook_pages import Composer, MailPage
from browser_adapters.session import Browsers
from browser_adapters.webmail import (
    ChallengeKeeper,
    Cursor,
    WebMail,
    carries,
    digest,
    goto,
    open_web_app,
    send_answer,
    stored_copy,
)
from managed_login.microsoft import MicrosoftLogin

PROVIDER = "microsoft"
CURSOR_PREFIX = "owa1."
MARKER_PREFIX = "owa-sent:"
LARGEST = 25 * 1024 * 1024
SENT_SCAN = 50
"""The most conversations of Sent Items a search for a copy reads (past them, a copy not
found is not proven absent)."""
SENT_ROWS = 512
"""Sent Items rows whose items a channel instance remembers (newest read kept)."""
REPLY_MARK = re.compile(r'<div id="appendonsend"></div>.*', re.S | re.I)
QUOTE_RULE = "\n" + "_" * 32
"""The line Outlook's plain text puts above the original it answers."""
MARK_AS_READ_OFF = "Don't automatically mark items as read"


@dataclass(frozen=True)
class _Item:
    rest_id: str
    folder: str
    conversation: str


class OutlookWeb(WebMail):
    """One Microsoft mailbox through Outlook on the web (implements ``MailProvider``)."""

    PROVIDER = PROVIDER
    APP = "Outlook on the web"
    LOGIN = MicrosoftLogin
    HOME = "inbox"
    SEARCHES = (MarkerKind.MESSAGE_ID,)
    MARKER_PREFIX = MARKER_PREFIX
    CLASS_PREFIXES = "x_"

    def _setup(self) -> None:
        self._mark_as_read_checked = False
        self._by_message_id: dict[str, _Item] = {}
        self._read_items: set[str] = set()
        self._sent_rows: dict[tuple[str, str, str], list[_Item]] = {}
        """Sent Items rows as read (conversation, name, link) and their sent items."""

    def _arrived(self, page: Page) -> Locator:
        return MailPage(page).account

    async def _signed_in_as(self, page: Page) -> str:
        shown = MailPage(page)
        await shown.account.click()
        card = await shown.account_card.inner_text()
        await page.keyboard.press("Escape")
        return card

    async def _open(self, path: str) -> MailPage:
        """The app's page at ``path`` (relative to the mail app), signed in."""
        return MailPage(await self._open_page(path))

    async def _no_mark_as_read(self) -> None:
        """Opening an item must not mark it read: the option is set once, before anything
        is opened (the app's own setting; no message changes)."""
        if self._mark_as_read_checked:
            return
        page = (await self._open("options/mail/messageHandling")).page
        option = page.get_by_role("radio", name=MARK_AS_READ_OFF)
        if not await option.is_checked():
            await option.check()
            await page.get_by_role("button", name="Save").click()
            await page.get_by_role("radio", name=MARK_AS_READ_OFF, checked=True).wait_for()
        self._mark_as_read_checked = True

    # -- reading -------------------------------------------------------------------------

    async def _changes(self, cursor: str | None) -> ChangePage:
        state = (
            Cursor(CURSOR_PREFIX)
            if cursor is None
            else Cursor.decode(CURSOR_PREFIX, cursor, self.APP)
        )
        await self._no_mark_as_read()
        rows = await self._rows("inbox")
        found: list[ScannedMessage] = []
        for conversation, label, href in reversed(rows):
            if state.rows.get(digest(conversation)) == digest(label):
                continue
            for item in await self._conversation(conversation, href):
                if item.folder != "inbox" or digest(item.rest_id) in state.seen:
                    continue
                if len(found) == self.capabilities_.page_size:
                    return ChangePage(items=tuple(found), cursor=state.encode(), more=True)
                found.append(await self._scanned(item))
                state.seen.add(digest(item.rest_id))
            state.rows[digest(conversation)] = digest(label)
        return ChangePage(items=tuple(found), cursor=state.encode(), more=False)

    async def _rows(self, folder: str) -> list[tuple[str, str, str]]:
        """The folder's conversation rows as the list shows them, newest first (once it shows
        a row, or says the folder is empty)."""
        shown = await self._open(folder)
        await shown.rows.first.or_(shown.empty).wait_for()
        return await _row_values(shown)

    async def _sent_of(self, row: tuple[str, str, str]) -> list[_Item]:
        """A Sent Items row's sent items, newest first: read again only when the row changed
        (its name and link name the conversation's newest sent item)."""
        found = self._sent_rows.pop(row, None)
        if found is None:
            conversation, _, href = row
            items = reversed(await self._conversation(conversation, href))
            found = [item for item in items if item.folder == "sentitems"]
        self._sent_rows[row] = found
        while len(self._sent_rows) > SENT_ROWS:
            del self._sent_rows[next(iter(self._sent_rows))]
        return found

    async def _listed_whole(self, folder: str, count: int) -> bool:
        """Whether the folder's list holds no more than the ``count`` rows read (fewer than
        ``SENT_SCAN``): it says the folder is empty, or scrolling to its last row draws no
        other. A list drawn as it scrolls could hide rows from a plain read."""
        if count >= SENT_SCAN:
            return False
        shown = await self._open(folder)
        await shown.rows.first.or_(shown.empty).wait_for()
        if count == 0:
            return await shown.empty.is_visible()
        while count < SENT_SCAN:
            await shown.rows.last.scroll_into_view_if_needed()
            drawn = await shown.rows.count()
            if drawn == count:
                return True
            count = drawn
        return False

    async def _conversation(self, conversation: str, href: str) -> list[_Item]:
        """The items of a conversation, oldest first, with the folder each is in."""
        await self._no_mark_as_read()  # its page opens its newest item
        page = await self._working_page()
        self._showing = None
        await goto(page, urlsplit(page.url)._replace(path=href, query="").geturl())
        shown = MailPage(page)
        await shown.reading.wait_for()
        here = urlsplit(page.url).path
        found: list[list[str]] = await shown.items.evaluate_all(
            "els => els.map(e => [e.dataset.itemId || '', e.dataset.href || '',"
            " e.classList.contains('collapsed') ? '' : 'open'])"
        )
        opened = [item_id for item_id, _, state in found if state]
        self._showing = opened[0] if len(opened) == 1 else None
        return [
            _Item(item_id, _folder_of(link or here), conversation) for item_id, link, _ in found
        ]

    async def _scanned(self, item: _Item) -> ScannedMessage:
        scanned = self._scan(await self._source(item.rest_id), item.rest_id, item.conversation)
        self._read_items.add(item.rest_id)
        if scanned.envelope is not None and scanned.envelope.internet_message_id is not None:
            self._by_message_id[scanned.envelope.internet_message_id] = item
        return scanned

    async def _show(self, rest_id: str) -> MailPage:
        """The item's page, or ``NotFound`` when the app does not show it (the page of the
        conversation this operation just opened, when it shows the item open)."""
        await self._no_mark_as_read()
        if self._showing == rest_id:
            return MailPage(await self._working_page())
        shown = await self._open("id/" + quote(rest_id, safe=""))
        if "/id/" not in urlsplit(shown.page.url).path:  # the app went home: no such item
            raise NotFound(f"mailbox {self._mailbox_id} shows no item {rest_id!r}")
        try:
            await shown.shown_item.wait_for(timeout=self._browser.timeout_ms)
        except PlaywrightError:
            raise NotFound(f"mailbox {self._mailbox_id} shows no item {rest_id!r}") from None
        if await shown.shown_item.get_attribute("data-item-id") != rest_id:
            raise NotFound(f"mailbox {self._mailbox_id} shows no item {rest_id!r}")
        return shown

    async def _source(self, ref: str) -> bytes:
        shown = await self._show(ref)
        await shown.more_actions.click()
        await shown.view_source.click()
        await shown.source.wait_for()
        text = await shown.source.inner_text()
        await shown.page.keyboard.press("Escape")
        return text.replace("\r\n", "\n").replace("\n", "\r\n").encode("utf-8", "surrogateescape")

    async def _parent_thread(self, message: OutgoingMessage) -> str:
        return (await self._parent(message)).conversation

    async def _draft_links(self) -> list[str]:
        return [href for _, _, href in await self._rows("drafts")]

    async def _parent(self, message: OutgoingMessage) -> _Item:
        """The item the reply answers, by its Message-ID: known from this channel's
        reading, else looked for conversation by conversation, newest first - the Inbox's,
        then Sent Items' (a reminder answers our own message)."""
        wanted = message.in_reply_to
        assert wanted is not None
        for folder in ("inbox", "sentitems"):
            if wanted in self._by_message_id:
                break
            for conversation, _, href in await self._rows(folder):
                for item in await self._conversation(conversation, href):
                    await self._index(item)
                if wanted in self._by_message_id:
                    break
        if wanted not in self._by_message_id:
            raise ProviderError(f"the message {wanted} answered is not in the mailbox")
        return self._by_message_id[wanted]

    async def _index(self, item: _Item) -> None:
        """Learn an item's Message-ID (an inbox item is read as intake reads it)."""
        if item.rest_id in self._read_items or item.folder not in ("inbox", "sentitems"):
            return
        if item.folder == "inbox":
            await self._scanned(item)
            return
        message_id = await self._message_id_of(item.rest_id)
        if message_id is not None:
            self._read_items.add(item.rest_id)
            self._by_message_id[message_id] = item

    async def _open_draft(self, href: str) -> Composer:
        page = await self._working_page()
        await goto(page, urlsplit(page.url)._replace(path=href, query="").geturl())
        composer = Composer(page)
        await composer.body.wait_for()
        return composer

    async def _composer(self, message: OutgoingMessage) -> Composer:
        """Reply on the parent's page, or New mail for a message that starts a thread."""
        if message.in_reply_to is None:
            shown = await self._open("inbox")
            await shown.new_mail.click()
        else:
            parent = await self._parent(message)
            shown = await self._show(parent.rest_id)
            await shown.reply.click()
        return Composer(shown.page)

    async def _find_sent(self, marker: Marker) -> StoredCopy | None:
        """Our copy in Sent Items: the item whose block of what we wrote carries the send's
        token as its class - in the conversation the marker names, else (Exchange may have
        filed it in a conversation of its own) among the newest conversations."""
        if marker.kind is MarkerKind.MESSAGE_ID:
            return await self._sent_with_message_id(marker.value)
        if marker.kind is not MarkerKind.NATIVE:
            raise Unsupported(
                f"this channel finds copies by its own marker or a Message-ID, not {marker.kind}"
            )
        if not marker.value.startswith(MARKER_PREFIX):
            return None  # a native marker of another channel's: no copy of this one's
        conversation, _, wanted = marker.value.removeprefix(MARKER_PREFIX).rpartition(":")

        def ours(raw: bytes, rest_id: str) -> StoredCopy | None:
            copy = _ours(stored_copy(raw, rest_id))
            return copy if carries(copy.html or "", wanted, "x_") else None

        return await self._search_sent(conversation, ours)

    async def _sent_with_message_id(self, message_id: str) -> StoredCopy | None:
        """A copy another channel sent with our Message-ID (an uncertain send is settled
        while its copy is among the newest conversations of Sent Items)."""

        def ours(raw: bytes, rest_id: str) -> StoredCopy | None:
            if rfc822.header_ids(rfc822.parse(raw), "Message-ID")[:1] != (message_id,):
                return None
            return _ours(stored_copy(raw, rest_id))

        return await self._search_sent("", ours)

    async def _search_sent(
        self, conversation: str, ours: Callable[[bytes, str], StoredCopy | None]
    ) -> StoredCopy | None:
        """The first sent item ``ours`` accepts, newest first: the named conversation's,
        then the newest ``SENT_SCAN`` conversations'. None only when the search read every
        conversation the list holds; else the absence is not proven (``TransientFailure``)."""
        rows = await self._rows("sentitems")
        named = [row for row in rows if conversation and row[0] == conversation]
        others = [row for row in rows if row not in named]
        for row in [*named, *others][:SENT_SCAN]:
            for item in await self._sent_of(row):
                copy = ours(await self._sent_source(item.rest_id, self._source), item.rest_id)
                if copy is not None:
                    return copy
        if await self._listed_whole("sentitems", len(rows)):
            return None
        raise TransientFailure(
            f"mailbox {self._mailbox_id}: no copy among the newest {SENT_SCAN} conversations "
            "of Sent Items, and Outlook on the web lists more (or may): its absence is not "
            "proven; it is settled through another channel or by a person"
        )


def _folder_of(path: str) -> str:
    parts = urlsplit(path).path.split("/")
    return parts[parts.index("id") - 1] if "id" in parts[1:] else "inbox"


def sent_answer(status: int, answer: object) -> dict[str, Any]:
    """What Outlook's answer to Send says (``webmail.send_answer``)."""
    return send_answer("Outlook", status, answer)


async def _row_values(shown: MailPage) -> list[tuple[str, str, str]]:
    """Each row's conversation id, accessible name and link."""
    found: list[list[str]] = await shown.rows.evaluate_all(
        "rows => rows.map(r => [r.dataset.convid || '', r.getAttribute('aria-label') || '',"
        " r.dataset.href || ''])"
    )
    return [(convid, name, link) for convid, name, link in found]


def _ours(copy: StoredCopy) -> StoredCopy:
    """The copy as we wrote it: Outlook's quote of the original (below its
    ``appendonsend`` mark) is not ours."""
    if copy.html is None or not REPLY_MARK.search(copy.html):
        return copy
    mine = REPLY_MARK.sub("</body></html>", copy.html)
    text = copy.text.split(QUOTE_RULE, 1)[0].rstrip() + "\n"
    return copy.model_copy(update={"html": mine, "text": text})


DEFAULT_URL = "https://outlook.office.com/mail/"


def open_outlook_web(
    browsers: Browsers,
    workspace_id: str,
    binding: MailboxBinding,
    *,
    read: Callable[[str], Secret],
    person_seconds: float | None = None,
    challenges: ChallengeKeeper | None = None,
) -> OutlookWeb:
    """The mailbox's Outlook on the web channel, its worker's secrets read by name from the vault
    when a login needs them."""
    return open_web_app(
        OutlookWeb,
        DEFAULT_URL,
        browsers,
        workspace_id,
        binding,
        read=read,
        person_seconds=person_seconds,
        challenges=challenges,
    )
