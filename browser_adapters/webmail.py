"""What the mail web apps' channels share: one mailbox's browser held for each operation,
the app's page signed in (managed login in a context of its own, the account re-verified
before anything is read), Send pressed once and its answer read, and the small page helpers
(a bounded discard, a navigation made again when the app's own aborted it, HTML inserted as
HTML, never typed).

A subclass is one app: its mail system (``PROVIDER``), its login flow, the locator only the
signed-in app shows, and the port's operations (``_changes``, ``_send``, ...)."""

from __future__ import annotations

import base64
import hashlib
import html
import json
import logging
import re
import zlib
from abc import ABC, abstractmethod
from collections.abc import AsyncGenerator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, ClassVar, Protocol, TypeVar

from playwright.async_api import Error as PlaywrightError
from playwright.async_api import Locator, Page, Response

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
from agent.events import Event, emit
from agent.providers import mime, rfc822
from browser_adapters.session import Browsers, MailboxBrowser
from managed_login.flow import LoginReport, PageByPage, Step, WorkerSignIn
from managed_login.totp import Codes

DIGEST = 12
DISCARD_MS = 2_000
"""How long a composer that stopped answering is given to discard its draft."""
REFUSALS = frozenset({400, 413, 415, 422})
"""Answers to Send that say the message was refused as it was (nothing went out)."""
SENT_SOURCE_BYTES = 32 * 1024 * 1024
"""The sent messages' sources a channel instance keeps, newest first (a sent message never
changes): at most this many bytes, however many messages."""
_ADDRESS = re.compile(r"[\w.+'-]+@[\w-]+(?:\.[\w-]+)+")


def digest(value: str) -> str:
    return hashlib.sha256(value.encode()).hexdigest()[:DIGEST]


@dataclass
class Cursor:
    """What a web channel read: each read conversation's row as it was (digests), and each
    read message (digests)."""

    prefix: str
    rows: dict[str, str] = field(default_factory=dict[str, str])
    seen: set[str] = field(default_factory=set[str])

    def encode(self) -> str:
        data = json.dumps({"r": self.rows, "s": sorted(self.seen)}, separators=(",", ":"))
        return self.prefix + base64.urlsafe_b64encode(zlib.compress(data.encode())).decode()

    @classmethod
    def decode(cls, prefix: str, text: str, app: str) -> Cursor:
        try:
            if not text.startswith(prefix):
                raise ValueError(text[:10])
            packed = base64.urlsafe_b64decode(text[len(prefix) :])
            data: Any = json.loads(zlib.decompress(packed))
            rows = {str(k): str(v) for k, v in dict(data["r"]).items()}
            return cls(prefix, rows, {str(s) for s in data["s"]})
        except (ValueError, KeyError, TypeError, zlib.error):
            raise CursorExpired(f"not a cursor of the {app} channel") from None


W = TypeVar("W", bound="WebMail")
LARGEST = 25 * 1024 * 1024
"""What both apps take of files in one message (25 MB)."""


class Composer(Protocol):
    """A web app's composer, as its page object names its parts."""

    root: Locator
    subject: Locator
    body: Locator
    send: Locator
    discard: Locator
    status: Locator
    attach: Locator
    attached: Locator

    def chips(self, field: str) -> Locator: ...

    def field(self, name: str) -> Locator: ...

    def remove(self, address: str) -> Locator: ...


class SignedOut(Exception):
    """The app refused Send for want of a session (nothing was sent)."""


