"""A mailbox on any standards mail server: read over IMAP, sent through SMTP submission.

Reading (``changes``): the inbox is opened read-only (EXAMINE) and messages are fetched with
``BODY.PEEK[]``, so reading marks nothing seen; no flag, keyword or folder is written as
workflow state. A cursor is ``imap-v1.<uidvalidity>.<last uid read>.<highestmodseq>``: new
mail has a higher UID than anything read before, so a page is the next UIDs after the
cursor's, and mail delivered while a reader pages is read exactly once. Where the server has
CONDSTORE (RFC 7162) a cursor taken at the end of the folder also holds its HIGHESTMODSEQ:
an unchanged value means nothing arrived, and the search is skipped. A different UIDVALIDITY
(the folder was rebuilt) expires the cursor: the caller reads again from the start, and the
Message-ID keys of part 1 keep anything from being recorded twice.

Threads: IMAP has no thread id every channel shows, so ``native_threads`` is False and the
core keeps its own aliases. The id proposed here is named after the root of the message's
thread: the server's ``THREAD=REFS`` tree where it advertises it (it threads by References
and In-Reply-To only), else the first message the References (or In-Reply-To) name. Never
``THREAD=REFERENCES`` or ``ORDEREDSUBJECT``, which join messages by their subject.

Sending (``send``): SMTP submission (RFC 6409) over TLS or STARTTLS with AUTH, the envelope
(MAIL FROM, RCPT TO) set from the approved plan, never read from the headers. After the
server accepted the message, its copy is appended to the ``\\Sent`` folder (RFC 6154) with
our marker - unless the mailbox's settings say the submission server files one itself (as
Gmail's and Microsoft 365's do), in which case that copy is what ``find_sent`` searches and
a lost answer is settled from it. A copy we append proves nothing about a lost answer (it is
written only after an answer), so such a channel declares ``keeps_sent_copy`` False: a lost
answer goes to a person, while ``files_sent_copy`` says ``find_sent`` still reads back what
was sent.
"""

from __future__ import annotations

import contextlib
import functools
import ssl
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from email.utils import parsedate_to_datetime
from typing import Any, TypeVar, cast

import aiosmtplib
import anyio

from agent.domain.context import MailServer, Security
from agent.domain.envelope import thread_alias
from agent.domain.errors import (
    AuthenticationExpired,
    CursorExpired,
    NotFound,
    NotHandedOver,
    OutcomeUnknown,
    ProviderError,
    Unsupported,
)
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
from agent.ports import Clock
from agent.providers import imap_wire, mime, rfc822
from agent.providers.imap_session import (
    FolderStatus,
    ImapSession,
    PasswordSource,
    password_source,
    tls_context,
    tls_refused,
)
from agent.providers.retry import with_retries

CHANNEL = Channel.IMAP
MARKERS = (MarkerKind.MESSAGE_ID, MarkerKind.HEADER)
"""What marks our copy in Sent, best first: a standards server keeps every header."""
PAGE_SIZE = 100
CURSOR_VERSION = "imap-v1"
INBOX = b"INBOX"
FETCH_ITEMS = "(UID INTERNALDATE BODY.PEEK[])"
THREADING = "REFS"
"""The only server threading used: by References and In-Reply-To, never by subject."""


@dataclass(frozen=True)
class _Cursor:
    uidvalidity: int
    last_uid: int
    modseq: int | None

    def encode(self) -> str:
        modseq = "-" if self.modseq is None else str(self.modseq)
        return f"{CURSOR_VERSION}.{self.uidvalidity}.{self.last_uid}.{modseq}"

    @staticmethod
    def decode(text: str) -> _Cursor:
        parts = text.split(".")
        ok = len(parts) == 4 and parts[0] == CURSOR_VERSION
        ok = ok and parts[1].isdigit() and parts[2].isdigit()
        ok = ok and (parts[3] == "-" or parts[3].isdigit())
        if not ok:
            raise CursorExpired(f"{text[:40]!r} is not a cursor of this IMAP channel: read again")
        modseq = None if parts[3] == "-" else int(parts[3])
        return _Cursor(int(parts[1]), int(parts[2]), modseq)


def _ref(folder: bytes, uidvalidity: int, uid: int) -> str:
    return f"imap:{folder.decode('ascii', 'replace')}:{uidvalidity}:{uid}"


