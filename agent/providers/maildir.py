"""The embedded default provider: a local Maildir, read with the standard library.

New mail is read from the Maildir (``new/`` and ``cur/``); replies are written as RFC 822
messages into its ``.Sent`` folder and read back from there. It never moves, flags or
renames a message: the provider holds no workflow state. Its send writes an outbox copy
only, so it never counts as a delivered client reply.

Threading is this provider's own and uses headers only: a message joins the thread of the
first message its References (or In-Reply-To) names, so the same conversation gets the same
``provider_thread_id`` however its messages arrive.
"""

from __future__ import annotations

import email.policy
import email.utils
import hashlib
import mailbox
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from email.message import EmailMessage
from pathlib import Path

import anyio.to_thread

from agent.domain.envelope import Address
from agent.domain.errors import ProviderError
from agent.domain.mail import (
    MessageBody,
    OutgoingMessage,
    ProviderHealth,
    ScannedMessage,
    SendResult,
    StoredCopy,
)
from agent.providers import rfc822

PROVIDER = "maildir"
SENT_FOLDER = "Sent"
CHANNEL = "maildir-outbox"


def thread_id(root: str) -> str:
    return "mt-" + hashlib.sha256(root.encode("utf-8", "surrogateescape")).hexdigest()[:20]


def _key_time(key: str) -> datetime:
    stamp = key.split(".", 1)[0]
    try:
        return datetime.fromtimestamp(int(stamp), UTC)
    except (ValueError, OverflowError, OSError):
        return datetime.fromtimestamp(0, UTC)


def _item_ref(key: str) -> str:
    return f"maildir:{key}"


def _key_of(ref: str) -> str:
    if not ref.startswith("maildir:"):
        raise ProviderError(f"{ref!r} is not a Maildir message reference (maildir:<key>)")
    return ref.removeprefix("maildir:")


class MaildirProvider:
    """The MailProvider port on a Maildir directory."""

    def __init__(self, path: Path, mailbox_id: str) -> None:
        self._path = path
        self._mailbox_id = mailbox_id.lower()

    @property
    def provider(self) -> str:
        return PROVIDER

    @property
    def mailbox_id(self) -> str:
        return self._mailbox_id

    def _inbox(self) -> mailbox.Maildir:
        try:
            return mailbox.Maildir(str(self._path), factory=None, create=False)
        except mailbox.NoSuchMailboxError as exc:
            raise ProviderError(
                f"no Maildir at {self._path}; create it (with cur/, new/ and tmp/) or fix the "
                "mailbox path in the Workspace Context"
            ) from exc

    def _sent(self, create: bool) -> mailbox.Maildir | None:
        inbox = self._inbox()
        if SENT_FOLDER in inbox.list_folders():
            return inbox.get_folder(SENT_FOLDER)
        return inbox.add_folder(SENT_FOLDER) if create else None

    def _read_all(self) -> list[tuple[str, bytes]]:
        inbox = self._inbox()
        items: list[tuple[str, bytes]] = []
        for key in sorted(inbox.iterkeys()):
            try:
                items.append((key, inbox.get_bytes(key)))
            except (KeyError, FileNotFoundError):
                continue  # moved away by someone else between listing and reading
        return items

    def _sent_ids(self) -> list[tuple[str | None, str | None, tuple[str, ...]]]:
        sent = self._sent(create=False)
        if sent is None:
            return []
        out: list[tuple[str | None, str | None, tuple[str, ...]]] = []
        for key in sent.iterkeys():
            out.append(_ids_of(sent.get_bytes(key)))
        return out

    def _scan_sync(self) -> list[ScannedMessage]:
        raw_items = self._read_all()
        threads = _Threads()
        for ids in self._sent_ids():
            threads.add(*ids)
        parsed_ids = [(key, _ids_of(raw)) for key, raw in raw_items]
        for _, ids in sorted(parsed_ids, key=lambda kv: len(kv[1][2])):
            threads.add(*ids)
        results: list[ScannedMessage] = []
        for key, raw in raw_items:
            ref = _item_ref(key)
            try:
                envelope = rfc822.normalize(
                    raw,
                    provider=PROVIDER,
                    mailbox_id=self._mailbox_id,
                    provider_message_id=ref,
                    thread_id_for=lambda mid, irt, refs, key=key: threads.thread_of(
                        mid, irt, refs, fallback=f"maildir:{key}"
                    ),
                    fallback_received_at=_key_time(key),
                )
            except rfc822.UnparseableMessage as exc:
                results.append(ScannedMessage(item_ref=ref, error=str(exc)))
                continue
            results.append(ScannedMessage(item_ref=ref, envelope=envelope))
        return results

    async def scan(self) -> AsyncIterator[ScannedMessage]:
        for item in await anyio.to_thread.run_sync(self._scan_sync):
            yield item

    async def fetch_body(self, body_ref: str) -> MessageBody:
        key = _key_of(body_ref)

        def read() -> bytes:
            try:
                return self._inbox().get_bytes(key)
            except KeyError as exc:
                raise ProviderError(f"message {body_ref} is no longer in {self._path}") from exc

        return rfc822.body(await anyio.to_thread.run_sync(read))

    async def send(self, message: OutgoingMessage) -> SendResult:
        mime = _build(message)

        def write() -> str:
            sent = self._sent(create=True)
            assert sent is not None
            return str(sent.add(mime.as_bytes()))

        key = await anyio.to_thread.run_sync(write)
        return SendResult(
            provider_message_id=f"maildir:{SENT_FOLDER}/{key}",
            provider_thread_id=message.provider_thread_id,
            internet_message_id=message.internet_message_id,
            channel=CHANNEL,
            delivered=False,
            accepted_at=datetime.now(UTC),
        )

    async def read_back(self, internet_message_id: str) -> StoredCopy | None:
        def find() -> StoredCopy | None:
            sent = self._sent(create=False)
            if sent is None:
                return None
            for key in sent.iterkeys():
                raw = sent.get_bytes(key)
                mid, irt, refs = _ids_of(raw)
                if mid != internet_message_id:
                    continue
                parsed = rfc822.parse(raw)
                content = rfc822.body(raw)
                from_ = _first(parsed, "From")
                return StoredCopy(
                    provider_message_id=f"maildir:{SENT_FOLDER}/{key}",
                    provider_thread_id=_sent_thread(self, mid, irt, refs),
                    internet_message_id=mid,
                    sender=from_,
                    to=_all(parsed, "To"),
                    cc=_all(parsed, "Cc"),
                    subject=parsed.header("Subject") or "",
                    text=content.text,
                    html=content.html,
                )
            return None

        return await anyio.to_thread.run_sync(find)

    async def health(self) -> ProviderHealth:
        try:
            count = len(await anyio.to_thread.run_sync(lambda: list(self._inbox().iterkeys())))
        except ProviderError as exc:
            return ProviderHealth(
                provider=PROVIDER, mailbox_id=self._mailbox_id, ok=False, detail=str(exc)
            )
        return ProviderHealth(
            provider=PROVIDER,
            mailbox_id=self._mailbox_id,
            ok=True,
            detail=f"Maildir {self._path} readable, {count} messages in the inbox",
        )