class WebMail(ABC):
    """One mailbox through its mail system's web app (implements ``MailProvider``)."""

    PROVIDER: ClassVar[str]
    APP: ClassVar[str]
    """The app's name in what an operator reads ("Outlook on the web")."""
    LOGIN: ClassVar[type[PageByPage]]
    HOME: ClassVar[str]
    """The app's mail list, relative to the app's address."""
    SEARCHES: ClassVar[tuple[MarkerKind, ...]]
    """The markers other channels of the mailbox set that ``find_sent`` searches."""
    MARKER_PREFIX: ClassVar[str]
    """How this channel's native markers begin."""
    CLASS_PREFIXES: ClassVar[str] = ""
    """A regex of what the app prefixes the classes of what it shows with."""
    SUBJECT_IN_EVERY_COMPOSER: ClassVar[bool] = True
    """Every composer of the app has a subject field (filled, waiting for it to show)."""
    SEND_CALL: ClassVar[str] = "/_api/send"
    """The call the app's Send makes (its answer is read)."""

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
        challenges: ChallengeKeeper | None = None,
    ) -> None:
        self._browser = browser
        self._challenges = challenges
        self._mailbox_id = mailbox_id.lower()
        self._account = (account or mailbox_id).lower()
        self._verified = False
        self._person_seconds = person_seconds
        """In a visible browser (``outloop login --headed``): how long a person has to
        complete a challenge managed login stopped at."""
        self._operator_asked = False
        self._app = app_url.rstrip("/") + "/"
        self._worker = worker
        self._workspace_id = workspace_id
        self._page: Page | None = None
        self._showing: str | None = None
        """The message the working page shows open, loaded by this operation: read there
        without loading it again. Forgotten at every other page load and when the
        operation ends."""
        self._unsent: set[str] = set()
        """Tokens of sends whose writing stopped before Send: their saved drafts are
        discarded before they are written again."""
        self._sent_sources: dict[str, bytes] = {}
        """Sources of sent messages read (a sent message never changes), newest last."""
        self.last_login: LoginReport | None = None
        self.capabilities_ = Capabilities(
            channel=Channel.BROWSER,
            native_threads=False,
            markers=(MarkerKind.NATIVE,),
            searches=self.SEARCHES,
            sent_copy_latency=sent_copy_latency,
            page_size=page_size,
        )
        self._setup()

    @abstractmethod
    def _setup(self) -> None:
        """The app's own state of a channel instance, made once."""

    @property
    def provider(self) -> str:
        return self.PROVIDER

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

    @abstractmethod
    async def _changes(self, cursor: str | None) -> ChangePage: ...

    @abstractmethod
    async def _find_sent(self, marker: Marker) -> StoredCopy | None: ...

    @abstractmethod
    def _arrived(self, page: Page) -> Locator:
        """What only the signed-in app shows (the account's button)."""

    @abstractmethod
    async def _signed_in_as(self, page: Page) -> str:
        """The text in which the app names the signed-in account."""

    def _forget_page(self) -> None:
        """What the working page showed is not carried into another operation."""
        self._showing = None

    @asynccontextmanager
    async def _driving(self) -> AsyncGenerator[None]:
        """Hold the mailbox's browser for one operation; what its page showed is not
        carried into the next."""
        async with self._browser.driving():
            self._forget_page()
            try:
                yield
            except PlaywrightError as exc:  # a page that stopped answering: every wait is bounded
                raise TransientFailure(
                    f"mailbox {self._mailbox_id}: {self.APP} did not answer ({what(exc)}); "
                    "try again later"
                ) from None
            finally:
                self._forget_page()

    # -- the page, signed in -------------------------------------------------------------

    def _in_app(self, url: str) -> bool:
        return url.startswith(self._app)

    async def _open_page(self, path: str) -> Page:
        """The app's page at ``path`` (relative to the app), signing in first when the app
        sends the browser to sign-in; the account verified on a new page."""
        page = await self._working_page()
        self._forget_page()
        await self._go(page, self._app + path)
        if not self._in_app(page.url):
            await self._sign_in()
            page = await self._working_page()
            await self._go(page, self._app + path)
            if not self._in_app(page.url):
                raise SignInFailed(
                    f"mailbox {self._mailbox_id}: {self.APP} sent the browser to sign in again "
                    "right after a managed login",
                    "run `outloop login` for the mailbox and check its output",
                )
        if not self._verified:
            await self._verify_account(page)
        return page

    async def _go(self, page: Page, url: str) -> None:
        """Load ``url`` in the working page."""
        await goto(page, url)

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
                page = await self._open_page(self.HOME)
            finally:
                self._operator_asked = False
            await self._arrived(page).wait_for()
            if self.last_login is None:  # the kept session was signed in: no sign-in ran
                self._login_record("already_signed_in", "kept_session", logging.INFO)
                return LoginReport(account=self._mailbox_id, steps=(), signed_in=False)
            return self.last_login

    async def _sign_in(self) -> LoginReport:
        """Managed login in a context of its own; the signed-in account verified before
        the session is kept and anything is read. Its outcome is a decision record."""
        try:
            report = await self._signing_in()
        except AuthChallengeUnresolved as exc:
            self._login_record("challenge", exc.challenge, logging.WARNING)
            raise
        except ProviderError as exc:
            self._login_record("failed", type(exc).__name__, logging.WARNING)
            raise
        by_person = Step.BY_PERSON in report.steps
        outcome = "signed_in" if report.signed_in else "already_signed_in"
        self._login_record(outcome, "by_person" if by_person else "managed", logging.INFO)
        return report

    def _login_record(self, outcome: str, reason: str, level: int) -> None:
        emit(
            Event.LOGIN,
            level=level,
            workspace_id=self._workspace_id,
            mailbox_id=self._mailbox_id,
            channel=Channel.BROWSER.value,
            outcome=outcome,
            reason=reason,
        )

    async def _signing_in(self) -> LoginReport:
        self._page = None
        self._refuse_a_refused_password()
        self._refuse_a_kept_challenge()
        async with self._browser.sign_in_context() as context:
            page = await context.new_page()
            await goto(page, self._app)
            worker = self._worker()
            worker.codes.used_through(self._browser.last_code_step())
            arrived = self._arrived(page)
            login = self.LOGIN(
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
            except AuthChallengeUnresolved as exc:
                if self._person_seconds is None:
                    if self._challenges is not None:
                        self._challenges.keep(exc)
                    raise
                await arrived.wait_for(timeout=self._person_seconds * 1000)
                report = LoginReport(
                    account=worker.account, steps=(Step.BY_PERSON, Step.ARRIVED), signed_in=True
                )
            finally:
                self._browser.keep_code_step(worker.codes.last_step)
            await self._verify_account(page)
        self._browser.clear_password_refused()
        self.last_login = report
        return report

    def _refuse_a_refused_password(self) -> None:
        refused_at = self._browser.password_refused_at()
        if refused_at is not None and not self._operator_asked:
            raise PasswordRefused(
                f"mailbox {self._mailbox_id}: managed login stopped after the sign-in refused "
                f"the stored password ({refused_at}); it does not type it again by itself",
                "store the worker's current password with `outloop vault set`, then run "
                f"`outloop login --workspace {self._workspace_id} --mailbox {self._mailbox_id}`",
            )

    def _refuse_a_kept_challenge(self) -> None:
        """A challenge a person has not resolved yet stops the login again at once: the
        provider's sign-in is not asked again (an operator's ``outloop login`` may)."""
        kept = self._challenges.kept() if self._challenges is not None else None
        if kept is not None and not self._operator_asked:
            raise kept

    async def _verify_account(self, page: Page) -> None:
        """The app shows the bound account, or nothing is read: the kept session is
        dropped and the login refused."""
        shown = {a.lower() for a in _ADDRESS.findall(await self._signed_in_as(page))}
        if self._account not in shown:
            self._browser.forget()
            self._page = None
            raise SignInFailed(
                f"mailbox {self._mailbox_id}: the browser is signed in to another account than "
                f"{self._account}; nothing was read and the session was dropped",
                "check the mailbox's worker account in the Workspace Context (browser.account)",
            )
        self._verified = True

    # -- sending -------------------------------------------------------------------------

    @abstractmethod
    async def _source(self, ref: str) -> bytes:
        """A message's exact bytes (``NotFound`` when the app shows no such message)."""

    @abstractmethod
    async def _parent_thread(self, message: OutgoingMessage) -> str:
        """The thread (or conversation) of the message a reply answers, as the app names it."""

    @abstractmethod
    async def _composer(self, message: OutgoingMessage) -> Composer:
        """Reply on the parent, or a new message's composer for one that starts a thread."""

    @abstractmethod
    async def _draft_links(self) -> list[str]:
        """Where each saved draft opens, newest first."""

    @abstractmethod
    async def _open_draft(self, href: str) -> Composer:
        """A saved draft, open in its composer."""

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

    def _scan(self, raw: bytes, ref: str, thread: str) -> ScannedMessage:
        """A message as intake takes it in, given its provider ids."""

        def thread_of(*_: object) -> str:
            return thread

        try:
            envelope = rfc822.normalize(
                raw,
                provider=self.PROVIDER,
                mailbox_id=self._mailbox_id,
                provider_message_id=ref,
                thread_id_for=thread_of,
                fallback_received_at=datetime.now(UTC),
            )
        except Exception as exc:  # a message the app shows but no parser reads
            return ScannedMessage(item_ref=ref, error=f"could not be normalized ({exc})")
        return ScannedMessage(item_ref=ref, envelope=envelope)

    async def _prepare(self, message: OutgoingMessage) -> Handover:
        check_writable(message, self._mailbox_id, self.APP, LARGEST)
        thread = "" if message.in_reply_to is None else await self._parent_thread(message)
        token = mime.send_token(message.internet_message_id)
        return Handover(
            message=message,
            channel=Channel.BROWSER.value,
            recipients=lists([a.address for a in message.to], [a.address for a in message.cc]),
            marker=Marker(kind=MarkerKind.NATIVE, value=f"{self.MARKER_PREFIX}{thread}:{token}"),
        )

    async def _send(self, handover: Handover) -> SendResult:
        message = handover.message
        answer = await self._written_and_sent(handover)
        sent = str(answer["sent"])
        given = await self._message_id_of(sent) or message.internet_message_id
        return SendResult(
            provider_message_id=sent,
            provider_thread_id=self._sent_thread(message, given),
            internet_message_id=given,
            channel=Channel.BROWSER.value,
            delivered=True,
            accepted_at=datetime.now(UTC),
        )

    def _sent_thread(self, message: OutgoingMessage, given: str) -> str:
        """The thread a send reports, as the core names threads (the message its
        References name first, else the one it answers, else itself)."""
        first = message.references[0] if message.references else message.in_reply_to
        return thread_alias(first or given)

    async def _written_and_sent(self, handover: Handover) -> dict[str, Any]:
        """The message written and Send pressed once; a page that stops answering before
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
                await discard_stuck(composer)
            raise NotHandedOver(
                f"mailbox {self._mailbox_id}: {self.APP}'s composer did not answer "
                f"({what(exc)}); Send was not pressed"
            ) from None
        self._unsent.discard(token)
        try:
            return await self._press_send(composer.send)
        except SignedOut:  # refused for want of a session: nothing went out
            return await self._send_again(handover)

    async def _write(self, composer: Composer, handover: Handover) -> None:
        """The message as planned: recipients (checked), the subject where the composer
        has one, the HTML, the files."""
        message = handover.message
        await composer.body.wait_for()
        await self._recipients(composer, handover)
        await self._subject(composer, message)
        await insert_composed(composer, wrapped(message))
        if message.attachments:
            await composer.attach.set_input_files(
                [
                    {"name": f.ref.name, "mimeType": f.ref.content_type, "buffer": f.data}
                    for f in message.attachments
                ]
            )
            await composer.attached.nth(len(message.attachments) - 1).wait_for()

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
                f"{self.APP}'s recipient chips are not the plan (nothing sent): "
                + "; ".join(problems)
            )

    async def _send_again(self, handover: Handover) -> dict[str, Any]:
        """After the session ended at Send: sign in, reopen the draft the app saved (its
        recipients set and checked again), or write the message again if none was saved
        as planned, and send."""
        try:
            await self._sign_in()
            composer = await self._saved_draft(handover.message)
            if composer is None:
                composer = await self._composer(handover.message)
                await self._write(composer, handover)
            else:
                await self._recipients(composer, handover)
                await self._subject(composer, handover.message)
        except PlaywrightError as exc:
            raise NotHandedOver(
                f"mailbox {self._mailbox_id}: {self.APP} did not answer while the message was "
                f"written again ({what(exc)}); Send was not pressed again"
            ) from None
        try:
            return await self._press_send(composer.send)
        except SignedOut:
            raise NotHandedOver(
                f"mailbox {self._mailbox_id}: {self.APP} signed the browser out again at "
                "Send; nothing was sent"
            ) from None

    async def _saved_draft(self, message: OutgoingMessage, *, keep: bool = True) -> Composer | None:
        """The app's saved draft of this send (its block carries the send's token) whose
        body and files are as planned, open; every other saved draft of the send (a second
        one, or one saved half-written) is discarded, so none is left to be sent by hand
        (``keep`` False: every one is)."""
        token = mime.send_token(message.internet_message_id)
        kept: str | None = None
        for href in await self._draft_links():
            composer = await self._open_draft(href)
            if not carries(await composer.body.inner_html(), token, self.CLASS_PREFIXES):
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

    async def _message_id_of(self, ref: str) -> str | None:
        """The Message-ID the mail system gave a message we sent (the web apps set their
        own), read from its source; None while the copy does not show yet (the message went
        out: nothing here may fail the send)."""
        try:
            raw = await self._sent_source(ref, self._source)
        except (ProviderError, PlaywrightError):  # a sign-in, a page that stopped answering
            return None
        ids = rfc822.header_ids(rfc822.parse(raw), "Message-ID")
        return ids[0] if ids else None

    async def _subject(self, composer: Composer, message: OutgoingMessage) -> None:
        """The planned subject, where the composer has a subject field."""
        if self.SUBJECT_IN_EVERY_COMPOSER or await composer.subject.count():
            await composer.subject.fill(message.subject)

    def _is_send(self, response: Response) -> bool:
        return response.request.method == "POST" and response.url.endswith(self.SEND_CALL)

    # -- sent copies ---------------------------------------------------------------------

    async def _sent_source(self, ref: str, read: Callable[[str], Awaitable[bytes]]) -> bytes:
        """A sent message's source, read once per channel instance (the newest kept, up
        to ``SENT_SOURCE_BYTES``)."""
        raw = self._sent_sources.pop(ref, None) or await read(ref)
        self._sent_sources[ref] = raw
        while sum(map(len, self._sent_sources.values())) > SENT_SOURCE_BYTES:
            del self._sent_sources[next(iter(self._sent_sources))]
        return raw

    async def _press_send(self, button: Locator) -> dict[str, Any]:
        """Send pressed once and the app's answer read: refused for want of a session
        (``SignedOut``, nothing went out), refused outright (``NotHandedOver``), or anything
        that may have sent it (a lost or unreadable answer, a draft already gone) is
        ``OutcomeUnknown``: settled from the sent copies, never sent again blind."""
        try:
            async with button.page.expect_response(self._is_send) as answered:
                await button.click()
            response: Response = await answered.value
        except PlaywrightError as exc:
            raise OutcomeUnknown(
                f"{self.APP}'s answer to Send was lost ({type(exc).__name__})"
            ) from None
        if response.status == 401:
            raise SignedOut
        answer = await json_of(response) if response.status == 200 else None
        return send_answer(self.APP, response.status, answer)

    async def _health(self) -> ProviderHealth:
        try:
            page = await self._open_page(self.HOME)
            await self._arrived(page).wait_for()
        except (SignInFailed, TransientFailure) as exc:
            return ProviderHealth(
                provider=self.PROVIDER, mailbox_id=self._mailbox_id, ok=False, detail=str(exc)
            )
        return ProviderHealth(
            provider=self.PROVIDER,
            mailbox_id=self._mailbox_id,
            ok=True,
            detail=f"{self.APP} shows mailbox {self._mailbox_id}",
        )

    async def aclose(self) -> None:
        self._page = None
        await self._browser.aclose()


async def _chips(composer: Composer, name: str) -> list[str]:
    return await composer.chips(name).evaluate_all("els => els.map(e => e.dataset.address)")


async def insert_composed(composer: Composer, markup: str) -> None:
    """The rendered HTML inserted into the composer's editor as HTML, never typed."""
    await insert_html(composer.body, markup)


