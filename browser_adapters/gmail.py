"""Gmail on the web as a channel of a Google mailbox (the ``browser`` channel).

It is the same mailbox the Gmail API reaches, keyed the same way: a message by its Message-ID
and header fields (read from "Show original"'s exact bytes), and given the API's ids - a
thread's rows carry ``data-legacy-thread-id`` (the API's hexadecimal thread id; the page's
``#thread-f:<decimal>`` is the same number), a message ``data-legacy-message-id``. So the
same message has the same provider ids through either channel, and its thread the same id.

- Reading: the inbox's rows, one per thread, newest first; each row names the thread's last
  message (``data-legacy-last-message-id``). A thread whose last message changed since the
  cursor is opened, and each message of it not read yet and not sent by the mailbox is read
  through "Show original" (``?view=om&permmsgid=msg-f:<decimal>``, which marks nothing).
  The cursor keeps each read thread's last message and each read message (digests only).
- Opening a conversation marks it read in the whole window. Before it opens anything the
  adapter sets Settings > Inbox once: a reading pane ("Right of inbox") that never marks a
  conversation read ("Mark conversation as read: Never"): the app's own setting; no message
  changes.
- Sending: Reply on the parent message in its conversation, the recipient chips replaced
  with the plan's and checked against it before Send, the rendered HTML inserted as HTML
  (never typed) in a block whose class is the send's token, the files attached, Send
  pressed once. Gmail gives the message its own Message-ID: our copy is found by the token,
  in the parent's thread, else among the newest threads of Sent. The read-back is of what
  we wrote, above Gmail's quote of the original.
- Signed out (at the start, or in the middle of anything): managed Google login in a
  context of its own, the account re-verified before anything is read, then the step again.
  Google's "This browser or app may not be secure" and "Verify it's you" stop it
  (``AuthChallengeUnresolved``, naming the Gmail API with OAuth as the supported path).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import urljoin, urlsplit

from playwright.async_api import Locator, Page

from agent.domain.context import MailboxBinding
from agent.domain.errors import (
    NotFound,
    ProviderError,
    SignInFailed,
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
from agent.providers import mime, rfc822
from browser_adapters.gmail_pages import GmailComposer, GmailPage, OriginalPage
from browser_adapters.session import Browsers
from browser_adapters.webmail import (
    ChallengeKeeper,
    Cursor,
    WebMail,
    carries,
    digest,
    goto,
    open_web_app,
    stored_copy,
)
from managed_login.google import GoogleLogin

PROVIDER = "google"
CURSOR_PREFIX = "gweb1."
MARKER_PREFIX = "gweb-sent:"
LARGEST = 25 * 1024 * 1024
SENT_SCAN = 50
"""The most threads of Sent a search for a copy reads; Gmail lists 50 a page, so a list of
fewer holds them all."""
READING_PANE = ("Reading pane position:", "Right of inbox")
NEVER_MARK_READ = ("Mark conversation as read:", "Never")
_ID = re.compile(r"[0-9a-f]{1,16}")
"""A Gmail message or thread id, as the API and the page's ``data-legacy-`` ids give it."""
QUOTE = re.compile(r'<div class="gmail_quote">.*', re.S | re.I)
TEXT_QUOTE = re.compile(r"\n+On .{1,300}wrote:\n.*", re.S)
"""Where Gmail's quote of the original begins, in the HTML and in the text."""


@dataclass(frozen=True)
class _Message:
    """A message of a conversation as the page lists it: its id, thread and sender."""

    id: str
    thread: str
    sender: str


