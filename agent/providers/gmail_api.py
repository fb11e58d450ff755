"""A Google mailbox through the Gmail API (https://developers.google.com/gmail/api/reference/rest).

An async HTTP client (``agent.providers.api_http.ApiClient``) over the documented REST API,
signed by the mailbox's OAuth credential (the adapter never sees a token); every answer is
read through the adapter's own shapes (``agent.providers.shapes``), so one that breaks the
reference is a ``ProviderError``, never a half-read message.

Reading (``changes``). Only the inbox is read (``INBOX``: never our sent copies or drafts),
and nothing is written: no label is added or removed, nothing is marked read. A cursor is an
opaque versioned string, ``gmail-v1.`` and a base64url JSON of:

- ``l`` (listing) or ``h`` (history), the history id ``h`` the phase reads from, and the
  page token ``t`` of the listing or history page to read next;
- ``s``: the ids the previous listing page gave. Gmail lists newest first, so mail arriving
  while a reader pages pushes the rest along, and the next page would start with messages
  already given: they are given once;
- ``n``: the ids the listing gave whose history id is past ``h`` (they arrived, or changed,
  while the listing ran), so the history that follows does not give them again. At most
  ``MAX_CARRIED`` are carried; beyond that a message may be given twice, and its occurrence
  key records it once.

From None, the profile's ``historyId`` is taken *before* the inbox is listed
(``messages.list labelIds=INBOX``, paged), and then ``history.list startHistoryId=...
historyTypes=messageAdded labelId=INBOX`` from it: mail arriving while the listing runs is
read by the history after it, once. At the end of the history the cursor holds the answer's
``historyId``. A 404 on ``history.list`` is Gmail's documented answer to a start it no longer
keeps: ``CursorExpired``, and the caller reads again from None (a full resync, recorded once
by the occurrence keys); so is a cursor that is not this channel's, and a listing page token
Gmail no longer takes.

Messages are fetched with ``format=raw``, not ``full``: the raw form is the message's exact
bytes, which ``agent.providers.rfc822`` normalizes as every other channel's bytes are, so the
envelope - Message-ID, sender, Date, content digest: the occurrence key - is the one every
channel gives. ``full`` gives Gmail's parse instead (header values unfolded and their encoded
words decoded, bodies split into parts), from which the same bytes cannot be rebuilt. A
page's messages are fetched concurrently, bounded by the client's ``parallel`` (the
per-mailbox limit that keeps a 2,000-message first sync under Gmail's per-user rate), and
given in Gmail's order. 429s, and 403s whose reason is a rate limit, wait the
``Retry-After`` Gmail names; 5xx answers are tried again (``agent.providers.retry``).

Threads. Gmail's ``threadId`` is the envelope's ``provider_thread_id``, but the channel
declares ``native_threads`` False and the core keeps its own aliases from Message-IDs.
Gmail joins a message to a thread only when its subject matches too: a client's follow-up
with an edited subject (or one read before the message it answers) is in another Gmail
thread, and would be another task. The Gmail IMAP channel of the same mailbox shows no
thread id, and a mailbox's channels either all show the mail system's thread id or none do.

Sending (``send``). ``users.messages.send`` with the MIME ``agent.providers.mime`` builds
(``raw``, base64url): Gmail takes the recipients from its To and Cc (``Handover.recipients``
is None: nothing is passed beside the MIME). A reply carries In-Reply-To and References and
the subject the core wrote ("Re: " and the original's); its ``threadId`` is the Gmail thread
of the message it answers, looked up by that message's Message-ID (``rfc822msgid:``), so
Gmail files it in the parent's thread. The send is made once: a 4xx, or a failure before the
request left, is ``NotHandedOver``; a 5xx or a lost answer is ``OutcomeUnknown``, settled
from the sent copy. Gmail files that copy as part of sending (``keeps_sent_copy``), within
the declared ``sent_copy_latency``.

Markers (``find_sent``), best first:

- ``header``: ``X-Outloop-Send`` with the send's token. Gmail may give mail sent through the
  API a Message-ID of its own, but keeps our headers; this marker survives. Gmail cannot
  search a header of ours, so the sent mail is read newest first (``labelIds=SENT``, ids
  only) and each message's ``X-Outloop-Send`` is read with ``format=metadata``, until the
  copy is found. Cost: a copy read back right after its send is among the first
  ``SCAN_FIRST`` (one list call and at most that many metadata reads); proving a copy absent
  reads every sent message, up to ``sent_scan``, once per channel instance (a message's
  headers never change: what was read is kept). Past ``sent_scan`` the copy can be neither
  found nor proven absent, and the search says so (the send stays uncertain for a person)
  rather than answering None.
- ``message_id``: ``rfc822msgid:`` within the sent mail - one list call and one read - for a
  channel configured so, or a send another channel of the mailbox marked by its Message-ID.

Either way the candidate is read back raw and must carry exactly the marker
(``mime.carries``); the read-back is Gmail's stored copy, whose HTML Gmail rewrote (style
sheets dropped, the body wrapped in its own ``div``), so it is compared, not byte-matched.

No token, secret or authorization header appears in an error, a log or a ``repr``.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar
from urllib.parse import quote

import httpx
from pydantic import BaseModel, ValidationError

from agent.domain.context import MailboxBinding
from agent.domain.envelope import thread_alias
from agent.domain.errors import (
    AccessRefused,
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
from agent.providers import mime, rfc822
from agent.providers.api_http import (
    ApiClient,
    ApiFailure,
    before_handover,
    gather,
    oauth_api_client,
)
from agent.providers.oauth import SecretReader, SecretWriter
from agent.providers.shapes import (
    GmailHistoryList,
    GmailMessage,
    GmailMessageList,
    GmailProfile,
    GoogleErrorBody,
)

BASE_URL = "https://gmail.googleapis.com/gmail/v1"
TOKEN_URL = "https://oauth2.googleapis.com/token"  # noqa: S105 - an endpoint, not a secret
PROVIDER = "google"
CHANNEL = Channel.API
MARKERS = (MarkerKind.HEADER, MarkerKind.MESSAGE_ID)
"""What marks our sent copy, best first: our header survives where Gmail gives the copy a
Message-ID of its own."""
PAGE_SIZE = 100
CURSOR_VERSION = "gmail-v1"
INBOX = "INBOX"
SENT = "SENT"
DRAFT = "DRAFT"
RATE_LIMIT_REASONS = frozenset({"rateLimitExceeded", "userRateLimitExceeded"})
"""Google's error reasons that mean "fewer requests" (whatever the status: often 403)."""
SENT_SCAN = 5000
"""The most sent messages a search by our header reads, newest first."""
SCAN_FIRST = 50
"""The sent messages a header search reads first (a copy read back right after its send is
among them)."""
LARGEST_PAGE = 500
"""Gmail's largest ``maxResults`` of messages.list and history.list."""
SCAN_PAGE = LARGEST_PAGE
"""The sent messages each further list call of a header search names."""
PARENTS_LOOKED_UP = 3
"""How many of the messages a reply names (In-Reply-To, then References from the latest)
are looked up for its Gmail thread."""
MAX_CARRIED = 1000
"""The most ids a cursor carries to keep the history after a listing from repeating it."""
_MESSAGE_ID = re.compile(r"[A-Za-z0-9_-]{1,128}")
_KNOWN_HEADERS = 50_000
"""How many sent messages' marker headers a channel keeps once read."""

