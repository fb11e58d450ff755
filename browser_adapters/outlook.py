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

import base64
import hashlib
import html
import json
import re
import zlib
from collections.abc import AsyncGenerator, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit

from playwright.async_api import Error as PlaywrightError
from playwright.async_api import Page, Response

from agent.domain.context import MailboxBinding
from agent.domain.envelope import thread_alias
from agent.domain.errors import (
    AccessRefused,
    AuthChallengeUnresolved,
    CursorExpired,
    NotFound,
    NotHandedOver,
    OutcomeUnknown,
    PasswordRefused,
    ProviderError,
    SignInFailed,
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
    ProviderHealth,
    ScannedMessage,
    SendResult,
    StoredCopy,
)
from agent.domain.secrets import Secret
from agent.providers import mime, rfc822
from browser_adapters.outlook_pages import Composer, MailPage
from browser_adapters.session import Browsers, MailboxBrowser
from managed_login.flow import LoginReport, Step, WorkerSignIn
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
SENT_SOURCE_BYTES = 32 * 1024 * 1024
"""The sent items' sources a channel instance keeps, newest first (a sent item never
changes): at most this many bytes, however many items."""
DIGEST = 12
DISCARD_MS = 2_000
"""How long a composer that stopped answering is given to discard its draft."""
REFUSALS = frozenset({400, 413, 415, 422})
"""Answers to Send that say the message was refused as it was (nothing went out)."""
REPLY_MARK = re.compile(r'<div id="appendonsend"></div>.*', re.S | re.I)
QUOTE_RULE = "\n" + "_" * 32
"""The line Outlook's plain text puts above the original it answers."""
MARK_AS_READ_OFF = "Don't automatically mark items as read"


def _digest(value: str) -> str:
    return hashlib.sha256(value.encode()).hexdigest()[:DIGEST]


@dataclass
class _Cursor:
    """What was read: each read conversation's row as it was, and each read item."""

    rows: dict[str, str] = field(default_factory=dict[str, str])
    seen: set[str] = field(default_factory=set[str])

    def encode(self) -> str:
        data = json.dumps({"r": self.rows, "s": sorted(self.seen)}, separators=(",", ":"))
        packed = base64.urlsafe_b64encode(zlib.compress(data.encode())).decode()
        return CURSOR_PREFIX + packed

    @classmethod
    def decode(cls, text: str) -> _Cursor:
        try:
            if not text.startswith(CURSOR_PREFIX):
                raise ValueError(text[:10])
            data: Any = json.loads(zlib.decompress(base64.urlsafe_b64decode(text[5:])))
            rows = {str(k): str(v) for k, v in dict(data["r"]).items()}
            return cls(rows, {str(s) for s in data["s"]})
        except (ValueError, KeyError, TypeError, zlib.error):
            raise CursorExpired("not a cursor of the Outlook on the web channel") from None


class _SignedOut(Exception):
    """The app refused Send for want of a session (nothing was sent)."""


@dataclass(frozen=True)
class _Item:
    rest_id: str
    folder: str
    conversation: str