class GmailWeb(WebMail):
    """One Google mailbox through Gmail on the web (implements ``MailProvider``)."""

    PROVIDER = PROVIDER
    APP = "Gmail"
    LOGIN = GoogleLogin
    HOME = "#inbox"
    SEARCHES = (MarkerKind.HEADER, MarkerKind.MESSAGE_ID)
    MARKER_PREFIX = MARKER_PREFIX
    SUBJECT_IN_EVERY_COMPOSER = False
    """A reply under a conversation keeps Gmail's subject ("Re: " and the original's)."""
    CLASS_PREFIXES = "gmail-"
    """Gmail may prefix the classes of HTML it takes in a composer with ``gmail-``."""

    def _setup(self) -> None:
        self._settings_checked = False
        self._by_message_id: dict[str, _Message] = {}
        self._indexed: set[str] = set()

    def _arrived(self, page: Page) -> Locator:
        return GmailPage(page).account

    async def _signed_in_as(self, page: Page) -> str:
        return await GmailPage(page).account.get_attribute("aria-label") or ""

    async def _go(self, page: Page, url: str) -> None:
        """A whole load of ``url`` (a new address after ``#`` alone would keep the page the
        app drew before, and would not meet a sign-in at the server)."""
        same_page = urlsplit(page.url)._replace(fragment="") == urlsplit(url)._replace(fragment="")
        if same_page:
            await goto(page, "about:blank")
        await goto(page, url)

    async def _open(self, where: str) -> GmailPage:
        return GmailPage(await self._open_page(where))

    async def _no_mark_read(self) -> None:
        """Opening a conversation must not mark it read: Settings > Inbox is set once,
        before anything is opened (the app's own setting; no message changes)."""
        if self._settings_checked:
            return
        shown = await self._open("#settings/inbox")
        await shown.save_settings.wait_for()
        pane, never = shown.choice(*READING_PANE), shown.choice(*NEVER_MARK_READ)
        if not (await pane.is_checked() and await never.is_checked()):
            await pane.check()
            await never.check()
            await shown.save_settings.click()
            await shown.saved.wait_for()
        self._settings_checked = True

    # -- reading -------------------------------------------------------------------------

    async def _changes(self, cursor: str | None) -> ChangePage:
        state = (
            Cursor(CURSOR_PREFIX)
            if cursor is None
            else Cursor.decode(CURSOR_PREFIX, cursor, self.APP)
        )
        await self._no_mark_read()
        found: list[ScannedMessage] = []
        for thread, last in reversed(await self._rows("inbox")):
            if state.rows.get(digest(thread)) == digest(last):
                continue
            for message in await self._thread(thread):
                if message.sender == self._mailbox_id or digest(message.id) in state.seen:
                    continue
                if len(found) == self.capabilities_.page_size:
                    return ChangePage(items=tuple(found), cursor=state.encode(), more=True)
                found.append(await self._scanned(message))
                state.seen.add(digest(message.id))
            state.rows[digest(thread)] = digest(last)
        return ChangePage(items=tuple(found), cursor=state.encode(), more=False)

    async def _rows(self, folder: str) -> list[tuple[str, str]]:
        """The first page of the list's threads as its rows show them, newest first: each
        one's id and its last message's, from the row's subject (once the list shows a row,
        or says it is empty). A row without them is a page this channel cannot read
        (``TransientFailure``), never a row passed over."""
        return (await self._listed(folder))[0]

    async def _listed(self, folder: str) -> tuple[list[tuple[str, str]], bool]:
        """``_rows``, and whether they are the whole list (its "Older" is disabled)."""
        shown = await self._open("#" + folder)
        rows = shown.rows(folder)
        await rows.first.or_(shown.empty).wait_for()
        found: list[list[str]] = await rows.evaluate_all(
            "rows => rows.map(r => { const s = r.querySelector('[data-legacy-last-message-id]');"
            " return s ? [s.dataset.legacyThreadId || '', s.dataset.legacyLastMessageId || '']"
            " : ['', '']; })"
        )
        if not all(_ID.fullmatch(thread) and _ID.fullmatch(last) for thread, last in found):
            raise TransientFailure(
                f"mailbox {self._mailbox_id}: a row of Gmail's {folder} list names no thread "
                "and last message this channel can read; nothing was taken from the list"
            )
        whole = not found or await shown.older_disabled.is_visible()
        return [(thread, last) for thread, last in found], whole

    async def _thread(self, thread: str) -> list[_Message]:
        """A thread's messages, oldest first, with each one's sender, once its conversation
        shows (one that does not show within the bound is a page that did not answer:
        ``TransientFailure``, never a thread without messages)."""
        await self._no_mark_read()
        shown = await self._open(f"#inbox/{thread}")
        await shown.heading(int(thread, 16)).wait_for()
        found: list[list[str]] = await shown.messages.evaluate_all(
            "els => els.map(e => { const who = e.querySelector('[email]');"
            " return [e.dataset.legacyMessageId || '', who ? who.getAttribute('email') : '']; })"
        )
        return [_Message(mid, thread, sender.lower()) for mid, sender in found]

    async def _scanned(self, message: _Message) -> ScannedMessage:
        scanned = self._scan(await self._source(message.id), message.id, message.thread)
        self._indexed.add(message.id)
        if scanned.envelope is not None and scanned.envelope.internet_message_id is not None:
            self._by_message_id[scanned.envelope.internet_message_id] = message
        return scanned

    async def _source(self, ref: str) -> bytes:
        """A message's exact bytes: "Show original", then its "Download Original"."""
        if not _ID.fullmatch(ref):
            raise NotFound(f"{ref!r} is not a Gmail message id")
        page = await self._original(f"?view=om&permmsgid=msg-f:{int(ref, 16)}")
        original = OriginalPage(page)
        await original.title.or_(original.missing).wait_for()
        if not await original.title.is_visible():
            raise NotFound(f"mailbox {self._mailbox_id} shows no message {ref!r}")
        href = await original.download.get_attribute("href") or ""
        response = await page.request.get(urljoin(page.url, href))
        if response.status == 404:
            raise NotFound(f"mailbox {self._mailbox_id} shows no message {ref!r}")
        if not response.ok or not self._in_app(response.url):
            raise TransientFailure(
                f"mailbox {self._mailbox_id}: Gmail did not give the original of "
                f"{ref!r} (HTTP {response.status}); try again later"
            )
        return await response.body()

    async def _original(self, path: str) -> Page:
        """A page of the app that does not show the account (a message's original), loaded
        once the account was verified where the app shows it; signed in again, and the
        account verified again, when the session ended meanwhile."""
        if not self._verified:
            await self._open(self.HOME)
        page = await self._working_page()
        await self._go(page, self._app + path)
        if not self._in_app(page.url):
            await self._open(self.HOME)  # signs in and verifies the account
            page = await self._working_page()
            await self._go(page, self._app + path)
            if not self._in_app(page.url):
                raise SignInFailed(
                    f"mailbox {self._mailbox_id}: Gmail sent the browser to sign in again "
                    "right after a managed login",
                    "run `outloop login` for the mailbox and check its output",
                )
        return page

    async def _parent_thread(self, message: OutgoingMessage) -> str:
        return (await self._parent(message)).thread

    def _sent_thread(self, message: OutgoingMessage, given: str) -> str:
        """The parent's Gmail thread, as the Gmail API channel reports it (else the
        core's name for the thread)."""
        return message.provider_thread_id or super()._sent_thread(message, given)

    async def _parent(self, message: OutgoingMessage) -> _Message:
        """The message the reply answers, by its Message-ID: known from this channel's
        reading, else looked for thread by thread, newest first - the Inbox's, then Sent's
        (a reminder answers our own message)."""
        wanted = message.in_reply_to
        assert wanted is not None
        for folder in ("inbox", "sent"):
            if wanted in self._by_message_id:
                break
            for thread, _ in await self._rows(folder):
                for found in await self._thread(thread):
                    await self._index(found)
                if wanted in self._by_message_id:
                    break
        if wanted not in self._by_message_id:
            raise ProviderError(f"the message {wanted} answered is not in the mailbox")
        return self._by_message_id[wanted]

    async def _index(self, message: _Message) -> None:
        """Learn a message's Message-ID."""
        if message.id in self._indexed:
            return
        raw = await self._sent_source(message.id, self._source)
        ids = rfc822.header_ids(rfc822.parse(raw), "Message-ID")
        self._indexed.add(message.id)
        if ids:
            self._by_message_id[ids[0]] = message

    async def _composer(self, message: OutgoingMessage) -> GmailComposer:
        """Reply on the parent message in its conversation, or Compose for a message that
        starts a thread."""
        if message.in_reply_to is None:
            shown = await self._open(self.HOME)
            await shown.compose.click()
            return GmailComposer.window(shown.page)
        parent = await self._parent(message)
        await self._no_mark_read()
        shown = await self._open(f"#inbox/{parent.thread}")
        await shown.reply(shown.message(parent.id)).click()
        return GmailComposer.reply(shown.page)

    async def _draft_links(self) -> list[str]:
        shown = await self._open("#drafts")
        rows = shown.rows("drafts")
        await rows.first.or_(shown.empty).wait_for()
        return await rows.evaluate_all("rows => rows.map(r => r.dataset.href || '')")

    async def _open_draft(self, href: str) -> GmailComposer:
        shown = await self._open(href)
        composer = GmailComposer.window(shown.page)
        await composer.body.wait_for()
        return composer

    async def _find_sent(self, marker: Marker) -> StoredCopy | None:
        """Our copy among the mailbox's sent messages: by the token of our block for this
        channel's marker (in the thread it names first), by the header or the Message-ID
        another channel of the mailbox set."""
        if marker.kind is MarkerKind.NATIVE:
            if not marker.value.startswith(MARKER_PREFIX):
                return None  # a native marker of another channel's: no copy of this one's
            thread, _, token = marker.value.removeprefix(MARKER_PREFIX).rpartition(":")
            return await self._search_sent(thread, lambda raw, ref: _by_token(raw, ref, token))
        if marker.kind is MarkerKind.HEADER:
            return await self._search_sent("", lambda raw, ref: _by_header(raw, ref, marker.value))
        if marker.kind is MarkerKind.MESSAGE_ID:
            return await self._search_sent("", lambda raw, ref: _by_id(raw, ref, marker.value))
        raise Unsupported(
            f"this channel finds copies by its own marker, a header or a Message-ID, not "
            f"{marker.kind}"
        )

    async def _search_sent(
        self, thread: str, ours: Callable[[bytes, str], StoredCopy | None]
    ) -> StoredCopy | None:
        """The first sent message ``ours`` accepts, newest first: the named thread's, then
        the threads of Sent's first page (at most ``SENT_SCAN``). None only when that page
        is the whole list ("Older" disabled) and every thread on it was read; else the
        absence is not proven (``TransientFailure``)."""
        listed, whole = await self._listed("sent")
        rows = [t for t, _ in listed]
        named = [thread] if thread and _ID.fullmatch(thread) else []
        order = list(dict.fromkeys([*named, *rows]))
        for each in order[:SENT_SCAN]:
            for message in reversed(await self._thread(each)):
                if message.sender != self._mailbox_id:
                    continue
                copy = ours(await self._sent_source(message.id, self._source), message.id)
                if copy is not None:
                    return copy
        if whole and len(order) <= SENT_SCAN:
            return None
        raise TransientFailure(
            f"mailbox {self._mailbox_id}: no copy among the newest threads of Sent, and "
            "Gmail lists more: its absence is not proven; it is settled through another "
            "channel or by a person"
        )