def _parse_ref(ref: str) -> tuple[bytes, int, int]:
    head, _, rest = ref.partition(":")
    folder, _, numbers = rest.rpartition(":")
    folder, _, validity = folder.rpartition(":")
    if head != "imap" or not folder or not validity.isdigit() or not numbers.isdigit():
        raise NotFound(f"{ref!r} is not an IMAP message reference (imap:<folder>:<validity>:<uid>)")
    return folder.encode("ascii", "replace"), int(validity), int(numbers)


F = TypeVar("F", bound=Callable[..., Coroutine[Any, Any, Any]])


def _one_at_a_time(method: F) -> F:
    """The IMAP connection serves one call at a time: two calls interleaving on it would
    each open a folder under the other."""

    @functools.wraps(method)
    async def run(self: ImapSmtpProvider, *args: Any, **kwargs: Any) -> Any:
        async with self._lock:  # pyright: ignore[reportPrivateUsage]
            return await method(self, *args, **kwargs)

    return cast(F, run)


class ImapSmtpProvider:
    """The MailProvider port on an IMAP server and its SMTP submission server.

    ``provider`` is the mail system (``imap`` for a standards server; ``google`` or
    ``microsoft`` for their IMAP endpoints). ``markers`` narrows the markers it sets;
    ``page_size`` is how many messages a page of changes holds at most."""

    def __init__(
        self,
        server: MailServer,
        mailbox_id: str,
        password: Secret | PasswordSource,
        *,
        provider: str = "imap",
        markers: tuple[MarkerKind, ...] = MARKERS,
        page_size: int = PAGE_SIZE,
        clock: Clock | None = None,
    ) -> None:
        if not markers or not set(markers) <= set(MARKERS):
            raise ValueError(f"an IMAP channel marks its copies by {', '.join(MARKERS)} only")
        self._server = server
        self._mailbox_id = mailbox_id.lower()
        self._password = password_source(password)
        self._provider = provider
        self._markers = markers
        self._page_size = page_size
        self._clock = clock
        self._session = ImapSession(server, self._mailbox_id, password)
        self._sent: bytes | None = None
        self._lock = anyio.Lock()
        self._threading: tuple[tuple[int, int | None, int | None], dict[int, int]] | None = None

    @property
    def provider(self) -> str:
        return self._provider

    @property
    def mailbox_id(self) -> str:
        return self._mailbox_id

    @property
    def capabilities(self) -> Capabilities:
        server_copy = self._server.submission_keeps_sent_copy
        latency = timedelta(seconds=self._server.sent_copy_latency_seconds)
        return Capabilities(
            channel=CHANNEL,
            key_basis=True,
            native_threads=False,
            markers=self._markers,
            keeps_sent_copy=server_copy,
            files_sent_copy=not server_copy,
            sent_copy_latency=latency if server_copy else timedelta(0),
            delivers=True,
            page_size=self._page_size,
        )

    def _now(self) -> datetime:
        return datetime.now(UTC) if self._clock is None else self._clock.now()

    # -- reading -------------------------------------------------------------------------

    @with_retries
    @_one_at_a_time
    async def changes(self, cursor: str | None) -> ChangePage:
        start = None if cursor is None else _Cursor.decode(cursor)
        status = await self._session.open_folder(INBOX)
        if start is not None and start.uidvalidity != status.uidvalidity:
            raise CursorExpired(
                f"mailbox {self._mailbox_id}: the inbox was rebuilt (UIDVALIDITY "
                f"{start.uidvalidity} is now {status.uidvalidity}): read again from the start"
            )
        last = 0 if start is None else start.last_uid
        if self._nothing_new(start, status):
            return ChangePage(items=(), cursor=self._cursor(status, last, True), more=False)
        uids = sorted(u for u in await self._session.uid_search(f"UID {last + 1}:*") if u > last)
        page = uids[: self._page_size]
        items = await self._read_page(status, page)
        more = len(uids) > len(page)
        return ChangePage(
            items=items,
            cursor=self._cursor(status, page[-1] if page else last, not more),
            more=more,
        )

    @staticmethod
    def _nothing_new(start: _Cursor | None, status: FolderStatus) -> bool:
        if start is None:
            return False
        if start.modseq is not None and status.highestmodseq == start.modseq:
            return True
        return status.uidnext is not None and status.uidnext <= start.last_uid + 1

    @staticmethod
    def _cursor(status: FolderStatus, last_uid: int, at_end: bool) -> str:
        modseq = status.highestmodseq if at_end else None
        return _Cursor(status.uidvalidity, last_uid, modseq).encode()

    async def _read_page(
        self, status: FolderStatus, uids: Sequence[int]
    ) -> tuple[ScannedMessage, ...]:
        fetched = await self._session.uid_fetch(uids, FETCH_ITEMS)
        by_uid = _with_section(fetched, b"BODY[]")
        roots = await self._roots(status, uids)
        items: list[ScannedMessage] = []
        for uid in uids:
            found = by_uid.get(uid)
            if found is None:
                continue  # expunged by someone else between the search and the fetch
            ref = _ref(INBOX, status.uidvalidity, uid)
            items.append(_scanned(ref, found, roots.get(uid), self._provider, self._mailbox_id))
        return tuple(items)

    async def _roots(self, status: FolderStatus, uids: Sequence[int]) -> dict[int, str]:
        """Each message's thread root's Message-ID, from the server's REFS threading (empty
        where the server has none: each message then names its thread from its headers).
        The server threads the whole folder; its answer serves every page read while the
        folder is unchanged (the same UIDVALIDITY, UIDNEXT and HIGHESTMODSEQ)."""
        if f"THREAD={THREADING}" not in self._session.capabilities or not uids:
            return {}
        version = (status.uidvalidity, status.uidnext, status.highestmodseq)
        if self._threading is None or self._threading[0] != version or None in version[1:2]:
            root_of = {
                uid: thread[0]
                for thread in await self._session.uid_thread(THREADING)
                for uid in thread
            }
            self._threading = (version, root_of)
        root_of = self._threading[1]
        wanted = {uid: root_of[uid] for uid in uids if uid in root_of}
        ids = await self._message_ids(sorted(set(wanted.values())))
        return {uid: ids[root] for uid, root in wanted.items() if root in ids}

    async def _message_ids(self, uids: Sequence[int]) -> dict[int, str]:
        fetched = await self._session.uid_fetch(uids, "(UID BODY.PEEK[HEADER.FIELDS (MESSAGE-ID)])")
        found: dict[int, str] = {}
        for item in fetched:
            uid = item.get(b"UID")
            header = next((v for k, v in item.items() if k.startswith(b"BODY[")), None)
            if not (isinstance(uid, bytes) and uid.isdigit() and isinstance(header, bytes)):
                continue  # a FETCH the server sent of its own (flags changed elsewhere)
            try:
                ids = rfc822.header_ids(rfc822.parse(header + b"\r\n"), "Message-ID")
            except rfc822.UnparseableMessage:
                continue
            if ids:
                found[int(uid)] = ids[0]
        return found

    async def _raw(self, ref: str) -> bytes:
        folder, validity, uid = _parse_ref(ref)
        status = await self._session.open_folder(folder)
        if status.uidvalidity != validity:
            raise NotFound(
                f"message {ref} is gone: folder {folder.decode('ascii', 'replace')} was rebuilt "
                "since it was read (read the changes again)"
            )
        fetched = await self._session.uid_fetch([uid], "(UID BODY.PEEK[])")
        found = _with_section(fetched, b"BODY[]").get(uid)
        if found is not None:
            return imap_wire.text(found[b"BODY[]"])
        raise NotFound(f"message {ref} is no longer in mailbox {self._mailbox_id}")

    @with_retries
    @_one_at_a_time
    async def fetch_body(self, body_ref: str) -> MessageBody:
        return rfc822.body(await self._raw(body_ref))

    @with_retries
    @_one_at_a_time
    async def fetch_attachment(self, ref: str) -> AttachmentData:
        item_ref, _, index = ref.rpartition("/")
        if not index.isdigit():
            raise NotFound(f"{ref!r} is not an IMAP attachment reference (<message>/<n>)")
        found = rfc822.attachments(await self._raw(item_ref), item_ref)
        if int(index) >= len(found):
            raise NotFound(f"message {item_ref} has no attachment {index}")
        return found[int(index)]

    # -- sending -------------------------------------------------------------------------

    async def prepare(self, message: OutgoingMessage) -> Handover:
        marker = mime.marker_for(message, self._markers[0])
        raw = mime.build_marked(message, marker, self._now())
        recipients = tuple(a.address for a in (*message.to, *message.cc))
        return Handover(
            message=message,
            channel=CHANNEL.value,
            mime=raw,
            envelope_recipients=recipients,
            marker=marker,
        )

    async def send(self, handover: Handover) -> SendResult:
        raw, recipients = handover.mime, handover.envelope_recipients
        if raw is None or not recipients:
            raise ProviderError("an SMTP submission needs the MIME and its envelope; prepare it")
        refused = await _Submission(self._server, self._mailbox_id, self._password).submit(
            handover.message.sender.address, recipients, raw
        )
        filed = None
        if not self._server.submission_keeps_sent_copy:
            async with self._lock:
                filed = await self._file_copy(raw, handover.marker)
        message = handover.message
        return SendResult(
            provider_message_id=filed or f"smtp:{message.internet_message_id}",
            provider_thread_id=message.provider_thread_id,
            internet_message_id=message.internet_message_id,
            channel=CHANNEL.value,
            delivered=True,
            accepted_at=self._now(),
            refused=refused,
        )

    async def _file_copy(self, raw: bytes, marker: Marker | None) -> str | None:
        """Append our sent copy to the Sent folder; its reference when the server names it.
        The message went out already: a failure here loses only the copy, so it is tried
        again on a new connection - unless the copy is there already (the append may have
        been stored and its answer lost) - and then left (read-back finds no copy), never
        raised as a failed send."""
        for _ in range(3):
            try:
                folder = await self._sent_folder()
                appended = await self._session.append(folder, raw)
            except ProviderError:
                await self._session.discard()
                found = await self._already_filed(marker)
                if found is not None:
                    return found
                continue
            return None if appended is None else _ref(folder, *appended)
        return None

    async def _already_filed(self, marker: Marker | None) -> str | None:
        if marker is None:
            return None
        try:
            copy = await self._find(marker)
        except ProviderError:
            return None
        return None if copy is None else copy.provider_message_id

    async def _sent_folder(self) -> bytes:
        if self._sent is None:
            self._sent = await self._session.sent_folder()
        return self._sent

    @with_retries
    @_one_at_a_time
    async def find_sent(self, marker: Marker) -> StoredCopy | None:
        if marker.kind not in self._markers:
            raise Unsupported(f"this IMAP channel does not search by a {marker.kind} marker")
        return await self._find(marker)

    async def _find(self, marker: Marker) -> StoredCopy | None:
        folder = await self._sent_folder()
        status = await self._session.open_folder(folder)
        header = "Message-ID" if marker.kind is MarkerKind.MESSAGE_ID else mime.MARKER_HEADER
        value = marker.value.replace("\\", "\\\\").replace('"', '\\"')
        uids = await self._session.uid_search(f'HEADER {header} "{value}"')
        for uid in sorted(uids):
            ref = _ref(folder, status.uidvalidity, uid)
            copy = await self._copy_if_marked(ref, marker)
            if copy is not None:
                return copy
        return None

    async def _copy_if_marked(self, ref: str, marker: Marker) -> StoredCopy | None:
        """The copy at ``ref`` if it carries exactly ``marker`` (a server's HEADER search
        matches substrings)."""
        try:
            raw = await self._raw(ref)
        except NotFound:
            return None
        parsed = rfc822.parse(raw)
        if not mime.carries(parsed, marker):
            return None
        return rfc822.stored_copy(
            raw,
            provider_message_id=ref,
            provider_thread_id=_own_thread(parsed, ref),
            delivered=True,
        )

    # -- the rest ------------------------------------------------------------------------

    @_one_at_a_time
    async def health(self) -> ProviderHealth:
        login = self._session.username.lower()
        try:
            status = await self._session.open_folder(INBOX)
        except ProviderError as exc:
            return ProviderHealth(
                provider=self._provider, mailbox_id=self._mailbox_id, ok=False, detail=str(exc)
            )
        return ProviderHealth(
            provider=self._provider,
            mailbox_id=self._mailbox_id,
            ok=True,
            detail=f"IMAP {self._session.where} signed in as {login}, inbox UIDVALIDITY "
            f"{status.uidvalidity}, next UID {status.uidnext}",
            account=login if "@" in login and "*" not in login else None,
        )

    @_one_at_a_time
    async def aclose(self) -> None:
        await self._session.close()