def check_writable(message: OutgoingMessage, mailbox_id: str, app: str, largest: int) -> None:
    """``ProviderError`` for a message the app cannot write as planned: an address that is
    not one, another sender, more files than it takes."""
    try:
        for address in (message.sender, *message.to, *message.cc):
            mime.mailbox(address)
    except mime.UnsendableHeader as exc:
        raise ProviderError(f"the message cannot be written in {app}: {exc}") from None
    if message.sender.address != mailbox_id:
        raise ProviderError(f"{app} sends from {mailbox_id} only")
    if message.attachments and sum(len(f.data) for f in message.attachments) > largest:
        raise ProviderError(f"{app} takes up to {largest // 2**20} MB of files in one message")


def send_answer(app: str, status: int, answer: object) -> dict[str, Any]:
    """What a web app's answer to Send (its status, and its JSON when it is 200) says: the
    sent message's ids; else ``NotHandedOver`` for the app's refusals of a message as it is,
    ``AccessRefused`` for 403, ``OutcomeUnknown`` for anything else (a draft gone, a 5xx,
    429, an answer that cannot be read): it may have gone out."""
    if status == 404:  # the draft is gone: sent (perhaps by this very press) or discarded
        raise OutcomeUnknown(f"{app} no longer has the draft Send was pressed on")
    if status == 403:
        raise AccessRefused(f"{app} refused to send for this account (HTTP {status})")
    if status in REFUSALS:
        raise NotHandedOver(f"{app} refused the message (HTTP {status}); nothing was sent")
    if status != 200 or not isinstance(answer, dict) or not answer.get("sent"):  # pyright: ignore[reportUnknownMemberType]
        raise OutcomeUnknown(f"{app}'s answer to Send could not be read (HTTP {status})")
    return dict(answer)  # pyright: ignore[reportUnknownArgumentType]