def _by_token(raw: bytes, ref: str, token: str) -> StoredCopy | None:
    copy = _ours(stored_copy(raw, ref))
    return copy if carries(copy.html or "", token, GmailWeb.CLASS_PREFIXES) else None


def _by_header(raw: bytes, ref: str, token: str) -> StoredCopy | None:
    value = rfc822.parse(raw).header(mime.MARKER_HEADER)
    return _ours(stored_copy(raw, ref)) if (value or "").strip() == token else None


def _by_id(raw: bytes, ref: str, message_id: str) -> StoredCopy | None:
    if rfc822.header_ids(rfc822.parse(raw), "Message-ID")[:1] != (message_id,):
        return None
    return _ours(stored_copy(raw, ref))


def _ours(copy: StoredCopy) -> StoredCopy:
    """The copy as we wrote it: Gmail's quote of the original (its ``gmail_quote``, under
    "On ... wrote:") is not ours."""
    if copy.html is None or not QUOTE.search(copy.html):
        return copy
    mine = QUOTE.sub("</body></html>", copy.html)
    text = TEXT_QUOTE.sub("", copy.text).rstrip() + "\n"
    return copy.model_copy(update={"html": mine, "text": text})


DEFAULT_URL = "https://mail.google.com/mail/u/0/"


def open_gmail_web(
    browsers: Browsers,
    workspace_id: str,
    binding: MailboxBinding,
    *,
    read: Callable[[str], Secret],
    person_seconds: float | None = None,
    challenges: ChallengeKeeper | None = None,
) -> GmailWeb:
    """The mailbox's Gmail channel, its worker's secrets read by name from the vault
    when a login needs them."""
    return open_web_app(
        GmailWeb,
        DEFAULT_URL,
        browsers,
        workspace_id,
        binding,
        read=read,
        person_seconds=person_seconds,
        challenges=challenges,
    )