def _scanned(
    ref: str,
    item: dict[bytes, imap_wire.Value],
    root_mid: str | None,
    provider: str,
    mailbox_id: str,
) -> ScannedMessage:
    raw = imap_wire.text(item.get(b"BODY[]"))
    received = _internal_date(item.get(b"INTERNALDATE"))

    def thread_id_for(mid: str | None, in_reply_to: str | None, refs: tuple[str, ...]) -> str:
        root = root_mid or (refs[0] if refs else in_reply_to or mid)
        return thread_alias(root if root is not None else ref)

    try:
        envelope = rfc822.normalize(
            raw,
            provider=provider,
            mailbox_id=mailbox_id,
            provider_message_id=ref,
            thread_id_for=thread_id_for,
            fallback_received_at=received,
        )
    except rfc822.UnparseableMessage as exc:
        return ScannedMessage(item_ref=ref, error=str(exc))
    except Exception as exc:
        return ScannedMessage(
            item_ref=ref, error=f"could not be normalized ({type(exc).__name__}: {exc})"
        )
    return ScannedMessage(item_ref=ref, envelope=envelope)


def _internal_date(value: imap_wire.Value) -> datetime:
    try:
        return parsedate_to_datetime(imap_wire.text(value).decode("ascii").replace("-", " "))
    except (ValueError, TypeError, UnicodeError, imap_wire.ImapSyntaxError):
        return datetime.fromtimestamp(0, UTC)