T = TypeVar("T")
S = TypeVar("S", bound=BaseModel)


def read_error(response: httpx.Response) -> ApiFailure:
    """What Google's JSON error body says (https://cloud.google.com/apis/design/errors): its
    message, its first reason, and whether that reason is a rate limit."""
    try:
        body = GoogleErrorBody.model_validate_json(response.content)
    except ValidationError:
        return ApiFailure(f"HTTP {response.status_code} {response.reason_phrase}".strip())
    error = body.error
    reasons = [detail.reason for detail in error.errors if detail.reason]
    return ApiFailure(
        message=" ".join(error.message.split())[:300] or error.status,
        reason=reasons[0] if reasons else error.status,
        rate_limited=bool(RATE_LIMIT_REASONS.intersection(reasons)),
    )


@dataclass(frozen=True)
class _Cursor:
    """Where a reader stands (see the module's docstring)."""

    listing: bool
    history_id: str
    token: str | None = None
    seen: tuple[str, ...] = ()
    new: tuple[str, ...] = ()

    def encode(self) -> str:
        body: dict[str, Any] = {"p": "l" if self.listing else "h", "h": self.history_id}
        if self.token is not None:
            body["t"] = self.token
        if self.seen:
            body["s"] = list(self.seen)
        if self.new:
            body["n"] = list(self.new)
        packed = json.dumps(body, separators=(",", ":")).encode("ascii")
        return f"{CURSOR_VERSION}.{base64.urlsafe_b64encode(packed).decode('ascii')}"

    @staticmethod
    def decode(text: str) -> _Cursor:
        version, _, packed = text.partition(".")
        try:
            if version != CURSOR_VERSION:
                raise ValueError(f"version {version[:20]!r}")
            body = json.loads(base64.urlsafe_b64decode(packed.encode("ascii")))
            phase, history, token = body["p"], body["h"], body.get("t")
            if phase not in ("l", "h") or not (isinstance(history, str) and history.isdigit()):
                raise ValueError("phase or history id")
            if token is not None and not isinstance(token, str):
                raise ValueError("page token")
            seen, new = _ids(body.get("s", [])), _ids(body.get("n", []))
        except (ValueError, KeyError, TypeError, UnicodeError, binascii.Error) as exc:
            raise CursorExpired(
                f"{text[:40]!r} is not a cursor of this Gmail channel: read again"
            ) from exc
        return _Cursor(phase == "l", history, token, seen, new)


