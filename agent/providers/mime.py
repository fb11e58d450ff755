"""The MIME form of an outgoing message, for every channel that hands over RFC 822 bytes.

The header block is written here, value by value, never by the email package's header
classes: on the Pythons this project supports, those decode RFC 2047 encoded words found in
a value they are given and write the decoded text out, so an encoded CR LF copied from
received mail would become a header line of its own (CVE-2024-6923). Every value that came
from mail (a subject, a display name) is taken as decoded text, put on one line, and encoded
again here: plain printable ASCII as it is, anything else - non-ASCII, control characters,
text that looks like an encoded word - as UTF-8 encoded words. Identifiers are copied only
in msg-id form (``agent.domain.headers``); addresses only as plain addr-specs. Only the body
parts - the text, its HTML alternative and the attachments - are built by the email package
(with ``verify_generated_headers`` on where the running Python has it). The result is still
checked as bytes before any channel takes it (``agent.domain.handover``): nothing here is
trusted to be right.

A channel whose best surviving marker is a header of ours adds ``X-Outloop-Send`` with the
send's token (``send_token``, derived from the Message-ID); a channel whose marker is a body
token finds that token in the rendered text.
"""

from __future__ import annotations

import email.header
import email.policy
import email.utils
import hashlib
import re
from collections.abc import Sequence
from datetime import datetime
from email.message import EmailMessage

from agent.domain.envelope import Address, header_text
from agent.domain.errors import ProviderError
from agent.domain.mail import AttachmentData, Marker, MarkerKind, OutgoingMessage
from agent.providers import rfc822

CRLF = "\r\n"
_SAFE_TEXT = re.compile(r"[\x20-\x7e]*")
_ATOM_WORD = re.compile(r"[A-Za-z0-9!#$%&'*+\-/=?^_`{|}~ .]*")
_ADDR_SPEC = re.compile(
    r"[A-Za-z0-9!#$%&'*+\-/=?^_`{|}~]+(?:\.[A-Za-z0-9!#$%&'*+\-/=?^_`{|}~]+)*"
    r"@[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?)*"
)
_LONGEST_WORD = 76
_CONTENT_TYPE = re.compile(r"([a-z0-9][a-z0-9!#$&^_.+-]*)/([a-z0-9][a-z0-9!#$&^_.+-]*)")

MARKER_HEADER = "X-Outloop-Send"
"""The header that carries a send's token where a channel keeps our headers but not our
Message-ID (the ``header`` marker)."""


def send_token(internet_message_id: str) -> str:
    """The token that marks the send of ``internet_message_id`` (the same for every attempt,
    on every channel): a header value, or the body token a rendered message carries."""
    digest = hashlib.sha256(internet_message_id.encode("utf-8", "surrogateescape")).hexdigest()
    return f"outloop-{digest[:32]}"


def _policy() -> email.policy.EmailPolicy[EmailMessage]:
    policy = email.policy.SMTP
    if hasattr(policy, "verify_generated_headers"):  # CPython's fix for CVE-2024-6923
        policy = policy.clone(verify_generated_headers=True)
    return policy


_POLICY = _policy()


class UnsendableHeader(ValueError):
    """A value cannot be written as a header of a message we send."""


def encoded_text(value: str, name: str) -> str:
    """Unstructured text (RFC 5322 ``unstructured``) as one folded header value: printable
    ASCII with no encoded-word lookalike stays as it is, anything else is UTF-8 encoded
    words (RFC 2047)."""
    value = header_text(value)
    plain = (
        _SAFE_TEXT.fullmatch(value) is not None
        and "=?" not in value
        and all(len(word) <= _LONGEST_WORD for word in value.split(" "))
    )
    charset = "us-ascii" if plain else "utf-8"
    header = email.header.Header(value, charset, header_name=name)
    return header.encode(linesep=CRLF)


def mailbox(address: Address) -> str:
    """``name <addr-spec>`` or the bare addr-spec; refused unless the address is plain."""
    if _ADDR_SPEC.fullmatch(address.address) is None:
        raise UnsendableHeader(f"{address.address!r} is not a plain address this core sends to")
    if not address.name:
        return address.address
    name = header_text(address.name)
    if _ATOM_WORD.fullmatch(name) and "=?" not in name and len(name) <= _LONGEST_WORD:
        phrase = email.utils.quote(name)
        return f'"{phrase}" <{address.address}>'
    encoded = email.header.Header(name, "utf-8").encode(linesep=CRLF)
    return f"{encoded} <{address.address}>"


