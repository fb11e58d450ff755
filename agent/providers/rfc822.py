"""Normalize raw RFC 822 messages into the canonical envelope, whatever shape they arrive in.

Real mail is often malformed: no Message-ID, broken charsets and encoded words, CR or LF
inside header values, empty bodies, absurd MIME nesting. Every field is read defensively;
what had to be repaired is listed in ``normalization_notes``. Only a message with no usable
header block at all is refused (with the reason), and the caller still records it.
"""

from __future__ import annotations

import email
import email.header
import email.policy
import email.utils
import functools
import hashlib
import html as html_lib
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from email.message import EmailMessage, Message
from email.parser import HeaderParser
from email.policy import compat32
from typing import Any, cast

from agent.domain.envelope import Address, Envelope, content_digest
from agent.domain.headers import ADDRESS_HEADERS, msg_ids
from agent.domain.mail import AttachmentData, AttachmentRef, MessageBody, StoredCopy
from agent.rendering.text import visible_text

_HEADER_END_RE = re.compile(rb"\n\r?\n")
_LONE_CR_RE = re.compile(rb"\r(?!\n)")
MAX_MIME_DEPTH = 200


class UnparseableMessage(ValueError):
    """The bytes are not an email message at all."""


@dataclass
class Parsed:
    message: EmailMessage
    notes: list[str] = field(default_factory=list[str])

    def header(self, name: str) -> str | None:
        """A header's decoded text, or None; never raises on malformed values."""
        try:
            value = self.message.get(name)
        except Exception as exc:
            self.notes.append(f"{name}: unreadable header ({type(exc).__name__})")
            return self._raw_header(name)
        if value is None:
            return None
        text = str(value)
        if "\r" in text or "\n" in text:
            self.notes.append(f"{name}: line breaks inside the value were folded")
            text = " ".join(text.split())
        return text

    def _raw_header(self, name: str) -> str | None:
        for key, raw in self.message.raw_items():
            if key.lower() == name.lower():
                return _decode_words(str(raw))
        return None

    def raw_values(self, name: str) -> list[str]:
        """A header's values exactly as written (unfolded, nothing decoded): identifiers are
        read from these, never from decoded text."""
        return [
            " ".join(str(raw).split())
            for key, raw in self.message.raw_items()
            if key.lower() == name.lower()
        ]

    def all_headers(self, name: str) -> list[str]:
        try:
            values = self.message.get_all(name) or []
        except Exception:
            self.notes.append(f"{name}: unreadable header")
            return []
        return [" ".join(str(v).split()) for v in values]


def _decode_words(raw: str) -> str:
    try:
        parts = email.header.decode_header(raw)
    except Exception:
        return " ".join(raw.split())
    out: list[str] = []
    for chunk, charset in parts:
        if isinstance(chunk, bytes):
            out.append(_decode_bytes(chunk, charset))
        else:
            out.append(chunk)
    return " ".join("".join(out).split())


def _decode_bytes(data: bytes, charset: str | None) -> str:
    for candidate in (charset, "utf-8"):
        if not candidate:
            continue
        try:
            return data.decode(candidate)
        except (LookupError, UnicodeDecodeError):
            continue
    return data.decode("latin-1")


def _fold_lone_cr(raw: bytes) -> tuple[bytes, bool]:
    """Replace a bare CR inside the header block with a space.

    The parser ends a header line at a bare CR too, so one stray CR inside a Subject would
    push every header after it (From, Message-ID, ...) into the body. A header block with
    more bare CRs than LFs uses CR alone as its line ending and is left as it is.
    """
    end_match = _HEADER_END_RE.search(raw)
    end = end_match.end() if end_match else len(raw)
    head = raw[:end]
    lone = len(_LONE_CR_RE.findall(head))
    if lone == 0 or lone > head.count(b"\n"):
        return raw, False
    return _LONE_CR_RE.sub(b" ", head) + raw[end:], True


class _OncePerValue(email.policy.EmailPolicy):
    """The standard library's default policy, but a header value it has parsed once is not
    parsed again: reading a message asks for the same headers many times (every part's
    Content-Type at each step), and most messages share most values. Parsed headers are
    immutable, so sharing them changes nothing a reader sees."""

    def header_fetch_parse(self, name: str, value: str) -> Any:
        if hasattr(value, "name"):
            return value
        if len(value) > _CACHED_VALUE_LIMIT:  # a huge crafted value is parsed, never kept
            return email.policy.default.header_fetch_parse(name, value)
        return _parsed_header(name, value)


