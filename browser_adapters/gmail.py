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
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import urljoin, urlsplit

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
from browser_adapters.gmail_pages import GmailComposer, GmailPage, OriginalPage
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
    stored_copy,
    what,
    wrapped,
)
from managed_login.flow import WorkerSignIn
from managed_login.google import GoogleLogin
from managed_login.totp import Codes

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
        self._settings_checked = False
        self._by_message_id: dict[str, _Message] = {}
        self._indexed: set[str] = set()
        self.capabilities_ = Capabilities(
            channel=Channel.BROWSER,
            native_threads=False,
            markers=(MarkerKind.NATIVE,),
            searches=(MarkerKind.HEADER, MarkerKind.MESSAGE_ID),
            sent_copy_latency=sent_copy_latency,
            page_size=page_size,
        )

    @property
    def capabilities(self) -> Capabilities:
        return self.capabilities_

    def _arrived(self, page: Page) -> Locator:
        return GmailPage(page).account

    async def _signed_in_as(self, page: Page) -> str:
        return await GmailPage(page).account.get_attribute("aria-label") or ""

    async def _go(self, page: Page, url: str) -> None:
        """A whole load of ``url`` (a new address after ``#`` alone would keep the page the
        app drew before, and would not meet a sign-in at the server)."""
        same_page = urlsplit(page.url)._replace(fragment="") == urlsplit(url)._replace(fragment="")
        await goto(page, url)
        if same_page:
            await page.reload()

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
        """The list's threads as its rows show them, newest first: each one's id and its
        last message's (once the list shows a row, or says it is empty)."""
        shown = await self._open("#" + folder)
        rows = shown.rows(folder)
        await rows.first.or_(shown.empty).wait_for()
        found: list[list[str]] = await rows.evaluate_all(
            "rows => rows.map(r => { const s = r.querySelector('[data-legacy-last-message-id]');"
            " return [r.dataset.legacyThreadId || '', s ? s.dataset.legacyLastMessageId : '']; })"
        )
        return [(thread, last) for thread, last in found if _ID.fullmatch(thread)]

    async def _thread(self, thread: str) -> list[_Message]:
        """A thread's messages, oldest first, with each one's sender (nothing when the
        mailbox has no such thread)."""
        await self._no_mark_read()
        shown = await self._open(f"#inbox/{thread}")
        heading = shown.heading(int(thread, 16))
        await heading.or_(shown.rows("inbox").first).or_(shown.empty).wait_for()
        if not await heading.is_visible():
            return []
        found: list[list[str]] = await shown.messages.evaluate_all(
            "els => els.map(e => { const who = e.querySelector('[email]');"
            " return [e.dataset.legacyMessageId || '', who ? who.getAttribute('email') : '']; })"
        )
        return [_Message(mid, thread, sender.lower()) for mid, sender in found]

    async def _scanned(self, message: _Message) -> ScannedMessage:
        raw = await self._source(message.id)

        def thread(*_: object) -> str:
            return message.thread

        try:
            envelope = rfc822.normalize(
                raw,
                provider=PROVIDER,
                mailbox_id=self._mailbox_id,
                provider_message_id=message.id,
                thread_id_for=thread,
                fallback_received_at=datetime.now(UTC),
            )
        except Exception as exc:  # a message the app shows but no parser reads
            return ScannedMessage(item_ref=message.id, error=f"could not be normalized ({exc})")
        self._indexed.add(message.id)
        if envelope.internet_message_id is not None:
            self._by_message_id[envelope.internet_message_id] = message
        return ScannedMessage(item_ref=message.id, envelope=envelope)

    async def _source(self, message_id: str) -> bytes:
        """A message's exact bytes: "Show original", then its "Download Original"."""
        if not _ID.fullmatch(message_id):
            raise NotFound(f"{message_id!r} is not a Gmail message id")
        if not self._verified:
            await self._open(self.HOME)  # whose session it is, checked where the app shows it
        page = await self._open_page(f"?view=om&permmsgid=msg-f:{int(message_id, 16)}")
        original = OriginalPage(page)
        await original.title.or_(original.missing).wait_for()
        if not await original.title.is_visible():
            raise NotFound(f"mailbox {self._mailbox_id} shows no message {message_id!r}")
        href = await original.download.get_attribute("href") or ""
        response = await page.request.get(urljoin(page.url, href))
        if response.status == 404:
            raise NotFound(f"mailbox {self._mailbox_id} shows no message {message_id!r}")
        if not response.ok or not self._in_app(response.url):
            raise TransientFailure(
                f"mailbox {self._mailbox_id}: Gmail did not give the original of "
                f"{message_id!r} (HTTP {response.status}); try again later"
            )
        return await response.body()

    async def _fetch_body(self, body_ref: str) -> MessageBody:
        return rfc822.body(await self._source(body_ref))

    async def _fetch_attachment(self, ref: str) -> AttachmentData:
        message, _, index = ref.rpartition("/")
        if not message or not index.isdigit():
            raise NotFound(f"{ref!r} is not an attachment reference of this channel")
        found = rfc822.attachments(await self._source(message), message)
        if int(index) >= len(found):
            raise NotFound(f"message {message!r} of mailbox {self._mailbox_id} has no file {index}")
        return found[int(index)]

    # -- sending -------------------------------------------------------------------------

    async def _prepare(self, message: OutgoingMessage) -> Handover:
        check_writable(message, self._mailbox_id, "Gmail", LARGEST)
        parent = None if message.in_reply_to is None else await self._parent(message)
        return Handover(
            message=message,
            channel=Channel.BROWSER.value,
            recipients=lists([a.address for a in message.to], [a.address for a in message.cc]),
            marker=_marker(message, parent.thread if parent else ""),
        )

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

    async def _send(self, handover: Handover) -> SendResult:
        message = handover.message
        answer = await self._written_and_sent(handover)
        sent = str(answer["sent"])
        given = await self._message_id_of(sent) or message.internet_message_id
        first = message.references[0] if message.references else message.in_reply_to
        return SendResult(
            provider_message_id=sent,
            provider_thread_id=message.provider_thread_id or thread_alias(first or given),
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
        composer: GmailComposer | None = None
        try:
            if token in self._unsent:
                await self._saved_draft(handover.message, keep=False)
            composer = await self._composer(handover.message)
            await self._write(composer, handover)
        except PlaywrightError as exc:
            self._unsent.add(token)
            if composer is not None:
                await discard(composer.discard, DISCARD_MS)
            raise NotHandedOver(
                f"mailbox {self._mailbox_id}: Gmail's composer did not answer ({what(exc)}); "
                "Send was not pressed"
            ) from None
        self._unsent.discard(token)
        try:
            return await self._press_send(composer.send, _is_send)
        except SignedOut:  # refused for want of a session: nothing went out
            return await self._send_again(handover)

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

    async def _write(self, composer: GmailComposer, handover: Handover) -> None:
        """The reply as planned: recipients (checked), the subject where the composer has
        one, the HTML, the files."""
        message = handover.message
        await composer.body.wait_for()
        await self._recipients(composer, handover)
        if await composer.subject.count():
            await composer.subject.fill(message.subject)
        await insert_html(composer.body, wrapped(message))
        if message.attachments:
            await composer.attach.set_input_files(
                [
                    {"name": f.ref.name, "mimeType": f.ref.content_type, "buffer": f.data}
                    for f in message.attachments
                ]
            )
            await composer.attached.nth(len(message.attachments) - 1).wait_for()

    async def _recipients(self, composer: GmailComposer, handover: Handover) -> None:
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
                "Gmail's recipient chips are not the plan (nothing sent): " + "; ".join(problems)
            )

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
        except PlaywrightError as exc:
            raise NotHandedOver(
                f"mailbox {self._mailbox_id}: Gmail did not answer while the reply was written "
                f"again ({what(exc)}); Send was not pressed again"
            ) from None
        try:
            return await self._press_send(composer.send, _is_send)
        except SignedOut:
            raise NotHandedOver(
                f"mailbox {self._mailbox_id}: Gmail signed the browser out again at Send; "
                "nothing was sent"
            ) from None

    async def _saved_draft(
        self, message: OutgoingMessage, *, keep: bool = True
    ) -> GmailComposer | None:
        """The app's saved draft of this send (its block carries the send's token) whose
        body and files are as planned, open; every other saved draft of the send is
        discarded, so none is left to be sent by hand (``keep`` False: every one is)."""
        token = mime.send_token(message.internet_message_id)
        kept: str | None = None
        for href in await self._draft_links():
            composer = await self._open_draft(href)
            if not carries(await composer.body.inner_html(), token):
                continue
            planned = await as_planned(composer.body, composer.attached, message)
            if keep and kept is None and planned:
                kept = href
                continue
            await discard(composer.discard, self._browser.timeout_ms)
        return None if kept is None else await self._open_draft(kept)

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

    async def _message_id_of(self, message_id: str) -> str | None:
        """The Message-ID Gmail gave a message we sent (Gmail on the web sets its own), read
        from its original; None while it does not show (the message went out: nothing here
        may fail the send)."""
        try:
            raw = await self._sent_source(message_id, self._source)
        except (ProviderError, PlaywrightError):  # a sign-in, a page that stopped answering
            return None
        ids = rfc822.header_ids(rfc822.parse(raw), "Message-ID")
        return ids[0] if ids else None

    # -- our sent copies -----------------------------------------------------------------

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
        the newest ``SENT_SCAN`` threads of Sent. None only when Sent lists fewer threads
        than a page holds; else the absence is not proven (``TransientFailure``)."""
        rows = [t for t, _ in await self._rows("sent")]
        order = [*([thread] if thread and _ID.fullmatch(thread) else []), *rows]
        for each in list(dict.fromkeys(order))[:SENT_SCAN]:
            for message in reversed(await self._thread(each)):
                if message.sender != self._mailbox_id:
                    continue
                copy = ours(await self._sent_source(message.id, self._source), message.id)
                if copy is not None:
                    return copy
        if len(rows) < SENT_SCAN:
            return None
        raise TransientFailure(
            f"mailbox {self._mailbox_id}: no copy among the newest {SENT_SCAN} threads of "
            "Sent, and Gmail lists more: its absence is not proven; it is settled through "
            "another channel or by a person"
        )


def _marker(message: OutgoingMessage, thread: str) -> Marker:
    """The native marker of a send: the parent's thread (none for a new one: the newest
    threads of Sent are searched), and the send's token, which the adapter writes as the
    class of the block holding what we wrote (Gmail sets its own Message-ID and no header
    of ours)."""
    token = mime.send_token(message.internet_message_id)
    return Marker(kind=MarkerKind.NATIVE, value=f"{MARKER_PREFIX}{thread}:{token}")


def _by_token(raw: bytes, ref: str, token: str) -> StoredCopy | None:
    copy = _ours(stored_copy(raw, ref))
    return copy if carries(copy.html or "", token) else None


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


def _is_send(response: Response) -> bool:
    return response.request.method == "POST" and response.url.endswith("/_api/send")


async def _chips(composer: GmailComposer, name: str) -> list[str]:
    return await composer.chips(name).evaluate_all("els => els.map(e => e.dataset.address)")


DEFAULT_URL = "https://mail.google.com/mail/u/0/"


def open_gmail_web(
    browsers: Browsers,
    workspace_id: str,
    binding: MailboxBinding,
    *,
    read: Callable[[str], Secret],
    person_seconds: float | None = None,
) -> GmailWeb:
    """The mailbox's Gmail on the web channel, its worker's secrets read by name from the
    vault when a login needs them."""
    access = binding.browser
    if access.account is not None and access.account != binding.mailbox_id:
        raise Unsupported(
            f"mailbox {binding.mailbox_id}: this version signs in to Gmail as the mailbox "
            f"itself, not as another account ({access.account}); remove browser.account"
        )

    def worker() -> WorkerSignIn:
        return WorkerSignIn(
            account=access.account or binding.mailbox_id,
            password=read(access.password),
            codes=Codes(read(access.totp)),
        )

    return GmailWeb(
        MailboxBrowser(browsers, workspace_id, binding.mailbox_id),
        binding.mailbox_id,
        access.url or DEFAULT_URL,
        worker,
        workspace_id=workspace_id,
        account=access.account,
        person_seconds=person_seconds,
        sent_copy_latency=timedelta(seconds=access.sent_copy_latency_seconds),
    )