def stored_copy(raw: bytes, ref: str) -> StoredCopy:
    """A sent copy as read back, its thread named as the core names threads (the message
    its References name first, else the one it answers, else itself)."""
    parsed = rfc822.parse(raw)
    references = rfc822.header_ids(parsed, "References")
    answers = rfc822.header_ids(parsed, "In-Reply-To")
    first = references[0] if references else next(iter(answers), None)
    own = rfc822.header_ids(parsed, "Message-ID")
    thread = thread_alias(first or next(iter(own), ref))
    return rfc822.stored_copy(
        raw, provider_message_id=ref, provider_thread_id=thread, delivered=True
    )


def what(exc: PlaywrightError) -> str:
    """A Playwright error in a line: its kind and first line (never its call log)."""
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return f"{type(exc).__name__}: {first[:160]}"


async def json_of(response: Response) -> object:
    try:
        return await response.json()
    except (PlaywrightError, ValueError):
        return None


async def discard(button: Locator, timeout_ms: float) -> None:
    """Press a composer's Discard and wait for the page the app goes to after it (so no
    later navigation of ours races the app's); a page that stops answering within
    ``timeout_ms`` is left as it is."""
    try:
        async with button.page.expect_navigation(timeout=timeout_ms):
            await button.click(timeout=timeout_ms)
    except PlaywrightError:
        return


