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

import hashlib
import mailbox
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path
from typing import NamedTuple
from urllib.parse import quote, unquote

import anyio.to_thread

from agent.domain.errors import ProviderError
from agent.domain.mail import (
    Handover,
    MessageBody,
    OutgoingMessage,
    ProviderHealth,
    ScannedMessage,
    SendResult,
    StoredCopy,
)
from agent.providers import mime, rfc822

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


_QUOTED = "maildir+q:"


def _item_ref(key: str) -> str:
    """``maildir:<key>``; a key that is not UTF-8 text (a file name of other bytes, read as
    lone surrogates) or holds a ``%`` is percent-encoded, so every reference is plain text
    that a store and a JSON answer can carry."""
    try:
        key.encode("utf-8")
    except UnicodeEncodeError:
        plain = False
    else:
        plain = "%" not in key
    if plain:
        return f"maildir:{key}"
    return _QUOTED + quote(key, safe="", errors="surrogateescape")


def _key_of(ref: str) -> str:
    if ref.startswith(_QUOTED):
        return unquote(ref.removeprefix(_QUOTED), errors="surrogateescape")
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

    def _sent_facts(self) -> list[_Facts]:
        sent = self._sent(create=False)
        if sent is None:
            return []
        return [_facts_of(sent.get_bytes(key)) for key in sent.iterkeys()]

    def _threads(self, raw_items: list[tuple[str, bytes]] | None = None) -> _Threads:
        """This mailbox's threading, from every message it holds (inbox and sent copies)."""
        threads = _Threads()
        for facts in self._sent_facts():
            threads.add(facts)
        for _, raw in self._read_all() if raw_items is None else raw_items:
            threads.add(_facts_of(raw))
        return threads

    def _scan_sync(self) -> list[ScannedMessage]:
        raw_items = self._read_all()
        threads = self._threads(raw_items)
        results: list[ScannedMessage] = []
        for key, raw in raw_items:
            ref = _item_ref(key)
            try:
                envelope = rfc822.normalize(
                    raw,
                    provider=PROVIDER,
                    mailbox_id=self._mailbox_id,
                    provider_message_id=ref,
                    thread_id_for=lambda mid, irt, refs, raw=raw, ref=ref: threads.thread_of(
                        _Facts(mid, irt, refs, rfc822.body_fingerprint(raw)),
                        fallback=ref,
                    ),
                    fallback_received_at=_key_time(key),
                )
            except rfc822.UnparseableMessage as exc:
                results.append(ScannedMessage(item_ref=ref, error=str(exc)))
                continue
            except Exception as exc:
                results.append(
                    ScannedMessage(
                        item_ref=ref,
                        error=f"could not be normalized ({type(exc).__name__}: {exc})",
                    )
                )
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

    async def prepare(self, message: OutgoingMessage) -> Handover:
        try:
            raw = mime.build(message, datetime.now(UTC))
        except ValueError as exc:
            raise ProviderError(f"the message cannot be written as MIME: {exc}") from exc
        return Handover(message=message, channel=CHANNEL, mime=raw)

    async def send(self, handover: Handover) -> SendResult:
        raw = handover.mime
        if raw is None:
            raise ProviderError("a Maildir outbox copy is written from MIME; prepare it first")

        def write() -> str:
            sent = self._sent(create=True)
            assert sent is not None
            return str(sent.add(raw))

        key = await anyio.to_thread.run_sync(write)
        return SendResult(
            provider_message_id=f"maildir:{SENT_FOLDER}/{key}",
            provider_thread_id=handover.message.provider_thread_id,
            internet_message_id=handover.message.internet_message_id,
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
                facts = _facts_of(raw)
                if facts.mid != internet_message_id:
                    continue
                return rfc822.stored_copy(
                    raw,
                    provider_message_id=f"maildir:{SENT_FOLDER}/{key}",
                    provider_thread_id=self._threads().thread_of(facts, fallback=key),
                    delivered=False,  # an outbox copy: it reached no one
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


class _Facts(NamedTuple):
    mid: str | None
    in_reply_to: str | None
    refs: tuple[str, ...]
    fingerprint: str


class _Threads:
    """Maildir threading: each message id points at its parent; a thread is named by its root.

    A message's parent is the first id its References name (the conversation's start), else
    its In-Reply-To. The root is where the chain of parents ends, so the result depends only
    on which messages are present, never on the order in which they were added.

    A Message-ID carried by messages that differ (another body, another parent) is
    ambiguous: it is nobody's parent, and each differing message that starts a thread with
    it starts its own. Copies of one message (delivered twice) are not ambiguous.
    """

    def __init__(self) -> None:
        self._versions: dict[str, set[tuple[str | None, str]]] = {}

    def add(self, facts: _Facts) -> None:
        if facts.mid is not None:
            parent = _parent_of(facts.in_reply_to, facts.refs)
            self._versions.setdefault(facts.mid, set()).add((parent, facts.fingerprint))

    def _ambiguous(self, mid: str) -> bool:
        versions = self._versions.get(mid, set())
        return len({p for p, _ in versions}) > 1 or len({f for _, f in versions}) > 1

    def _parent(self, mid: str) -> str | None:
        versions = self._versions.get(mid)
        if not versions or self._ambiguous(mid):
            return None
        parent = next(iter(versions))[0]
        return None if parent == mid else parent

    def _root(self, start: str) -> str:
        path = [start]
        seen = {start}
        while (parent := self._parent(path[-1])) is not None:
            if parent in seen:  # a reference cycle: name it by its smallest member
                return min(path[path.index(parent) :])
            path.append(parent)
            seen.add(parent)
        return path[-1]

    def thread_of(self, facts: _Facts, fallback: str) -> str:
        parent = _parent_of(facts.in_reply_to, facts.refs)
        if parent is not None:
            return thread_id(self._root(parent))
        if facts.mid is None:
            return thread_id(fallback)
        if self._ambiguous(facts.mid):
            return thread_id(f"{facts.mid}#{facts.fingerprint}")
        return thread_id(facts.mid)


def _parent_of(in_reply_to: str | None, refs: tuple[str, ...]) -> str | None:
    return refs[0] if refs else in_reply_to


def _facts_of(raw: bytes) -> _Facts:
    try:
        parsed = rfc822.parse(raw)
    except Exception:
        return _Facts(None, None, (), "")
    mids = rfc822.header_ids(parsed, "Message-ID")
    irt = rfc822.header_ids(parsed, "In-Reply-To")
    refs = rfc822.header_ids(parsed, "References")
    return _Facts(
        mids[0] if mids else None, irt[0] if irt else None, refs, rfc822.body_fingerprint(raw)
    )