def _ids(value: object) -> tuple[str, ...]:
    if not isinstance(value, list):
        raise ValueError("ids")
    ids: list[str] = []
    for item in value:  # pyright: ignore[reportUnknownVariableType] - checked just below
        if not isinstance(item, str) or _MESSAGE_ID.fullmatch(item) is None:
            raise ValueError("ids")
        ids.append(item)
    return tuple(ids)


def _number(value: str | None) -> int:
    return int(value) if value is not None and value.isdigit() else 0


def _b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode("ascii").rstrip("=")


def _unb64url(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def _received(message: GmailMessage) -> datetime:
    """When Gmail took the message (``internalDate``, epoch milliseconds)."""
    return datetime.fromtimestamp(_number(message.internal_date) / 1000, UTC)


def _in_inbox(message: GmailMessage) -> bool:
    labels = message.label_ids
    return DRAFT not in labels and (not labels or INBOX in labels)


def _alias(references: Sequence[str], in_reply_to: str | None, message_id: str) -> str:
    """The alias of a message's thread from its own ids: the message its References name
    first, else the one it answers, else itself (the root the core names a thread by)."""
    return thread_alias(references[0] if references else in_reply_to or message_id)


def _own_thread(parsed: rfc822.Parsed, fallback: str) -> str:
    """The alias of a stored copy's thread, from its headers (``fallback``: its Gmail id,
    for a copy without a Message-ID)."""
    mids = rfc822.header_ids(parsed, "Message-ID")
    irt = rfc822.header_ids(parsed, "In-Reply-To")
    refs = rfc822.header_ids(parsed, "References")
    return _alias(refs, irt[0] if irt else None, mids[0] if mids else fallback)


class GmailApiProvider:
    """The MailProvider port on one mailbox through the Gmail API.

    ``user`` is whose mailbox (``me``: the signed-in account); ``markers`` narrows or
    reorders the markers it sets (a subset of ``MARKERS``); ``page_size`` is how many
    messages a page of changes holds at most; ``sent_scan`` how many sent messages a search
    by our header reads at most."""

    def __init__(
        self,
        api: ApiClient,
        mailbox_id: str,
        *,
        user: str = "me",
        sent_copy_latency: timedelta = timedelta(seconds=120),
        page_size: int = PAGE_SIZE,
        markers: tuple[MarkerKind, ...] | None = None,
        sent_scan: int = SENT_SCAN,
    ) -> None:
        markers = MARKERS if markers is None else markers
        if not markers or not set(markers) <= set(MARKERS):
            raise ValueError(f"a Gmail API channel marks its copies by {', '.join(MARKERS)} only")
        if not 1 <= page_size <= LARGEST_PAGE:
            raise ValueError(f"a page of Gmail messages or history holds 1 to {LARGEST_PAGE}")
        self._api = api
        self._mailbox_id = mailbox_id.lower()
        self._user = quote(user, safe="@")
        self._latency = sent_copy_latency
        self._page_size = page_size
        self._markers = markers
        self._sent_scan = sent_scan
        self._headers: dict[str, tuple[str, ...]] = {}
        """The ``X-Outloop-Send`` values of sent messages already read, by Gmail id."""

    def __repr__(self) -> str:
        return f"GmailApiProvider(mailbox={self._mailbox_id!r})"

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
            sent_copy_latency=self._latency,
            delivers=True,
            page_size=self._page_size,
        )

    # -- requests ------------------------------------------------------------------------

    def _path(self, rest: str) -> str:
        return f"users/{self._user}/{rest}"

    def _shape(self, model: type[S], data: Any, what: str) -> S:
        try:
            return model.model_validate(data)
        except ValidationError as exc:
            raise ProviderError(
                f"mailbox {self._mailbox_id}: Gmail answered {what} in a shape its reference "
                f"does not give ({exc.error_count()} problems)"
            ) from None

    async def _get(self, model: type[S], rest: str, params: dict[str, Any], what: str) -> S:
        data = await self._api.json("GET", self._path(rest), params=params)
        return self._shape(model, data, what)

    async def _profile(self) -> GmailProfile:
        return await self._get(GmailProfile, "profile", {}, "the profile")

    async def _list(self, params: dict[str, Any]) -> GmailMessageList:
        return await self._get(GmailMessageList, "messages", params, "a message list")

    async def _raw(self, message_id: str) -> tuple[GmailMessage, bytes]:
        """A message and its exact bytes (``format=raw``)."""
        if _MESSAGE_ID.fullmatch(message_id) is None:
            raise NotFound(f"{message_id[:80]!r} is not a Gmail message id")
        try:
            message = await self._get(
                GmailMessage, f"messages/{message_id}", {"format": "raw"}, "a message"
            )
        except NotFound:
            raise NotFound(f"message {message_id} is not in mailbox {self._mailbox_id}") from None
        if message.raw is None:
            raise ProviderError(
                f"mailbox {self._mailbox_id}: Gmail answered message {message_id} without "
                "its raw form"
            )
        try:
            return message, _unb64url(message.raw)
        except (ValueError, binascii.Error):
            raise ProviderError(
                f"mailbox {self._mailbox_id}: message {message_id}'s raw form is not base64url"
            ) from None

    # -- reading -------------------------------------------------------------------------

    async def changes(self, cursor: str | None) -> ChangePage:
        if cursor is None:
            start = _Cursor(listing=True, history_id=(await self._profile()).history_id)
        else:
            start = _Cursor.decode(cursor)
        if start.listing:
            items, after = await self._listing(start)
            if after.listing or items:
                return ChangePage(items=items, cursor=after.encode(), more=True)
            start = after  # an empty inbox: its history is read now
        return await self._history(start)

    async def _listing(self, start: _Cursor) -> tuple[tuple[ScannedMessage, ...], _Cursor]:
        params: dict[str, Any] = {"labelIds": INBOX, "maxResults": self._page_size}
        if start.token is not None:
            params["pageToken"] = start.token
        try:
            listing = await self._list(params)
        except ProviderError as exc:
            if start.token is None or type(exc) is not ProviderError:
                raise
            raise CursorExpired(
                f"mailbox {self._mailbox_id}: Gmail no longer takes the listing's page token "
                f"({exc}): read again"
            ) from None
        page = [ref.id for ref in listing.messages]
        given = {*start.seen, *start.new}
        items, fetched = await self._read(m for m in page if m not in given)
        floor = int(start.history_id)
        new = [*start.new, *(m.id for m in fetched if _number(m.history_id) > floor)]
        new = new[:MAX_CARRIED]
        if listing.next_page_token:
            token = listing.next_page_token
            return items, _Cursor(True, start.history_id, token, tuple(page), tuple(new))
        return items, _Cursor(False, start.history_id, None, (), tuple(new))

    async def _history(self, start: _Cursor) -> ChangePage:
        params: dict[str, Any] = {
            "startHistoryId": start.history_id,
            "historyTypes": "messageAdded",
            "labelId": INBOX,
            "maxResults": self._page_size,
        }
        if start.token is not None:
            params["pageToken"] = start.token
        try:
            answer = await self._get(GmailHistoryList, "history", params, "the history")
        except NotFound:
            raise CursorExpired(
                f"mailbox {self._mailbox_id}: Gmail no longer keeps history from "
                f"{start.history_id}: the inbox is read again in full"
            ) from None
        added = (
            record.message
            for entry in answer.history
            for record in entry.messages_added
            if _in_inbox(record.message)
        )
        given = set(start.new)
        items, _ = await self._read(m.id for m in added if m.id not in given)
        if answer.next_page_token:
            after = _Cursor(False, start.history_id, answer.next_page_token, (), start.new)
            return ChangePage(items=items, cursor=after.encode(), more=True)
        after = _Cursor(False, answer.history_id)
        return ChangePage(items=items, cursor=after.encode(), more=False)

    async def _read(
        self, ids: Iterable[str]
    ) -> tuple[tuple[ScannedMessage, ...], list[GmailMessage]]:
        """The messages of ``ids`` (each once, in order) normalized, and as Gmail gave them."""
        wanted = list(dict.fromkeys(ids))
        fetched = [f for f in await gather(wanted, self._raw) if f is not None]
        items = tuple(self._scanned(message, raw) for message, raw in fetched)
        return items, [message for message, _ in fetched]

    def _scanned(self, message: GmailMessage, raw: bytes) -> ScannedMessage:
        try:
            envelope = rfc822.normalize(
                raw,
                provider=PROVIDER,
                mailbox_id=self._mailbox_id,
                provider_message_id=message.id,
                thread_id_for=lambda _mid, _irt, _refs: message.thread_id,
                fallback_received_at=_received(message),
            )
        except rfc822.UnparseableMessage as exc:
            return ScannedMessage(item_ref=message.id, error=str(exc))
        except Exception as exc:
            error = f"could not be normalized ({type(exc).__name__}: {exc})"
            return ScannedMessage(item_ref=message.id, error=error)
        return ScannedMessage(item_ref=message.id, envelope=envelope)

    async def fetch_body(self, body_ref: str) -> MessageBody:
        _, raw = await self._raw(body_ref)
        return rfc822.body(raw)

    async def fetch_attachment(self, ref: str) -> AttachmentData:
        message_id, _, index = ref.rpartition("/")
        if not index.isdigit():
            raise NotFound(f"{ref[:80]!r} is not a Gmail attachment reference (<message>/<n>)")
        _, raw = await self._raw(message_id)
        found = rfc822.attachments(raw, message_id)
        if int(index) >= len(found):
            raise NotFound(f"message {message_id} has no attachment {index}")
        return found[int(index)]

    # -- sending -------------------------------------------------------------------------

    async def prepare(self, message: OutgoingMessage) -> Handover:
        marker = mime.marker_for(message, self._markers[0])
        raw = mime.build_marked(message, marker, datetime.now(UTC))
        return Handover(message=message, channel=CHANNEL.value, mime=raw, marker=marker)

    async def send(self, handover: Handover) -> SendResult:
        raw = handover.mime
        if raw is None:
            raise NotHandedOver("a Gmail API send takes the message's MIME: prepare it first")
        message = handover.message
        try:
            thread = await self._thread_of(message)
        except ProviderError as exc:
            raise before_handover(exc) from None
        body: dict[str, str] = {"raw": _b64url(raw)}
        if thread is not None:
            body["threadId"] = thread
        try:
            answer = await self._api.json("POST", self._path("messages/send"), json=body, once=True)
        except OutcomeUnknown:
            raise
        except ProviderError as exc:  # a 4xx, or the token refresh before the request left
            raise before_handover(exc) from None
        try:
            sent = GmailMessage.model_validate(answer)
        except ValidationError:
            raise OutcomeUnknown(
                f"mailbox {self._mailbox_id}: Gmail took the message but answered without "
                "its id; it is settled from the sent copy"
            ) from None
        return SendResult(
            provider_message_id=sent.id,
            provider_thread_id=message.provider_thread_id
            or _alias(message.references, message.in_reply_to, message.internet_message_id),
            internet_message_id=message.internet_message_id,
            channel=CHANNEL.value,
            delivered=True,
            accepted_at=datetime.now(UTC),
        )

    async def _thread_of(self, message: OutgoingMessage) -> str | None:
        """The Gmail thread of the message ``message`` answers (else of one of the latest
        messages its References name that the mailbox holds); None for a new thread."""
        named = (message.in_reply_to, *reversed(message.references))
        for parent in list(dict.fromkeys(m for m in named if m))[:PARENTS_LOOKED_UP]:
            found = await self._list({"q": f"rfc822msgid:{parent}", "maxResults": 1})
            if found.messages:
                return found.messages[0].thread_id
        return None

    async def find_sent(self, marker: Marker) -> StoredCopy | None:
        if marker.kind not in self._markers:
            raise Unsupported(f"this Gmail API channel does not search by a {marker.kind} marker")
        if marker.kind is MarkerKind.MESSAGE_ID:
            params = {"labelIds": SENT, "q": f"rfc822msgid:{marker.value}", "maxResults": 10}
            candidates = [ref.id for ref in (await self._list(params)).messages]
        else:
            found = await self._marked_by_header(marker.value)
            candidates = [] if found is None else [found]
        for message_id in candidates:
            copy = await self._copy_if_marked(message_id, marker)
            if copy is not None:
                return copy
        return None

    async def _marked_by_header(self, token: str) -> str | None:
        """The newest sent message whose ``X-Outloop-Send`` is ``token`` (see the module's
        docstring for the cost); ``ProviderError`` past ``sent_scan`` messages."""
        page_token: str | None = None
        scanned, size = 0, SCAN_FIRST
        while scanned < self._sent_scan:
            params: dict[str, Any] = {
                "labelIds": SENT,
                "maxResults": min(size, self._sent_scan - scanned),
            }
            if page_token is not None:
                params["pageToken"] = page_token
            listing = await self._list(params)
            ids = [ref.id for ref in listing.messages]
            unknown = [m for m in ids if m not in self._headers]
            for message_id, values in zip(
                unknown, await gather(unknown, self._marker_values), strict=True
            ):
                if values is not None:
                    self._remember(message_id, values)
            for message_id in ids:
                if token in self._headers.get(message_id, ()):
                    return message_id
            scanned += len(ids)
            page_token, size = listing.next_page_token, SCAN_PAGE
            if page_token is None:
                return None
        raise ProviderError(
            f"mailbox {self._mailbox_id}: none of the newest {self._sent_scan} sent messages "
            f"carries {mime.MARKER_HEADER} {token}, and older ones are not searched: the copy "
            "is neither found nor proven absent (a person settles the send)"
        )

    async def _marker_values(self, message_id: str) -> tuple[str, ...]:
        message = await self._get(
            GmailMessage,
            f"messages/{message_id}",
            {"format": "metadata", "metadataHeaders": mime.MARKER_HEADER},
            "a message's headers",
        )
        headers = message.payload.headers if message.payload is not None else ()
        wanted = mime.MARKER_HEADER.lower()
        return tuple(h.value.strip() for h in headers if h.name.lower() == wanted)

    def _remember(self, message_id: str, values: tuple[str, ...]) -> None:
        if len(self._headers) >= _KNOWN_HEADERS:
            self._headers.clear()
        self._headers[message_id] = values

    async def _copy_if_marked(self, message_id: str, marker: Marker) -> StoredCopy | None:
        """The sent copy ``message_id`` read back, if it carries exactly ``marker``."""
        try:
            _, raw = await self._raw(message_id)
            parsed = rfc822.parse(raw)
        except (NotFound, rfc822.UnparseableMessage):
            return None
        if not mime.carries(parsed, marker):
            return None
        return rfc822.stored_copy(
            raw,
            provider_message_id=message_id,
            provider_thread_id=_own_thread(parsed, message_id),
            delivered=True,
        )

    # -- the rest ------------------------------------------------------------------------

    async def health(self) -> ProviderHealth:
        try:
            profile = await self._profile()
        except ProviderError as exc:
            return ProviderHealth(
                provider=PROVIDER,
                mailbox_id=self._mailbox_id,
                ok=False,
                detail=str(exc),
                refused=isinstance(exc, AccessRefused),
            )
        if profile.email_address.lower() != self._mailbox_id:
            return ProviderHealth(
                provider=PROVIDER,
                mailbox_id=self._mailbox_id,
                ok=False,
                detail=f"Gmail API signed in as {profile.email_address}, not "
                f"{self._mailbox_id}: these credentials are another account's",
            )
        return ProviderHealth(
            provider=PROVIDER,
            mailbox_id=self._mailbox_id,
            ok=True,
            detail=f"Gmail API signed in as {profile.email_address}: "
            f"{profile.messages_total} messages, history id {profile.history_id}",
        )

    async def aclose(self) -> None:
        await self._api.aclose()


def open_gmail(
    binding: MailboxBinding,
    *,
    read: SecretReader,
    write: SecretWriter,
    reconnect: str,
    transport: httpx.AsyncBaseTransport | None = None,
) -> GmailApiProvider:
    """The Gmail API channel of ``binding``'s mailbox, its OAuth secrets read from the vault
    by the names ``binding.api`` gives (``reconnect``: the command that connects it again)."""
    access = binding.api
    api = oauth_api_client(
        access,
        binding.mailbox_id,
        base_url=BASE_URL,
        token_url=TOKEN_URL,
        read_error=read_error,
        read=read,
        write=write,
        reconnect=reconnect,
        transport=transport,
    )
    return GmailApiProvider(
        api,
        binding.mailbox_id,
        user=access.user,
        sent_copy_latency=timedelta(seconds=access.sent_copy_latency_seconds),
    )
