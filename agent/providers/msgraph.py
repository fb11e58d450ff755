"""A Microsoft 365 or Outlook.com mailbox through Microsoft Graph (the v1.0 mail API).

Every request asks for immutable ids (``Prefer: IdType="ImmutableId"``; Graph applies it to
the request that carries it only): a message keeps its id when it moves between folders, so
the id a draft is given is also the id of its copy in Sent Items
(https://learn.microsoft.com/graph/outlook-immutable-id). Graph's 429 and 503 with
``Retry-After``, and its ``TooManyRequests`` and ``ApplicationThrottled`` errors, are
throttling (https://learn.microsoft.com/graph/throttling): a read waits as told and asks
again, a send is refused before it was taken (``agent.providers.api_http``).

Reading (``changes``): the inbox's messages in the order they arrived (``$orderby
receivedDateTime asc``), from the second the cursor names (``$filter receivedDateTime ge``),
``$top`` a page, following ``@odata.nextLink`` while a page holds messages read before. Each
message is read as its MIME (``/messages/{id}/$value``) and normalized by ``rfc822`` exactly
as the IMAP channel normalizes the same bytes: the same Message-ID, sender and Date (the
occurrence key), and the same envelope, body and attachments through every channel of the
mailbox. Graph's JSON properties would not give that: ``sentDateTime`` and ``from`` are
Exchange's readings of the headers (an internal sender shows the directory's name), and a
message's attachments, Auto-Submitted or delivery report are none of them. Only the id, the
``conversationId`` and ``receivedDateTime`` come from JSON. Nothing is written: reading marks
nothing read.

Threads. The ``conversationId`` is the envelope's ``provider_thread_id``, but the channel
declares ``native_threads`` False and the core keeps its own aliases from Message-IDs:
Exchange groups a conversation by its topic too (a message with the same subject and no
reference joins it), and a follow-up read before the message it answers starts a
conversation of its own. A stored copy's thread is named from its References as the core
names threads.

A cursor is ``graph-v1:<second>:<digests>``: the receivedDateTime (to the second) of the last
message read, and digests of the ids read at that second. The next read asks from that
second again and skips those ids. Mail that arrives while a reader pages is received later,
so it sorts after everything listed before it and is read once, by a later page; messages
sharing the boundary second are neither read twice nor lost; a message moved out of the
inbox shifts no position. A position in time never expires: only a cursor that is not this
channel's is refused (``CursorExpired``).

Sending. ``prepare`` writes nothing: it plans the draft's properties and hands over the
lists Graph will send it to (To and Cc as planned, Bcc and Reply-To none), which the core
checks against the plan, and the marker, our Message-ID. ``send`` then makes the draft: a
reply by ``createReply`` on the message it answers (found by its internetMessageId), so
Graph puts it in the parent's conversation with In-Reply-To and References; a new message by
``POST messages``. ``createReply`` fills in recipients of its own (the parent's sender, or
its Reply-To): ``PATCH`` sets the subject, the body, To and Cc to the plan's, Bcc and
Reply-To to none, and ``internetMessageId`` to our Message-ID, which Graph lets a draft set
(message-update: "Updatable only if isDraft = true") and keeps through the send. The lists
the draft then holds, as Graph answers them, must be the handover's, else nothing is sent.
Files are added one request each. A create is made once (repeated after a lost answer, it
would make two drafts). A draft an earlier attempt left unsent is found by our Message-ID
and used again, unless the message has files (which would need checking one by one: a new
draft is made, and the old one is left in Drafts). A message whose copy is in Sent Items
already is not sent again: the send is settled from that copy. The draft is posted with
``/send`` (202, no body); any failure before that post handed nothing over.

The marker is our Message-ID (``MESSAGE_ID``), looked up in Sent Items by
``internetMessageId``. Custom ``x-`` headers are taken when a message is made but cannot be
relied on when it is read back. A MIME send (``sendMail``, or a draft made from base64 MIME)
is not used: ``sendMail`` answers with no id, its thread is Exchange's guess from the
subject rather than ``createReply``'s link to the parent, and the mock the tests run on takes
JSON only. The draft's immutable id is the send's ``provider_message_id``: the copy in Sent
Items keeps it.
"""