async def discard_stuck(composer: Composer) -> None:
    """Discard the draft of a composer that stopped answering, if it still can (briefly)."""
    await discard(composer.discard, DISCARD_MS)


async def goto(page: Page, url: str) -> None:
    """Go to ``url``; once more when a navigation the app started itself aborted ours."""
    try:
        await page.goto(url)
    except PlaywrightError as exc:
        if "ERR_ABORTED" not in str(exc) and "interrupted by another navigation" not in str(exc):
            raise
        await page.goto(url)


def lists(to: Sequence[str], cc: Sequence[str]) -> tuple[tuple[str, tuple[str, ...]], ...]:
    return (("to", tuple(to)), ("cc", tuple(cc)))


def html_of(message: OutgoingMessage) -> str:
    if message.html is not None:
        return message.html
    lines = "".join(
        f"<div>{html.escape(line) or '<br>'}</div>" for line in message.text.split("\n")
    )
    return f'<div dir="ltr">{lines}</div>'


def wrapped(message: OutgoingMessage) -> str:
    """What is inserted into the editor: the rendered HTML in a block whose class is the
    send's token (the marker)."""
    token = mime.send_token(message.internet_message_id)
    return f'<div class="{token}">{html_of(message)}</div>'


async def insert_html(editor: Locator, markup: str) -> None:
    """The rendered HTML inserted as HTML (the editor's insertHTML), never typed."""
    await editor.click()
    await editor.evaluate(
        "(el, markup) => { el.focus(); document.execCommand('insertHTML', false, markup); }",
        markup,
    )