def _own_thread(parsed: rfc822.Parsed, ref: str) -> str:
    refs = rfc822.header_ids(parsed, "References")
    irt = rfc822.header_ids(parsed, "In-Reply-To")
    mids = rfc822.header_ids(parsed, "Message-ID")
    root = refs[0] if refs else irt[0] if irt else mids[0] if mids else ref
    return thread_alias(root)


class SubmissionLoginRefused(NotHandedOver, AuthenticationExpired):
    """The submission server refused the login: nothing was sent, and the password (or
    app password) in the vault needs to be replaced."""


class _Submission:
    """One SMTP submission: connect, authenticate, MAIL FROM and RCPT TO from the plan,
    DATA. A failure before DATA handed nothing over (``NotHandedOver``); a connection lost
    during DATA may have been accepted (``OutcomeUnknown``)."""

    def __init__(self, server: MailServer, mailbox_id: str, password: PasswordSource) -> None:
        self._server = server
        self._mailbox_id = mailbox_id
        self._password = password
        smtp = server.smtp
        self._where = f"{smtp.host}:{smtp.port_for('smtp')}"

    def _tls(self) -> ssl.SSLContext:
        try:
            return tls_context(self._server.ca_file)
        except ProviderError as exc:
            raise NotHandedOver(f"mailbox {self._mailbox_id}: {exc}; nothing was sent") from None

    def _not_handed_over(self, what: str, exc: BaseException) -> NotHandedOver:
        return NotHandedOver(
            f"mailbox {self._mailbox_id}: the SMTP server at {self._where} {what} "
            f"({type(exc).__name__}: {_reason(exc)}); nothing was sent. Check server.smtp in "
            "the Workspace Context and that the server is up"
        )

    async def submit(
        self, sender: str, recipients: Sequence[str], raw: bytes
    ) -> tuple[tuple[str, str], ...]:
        smtp = self._server.smtp
        secure = smtp.security is not Security.NONE
        client = aiosmtplib.SMTP(
            hostname=smtp.host,
            port=smtp.port_for("smtp"),
            use_tls=smtp.security is Security.TLS,
            start_tls=smtp.security is Security.STARTTLS,
            tls_context=self._tls() if secure else None,
            timeout=self._server.timeout_seconds,
        )
        try:
            await self._open(client)
            refused = await self._envelope(client, sender, recipients)
            try:
                await client.data(raw)
            except aiosmtplib.SMTPResponseException as exc:
                if 400 <= exc.code < 600:  # the server answered, refusing the message
                    raise self._not_handed_over("refused the message", exc) from None
                raise OutcomeUnknown(
                    f"mailbox {self._mailbox_id}: the SMTP server at {self._where} answered "
                    f"the message with something that is not SMTP ({_reason(exc)}): it may "
                    "have been sent"
                ) from None
            except (TimeoutError, aiosmtplib.SMTPException, OSError) as exc:
                raise OutcomeUnknown(
                    f"mailbox {self._mailbox_id}: the connection to the SMTP server at "
                    f"{self._where} was lost while it took the message ({_reason(exc)}): it "
                    "may have been sent"
                ) from None
            return refused
        finally:
            await _goodbye(client)

    async def _open(self, client: aiosmtplib.SMTP) -> None:
        try:
            await client.connect()
        except (TimeoutError, aiosmtplib.SMTPException, OSError) as exc:
            failed_tls = _tls_error(exc)
            if failed_tls is not None:
                refused = tls_refused(self._mailbox_id, self._where, failed_tls)
                raise NotHandedOver(f"{refused}. Nothing was sent") from None
            raise self._not_handed_over("could not be reached", exc) from None
        username = self._server.username or self._mailbox_id
        try:
            await client.login(username, self._password().reveal())
        except aiosmtplib.SMTPAuthenticationError as exc:
            raise SubmissionLoginRefused(
                f"mailbox {self._mailbox_id}: the SMTP server at {self._where} refused the "
                f"login of {username} ({exc.code}); store the right password with 'outloop "
                f"vault set WORKSPACE {self._mailbox_id} {self._server.password}'. Nothing was sent"
            ) from None
        except (TimeoutError, aiosmtplib.SMTPException, OSError) as exc:
            raise self._not_handed_over("failed during the login", exc) from None

    async def _envelope(
        self, client: aiosmtplib.SMTP, sender: str, recipients: Sequence[str]
    ) -> tuple[tuple[str, str], ...]:
        try:
            await client.mail(sender)
        except (TimeoutError, aiosmtplib.SMTPException, OSError) as exc:
            raise self._not_handed_over(f"refused the sender {sender}", exc) from None
        refused: list[tuple[str, str]] = []
        for address in recipients:
            try:
                await client.rcpt(address)
            except aiosmtplib.SMTPRecipientRefused as exc:
                refused.append((address, f"{exc.code} {exc.message}"))
            except (TimeoutError, aiosmtplib.SMTPException, OSError) as exc:
                raise self._not_handed_over(f"failed at recipient {address}", exc) from None
        if len(refused) == len(recipients):
            reasons = "; ".join(f"{a}: {why}" for a, why in refused)
            raise NotHandedOver(
                f"mailbox {self._mailbox_id}: the SMTP server at {self._where} refused every "
                f"recipient ({reasons}); nothing was sent"
            )
        return tuple(refused)