class OutlookWeb:
    """One Microsoft mailbox through Outlook on the web (implements ``MailProvider``)."""

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
        self._browser = browser
        self._mailbox_id = mailbox_id.lower()
        self._account = (account or mailbox_id).lower()
        self._verified = False
        self._person_seconds = person_seconds
        self._operator_asked = False
        """In a visible browser (``outloop login --headed``): how long a person has to
        complete a challenge managed login stopped at."""
        self._app = app_url.rstrip("/") + "/"
        self._worker = worker
        self._workspace_id = workspace_id
        self._page: Page | None = None
        self._mark_as_read_checked = False
        self._showing: str | None = None
        """The item the working page shows open, loaded by this operation (a conversation's
        page shows its newest item open): read there without loading it again. Forgotten at
        every other page load and when the operation ends."""
        self._by_message_id: dict[str, _Item] = {}
        self._read_items: set[str] = set()
        self._unsent: set[str] = set()
        """Tokens of sends whose writing stopped before Send: their saved drafts are
        discarded before they are written again."""
        self._sent_sources: dict[str, bytes] = {}
        self._sent_rows: dict[tuple[str, str, str], list[_Item]] = {}
        """Sent Items rows as read (conversation, name, link) and their sent items."""
        """Sources of sent items read (a sent item never changes), newest last."""
        self.capabilities_ = Capabilities(
            channel=Channel.BROWSER,
            native_threads=False,
            markers=(MarkerKind.NATIVE,),
            searches=(MarkerKind.MESSAGE_ID,),
            sent_copy_latency=sent_copy_latency,
            page_size=page_size,
        )
        self.last_login: LoginReport | None = None

    @property
    def provider(self) -> str:
        return PROVIDER

    @property
    def session_file(self) -> Path:
        """Where the mailbox's browser session is kept (mode 600)."""
        return self._browser.state_file

    @property
    def mailbox_id(self) -> str:
        return self._mailbox_id

    @property
    def capabilities(self) -> Capabilities:
        return self.capabilities_

    # -- the port: each operation holds the mailbox's browser ----------------------------

    async def changes(self, cursor: str | None) -> ChangePage:
        async with self._driving():
            return await self._changes(cursor)

    async def fetch_body(self, body_ref: str) -> MessageBody:
        async with self._driving():
            return await self._fetch_body(body_ref)

    async def fetch_attachment(self, ref: str) -> AttachmentData:
        async with self._driving():
            return await self._fetch_attachment(ref)

    async def prepare(self, message: OutgoingMessage) -> Handover:
        async with self._driving():
            return await self._prepare(message)

    async def send(self, handover: Handover) -> SendResult:
        async with self._driving():
            return await self._send(handover)

    async def find_sent(self, marker: Marker) -> StoredCopy | None:
        async with self._driving():
            return await self._find_sent(marker)

    async def health(self) -> ProviderHealth:
        async with self._driving():
            return await self._health()

    @asynccontextmanager
    async def _driving(self) -> AsyncGenerator[None]:
        """Hold the mailbox's browser for one operation; what its page showed is not
        carried into the next."""
        async with self._browser.driving():
            self._showing = None
            try:
                yield
            except PlaywrightError as exc:  # a page that stopped answering: every wait is bounded
                raise TransientFailure(
                    f"mailbox {self._mailbox_id}: Outlook on the web did not answer "
                    f"({_what(exc)}); try again later"
                ) from None
            finally:
                self._showing = None

    # -- the page, signed in -------------------------------------------------------------

    def _in_app(self, url: str) -> bool:
        return url.startswith(self._app)

    async def _open(self, path: str) -> MailPage:
        """The app's page at ``path`` (relative to the mail app), signing in first when the
        app sends the browser to sign-in."""
        page = await self._working_page()
        self._showing = None
        await _goto(page, self._app + path)
        if not self._in_app(page.url):
            await self._sign_in()
            page = await self._working_page()
            await _goto(page, self._app + path)
            if not self._in_app(page.url):
                raise SignInFailed(
                    f"mailbox {self._mailbox_id}: Outlook sent the browser to sign in again "
                    "right after a managed login",
                    "run `outloop login` for the mailbox and check its output",
                )
        shown = MailPage(page)
        if not self._verified:
            await self._verify_account(shown)
        return shown

    async def _working_page(self) -> Page:
        if self._page is None or self._page.is_closed():
            self._verified = False  # a new page of a session: whose it is is checked again
            context = await self._browser.context()
            self._page = await context.new_page()
        return self._page

    async def login(self) -> LoginReport:
        """Sign the mailbox's browser in now (``outloop login``): nothing is typed when
        its kept session is still signed in."""
        async with self._driving():
            self._operator_asked = True  # an operator's login may type a refused password again
            try:
                shown = await self._open("inbox")
            finally:
                self._operator_asked = False
            await shown.account.wait_for()
            if self.last_login is None:
                return LoginReport(account=self._mailbox_id, steps=(), signed_in=False)
            return self.last_login

    async def _sign_in(self) -> LoginReport:
        """Managed login in a context of its own; the signed-in account verified before
        the session is kept and anything is read."""
        self._page = None
        refused_at = self._browser.password_refused_at()
        if refused_at is not None and not self._operator_asked:
            raise PasswordRefused(
                f"mailbox {self._mailbox_id}: managed login stopped after Microsoft refused the "
                f"stored password ({refused_at}); it does not type it again by itself",
                "store the worker's current password with `outloop vault set`, then run "
                f"`outloop login --workspace {self._workspace_id} --mailbox {self._mailbox_id}`",
            )
        async with self._browser.sign_in_context() as context:
            page = await context.new_page()
            await _goto(page, self._app)
            worker = self._worker()
            worker.codes.used_through(self._browser.last_code_step())
            arrived = MailPage(page).account
            login = MicrosoftLogin(
                page,
                worker,
                arrived,
                workspace_id=self._workspace_id,
                mailbox_id=self._mailbox_id,
                timeout_ms=self._browser.timeout_ms,
            )
            try:
                report = await login.run()
            except PasswordRefused:
                self._browser.note_password_refused(datetime.now(UTC).isoformat(timespec="seconds"))
                raise
            except AuthChallengeUnresolved:
                if self._person_seconds is None:
                    raise
                await arrived.wait_for(timeout=self._person_seconds * 1000)
                report = LoginReport(
                    account=worker.account, steps=(Step.BY_PERSON, Step.ARRIVED), signed_in=True
                )
            finally:
                self._browser.keep_code_step(worker.codes.last_step)
            await self._verify_account(MailPage(page))
        self._browser.clear_password_refused()
        self.last_login = report
        return report

    async def _verify_account(self, shown: MailPage) -> None:
        """The app shows the bound account, or nothing is read: the kept session is
        dropped and the login refused."""
        await shown.account.click()
        card = (await shown.account_card.inner_text()).lower().split()
        await shown.page.keyboard.press("Escape")
        if self._account not in card:
            self._browser.forget()
            self._page = None
            raise SignInFailed(
                f"mailbox {self._mailbox_id}: the browser is signed in to another account than "
                f"{self._account}; nothing was read and the session was dropped",
                "check the mailbox's worker account in the Workspace Context (browser.account)",
            )
        self._verified = True

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
        state = _Cursor() if cursor is None else _Cursor.decode(cursor)
        await self._no_mark_as_read()
        rows = await self._rows("inbox")
        found: list[ScannedMessage] = []
        for conversation, label, href in reversed(rows):
            if state.rows.get(_digest(conversation)) == _digest(label):
                continue
            for item in await self._conversation(conversation, href):
                if item.folder != "inbox" or _digest(item.rest_id) in state.seen:
                    continue
                if len(found) == self.capabilities_.page_size:
                    return ChangePage(items=tuple(found), cursor=state.encode(), more=True)
                found.append(await self._scanned(item))
                state.seen.add(_digest(item.rest_id))
            state.rows[_digest(conversation)] = _digest(label)
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
        await _goto(page, urlsplit(page.url)._replace(path=href, query="").geturl())
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

    async def _sent_source(self, rest_id: str) -> bytes:
        """A sent item's source, read once per channel instance (the newest kept, up to
        ``SENT_SOURCE_BYTES``)."""
        raw = self._sent_sources.pop(rest_id, None) or await self._source(rest_id)
        self._sent_sources[rest_id] = raw
        while sum(map(len, self._sent_sources.values())) > SENT_SOURCE_BYTES:
            del self._sent_sources[next(iter(self._sent_sources))]
        return raw

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
        try:
            for address in (message.sender, *message.to, *message.cc):
                mime.mailbox(address)
        except mime.UnsendableHeader as exc:
            raise ProviderError(f"the message cannot be written in Outlook: {exc}") from None
        if message.sender.address != self._mailbox_id:
            raise ProviderError(f"Outlook sends from {self._mailbox_id} only")
        if message.attachments and sum(len(f.data) for f in message.attachments) > LARGEST:
            raise ProviderError("Outlook on the web takes up to 25 MB of files in one message")
        parent = None if message.in_reply_to is None else await self._parent(message)
        return Handover(
            message=message,
            channel=Channel.BROWSER.value,
            recipients=_lists([a.address for a in message.to], [a.address for a in message.cc]),
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
                f"({_what(exc)}); Send was not pressed"
            ) from None
        self._unsent.discard(token)
        try:
            return await self._press_send(composer)
        except _SignedOut:  # refused for want of a session: nothing went out
            return await self._send_again(handover)

    async def _write(self, composer: Composer, handover: Handover) -> None:
        """The reply as planned: recipients (checked), subject, the HTML, the files."""
        message = handover.message
        await composer.body.wait_for()
        await self._recipients(composer, handover)
        await composer.subject.fill(message.subject)
        await _insert_html(composer, _wrapped(message))
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
                f"written again ({_what(exc)}); Send was not pressed again"
            ) from None
        try:
            return await self._press_send(composer)
        except _SignedOut:
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
            if not _carries(await composer.body.inner_html(), token):
                continue
            if keep and kept is None and await _as_planned(composer, message):
                kept = href
                continue
            await _discard(composer, self._browser.timeout_ms)
        return None if kept is None else await self._open_draft(kept)

    async def _open_draft(self, href: str) -> Composer:
        page = await self._working_page()
        await _goto(page, urlsplit(page.url)._replace(path=href, query="").geturl())
        composer = Composer(page)
        await composer.body.wait_for()
        return composer

    async def _message_id_of(self, rest_id: str) -> str | None:
        """The Message-ID Exchange gave a message we sent (Outlook on the web sets its own),
        read from its source; None while the copy does not show yet (the message went out:
        nothing here may fail the send)."""
        try:
            raw = await self._sent_source(rest_id)
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
        shown = _lists(await _chips(composer, "to"), await _chips(composer, "cc"))
        problems = check_handover(handover.model_copy(update={"recipients": shown}))
        if problems:
            await _discard(composer, self._browser.timeout_ms)
            raise NotHandedOver(
                "Outlook's recipient chips are not the plan (nothing sent): " + "; ".join(problems)
            )

    async def _press_send(self, composer: Composer) -> dict[str, Any]:
        """Send pressed once and the app's answer read: refused for want of a session
        (``_SignedOut``, nothing went out), refused outright (``NotHandedOver``), or anything
        that may have sent it (a lost or unreadable answer, a draft already gone) is
        ``OutcomeUnknown``: settled from Sent Items, never sent again blind."""
        page = composer.root.page
        try:
            async with page.expect_response(_is_send) as answered:
                await composer.send.click()
            response: Response = await answered.value
        except PlaywrightError as exc:
            raise OutcomeUnknown(
                f"Outlook's answer to Send was lost ({type(exc).__name__})"
            ) from None
        if response.status == 401:
            raise _SignedOut
        answer = await _json_of(response) if response.status == 200 else None
        return sent_answer(response.status, answer)

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
            copy = _ours(_stored_copy(raw, rest_id))
            return copy if _carries(copy.html or "", wanted) else None

        return await self._search_sent(conversation, ours)

    async def _sent_with_message_id(self, message_id: str) -> StoredCopy | None:
        """A copy another channel sent with our Message-ID (an uncertain send is settled
        while its copy is among the newest conversations of Sent Items)."""

        def ours(raw: bytes, rest_id: str) -> StoredCopy | None:
            if rfc822.header_ids(rfc822.parse(raw), "Message-ID")[:1] != (message_id,):
                return None
            return _ours(_stored_copy(raw, rest_id))

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
                copy = ours(await self._sent_source(item.rest_id), item.rest_id)
                if copy is not None:
                    return copy
        if await self._listed_whole("sentitems", len(rows)):
            return None
        raise TransientFailure(
            f"mailbox {self._mailbox_id}: no copy among the newest {SENT_SCAN} conversations "
            "of Sent Items, and Outlook on the web lists more (or may): its absence is not "
            "proven; it is settled through another channel or by a person"
        )

    async def _health(self) -> ProviderHealth:
        try:
            shown = await self._open("inbox")
            await shown.account.wait_for()
        except (SignInFailed, TransientFailure) as exc:
            return ProviderHealth(
                provider=PROVIDER, mailbox_id=self._mailbox_id, ok=False, detail=str(exc)
            )
        return ProviderHealth(
            provider=PROVIDER,
            mailbox_id=self._mailbox_id,
            ok=True,
            detail=f"Outlook on the web shows mailbox {self._mailbox_id}",
        )

    async def aclose(self) -> None:
        self._page = None
        await self._browser.aclose()