async def as_planned(editor: Locator, attached: Locator, message: OutgoingMessage) -> bool:
    """Whether a reopened draft holds what the send planned: the text of our block as the
    page's own parser reads the planned HTML, and the planned files by name."""
    same_text = await editor.evaluate(
        """(el, [token, markup]) => {
            const block = el.querySelector('.' + CSS.escape(token));
            const planned = document.createElement('div');
            planned.innerHTML = markup;
            return block !== null && block.textContent === planned.textContent;
        }""",
        [mime.send_token(message.internet_message_id), wrapped(message)],
    )
    names = await attached.evaluate_all("els => els.map(e => e.getAttribute('aria-label'))")
    return bool(same_text) and sorted(names) == sorted(f.ref.name for f in message.attachments)


def carries(markup: str, token: str, prefixes: str = "") -> bool:
    """Whether a stored body's block of ours has the send's token as its class (a web app
    may prefix the classes of what it shows: ``prefixes`` is a regex of them)."""
    return re.search(rf'class="(?:{prefixes})?{re.escape(token)}"', markup) is not None


class ChallengeKeeper(Protocol):
    """Where the mailbox's sign-in challenges are kept for every process of the station
    (``agent.services.challenges.Keeper``)."""

    def kept(self) -> AuthChallengeUnresolved | None: ...
    def keep(self, exc: AuthChallengeUnresolved) -> None: ...