_CACHED_VALUE_LIMIT = 4096


@functools.lru_cache(maxsize=8192)
def _parsed_header(name: str, value: str) -> Any:
    return email.policy.default.header_fetch_parse(name, value)


POLICY = _OncePerValue()


def parse(raw: bytes) -> Parsed:
    if not raw.strip():
        raise UnparseableMessage("the message is empty (zero bytes of headers and body)")
    raw, folded = _fold_lone_cr(raw)
    try:
        message = cast(EmailMessage, email.message_from_bytes(raw, policy=POLICY))
    except RecursionError as exc:
        raise UnparseableMessage(
            "the MIME parts are nested too deeply for the parser to read "
            f"(far more than {MAX_MIME_DEPTH} levels)"
        ) from exc
    if not list(message.raw_items()):
        raise UnparseableMessage("no header block could be read (the first line is not a header)")
    parsed = Parsed(message)
    if folded:
        parsed.notes.append("header block: a bare CR inside a header value was folded")
    for defect in message.defects:
        parsed.notes.append(f"defect: {type(defect).__name__}")
    return parsed


def header_ids(parsed: Parsed, name: str) -> tuple[str, ...]:
    """The msg-ids of a header, read from its raw value: an encoded word or whitespace
    inside an identifier leaves it out (noted), never decoded into one."""
    raw = " ".join(parsed.raw_values(name))
    ids = msg_ids(raw)
    if raw.count("<") > len(ids) or (raw.strip() and not ids):
        parsed.notes.append(f"{name}: an identifier not in msg-id form was left out")
    return ids


def _addresses(parsed: Parsed, name: str) -> tuple[Address, ...]:
    values = parsed.all_headers(name)
    if not values:
        return ()
    try:
        pairs = email.utils.getaddresses(values)
    except Exception:
        parsed.notes.append(f"{name}: addresses could not be parsed")
        return ()
    out: list[Address] = []
    for display, addr in pairs:
        if "@" not in addr:
            continue
        out.append(Address(address=addr, name=_decode_words(display)))
    return tuple(dict.fromkeys(out))


_ADDR_SPEC = re.compile(r"^[^\s@<>()\[\],;:\"\\]+@[^\s@<>()\[\],;:\"\\]+$")


def _strict_mailbox(raw_values: list[str]) -> str | None:
    """The one addr-spec the raw header values name, or None when they do not name exactly
    one plain address (several, an empty one, an encoded word inside the address)."""
    try:
        pairs = email.utils.getaddresses(raw_values)
    except Exception:
        return None
    if len(raw_values) != 1 or len(pairs) != 1:
        return None
    addr = pairs[0][1]
    if not addr or "=?" in addr or not _ADDR_SPEC.match(addr):
        return None
    return addr.lower()


def _sender(parsed: Parsed) -> tuple[Address, ...]:
    """The one sender address, or none when From (or, without From, Sender) does not name
    exactly one mailbox unambiguously (mail software would disagree on who sent it)."""
    for name in ("From", "Sender"):
        raw = [
            " ".join(str(value).split())
            for key, value in parsed.message.raw_items()
            if key.lower() == name.lower()
        ]
        if not raw:
            continue
        # The raw value: the parsed header has already dropped what it could not read.
        strict = _strict_mailbox(raw)
        decoded = _addresses(parsed, name)
        if strict is not None and len(decoded) == 1 and decoded[0].address == strict:
            return decoded
        parsed.notes.append(
            f"{name} does not name exactly one mailbox unambiguously: the sender is unknown"
        )
        return ()
    return ()


def _date(value: str | None) -> datetime | None:
    if not value:
        return None
    try:
        moment = email.utils.parsedate_to_datetime(value)
        if moment.tzinfo is None:
            moment = moment.replace(tzinfo=UTC)
        return moment.astimezone(UTC)
    except (TypeError, ValueError, IndexError, OverflowError):
        return None  # unreadable, or a valid date at the edge of the calendar


def received_time(parsed: Parsed) -> datetime | None:
    """The delivery time: the newest Received header's date, else the Date header."""
    for received in parsed.all_headers("Received"):
        _, _, stamp = received.rpartition(";")
        moment = _date(stamp.strip())
        if moment is not None:
            return moment
    return _date(parsed.header("Date"))