def _marker(message: OutgoingMessage, conversation: str) -> Marker:
    """The native marker of a send: its conversation (none for a new one: the newest
    conversations of Sent Items are searched), and the send's token, which the
    adapter writes as the class of the block holding what we wrote (Outlook on the web
    sets neither our Message-ID nor a header of ours; the class is kept, unseen)."""
    token = mime.send_token(message.internet_message_id)
    return Marker(kind=MarkerKind.NATIVE, value=f"{MARKER_PREFIX}{conversation}:{token}")


def _stored_copy(raw: bytes, rest_id: str) -> StoredCopy:
    """A sent copy as read back, its thread named as the core names threads (the message
    its References name first, else the one it answers, else itself)."""
    parsed = rfc822.parse(raw)
    references = rfc822.header_ids(parsed, "References")
    answers = rfc822.header_ids(parsed, "In-Reply-To")
    first = references[0] if references else next(iter(answers), None)
    own = rfc822.header_ids(parsed, "Message-ID")
    thread = thread_alias(first or next(iter(own), rest_id))
    return rfc822.stored_copy(
        raw, provider_message_id=rest_id, provider_thread_id=thread, delivered=True
    )


def _carries(markup: str, token: str) -> bool:
    """Whether a stored body's block of ours has the send's token as its class (Exchange
    prefixes the classes of what it shows with ``x_``)."""
    return re.search(rf'class="(?:x_)?{re.escape(token)}"', markup) is not None


