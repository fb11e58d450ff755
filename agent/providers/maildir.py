"""The embedded default provider: a local Maildir, read with the standard library.

New mail is read from the Maildir (``new/`` and ``cur/``); what we send is written as RFC 822
messages into its ``.Sent`` folder and searched for there by its marker. It never moves,
flags or renames a message: the provider holds no workflow state. Its send writes an outbox
copy only, so it never counts as a delivered client reply.

Changes are paged in delivery order: by each file's ctime (set when a delivery renames the
file into ``new/``), then its key. A cursor is an opaque versioned string naming the folder
(its inodes: a rebuilt Maildir expires every cursor), a horizon below which every file was
read, and the few files at or above it that were read. A file that appears after a page was
read has a ctime no earlier than the moment of reading (less a clock tick), so mail delivered
while a reader pages is read exactly once. A message another mail program renames (marks
read, moves from ``new/`` to ``cur/``) gets a new ctime and is read again; its occurrence key
is the same, so the core records it once.

Threading is this provider's own and uses headers only: a message joins the thread of the
first message its References (or In-Reply-To) names, so the same conversation gets the same
``provider_thread_id`` however its messages arrive. Every channel of a Maildir is this one,
but the core keeps thread aliases all the same (``native_threads`` is False).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import mailbox
import os
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from functools import partial
from pathlib import Path
from typing import Any, NamedTuple
from urllib.parse import quote, unquote

import anyio.to_thread

from agent.domain.errors import CursorExpired, NotFound, ProviderError, Unsupported
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
from agent.ports import Clock
from agent.providers import mime, rfc822

PROVIDER = "maildir"
SENT_FOLDER = "Sent"
CHANNEL = Channel.LOCAL
MARKERS = (MarkerKind.MESSAGE_ID, MarkerKind.HEADER)
"""What marks our copy in ``.Sent``, best first: everything we write survives there."""
PAGE_SIZE = 100
CURSOR_VERSION = "maildir-v1"
SETTLE = timedelta(milliseconds=500)
"""How far before a read a file's ctime may lie and the file still be new to that read: more
than a clock tick (the filesystem stamps files with a coarse clock), less than mail takes."""


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
        raise NotFound(f"{ref!r} is not a Maildir message reference (maildir:<key>)")
    return ref.removeprefix("maildir:")


class _File(NamedTuple):
    """One message file of the inbox, where it stands in delivery order."""

    ctime_ns: int
    key: str
    path: Path

    @property
    def mark(self) -> tuple[int, str]:
        return self.ctime_ns, self.key


@dataclass(frozen=True)
class _Cursor:
    """Where a reader stands: every file with a ctime below ``horizon`` was read, and of the
    files at or above it, those in ``seen``."""

    folder: tuple[int, ...]
    horizon: int
    seen: frozenset[tuple[int, str]]

    def encode(self) -> str:
        body = {"f": list(self.folder), "h": self.horizon, "s": sorted(self.seen)}
        packed = json.dumps(body, separators=(",", ":")).encode("ascii")
        return f"{CURSOR_VERSION}.{base64.urlsafe_b64encode(packed).decode('ascii')}"

    @staticmethod
    def decode(text: str, folder: tuple[int, ...]) -> _Cursor:
        version, _, packed = text.partition(".")
        try:
            if version != CURSOR_VERSION:
                raise ValueError(f"version {version!r}")
            body: dict[str, Any] = json.loads(base64.urlsafe_b64decode(packed.encode("ascii")))
            cursor = _Cursor(
                folder=tuple(int(n) for n in body["f"]),
                horizon=int(body["h"]),
                seen=frozenset((int(c), str(k)) for c, k in body["s"]),
            )
        except (ValueError, KeyError, TypeError, UnicodeError, binascii.Error) as exc:
            raise CursorExpired(
                f"{text[:40]!r} is not a cursor of this Maildir: read again"
            ) from exc
        if cursor.folder != folder:
            raise CursorExpired("the Maildir was rebuilt since the cursor was given: read again")
        return cursor

    def after(self, page: list[_File], candidates: list[_File], read_at: int) -> _Cursor:
        """The cursor past ``page``, the first of ``candidates`` (files not read before, in
        order) read at ``read_at`` (ns)."""
        bound = read_at - SETTLE // timedelta(microseconds=1) * 1000
        if len(candidates) > len(page):
            bound = min(bound, candidates[len(page)].ctime_ns)
        horizon = max(self.horizon, bound)
        marks = self.seen | {f.mark for f in page}
        return _Cursor(self.folder, horizon, frozenset(m for m in marks if m[0] >= horizon))


class MaildirProvider:
    """The MailProvider port on a Maildir directory.

    ``markers`` narrows or reorders the markers it sets (a subset of ``MARKERS``);
    ``page_size`` is how many messages a page of changes holds at most."""

    def __init__(
        self,
        path: Path,
        mailbox_id: str,
        *,
        markers: tuple[MarkerKind, ...] = MARKERS,
        page_size: int = PAGE_SIZE,
        clock: Clock | None = None,
    ) -> None:
        if not markers or not set(markers) <= set(MARKERS):
            raise ValueError(f"a Maildir marks its copies by {', '.join(MARKERS)} only")
        self._path = path
        self._mailbox_id = mailbox_id.lower()
        self._markers = markers
        self._page_size = page_size
        self._clock = clock
        self._known: dict[tuple[str, int], _Facts] = {}

    @property
    def provider(self) -> str:
        return PROVIDER

    @property
    def mailbox_id(self) -> str:
        return self._mailbox_id

    @property
    def capabilities(self) -> Capabilities:
        return Capabilities(
            channel=CHANNEL,
            key_basis=True,
            native_threads=False,
            markers=self._markers,
            keeps_sent_copy=True,
            sent_copy_latency=timedelta(0),
            delivers=False,
            page_size=self._page_size,
        )

    def _now(self) -> datetime:
        return datetime.now(UTC) if self._clock is None else self._clock.now()

    def _missing(self) -> ProviderError:
        return ProviderError(
            f"no Maildir at {self._path}; create it (with cur/, new/ and tmp/) or fix the "
            "mailbox path in the Workspace Context"
        )

    def _inbox(self) -> mailbox.Maildir:
        try:
            return mailbox.Maildir(str(self._path), factory=None, create=False)
        except mailbox.NoSuchMailboxError as exc:
            raise self._missing() from exc

    def _sent(self, create: bool) -> mailbox.Maildir | None:
        inbox = self._inbox()
        if SENT_FOLDER in inbox.list_folders():
            return inbox.get_folder(SENT_FOLDER)
        return inbox.add_folder(SENT_FOLDER) if create else None

    def _folder(self) -> tuple[int, ...]:
        """Which Maildir this is: its device and the inodes of it and its new/ and cur/."""
        try:
            stats = [(self._path / sub).stat() for sub in ("", "new", "cur")]
        except (FileNotFoundError, NotADirectoryError) as exc:
            raise self._missing() from exc
        return (stats[0].st_dev, *(s.st_ino for s in stats))

    def _files(self) -> dict[str, _File]:
        """The inbox's message files by key (as the mailbox module reads them: a key in both
        cur/ and new/ is the one in new/)."""
        files: dict[str, _File] = {}
        for sub in ("cur", "new"):
            try:
                entries = list(os.scandir(self._path / sub))
            except (FileNotFoundError, NotADirectoryError) as exc:
                raise self._missing() from exc
            for entry in entries:
                try:
                    if entry.is_dir():
                        continue
                    ctime = entry.stat().st_ctime_ns
                except FileNotFoundError:
                    continue  # moved away by someone else while listing
                key = entry.name.split(":")[0]
                files[key] = _File(ctime, key, Path(entry.path))
        return files

    @staticmethod
    def _raw(files: list[_File]) -> list[tuple[_File, bytes]]:
        read: list[tuple[_File, bytes]] = []
        for file in files:
            try:
                read.append((file, file.path.read_bytes()))
            except (FileNotFoundError, IsADirectoryError):
                continue  # moved away by someone else between listing and reading
        return read

    def _sent_items(self) -> list[tuple[str, bytes]]:
        """Every sent copy (key, bytes), each file read once, directly."""
        if self._sent(create=False) is None:
            return []
        folder = self._path / f".{SENT_FOLDER}"
        items: list[tuple[str, bytes]] = []
        for sub in ("new", "cur"):
            try:
                entries = list(os.scandir(folder / sub))
            except FileNotFoundError:
                continue
            for entry in entries:
                try:
                    items.append((entry.name.split(":")[0], Path(entry.path).read_bytes()))
                except FileNotFoundError:
                    continue  # moved by another reader between listing and reading
        return sorted(items)

    def _facts(self, version: tuple[str, int], read: Callable[[], bytes]) -> _Facts | None:
        """A message's threading facts, read once per version of its file."""
        facts = self._known.get(version)
        if facts is None:
            try:
                facts = _facts_of(read())
            except (KeyError, FileNotFoundError, IsADirectoryError):
                return None  # moved away by someone else between listing and reading
        return facts

    def _threads(self, files: Iterable[_File]) -> _Threads:
        """This mailbox's threading, from every message it holds (inbox and sent copies);
        each file is parsed once while it stays as it is."""
        threads = _Threads()
        known: dict[tuple[str, int], _Facts] = {}
        sent = self._sent(create=False)
        versions: list[tuple[tuple[str, int], Callable[[], bytes]]] = [
            ((str(f.path), f.ctime_ns), f.path.read_bytes) for f in files
        ]
        if sent is not None:
            for key in sent.iterkeys():  # a sent copy's key is never reused
                versions.append(((f"{SENT_FOLDER}/{key}", 0), partial(sent.get_bytes, key)))
        for version, read in versions:
            facts = self._facts(version, read)
            if facts is not None:
                threads.add(facts)
                known[version] = facts
        self._known = known
        return threads

    def _normalize(self, file: _File, raw: bytes, threads: _Threads) -> ScannedMessage:
        ref = _item_ref(file.key)
        try:
            envelope = rfc822.normalize(
                raw,
                provider=PROVIDER,
                mailbox_id=self._mailbox_id,
                provider_message_id=ref,
                thread_id_for=lambda mid, irt, refs: threads.thread_of(
                    _Facts(mid, irt, refs, rfc822.body_fingerprint(raw)), fallback=ref
                ),
                fallback_received_at=_key_time(file.key),
            )
        except rfc822.UnparseableMessage as exc:
            return ScannedMessage(item_ref=ref, error=str(exc))
        except Exception as exc:
            error = f"could not be normalized ({type(exc).__name__}: {exc})"
            return ScannedMessage(item_ref=ref, error=error)
        return ScannedMessage(item_ref=ref, envelope=envelope)

    def _changes_sync(self, cursor: str | None) -> ChangePage:
        folder = self._folder()
        read_at = time.time_ns()  # before listing: a file listed later is stamped after it
        files = self._files()
        start = (
            _Cursor(folder, 0, frozenset()) if cursor is None else _Cursor.decode(cursor, folder)
        )
        candidates = sorted(
            (f for f in files.values() if f.ctime_ns >= start.horizon and f.mark not in start.seen),
            key=lambda f: f.mark,
        )
        page = candidates[: self._page_size]
        threads = self._threads(files.values())
        items = tuple(self._normalize(file, raw, threads) for file, raw in self._raw(page))
        return ChangePage(
            items=items,
            cursor=start.after(page, candidates, read_at).encode(),
            more=len(candidates) > len(page),
        )

    async def changes(self, cursor: str | None) -> ChangePage:
        return await anyio.to_thread.run_sync(self._changes_sync, cursor)

    def _read(self, ref: str) -> bytes:
        """The bytes of an inbox message or a sent copy (``maildir:Sent/<key>``)."""
        key = _key_of(ref)
        try:
            if key.startswith(f"{SENT_FOLDER}/"):
                sent = self._sent(create=False)
                if sent is None:
                    raise KeyError(key)
                return sent.get_bytes(key.removeprefix(f"{SENT_FOLDER}/"))
            return self._inbox().get_bytes(key)
        except (KeyError, FileNotFoundError) as exc:
            raise NotFound(f"message {ref} is no longer in {self._path}") from exc

    async def fetch_body(self, body_ref: str) -> MessageBody:
        return rfc822.body(await anyio.to_thread.run_sync(self._read, body_ref))

    async def fetch_attachment(self, ref: str) -> AttachmentData:
        item_ref, _, index = ref.rpartition("/")
        if not index.isdigit():
            raise NotFound(f"{ref!r} is not a Maildir attachment reference (<message>/<n>)")
        raw = await anyio.to_thread.run_sync(self._read, item_ref)
        found = rfc822.attachments(raw, item_ref)
        if int(index) >= len(found):
            raise NotFound(f"message {item_ref} has no attachment {index}")
        return found[int(index)]

    async def prepare(self, message: OutgoingMessage) -> Handover:
        marker = mime.marker_for(message, self._markers[0])
        raw = mime.build_marked(message, marker, self._now())
        return Handover(message=message, channel=CHANNEL.value, mime=raw, marker=marker)

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
            channel=CHANNEL.value,
            delivered=False,
            accepted_at=self._now(),
        )

    def _find_sync(self, marker: Marker) -> StoredCopy | None:
        # Our Message-ID and marker token are written verbatim and hold no whitespace a
        # header could be folded at: a copy whose bytes lack the value cannot carry it, and
        # is not parsed (a search stays cheap with thousands of copies).
        wanted = marker.value.encode("utf-8", "surrogateescape")
        for key, raw in self._sent_items():
            if wanted not in raw:
                continue
            try:
                parsed = rfc822.parse(raw)
            except rfc822.UnparseableMessage:
                continue
            if not mime.carries(parsed, marker):
                continue
            threads = self._threads(self._files().values())
            return rfc822.stored_copy(
                raw,
                provider_message_id=f"maildir:{SENT_FOLDER}/{key}",
                provider_thread_id=threads.thread_of(_facts_of(raw), fallback=key),
                delivered=False,  # an outbox copy: it reached no one
            )
        return None

    async def find_sent(self, marker: Marker) -> StoredCopy | None:
        if marker.kind not in self._markers:
            raise Unsupported(f"this Maildir channel does not search by a {marker.kind} marker")
        return await anyio.to_thread.run_sync(self._find_sync, marker)

    async def health(self) -> ProviderHealth:
        try:
            count = len(await anyio.to_thread.run_sync(self._files))
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

    async def aclose(self) -> None:
        """Nothing to release: every call opens the files it reads."""


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
