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
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import quote, urlsplit

from playwright.async_api import Error as PlaywrightError
from playwright.async_api import Locator, Page, Response

from agent.domain.context import MailboxBinding
from agent.domain.envelope import thread_alias
from agent.domain.errors import (
    NotFound,
    NotHandedOver,
    ProviderError,
    TransientFailure,
    Unsupported,
)
from agent.domain.handover import check_handover
from agent.domain.mail import (
    AttachmentData,
    Capabilities,
    ChangePage,
    Channel,
    Handover,
    Marker,
    MarkerKind,
    MessageBody,
    OutgoingMessage,
    ScannedMessage,
    SendResult,
    StoredCopy,
)
from agent.domain.secrets import Secret
from agent.providers import mime, rfc822
from browser_adapters.outlook_pages import Composer, MailPage
from browser_adapters.session import Browsers, MailboxBrowser
from browser_adapters.webmail import (
    DISCARD_MS,
    Cursor,
    SignedOut,
    WebMail,
    as_planned,
    carries,
    check_writable,
    digest,
    discard,
    goto,
    insert_html,
    lists,
    send_answer,
    stored_copy,
    what,
    wrapped,
)
from managed_login.flow import WorkerSignIn
from managed_login.microsoft import MicrosoftLogin
from managed_login.totp import Codes

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

    def __init__(
        self,
        browser: MailboxBrowser,
        mailbox_id: str,
        app_url: str,
        worker: Callable[[], WorkerSignIn],
        *,
        workspace_id: str,
        account: str | None = None,
        person_seconds: float | None = None,
        page_size: int = 25,
        sent_copy_latency: timedelta = timedelta(seconds=120),
    ) -> None:
        super().__init__(
            browser,
            mailbox_id,
            app_url,
            worker,
            workspace_id=workspace_id,
            account=account,
            person_seconds=person_seconds,
        )
        self._mark_as_read_checked = False
        self._by_message_id: dict[str, _Item] = {}
        self._read_items: set[str] = set()
        self._sent_rows: dict[tuple[str, str, str], list[_Item]] = {}
        """Sent Items rows as read (conversation, name, link) and their sent items."""
        self.capabilities_ = Capabilities(
            channel=Channel.BROWSER,
            native_threads=False,
            markers=(MarkerKind.NATIVE,),
            searches=(MarkerKind.MESSAGE_ID,),
            sent_copy_latency=sent_copy_latency,
            page_size=page_size,
        )

    @property
    def capabilities(self) -> Capabilities:
        return self.capabilities_

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
        raw = await self._source(item.rest_id)

        def thread(*_: object) -> str:
            return item.conversation

        try:
            envelope = rfc822.normalize(
                raw,
                provider=PROVIDER,
                mailbox_id=self._mailbox_id,
                provider_message_id=item.rest_id,
                thread_id_for=thread,
                fallback_received_at=datetime.now(UTC),
            )
        except Exception as exc:  # a message the app shows but no parser reads
            return ScannedMessage(item_ref=item.rest_id, error=f"could not be normalized ({exc})")
        self._read_items.add(item.rest_id)
        if envelope.internet_message_id is not None:
            self._by_message_id[envelope.internet_message_id] = item
        return ScannedMessage(item_ref=item.rest_id, envelope=envelope)

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

    async def _source(self, rest_id: str) -> bytes:
        shown = await self._show(rest_id)
        await shown.more_actions.click()
        await shown.view_source.click()
        await shown.source.wait_for()
        text = await shown.source.inner_text()
        await shown.page.keyboard.press("Escape")
        return text.replace("\r\n", "\n").replace("\n", "\r\n").encode("utf-8", "surrogateescape")

    async def _fetch_body(self, body_ref: str) -> MessageBody:
        return rfc822.body(await self._source(body_ref))

    async def _fetch_attachment(self, ref: str) -> AttachmentData:
        item, _, index = ref.rpartition("/")
        if not item or not index.isdigit():
            raise NotFound(f"{ref!r} is not an attachment reference of this channel")
        found = rfc822.attachments(await self._source(item), item)
        if int(index) >= len(found):
            raise NotFound(f"item {item!r} of mailbox {self._mailbox_id} has no file {index}")
        return found[int(index)]

    # -- sending -------------------------------------------------------------------------

    async def _prepare(self, message: OutgoingMessage) -> Handover:
        check_writable(message, self._mailbox_id, "Outlook", LARGEST)
        parent = None if message.in_reply_to is None else await self._parent(message)
        return Handover(
            message=message,
            channel=Channel.BROWSER.value,
            recipients=lists([a.address for a in message.to], [a.address for a in message.cc]),
            marker=_marker(message, parent.conversation if parent else ""),
        )

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

    async def _send(self, handover: Handover) -> SendResult:
        message = handover.message
        answer = await self._written_and_sent(handover)
        sent = str(answer["sent"])
        given = await self._message_id_of(sent) or message.internet_message_id
        first = message.references[0] if message.references else message.in_reply_to
        return SendResult(
            provider_message_id=sent,
            provider_thread_id=thread_alias(first or given),  # as the core names threads
            internet_message_id=given,
            channel=Channel.BROWSER.value,
            delivered=True,
            accepted_at=datetime.now(UTC),
        )

    async def _written_and_sent(self, handover: Handover) -> dict[str, Any]:
        """The reply written and Send pressed once; a page that stops answering before
        Send is pressed sent nothing (what the app saved of it is discarded, now if the
        page lets it, else before this channel writes the send again)."""
        token = mime.send_token(handover.message.internet_message_id)
        composer: Composer | None = None
        try:
            if token in self._unsent:
                await self._saved_draft(handover.message, keep=False)
            composer = await self._composer(handover.message)
            await self._write(composer, handover)
        except PlaywrightError as exc:
            self._unsent.add(token)
            if composer is not None:
                await _discard_stuck(composer)
            raise NotHandedOver(
                f"mailbox {self._mailbox_id}: Outlook's composer did not answer "
                f"({what(exc)}); Send was not pressed"
            ) from None
        self._unsent.discard(token)
        try:
            return await self._press_send(composer.send, _is_send)
        except SignedOut:  # refused for want of a session: nothing went out
            return await self._send_again(handover)

    async def _write(self, composer: Composer, handover: Handover) -> None:
        """The reply as planned: recipients (checked), subject, the HTML, the files."""
        message = handover.message
        await composer.body.wait_for()
        await self._recipients(composer, handover)
        await composer.subject.fill(message.subject)
        await _insert_html(composer, wrapped(message))
        if message.attachments:
            await composer.attach.set_input_files(
                [
                    {"name": f.ref.name, "mimeType": f.ref.content_type, "buffer": f.data}
                    for f in message.attachments
                ]
            )
            await composer.attached.nth(len(message.attachments) - 1).wait_for()

    async def _send_again(self, handover: Handover) -> dict[str, Any]:
        """After the session ended at Send: sign in, reopen the draft the app saved (its
        recipients set and checked again), or write the reply again if none was saved as
        planned, and send."""
        try:
            await self._sign_in()
            composer = await self._saved_draft(handover.message)
            if composer is None:
                composer = await self._composer(handover.message)
                await self._write(composer, handover)
            else:
                await self._recipients(composer, handover)
                await composer.subject.fill(handover.message.subject)
        except PlaywrightError as exc:
            raise NotHandedOver(
                f"mailbox {self._mailbox_id}: Outlook did not answer while the reply was "
                f"written again ({what(exc)}); Send was not pressed again"
            ) from None
        try:
            return await self._press_send(composer.send, _is_send)
        except SignedOut:
            raise NotHandedOver(
                f"mailbox {self._mailbox_id}: Outlook signed the browser out again at Send; "
                "nothing was sent"
            ) from None

    async def _saved_draft(self, message: OutgoingMessage, *, keep: bool = True) -> Composer | None:
        """The app's saved draft of this send (its block carries the send's token) whose
        body and files are as planned, open; every other saved draft of the send (a second
        one, or one saved half-written) is discarded, so none is left to be sent by hand
        (``keep`` False: every one is)."""
        token = mime.send_token(message.internet_message_id)
        kept: str | None = None
        for _, _, href in await self._rows("drafts"):
            composer = await self._open_draft(href)
            if not carries(await composer.body.inner_html(), token, "x_"):
                continue
            if (
                keep
                and kept is None
                and await as_planned(composer.body, composer.attached, message)
            ):
                kept = href
                continue
            await discard(composer.discard, self._browser.timeout_ms)
        return None if kept is None else await self._open_draft(kept)

    async def _open_draft(self, href: str) -> Composer:
        page = await self._working_page()
        await goto(page, urlsplit(page.url)._replace(path=href, query="").geturl())
        composer = Composer(page)
        await composer.body.wait_for()
        return composer

    async def _message_id_of(self, rest_id: str) -> str | None:
        """The Message-ID Exchange gave a message we sent (Outlook on the web sets its own),
        read from its source; None while the copy does not show yet (the message went out:
        nothing here may fail the send)."""
        try:
            raw = await self._sent_source(rest_id, self._source)
        except (ProviderError, PlaywrightError):  # a sign-in, a page that stopped answering
            return None
        ids = rfc822.header_ids(rfc822.parse(raw), "Message-ID")
        return ids[0] if ids else None

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

    async def _recipients(self, composer: Composer, handover: Handover) -> None:
        """The chips replaced with the plan's, then read back and checked against it."""
        message = handover.message
        plan = {"to": [a.address for a in message.to], "cc": [a.address for a in message.cc]}
        for name, wanted in plan.items():
            for address in await _chips(composer, name):
                await composer.remove(address).click()
            for address in wanted:
                await composer.field(name).fill(address)
                await composer.field(name).press("Enter")
        shown = lists(await _chips(composer, "to"), await _chips(composer, "cc"))
        problems = check_handover(handover.model_copy(update={"recipients": shown}))
        if problems:
            await discard(composer.discard, self._browser.timeout_ms)
            raise NotHandedOver(
                "Outlook's recipient chips are not the plan (nothing sent): " + "; ".join(problems)
            )

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