class _Threads:
    """Maildir threading: each message id maps to the root of its conversation."""

    def __init__(self) -> None:
        self._root: dict[str, str] = {}

    def _root_of(self, chain: tuple[str, ...]) -> str | None:
        for mid in chain:
            if mid in self._root:
                return self._root[mid]
        return chain[0] if chain else None

    def add(self, mid: str | None, in_reply_to: str | None, refs: tuple[str, ...]) -> None:
        chain = refs or ((in_reply_to,) if in_reply_to else ())
        root = self._root_of(chain) or mid
        if root is None:
            return
        for known in (*chain, *((mid,) if mid else ())):
            self._root.setdefault(known, root)

    def thread_of(
        self, mid: str | None, in_reply_to: str | None, refs: tuple[str, ...], fallback: str
    ) -> str:
        chain = refs or ((in_reply_to,) if in_reply_to else ())
        root = self._root_of(chain) or (self._root.get(mid) if mid else None) or mid or fallback
        return thread_id(root)


def _ids_of(raw: bytes) -> tuple[str | None, str | None, tuple[str, ...]]:
    try:
        parsed = rfc822.parse(raw)
    except rfc822.UnparseableMessage:
        return (None, None, ())
    mids = rfc822.message_ids(parsed.header("Message-ID"))
    irt = rfc822.message_ids(parsed.header("In-Reply-To"))
    refs = rfc822.message_ids(" ".join(parsed.all_headers("References")))
    return (mids[0] if mids else None, irt[0] if irt else None, refs)


def _sent_thread(
    provider: MaildirProvider, mid: str | None, irt: str | None, refs: tuple[str, ...]
) -> str:
    threads = _Threads()
    for _key, raw in provider._read_all():
        threads.add(*_ids_of(raw))
    return threads.thread_of(mid, irt, refs, fallback=mid or "sent")


def _first(parsed: rfc822.Parsed, name: str) -> Address | None:
    found = _all(parsed, name)
    return found[0] if found else None


def _all(parsed: rfc822.Parsed, name: str) -> tuple[Address, ...]:
    values = parsed.all_headers(name)
    return tuple(
        Address(address=addr, name=display)
        for display, addr in email.utils.getaddresses(values)
        if "@" in addr
    )


def _build(message: OutgoingMessage) -> EmailMessage:
    mime = EmailMessage(policy=email.policy.SMTP)
    mime["From"] = _format(message.sender)
    mime["To"] = ", ".join(_format(a) for a in message.to)
    if message.cc:
        mime["Cc"] = ", ".join(_format(a) for a in message.cc)
    mime["Subject"] = message.subject
    mime["Date"] = email.utils.format_datetime(datetime.now(UTC))
    mime["Message-ID"] = message.internet_message_id
    if message.in_reply_to:
        mime["In-Reply-To"] = message.in_reply_to
    if message.references:
        mime["References"] = " ".join(message.references)
    mime.set_content(message.text)
    if message.html is not None:
        mime.add_alternative(message.html, subtype="html")
    return mime


def _format(address: Address) -> str:
    return email.utils.formataddr((address.name, address.address))