def _wrapped(message: OutgoingMessage) -> str:
    """What is inserted into the editor: the rendered HTML in a block whose class is the
    send's token (the marker)."""
    token = mime.send_token(message.internet_message_id)
    return f'<div class="{token}">{_html_of(message)}</div>'


async def _as_planned(composer: Composer, message: OutgoingMessage) -> bool:
    """Whether a reopened draft holds what the send planned: the text of our block as the
    page's own parser reads the planned HTML, and the planned files by name."""
    same_text = await composer.body.evaluate(
        """(el, [token, markup]) => {
            const block = el.querySelector('.' + CSS.escape(token));
            const planned = document.createElement('div');
            planned.innerHTML = markup;
            return block !== null && block.textContent === planned.textContent;
        }""",
        [mime.send_token(message.internet_message_id), _wrapped(message)],
    )
    names = await composer.attached.evaluate_all(
        "els => els.map(e => e.getAttribute('aria-label'))"
    )
    return bool(same_text) and sorted(names) == sorted(f.ref.name for f in message.attachments)


def _what(exc: PlaywrightError) -> str:
    """A Playwright error in a line: its kind and first line (never its call log)."""
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return f"{type(exc).__name__}: {first[:160]}"


def _folder_of(path: str) -> str:
    parts = urlsplit(path).path.split("/")
    return parts[parts.index("id") - 1] if "id" in parts[1:] else "inbox"