def _marker(message: OutgoingMessage, conversation: str) -> Marker:
    """The native marker of a send: its conversation (none for a new one: the newest
    conversations of Sent Items are searched), and the send's token, which the
    adapter writes as the class of the block holding what we wrote (Outlook on the web
    sets neither our Message-ID nor a header of ours; the class is kept, unseen)."""
    token = mime.send_token(message.internet_message_id)
    return Marker(kind=MarkerKind.NATIVE, value=f"{MARKER_PREFIX}{conversation}:{token}")


def _folder_of(path: str) -> str:
    parts = urlsplit(path).path.split("/")
    return parts[parts.index("id") - 1] if "id" in parts[1:] else "inbox"


def sent_answer(status: int, answer: object) -> dict[str, Any]:
    """What Outlook's answer to Send says (``webmail.send_answer``)."""
    return send_answer("Outlook", status, answer)


async def _discard_stuck(composer: Composer) -> None:
    """Discard the draft of a composer that stopped answering, if it still can (briefly)."""
    await discard(composer.discard, DISCARD_MS)


async def _row_values(shown: MailPage) -> list[tuple[str, str, str]]:
    """Each row's conversation id, accessible name and link."""
    found: list[list[str]] = await shown.rows.evaluate_all(
        "rows => rows.map(r => [r.dataset.convid || '', r.getAttribute('aria-label') || '',"
        " r.dataset.href || ''])"
    )
    return [(convid, name, link) for convid, name, link in found]