def _line(name: str, value: str) -> str:
    return f"{name}: {value}{CRLF}"


def _list(items: Sequence[str], separator: str) -> str:
    return (separator + CRLF + " ").join(items)


def header_block(message: OutgoingMessage, at: datetime, token: str | None = None) -> str:
    """The message's own headers, in the order they are written (with ``token`` as the
    ``X-Outloop-Send`` header when one is given)."""
    lines = [_line("From", mailbox(message.sender))]
    lines.append(_line("To", _list([mailbox(a) for a in message.to], ",")))
    if message.cc:
        lines.append(_line("Cc", _list([mailbox(a) for a in message.cc], ",")))
    lines.append(_line("Subject", encoded_text(message.subject, "Subject")))
    lines.append(_line("Date", email.utils.format_datetime(at)))
    lines.append(_line("Message-ID", message.internet_message_id))
    if token is not None:
        if re.fullmatch(r"[A-Za-z0-9.-]{1,200}", token) is None:
            raise UnsendableHeader(f"{token!r} is not a send token this core writes")
        lines.append(_line(MARKER_HEADER, token))
    if message.in_reply_to:
        lines.append(_line("In-Reply-To", message.in_reply_to))
    if message.references:
        lines.append(_line("References", _list(message.references, "")))
    return "".join(lines)


def _attach(part: EmailMessage, attachment: AttachmentData) -> None:
    """One file as an attachment part: its name on one line, its declared content type when
    that is a plain type/subtype (else application/octet-stream), its bytes exactly as they
    are (base64)."""
    ref = attachment.ref
    kind = _CONTENT_TYPE.fullmatch(ref.content_type.strip().lower())
    maintype, subtype = kind.groups() if kind else ("application", "octet-stream")
    name = header_text(ref.name).strip() or "attachment"
    part.add_attachment(attachment.data, maintype=maintype, subtype=subtype, filename=name)


def _content(message: OutgoingMessage) -> bytes:
    part = EmailMessage(policy=_POLICY)
    part.set_content(message.text)
    if message.html is not None:
        part.add_alternative(message.html, subtype="html")
    for attachment in message.attachments:
        _attach(part, attachment)
    if "MIME-Version" not in part:
        part["MIME-Version"] = "1.0"
    return part.as_bytes(policy=_POLICY)


def build(message: OutgoingMessage, at: datetime, token: str | None = None) -> bytes:
    """The RFC 822 bytes of ``message``, dated ``at`` (timezone-aware), with its attachments
    and, when ``token`` is given, the ``X-Outloop-Send`` header carrying it."""
    if not message.to:
        raise UnsendableHeader("a message needs at least one To recipient")
    return header_block(message, at, token).encode("ascii") + _content(message)


def marker_for(message: OutgoingMessage, kind: MarkerKind) -> Marker:
    """The marker of ``kind`` our copy of ``message`` carries: its Message-ID, or the send
    token in our marker header."""
    if kind is MarkerKind.MESSAGE_ID:
        return Marker(kind=kind, value=message.internet_message_id)
    return Marker(kind=kind, value=send_token(message.internet_message_id))


def build_marked(message: OutgoingMessage, marker: Marker, at: datetime) -> bytes:
    """``message`` as MIME carrying ``marker`` (a header marker is written as our header),
    or ``ProviderError`` saying why it cannot be written."""
    token = marker.value if marker.kind is MarkerKind.HEADER else None
    try:
        return build(message, at, token)
    except ValueError as exc:
        raise ProviderError(f"the message cannot be written as MIME: {exc}") from exc


def carries(parsed: rfc822.Parsed, marker: Marker) -> bool:
    """Whether a stored message carries exactly ``marker`` (a server's search matches
    substrings; this decides)."""
    if marker.kind is MarkerKind.MESSAGE_ID:
        ids = rfc822.header_ids(parsed, "Message-ID")
        return bool(ids) and ids[0] == marker.value
    return marker.value in parsed.raw_values(MARKER_HEADER)