from __future__ import annotations

import base64
import hashlib
import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar
from urllib.parse import quote, urlsplit

import httpx
from pydantic import BaseModel, ValidationError

from agent.domain.context import MailboxBinding
from agent.domain.envelope import Address, thread_alias
from agent.domain.errors import (
    AccessRefused,
    CursorExpired,
    NotFound,
    NotHandedOver,
    OutcomeUnknown,
    ProviderError,
    Throttled,
    TransientFailure,
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
from agent.providers.retry import with_retries
from agent.providers.shapes import (
    GraphDraft,
    GraphErrorBody,
    GraphMessage,
    GraphMessageCollection,
    GraphRecipient,
    GraphUser,
)

PROVIDER = "microsoft"
CHANNEL = Channel.API
BASE_URL = "https://graph.microsoft.com/v1.0"
MARKERS = (MarkerKind.MESSAGE_ID,)
"""What marks our copy in Sent Items: the immutable id of the draft it was sent from."""
PAGE_SIZE = 100
LARGEST_TOP = 1000
"""Graph's largest ``$top`` for messages."""
CURSOR_VERSION = "graph-v1"
IMMUTABLE_IDS = {"Prefer": 'IdType="ImmutableId"'}
RATE_LIMITED = frozenset({"TooManyRequests", "ApplicationThrottled"})
"""Graph's error codes for throttling (https://learn.microsoft.com/graph/throttling)."""
LARGEST_FILE = 3 * 1024 * 1024
"""The largest file Graph takes in one ``POST attachments`` (larger needs an upload session,
which this channel does not open)."""
LISTED = "id,conversationId,receivedDateTime"
PARENT = "id,conversationId,internetMessageId,isDraft"
DRAFT = (
    "id,conversationId,internetMessageId,subject,isDraft,from,"
    "toRecipients,ccRecipients,bccRecipients,replyTo,hasAttachments"
)
_SECOND = "%Y%m%dT%H%M%SZ"
_CURSOR = re.compile(
    rf"{CURSOR_VERSION}:(-|\d{{8}}T\d{{6}}Z):((?:[0-9a-f]{{16}},)*[0-9a-f]{{16}})?"
)

S = TypeVar("S", bound=BaseModel)
T = TypeVar("T")


def token_url(tenant: str) -> str:
    """The Microsoft identity platform's token endpoint of ``tenant`` (an id, a domain, or
    ``common``)."""
    return f"https://login.microsoftonline.com/{tenant}/oauth2/v2.0/token"


def read_error(response: httpx.Response) -> ApiFailure:
    """Graph's error resource (https://learn.microsoft.com/graph/errors): its code and
    message; a throttling code is a rate limit whatever the status."""
    try:
        error = GraphErrorBody.model_validate_json(response.content).error
    except ValidationError:
        return ApiFailure(message=f"HTTP {response.status_code} without Graph's error resource")
    return ApiFailure(
        message=f"{error.code}: {error.message[:300]}",
        reason=error.code,
        rate_limited=error.code in RATE_LIMITED,
    )


def open_graph(
    binding: MailboxBinding,
    *,
    read: SecretReader,
    write: SecretWriter,
    reconnect: str,
    transport: httpx.AsyncBaseTransport | None = None,
) -> GraphMailProvider:
    """The Graph channel of ``binding``'s mailbox, signed with its OAuth secrets from the
    vault (``read``; a rotated refresh token is stored with ``write``)."""
    access = binding.api
    mailbox_id = binding.mailbox_id.lower()
    api = oauth_api_client(
        access,
        mailbox_id,
        base_url=BASE_URL,
        token_url=token_url(access.tenant),
        read_error=read_error,
        read=read,
        write=write,
        reconnect=reconnect,
        transport=transport,
    )
    return GraphMailProvider(
        api,
        mailbox_id,
        user=access.user,
        sent_copy_latency=timedelta(seconds=access.sent_copy_latency_seconds),
    )


@dataclass(frozen=True)
class _Listed:
    """A message of the inbox as a listing shows it."""

    id: str
    conversation_id: str
    received: datetime

    @property
    def second(self) -> datetime:
        return self.received.replace(microsecond=0)

    @property
    def digest(self) -> str:
        return hashlib.sha256(self.id.encode("utf-8", "surrogateescape")).hexdigest()[:16]


@dataclass(frozen=True)
class _Cursor:
    second: datetime | None
    """The receivedDateTime second of the last message read (None: nothing read yet)."""
    seen: frozenset[str] = frozenset()
    """Digests of the ids read that were received in that second."""

    def encode(self) -> str:
        when = "-" if self.second is None else self.second.strftime(_SECOND)
        return f"{CURSOR_VERSION}:{when}:{','.join(sorted(self.seen))}"

    @staticmethod
    def decode(text: str) -> _Cursor:
        refused = CursorExpired(f"{text[:40]!r} is not a cursor of this Graph channel: read again")
        match = _CURSOR.fullmatch(text)
        if match is None or (match[1] == "-" and match[2]):
            raise refused
        if match[1] == "-":
            return _Cursor(None)
        try:
            second = datetime.strptime(match[1], _SECOND).replace(tzinfo=UTC)
        except ValueError:
            raise refused from None
        return _Cursor(second, frozenset(match[2].split(",")) if match[2] else frozenset())

    def since(self) -> str | None:
        """The ``$filter`` that lists what may be new (None: everything)."""
        if self.second is None:
            return None
        return f"receivedDateTime ge {self.second:%Y-%m-%dT%H:%M:%SZ}"

    def has_read(self, listed: _Listed) -> bool:
        if self.second is None:
            return False
        return listed.second < self.second or (
            listed.second == self.second and listed.digest in self.seen
        )

    def after(self, taken: Sequence[_Listed]) -> _Cursor:
        """The cursor past ``taken`` (read in order after this one)."""
        if not taken:
            return self
        last = max(t.second for t in taken)
        seen = {t.digest for t in taken if t.second == last}
        return _Cursor(last, frozenset(seen | (self.seen if last == self.second else set())))


class GraphMailProvider:
    """The MailProvider port on a mailbox through Microsoft Graph.

    ``user`` is whose mailbox: ``me`` (the signed-in account) or a user id or address the
    app may use; ``sent_copy_latency`` the longest a sent copy takes to be in Sent Items;
    ``markers`` narrows the markers it sets; ``page_size`` is how many messages a page of
    changes holds at most."""

    def __init__(
        self,
        api: ApiClient,
        mailbox_id: str,
        *,
        user: str = "me",
        sent_copy_latency: timedelta = timedelta(seconds=120),
        page_size: int = PAGE_SIZE,
        markers: tuple[MarkerKind, ...] | None = None,
        channel: Channel = CHANNEL,
        immutable_ids: bool = True,
    ) -> None:
        markers = MARKERS if markers is None else markers
        if not markers or not set(markers) <= set(MARKERS):
            raise ValueError(f"a Graph channel marks its copies by {', '.join(MARKERS)} only")
        if not 1 <= page_size <= LARGEST_TOP:
            raise ValueError(f"a page of Graph messages holds 1 to {LARGEST_TOP}")
        self._api = api
        self._mailbox_id = mailbox_id.lower()
        self._root = "me" if user == "me" else f"users/{quote(user, safe='@')}"
        self._latency = sent_copy_latency
        self._page_size = page_size
        self._markers = markers
        self._channel = channel
        self._immutable_ids = immutable_ids

    def __repr__(self) -> str:
        return f"GraphMailProvider(mailbox={self._mailbox_id!r})"

    @property
    def provider(self) -> str:
        return PROVIDER

    @property
    def mailbox_id(self) -> str:
        return self._mailbox_id

    @property
    def capabilities(self) -> Capabilities:
        return Capabilities(
            channel=self._channel,
            key_basis=True,
            native_threads=False,
            markers=self._markers,
            keeps_sent_copy=True,
            files_sent_copy=False,
            sent_copy_latency=self._latency,
            delivers=True,
            page_size=self._page_size,
        )

    # -- requests ------------------------------------------------------------------------

    def _item(self, message_id: str) -> str:
        return f"{self._root}/messages/{quote(message_id, safe='')}"

    async def _request(
        self,
        method: str,
        path: str,
        *,
        params: dict[str, str] | None = None,
        json: Any = None,
        once: bool = False,
    ) -> httpx.Response:
        return await self._api.call(
            method,
            path,
            params=params,
            json=json,
            headers=IMMUTABLE_IDS if self._immutable_ids else None,
            once=once,
        )

    async def _read(
        self,
        shape: type[S],
        method: str,
        path: str,
        *,
        params: dict[str, str] | None = None,
        json: Any = None,
    ) -> tuple[S, httpx.Response]:
        response = await self._request(method, path, params=params, json=json)
        return self._shaped(shape, response), response

    def _shaped(self, shape: type[S], response: httpx.Response) -> S:
        try:
            return shape.model_validate_json(response.content)
        except ValidationError:
            raise ProviderError(
                f"mailbox {self._mailbox_id}: Graph answered {response.request.method} "
                f"{response.url.path} with a body that is not a {shape.__name__}"
            ) from None

    async def _mime(self, message_id: str) -> bytes:
        return (await self._request("GET", f"{self._item(message_id)}/$value")).content

    # -- reading -------------------------------------------------------------------------

    async def changes(self, cursor: str | None) -> ChangePage:
        start = _Cursor(None) if cursor is None else _Cursor.decode(cursor)
        taken, more = await self._new_since(start)
        raws = await gather([listed.id for listed in taken], self._mime)
        return ChangePage(
            items=tuple(
                self._scanned(listed, raw)
                for listed, raw in zip(taken, raws, strict=True)
                if raw is not None  # moved or deleted since it was listed
            ),
            cursor=start.after(taken).encode(),
            more=more,
        )

    async def _new_since(self, start: _Cursor) -> tuple[list[_Listed], bool]:
        """The next page of messages ``start`` has not read, oldest first, and whether more
        may follow."""
        params = {"$select": LISTED, "$orderby": "receivedDateTime asc"}
        params["$top"] = str(self._page_size)
        since = start.since()
        if since is not None:
            params["$filter"] = since
        path = f"{self._root}/mailFolders/inbox/messages"
        page, response = await self._read(GraphMessageCollection, "GET", path, params=params)
        taken: dict[str, _Listed] = {}
        followed: set[str] = set()
        while True:
            for message in page.value:
                listed = self._listed(message)
                if start.has_read(listed) or listed.id in taken:
                    continue
                if len(taken) == self._page_size:
                    return list(taken.values()), True
                taken[listed.id] = listed
            if page.next_link is None:
                return list(taken.values()), False
            if len(taken) == self._page_size:
                return list(taken.values()), True
            if page.next_link in followed:
                raise ProviderError(
                    f"mailbox {self._mailbox_id}: Graph gave the same next page link twice"
                )
            followed.add(page.next_link)
            next_link = self._same_origin(page.next_link, response.url)
            page, response = await self._read(GraphMessageCollection, "GET", next_link)

    def _same_origin(self, link: str, asked: httpx.URL) -> str:
        """A next-page link Graph gave, if it points where the listing was asked (the
        credential is sent to it)."""
        given = urlsplit(link)
        if (given.scheme, given.netloc) != (asked.scheme, asked.netloc.decode("ascii")):
            raise ProviderError(
                f"mailbox {self._mailbox_id}: Graph's next page link points to another host "
                f"({given.netloc}); it is not followed"
            )
        return link

    def _listed(self, message: GraphMessage) -> _Listed:
        try:
            received = datetime.fromisoformat(message.received_date_time or "")
        except ValueError:
            raise ProviderError(
                f"mailbox {self._mailbox_id}: Graph listed message {message.id} without a "
                f"readable receivedDateTime ({message.received_date_time!r})"
            ) from None
        if received.tzinfo is None:
            received = received.replace(tzinfo=UTC)
        conversation = message.conversation_id or message.id
        return _Listed(message.id, conversation, received.astimezone(UTC))

    def _scanned(self, listed: _Listed, raw: bytes) -> ScannedMessage:
        def conversation(*_: object) -> str:
            return listed.conversation_id

        try:
            envelope = rfc822.normalize(
                raw,
                provider=PROVIDER,
                mailbox_id=self._mailbox_id,
                provider_message_id=listed.id,
                thread_id_for=conversation,
                fallback_received_at=listed.received,
            )
        except rfc822.UnparseableMessage as exc:
            return ScannedMessage(item_ref=listed.id, error=str(exc))
        except Exception as exc:
            return ScannedMessage(
                item_ref=listed.id, error=f"could not be normalized ({type(exc).__name__}: {exc})"
            )
        return ScannedMessage(item_ref=listed.id, envelope=envelope)

    async def fetch_body(self, body_ref: str) -> MessageBody:
        return rfc822.body(await self._mime(body_ref))

    async def fetch_attachment(self, ref: str) -> AttachmentData:
        item_ref, _, index = ref.rpartition("/")
        if not item_ref or not index.isdigit():
            raise NotFound(f"{ref!r} is not a Graph attachment reference (<message id>/<n>)")
        found = rfc822.attachments(await self._mime(item_ref), item_ref)
        if int(index) >= len(found):
            raise NotFound(
                f"message {item_ref} of mailbox {self._mailbox_id} has no attachment {index}"
            )
        return found[int(index)]

    # -- sending -------------------------------------------------------------------------

    async def prepare(self, message: OutgoingMessage) -> Handover:
        """The form ``message`` is handed over in: the lists Graph will send it to (To and
        Cc as planned, Bcc and Reply-To none) and its marker, our Message-ID, which the draft
        carries. Nothing is written: the draft is made by ``send``, so a prepare whose
        handover is never sent leaves nothing in the mailbox."""
        plan = _plan(message)
        if message.in_reply_to is not None:
            await self._parent(message)  # a reply to a message not in the mailbox is refused
        return Handover(
            message=message,
            channel=self._channel.value,
            recipients=_planned_lists(plan),
            marker=Marker(kind=MarkerKind.MESSAGE_ID, value=message.internet_message_id),
        )

    async def _draft_for(self, message: OutgoingMessage, handover: Handover) -> GraphDraft:
        """The draft of ``message``, as planned and holding exactly the handover's lists: the
        one an earlier attempt left unsent (a message without files), else a new one."""
        plan = _plan(message)
        ours = [m for m in await self._ours(message.internet_message_id) if m.is_draft is True]
        reusable = [m for m in ours if m.has_attachments is False]
        parent = await self._parent(message) if message.in_reply_to is not None else None
        if reusable and not message.attachments:
            draft = await self._drafted("PATCH", self._item(reusable[0].id), plan)
        elif parent is None:
            draft = await self._drafted("POST", f"{self._root}/messages", plan, once=True)
        else:
            # Our Message-ID from the start, so a draft whose answer was lost is found again.
            ours_from_the_start = {"message": {"internetMessageId": message.internet_message_id}}
            made = await self._drafted(
                "POST", f"{self._item(parent.id)}/createReply", ours_from_the_start, once=True
            )
            draft = await self._drafted("PATCH", self._item(made.id), plan)
            if draft.id != made.id:
                raise self._unlike(draft, f"PATCH answered for another draft than {made.id}")
        await self._attach(draft.id, message.attachments)
        self._check_draft(draft, message, parent)
        if _planned_lists(_as_plan(draft)) != handover.recipients:
            raise self._unlike(draft, "its recipients are not the ones checked")
        return draft

    async def _ours(self, internet_message_id: str) -> list[GraphDraft]:
        """Every message of the mailbox carrying our Message-ID (drafts and sent copies)."""
        params = {"$filter": _id_filter(internet_message_id), "$select": DRAFT, "$top": "50"}
        found, _ = await self._read(
            _DraftCollection, "GET", f"{self._root}/messages", params=params
        )
        return [m for m in found.value if m.internet_message_id == internet_message_id]

    async def _parent(self, message: OutgoingMessage) -> GraphMessage:
        """The message ``message`` answers (in the plan's thread where that is a Graph
        conversation, as a thread read through Graph is not)."""
        wanted = message.in_reply_to or ""
        params = {"$filter": _id_filter(wanted), "$select": PARENT, "$top": "50"}
        found, _ = await self._read(
            GraphMessageCollection, "GET", f"{self._root}/messages", params=params
        )
        candidates = [m for m in found.value if not m.is_draft and m.internet_message_id == wanted]
        thread = message.provider_thread_id
        if candidates:
            return min(candidates, key=lambda m: m.conversation_id != thread)
        raise NotFound(
            f"mailbox {self._mailbox_id} holds no message {wanted} to reply to; nothing was written"
        )

    async def _drafted(
        self, method: str, path: str, body: dict[str, Any] | None, *, once: bool = False
    ) -> GraphDraft:
        """The draft a create, createReply or PATCH answered with, its id immutable (a
        create is made ``once``: repeated after a lost answer, it would make two)."""
        response = await self._request(method, path, json=body, once=once)
        draft = self._shaped(GraphDraft, response)
        applied = response.headers.get("preference-applied", "")
        if self._immutable_ids and "immutableid" not in applied.replace(" ", "").lower():
            raise self._unlike(
                draft,
                "Graph did not apply immutable ids, so its id would not find the sent copy",
            )
        return draft

    async def _attach(self, draft_id: str, files: Sequence[AttachmentData]) -> None:
        for file in files:
            try:
                await self._attach_one(draft_id, file)
            except (NotHandedOver, OutcomeUnknown) as exc:
                said = (
                    f"mailbox {self._mailbox_id}: {file.ref.name} could not be attached to draft "
                    f"{draft_id} ({exc}); the draft is left unsent"
                )
                if isinstance(exc, Throttled):
                    raise Throttled(said, exc.retry_after) from None
                raise TransientFailure(said) from None

    @with_retries  # a 429 attached nothing and is asked again; a lost answer is not
    async def _attach_one(self, draft_id: str, file: AttachmentData) -> None:
        body = {
            "@odata.type": "#microsoft.graph.fileAttachment",
            "name": file.ref.name,
            "contentType": file.ref.content_type,
            "contentBytes": base64.b64encode(file.data).decode("ascii"),
        }
        await self._request("POST", f"{self._item(draft_id)}/attachments", json=body, once=True)

    def _check_draft(
        self, draft: GraphDraft, message: OutgoingMessage, parent: GraphMessage | None
    ) -> None:
        if draft.is_draft is not True:
            raise self._unlike(draft, "Graph says it is not a draft")
        if draft.subject != message.subject:
            raise self._unlike(draft, f"its subject reads {draft.subject!r}")
        if draft.internet_message_id != message.internet_message_id:
            # Its copy could not be found by our Message-ID: a lost answer would go twice.
            raise self._unlike(draft, f"Graph gave it the Message-ID {draft.internet_message_id}")
        sender = draft.from_.email_address.address if draft.from_ is not None else None
        if sender is not None and sender.lower() != message.sender.address.lower():
            raise self._unlike(draft, f"it would go from {sender}")
        if parent is not None and draft.conversation_id != parent.conversation_id:
            raise self._unlike(draft, "it is not in the conversation of the message it answers")

    def _unlike(self, draft: GraphDraft, why: str) -> ProviderError:
        return ProviderError(
            f"mailbox {self._mailbox_id}: draft {draft.id} is not the message as planned "
            f"({why}); it is left unsent in Drafts"
        )

    async def send(self, handover: Handover) -> SendResult:
        if handover.recipients is None:
            raise NotHandedOver("a Graph send hands over what its prepare planned; prepare it")
        message = handover.message
        mid = message.internet_message_id
        try:
            gone = await self._sent_copy(Marker(kind=MarkerKind.MESSAGE_ID, value=mid))
            draft = None if gone is not None else await self._draft_for(message, handover)
        except ProviderError as exc:  # nothing was sent: at most a draft was written
            raise before_handover(exc) from None
        if draft is None:
            raise OutcomeUnknown(
                f"mailbox {self._mailbox_id}: {mid} was sent already (a copy of it is in the "
                "mailbox); the send is settled from that copy"
            )
        await self._request("POST", f"{self._item(draft.id)}/send", once=True)
        return SendResult(
            provider_message_id=draft.id,
            provider_thread_id=message.provider_thread_id
            or _thread(message.references, message.in_reply_to, mid),
            internet_message_id=draft.internet_message_id or mid,
            channel=self._channel.value,
            delivered=True,
            accepted_at=datetime.now(UTC),
        )

    async def find_sent(self, marker: Marker) -> StoredCopy | None:
        if marker.kind not in self._markers:
            raise Unsupported(f"this Graph channel does not search by a {marker.kind} marker")
        found = await self._sent_copy(marker)
        if found is None:
            return None  # not sent (yet)
        try:
            raw = await self._mime(found.id)
        except NotFound:
            return None  # moved out of the mailbox since it was listed
        parsed = rfc822.parse(raw)
        ids = {name: rfc822.header_ids(parsed, name) for name in ("References", "In-Reply-To")}
        own = rfc822.header_ids(parsed, "Message-ID")
        thread = _thread(ids["References"], next(iter(ids["In-Reply-To"]), None), *own, found.id)
        return rfc822.stored_copy(
            raw, provider_message_id=found.id, provider_thread_id=thread, delivered=True
        )

    async def _sent_copy(self, marker: Marker) -> GraphMessage | None:
        """A sent copy of the message with our Message-ID ``marker`` names: a message that
        is no longer a draft, in Sent Items or wherever a rule or a person moved it."""
        params = {"$filter": _id_filter(marker.value), "$select": PARENT, "$top": "50"}
        listed, _ = await self._read(
            GraphMessageCollection, "GET", f"{self._root}/messages", params=params
        )
        sent = [
            m for m in listed.value if m.is_draft is False and m.internet_message_id == marker.value
        ]
        return sent[0] if sent else None

    # -- the rest ------------------------------------------------------------------------

    async def health(self) -> ProviderHealth:
        try:
            user, _ = await self._read(
                GraphUser, "GET", self._root, params={"$select": "id,mail,userPrincipalName"}
            )
        except ProviderError as exc:
            return ProviderHealth(
                provider=PROVIDER,
                mailbox_id=self._mailbox_id,
                ok=False,
                detail=str(exc),
                refused=isinstance(exc, AccessRefused),
            )
        names = {n.lower() for n in (user.mail, user.user_principal_name) if n}
        shown = user.mail or user.user_principal_name or user.id
        if self._mailbox_id not in names:
            return ProviderHealth(
                provider=PROVIDER,
                mailbox_id=self._mailbox_id,
                ok=False,
                detail=f"Microsoft Graph signed in to the mailbox of {shown}, not "
                f"{self._mailbox_id}: these credentials are another account's",
            )
        return ProviderHealth(
            provider=PROVIDER,
            mailbox_id=self._mailbox_id,
            ok=True,
            detail=f"Microsoft Graph signed in, the mailbox of {shown}",
        )

    async def aclose(self) -> None:
        await self._api.aclose()


def _plan(message: OutgoingMessage) -> dict[str, Any]:
    """The draft's properties as planned, or ``ProviderError`` saying why it cannot be
    written (nothing is written then)."""
    try:
        for address in (message.sender, *message.to, *message.cc):
            mime.mailbox(address)
    except mime.UnsendableHeader as exc:
        raise ProviderError(f"the message cannot be handed to Graph as planned: {exc}") from None
    if not message.to:
        raise ProviderError("the message cannot be handed to Graph: it has no To recipient")
    large = [f.ref.name for f in message.attachments if len(f.data) > LARGEST_FILE]
    if large:
        raise ProviderError(
            f"Graph takes files up to {LARGEST_FILE} bytes in one request; "
            f"{', '.join(large)} is larger"
        )
    body = (
        {"contentType": "text", "content": message.text}
        if message.html is None
        else {"contentType": "html", "content": message.html}
    )
    return {
        "subject": message.subject,
        "body": body,
        "toRecipients": _recipients(message.to),
        "ccRecipients": _recipients(message.cc),
        "bccRecipients": [],
        "replyTo": [],
        "internetMessageId": message.internet_message_id,
    }


def _id_filter(internet_message_id: str) -> str:
    """``$filter`` for one Message-ID (OData doubles a quote inside a string)."""
    return "internetMessageId eq '" + internet_message_id.replace("'", "''") + "'"


class _DraftCollection(GraphMessageCollection):
    """https://learn.microsoft.com/graph/paging (messages with their recipient lists)"""

    value: tuple[GraphDraft, ...]  # pyright: ignore[reportIncompatibleVariableOverride]


def _thread(references: Sequence[str], in_reply_to: str | None, *own: str) -> str:
    """The alias the core names a message's thread by: the message its References name
    first, else the one it answers, else itself (the first of ``own`` ids)."""
    return thread_alias(references[0] if references else in_reply_to or own[0])


def _recipients(addresses: Sequence[Address]) -> list[dict[str, Any]]:
    return [
        {"emailAddress": {"address": a.address, **({"name": a.name} if a.name else {})}}
        for a in addresses
    ]


def _planned_lists(plan: dict[str, Any]) -> tuple[tuple[str, tuple[str, ...]], ...]:
    """The lists a draft with the plan's properties is sent to, as the core checks them."""
    names = (("to", "toRecipients"), ("cc", "ccRecipients"), ("bcc", "bccRecipients"))
    lists = [
        (name, tuple(str(p["emailAddress"]["address"]) for p in plan[field]))
        for name, field in names
    ]
    return (*lists, ("reply-to", tuple(str(p["emailAddress"]["address"]) for p in plan["replyTo"])))


def _as_plan(draft: GraphDraft) -> dict[str, Any]:
    """A draft's recipient lists in the shape of a plan."""

    def people(found: Sequence[GraphRecipient]) -> list[dict[str, Any]]:
        return [{"emailAddress": {"address": a}} for a in _addresses(found)]

    return {
        "toRecipients": people(draft.to_recipients),
        "ccRecipients": people(draft.cc_recipients),
        "bccRecipients": people(draft.bcc_recipients),
        "replyTo": people(draft.reply_to),
    }


def _addresses(people: Sequence[GraphRecipient]) -> tuple[str, ...]:
    return tuple(p.email_address.address or "" for p in people)