async def _goodbye(client: aiosmtplib.SMTP) -> None:
    """QUIT where the session is still up (a server logs a session dropped without one as
    lost), then close."""
    if client.is_connected:
        with contextlib.suppress(aiosmtplib.SMTPException, OSError, TimeoutError):
            await client.quit(timeout=5)
    client.close()


def _tls_error(exc: BaseException) -> ssl.SSLError | None:
    """The TLS failure behind a connection error, if that is what it was."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, ssl.SSLError):
            return seen
        seen = seen.__cause__ or seen.__context__
    return None


def _reason(exc: BaseException) -> str:
    if isinstance(exc, aiosmtplib.SMTPResponseException):
        return f"{exc.code} {exc.message}"
    return str(exc) or type(exc).__name__


def _with_section(
    fetched: Sequence[dict[bytes, imap_wire.Value]], section: bytes
) -> dict[int, dict[bytes, imap_wire.Value]]:
    """The fetched items that answer our request, by UID: a server also sends FETCH
    responses of its own while it answers (another client changed a message's flags), which
    carry no UID or none of the requested data, and are left out."""
    found: dict[int, dict[bytes, imap_wire.Value]] = {}
    for item in fetched:
        uid, data = item.get(b"UID"), item.get(section)
        answers = section in item and isinstance(data, bytes | None)
        if answers and isinstance(uid, bytes) and uid.isdigit():
            found[int(uid)] = item
    return found