def _body_bytes(raw: bytes) -> bytes:
    """The body, with line endings and trailing whitespace normalized: the same message
    stored with CRLF by one system and LF by another is one message."""
    body = b""
    for sep in (b"\r\n\r\n", b"\n\n"):
        index = raw.find(sep)
        if index >= 0:
            body = raw[index + len(sep) :]
            break
    lines = body.replace(b"\r\n", b"\n").split(b"\n")
    return b"\n".join(line.rstrip() for line in lines).rstrip()


def body_fingerprint(raw: bytes) -> str:
    """A digest of the message body, the same for copies that differ only in line endings."""
    return content_digest(_body_bytes(raw))


def normalize(
    raw: bytes,
    *,
    provider: str,
    mailbox_id: str,
    provider_message_id: str,
    thread_id_for: Callable[[str | None, str | None, tuple[str, ...]], str],
    fallback_received_at: datetime,
) -> Envelope:
    """Build the canonical envelope of one raw message.

    ``thread_id_for(message_id, in_reply_to, references)`` is the provider's own threading.
    """
    parsed = parse(raw)
    internet_message_id, in_reply_to, references = _threading(parsed)
    sender = _one_sender(parsed)
    received_at = _received_at(parsed, fallback_received_at)
    subject = parsed.header("Subject") or ""
    _note_deep_nesting(parsed)
    attachments, names = _attachments(parsed.message, provider_message_id)
    auto_submitted = _auto_submitted(parsed)
    report_type, reported, report_failed = _delivery_report(parsed.message)
    return Envelope(
        provider=provider,
        mailbox_id=mailbox_id,
        provider_thread_id=thread_id_for(internet_message_id, in_reply_to, references),
        provider_message_id=provider_message_id,
        internet_message_id=internet_message_id,
        in_reply_to=in_reply_to,
        references=references,
        received_at=received_at,
        sent_at=_date(parsed.header("Date")),
        sender=sender,
        to=_addresses(parsed, "To"),
        cc=_addresses(parsed, "Cc"),
        subject=subject,
        body_ref=provider_message_id,
        attachment_refs=attachments,
        attachment_names=names,
        report_type=report_type,
        reported_message_id=reported,
        report_failed=report_failed,
        auto_submitted=auto_submitted,
        precedence=parsed.header("Precedence"),
        list_id=parsed.header("List-Id"),
        content_digest=_content_digest(parsed, subject, internet_message_id, raw),
        normalization_notes=tuple(dict.fromkeys(parsed.notes)),
    )


def _threading(parsed: Parsed) -> tuple[str | None, str | None, tuple[str, ...]]:
    """The message's own Message-ID, the one it answers, and its References."""
    ids = header_ids(parsed, "Message-ID")
    internet_message_id = ids[0] if ids else None
    if internet_message_id is None:
        parsed.notes.append("no Message-ID: the provider message id identifies the occurrence")
    in_reply_to_ids = header_ids(parsed, "In-Reply-To")
    in_reply_to = in_reply_to_ids[0] if in_reply_to_ids else None
    return internet_message_id, in_reply_to, header_ids(parsed, "References")


def _one_sender(parsed: Parsed) -> Address:
    """The one sender address, or a placeholder that matches no one."""
    senders = _sender(parsed)
    if not senders:
        parsed.notes.append("no readable sender address")
    return senders[0] if senders else Address(address="unknown-sender@invalid")


def _received_at(parsed: Parsed, fallback: datetime) -> datetime:
    """The delivery time the message states, else the time the provider gives."""
    received_at = received_time(parsed)
    if received_at is None:
        parsed.notes.append("no readable Date or Received time: the delivery time is used")
        received_at = fallback
    return received_at


def _note_deep_nesting(parsed: Parsed) -> None:
    """Absurd MIME nesting is noted."""
    depth = mime_depth(parsed.message)
    if depth > 20:
        parsed.notes.append(f"MIME nesting {depth} levels deep")


def _attachments(
    message: EmailMessage, provider_message_id: str
) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """Each attachment's reference and its name."""
    parts = list(_attachment_parts(message))
    refs = tuple(f"{provider_message_id}/{i}" for i in range(len(parts)))
    names = tuple(_attachment_name(part, i) for i, part in enumerate(parts))
    return refs, names