def open_web_app(
    kind: type[W],
    default_url: str,
    browsers: Browsers,
    workspace_id: str,
    binding: MailboxBinding,
    *,
    read: Callable[[str], Secret],
    person_seconds: float | None = None,
    challenges: ChallengeKeeper | None = None,
) -> W:
    """The mailbox's channel through the web app ``kind`` drives (at ``default_url``
    unless the binding names another), its worker's secrets read by name from the vault
    when a login needs them."""
    access = binding.browser
    if access.account is not None and access.account != binding.mailbox_id:
        raise Unsupported(
            f"mailbox {binding.mailbox_id}: this version signs in to {kind.APP} as the "
            f"mailbox itself, not as another account ({access.account}); remove "
            "browser.account"
        )

    def worker() -> WorkerSignIn:
        return WorkerSignIn(
            account=access.account or binding.mailbox_id,
            password=read(access.password),
            codes=Codes(read(access.totp)),
        )

    return kind(
        MailboxBrowser(browsers, workspace_id, binding.mailbox_id),
        binding.mailbox_id,
        access.url or default_url,
        worker,
        workspace_id=workspace_id,
        account=access.account,
        person_seconds=person_seconds,
        sent_copy_latency=timedelta(seconds=access.sent_copy_latency_seconds),
        challenges=challenges,
    )