def sent_answer(status: int, answer: object) -> dict[str, Any]:
    """What Outlook's answer to Send (its status, and its JSON when it is 200) says: the
    sent message's ids; else ``NotHandedOver`` for the app's refusals of a message as it is,
    ``AccessRefused`` for 403, ``OutcomeUnknown`` for anything else (a draft gone, a 5xx,
    429, an answer that cannot be read): it may have gone out."""
    if status == 404:  # the draft is gone: sent (perhaps by this very press) or discarded
        raise OutcomeUnknown("Outlook no longer has the draft Send was pressed on")
    if status == 403:
        raise AccessRefused(f"Outlook refused to send for this account (HTTP {status})")
    if status in REFUSALS:
        raise NotHandedOver(f"Outlook refused the message (HTTP {status}); nothing was sent")
    if status != 200 or not isinstance(answer, dict) or not answer.get("sent"):  # pyright: ignore[reportUnknownMemberType]
        raise OutcomeUnknown(f"Outlook's answer to Send could not be read (HTTP {status})")
    return dict(answer)  # pyright: ignore[reportUnknownArgumentType]


async def _json_of(response: Response) -> object:
    try:
        return await response.json()
    except (PlaywrightError, ValueError):
        return None


async def _discard(composer: Composer, timeout_ms: float) -> None:
    """Discard what the composer holds and wait for the page the app goes to after it (so
    no later navigation of ours races the app's); a page that stops answering within
    ``timeout_ms`` is left as it is."""
    try:
        async with composer.root.page.expect_navigation(timeout=timeout_ms):
            await composer.discard.click(timeout=timeout_ms)
    except PlaywrightError:
        return