def _auto_submitted(parsed: Parsed) -> str | None:
    """The Auto-Submitted header, with a legacy auto-reply header read as one."""
    auto_submitted = parsed.header("Auto-Submitted")
    if auto_submitted is None and _legacy_autoreply(parsed):
        auto_submitted = "auto-replied"
        parsed.notes.append("legacy auto-reply header read as Auto-Submitted: auto-replied")
    return auto_submitted


def _content_digest(
    parsed: Parsed, subject: str, internet_message_id: str | None, raw: bytes
) -> str:
    """The digest that tells copies of one message apart from different messages."""
    return content_digest(
        parsed.header("From") or "",
        parsed.header("Date") or "",
        subject,
        internet_message_id or "",
        _body_bytes(raw),
    )


def _attachment_name(part: Message, index: int) -> str:
    try:
        name = part.get_filename()
    except Exception:
        name = None
    return _decode_words(name) if name else f"attachment-{index + 1}"


def _legacy_autoreply(parsed: Parsed) -> bool:
    """X-Autoreply / X-Autorespond, which some servers send instead of Auto-Submitted."""
    return any(parsed.header(name) for name in ("X-Autoreply", "X-Autorespond"))


def _delivery_report(message: Message) -> tuple[str | None, str | None, bool]:
    """A delivery status report (RFC 3464 ``multipart/report``): its report type, the
    Message-ID of the message it reports on (read from the returned original's headers),
    and whether it reports a failure (an ``Action: failed`` field)."""
    if message.get_content_type() != "multipart/report":
        return None, None, False
    report_type = str(message.get_param("report-type") or "").lower() or "unknown"
    reported: str | None = None
    failed = False
    stack: list[tuple[Message, int]] = [(message, 1)]
    while stack:
        part, depth = stack.pop()
        ctype = part.get_content_type()
        headers: Message | None = None
        if ctype == "message/rfc822":
            inner = _children(part)
            headers = inner[0] if inner else None
        elif ctype == "text/rfc822-headers":
            headers = HeaderParser(policy=compat32).parsestr(_part_text(part))
        elif ctype == "message/delivery-status":
            fields = _children(part) or [HeaderParser(policy=compat32).parsestr(_part_text(part))]
            failed = failed or any(
                str(f.get("Action") or "").strip().lower() == "failed" for f in fields
            )
            continue
        if headers is not None and reported is None:
            try:
                ids = msg_ids(str(headers.get("Message-ID") or ""))
            except Exception:  # the returned original's header is beyond repair
                ids = ()
            reported = ids[0] if ids else None
        if depth < MAX_MIME_DEPTH and ctype != "message/rfc822":
            stack.extend((child, depth + 1) for child in _children(part))
    return report_type, reported, failed and report_type == "delivery-status"


def _children(part: Message) -> list[Message]:
    payload: object = part.get_payload()
    if not isinstance(payload, list):
        return []
    return [child for child in cast("list[object]", payload) if isinstance(child, Message)]


def mime_depth(message: Message) -> int:
    """How deep the MIME tree goes, computed without recursion."""
    deepest = 0
    stack: list[tuple[Message, int]] = [(message, 1)]
    while stack:
        part, depth = stack.pop()
        deepest = max(deepest, depth)
        if depth < MAX_MIME_DEPTH:
            stack.extend((child, depth + 1) for child in _children(part))
    return deepest


def _leaves(message: Message) -> Iterator[Message]:
    stack: list[tuple[Message, int]] = [(message, 1)]
    while stack:
        part, depth = stack.pop()
        if not part.is_multipart():
            yield part
        elif depth < MAX_MIME_DEPTH:
            stack.extend((child, depth + 1) for child in reversed(_children(part)))


def _attachment_parts(message: Message) -> Iterator[Message]:
    for part in _leaves(message):
        if part.get_content_disposition() == "attachment":
            yield part


def _part_bytes(part: Message) -> bytes:
    try:
        payload = part.get_payload(decode=True)
    except Exception:
        payload = None
    return payload if isinstance(payload, bytes) else b""


def attachments(raw: bytes, provider_message_id: str) -> tuple[AttachmentData, ...]:
    """Every attachment of the message, each under the reference its envelope gives
    (``<provider_message_id>/<n>``), with its name, content type, decoded bytes, size and
    sha256."""
    return _attachments_of(parse(raw).message, provider_message_id)