def _is_send(response: Response) -> bool:
    return response.request.method == "POST" and response.url.endswith("/_api/send")


async def _chips(composer: Composer, name: str) -> list[str]:
    return await composer.chips(name).evaluate_all("els => els.map(e => e.dataset.address)")


async def _insert_html(composer: Composer, markup: str) -> None:
    """The rendered HTML inserted into the editor as HTML, never typed."""
    await insert_html(composer.body, markup)


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
) -> OutlookWeb:
    """The mailbox's Outlook on the web channel, its worker's secrets read by name from the
    vault when a login needs them."""
    access = binding.browser
    if access.account is not None and access.account != binding.mailbox_id:
        raise Unsupported(
            f"mailbox {binding.mailbox_id}: this version signs in to Outlook on the web as the "
            f"mailbox itself, not as another account ({access.account}); remove browser.account"
        )

    def worker() -> WorkerSignIn:
        return WorkerSignIn(
            account=access.account or binding.mailbox_id,
            password=read(access.password),
            codes=Codes(read(access.totp)),
        )

    return OutlookWeb(
        MailboxBrowser(browsers, workspace_id, binding.mailbox_id),
        binding.mailbox_id,
        access.url or DEFAULT_URL,
        worker,
        workspace_id=workspace_id,
        account=access.account,
        person_seconds=person_seconds,
        sent_copy_latency=timedelta(seconds=access.sent_copy_latency_seconds),
    )