async def _discard_stuck(composer: Composer) -> None:
    """Discard the draft of a composer that stopped answering, if it still can (briefly)."""
    await _discard(composer, DISCARD_MS)


async def _goto(page: Page, url: str) -> None:
    """Go to ``url``; once more when a navigation the app started itself aborted ours."""
    try:
        await page.goto(url)
    except PlaywrightError as exc:
        if "ERR_ABORTED" not in str(exc) and "interrupted by another navigation" not in str(exc):
            raise
        await page.goto(url)


async def _row_values(shown: MailPage) -> list[tuple[str, str, str]]:
    """Each row's conversation id, accessible name and link."""
    found: list[list[str]] = await shown.rows.evaluate_all(
        "rows => rows.map(r => [r.dataset.convid || '', r.getAttribute('aria-label') || '',"
        " r.dataset.href || ''])"
    )
    return [(convid, name, link) for convid, name, link in found]


def _is_send(response: Response) -> bool:
    return response.request.method == "POST" and response.url.endswith("/_api/send")


def _lists(to: Sequence[str], cc: Sequence[str]) -> tuple[tuple[str, tuple[str, ...]], ...]:
    return (("to", tuple(to)), ("cc", tuple(cc)))


async def _chips(composer: Composer, name: str) -> list[str]:
    return await composer.chips(name).evaluate_all("els => els.map(e => e.dataset.address)")


def _html_of(message: OutgoingMessage) -> str:
    if message.html is not None:
        return message.html
    lines = "".join(
        f"<div>{html.escape(line) or '<br>'}</div>" for line in message.text.split("\n")
    )
    return f'<div dir="ltr">{lines}</div>'


async def _insert_html(composer: Composer, markup: str) -> None:
    """The rendered HTML inserted as HTML (the editor's insertHTML), never typed."""
    await composer.body.click()
    await composer.body.evaluate(
        "(el, markup) => { el.focus(); document.execCommand('insertHTML', false, markup); }",
        markup,
    )


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