def _attachments_of(message: Message, provider_message_id: str) -> tuple[AttachmentData, ...]:
    found: list[AttachmentData] = []
    for index, part in enumerate(_attachment_parts(message)):
        data = _part_bytes(part)
        ref = AttachmentRef(
            ref=f"{provider_message_id}/{index}",
            name=_attachment_name(part, index),
            content_type=part.get_content_type(),
            size=len(data),
            sha256=hashlib.sha256(data).hexdigest(),
        )
        found.append(AttachmentData(ref=ref, data=data))
    return tuple(found)


def _part_text(part: Message) -> str:
    try:
        payload = part.get_payload(decode=True)
    except Exception:
        payload = None
    if isinstance(payload, bytes):
        return _decode_bytes(payload, part.get_content_charset())
    raw = part.get_payload()
    return raw if isinstance(raw, str) else ""


def stored_copy(
    raw: bytes, *, provider_message_id: str, provider_thread_id: str, delivered: bool
) -> StoredCopy:
    """A stored message as read back: every header that names mailboxes is read, and each
    attachment's name, size and digest."""
    parsed = parse(raw)
    content = _body_of(parsed.message)
    ids = header_ids(parsed, "Message-ID")
    senders = _addresses(parsed, "From")
    named = {"from", "to", "cc", "bcc", "reply-to"}
    return StoredCopy(
        provider_message_id=provider_message_id,
        provider_thread_id=provider_thread_id,
        internet_message_id=ids[0] if ids else None,
        sender=senders[0] if senders else None,
        to=_addresses(parsed, "To"),
        cc=_addresses(parsed, "Cc"),
        bcc=_addresses(parsed, "Bcc"),
        reply_to=_addresses(parsed, "Reply-To"),
        other_address_headers=tuple(
            (key, " ".join(str(value).split()))
            for key, value in parsed.message.raw_items()
            if key.lower() in ADDRESS_HEADERS - named
            or (key.lower() == "from" and len(senders) != 1)  # more senders than ours
        ),
        subject=parsed.header("Subject") or "",
        text=content.text,
        html=content.html,
        delivered=delivered,
        attachments=tuple(a.ref for a in _attachments_of(parsed.message, provider_message_id)),
    )


@dataclass(frozen=True)
class _Shown:
    """One unit a mail client displays: its plain-text form, its HTML form, or both (the
    two alternatives of a ``multipart/alternative``)."""

    plain: str | None
    html: str | None


def _plain_of(units: list[_Shown]) -> str:
    return "\n\n".join(
        u.plain if u.plain is not None else visible_text(u.html or "") for u in units
    )


def _html_of(units: list[_Shown]) -> str:
    return "\n".join(
        u.html if u.html is not None else f"<pre>{html_lib.escape(u.plain or '')}</pre>"
        for u in units
    )


def _shown(part: Message, depth: int) -> list[_Shown]:
    """What a mail client displays of ``part``, in order: every inline text part; of a
    ``multipart/alternative``, its plain and its richest HTML alternative."""
    if depth > MAX_MIME_DEPTH or part.get_content_disposition() == "attachment":
        return []
    if not part.is_multipart():
        ctype = part.get_content_type()
        if ctype == "text/plain":
            return [_Shown(_part_text(part), None)]
        return [_Shown(None, _part_text(part))] if ctype == "text/html" else []
    children = [_shown(child, depth + 1) for child in _children(part)]
    if part.get_content_type() != "multipart/alternative":
        return [unit for units in children for unit in units]
    with_plain = [units for units in children if any(u.plain is not None for u in units)]
    with_html = [units for units in children if any(u.html is not None for u in units)]
    plain = _plain_of(with_plain[0]) if with_plain else None
    rich = _html_of(with_html[-1]) if with_html else None
    return [_Shown(plain, rich)] if plain is not None or rich is not None else []


def body(raw: bytes) -> MessageBody:
    """The message's words as a mail client displays them: every inline text part, in
    order, as plain text and (when the message has HTML) as HTML. A part that exists in one
    form only is converted for the other, so each form holds every displayed part."""
    return _body_of(parse(raw).message)


def _body_of(message: Message) -> MessageBody:
    units = _shown(message, 1)
    has_plain = any(u.plain is not None for u in units)
    has_html = any(u.html is not None for u in units)
    return MessageBody(
        text=_plain_of(units) if has_plain else "",
        html=_html_of(units) if has_html else None,
    )
