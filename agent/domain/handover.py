"""The one check every outgoing message passes before a channel takes it.

Whatever its kind (a client reply, an approval request, an acknowledgement, a reminder) and
whatever its channel, a message is checked in the exact form it is handed over: the
serialized MIME is parsed back, and its header names must be exactly the ones a send sets,
each once; every header that names mailboxes must name exactly the planned sender and
recipients (and Bcc, Reply-To, Resent-* and the rest must be absent); the identifiers and
the subject must read back as planned, and no header may hold a line break, a control
character or a line that is not a header. Recipient lists a channel passes beside the MIME
(an API's JSON recipients, browser recipient chips, SMTP ``RCPT TO``) must equal the plan
too. Anything else refuses the send, with every reason.
"""

from __future__ import annotations

import email.parser
import email.policy
import email.utils
import re
from collections.abc import Iterable
from email.message import Message

from agent.domain.envelope import LINE_BREAKS
from agent.domain.headers import ADDRESS_HEADERS, msg_ids
from agent.domain.mail import Handover, Marker, MarkerKind, OutgoingMessage

MAX_LINE = 998
"""RFC 5322 section 2.1.1: a line is at most 998 characters."""
_FIELD = re.compile(rb"[\x21-\x39\x3b-\x7e]+:")
_BLANK_LINE = re.compile(rb"\r?\n\r?\n")
_STRUCTURE = frozenset({"mime-version", "content-type", "content-transfer-encoding"})


def planned_headers(message: OutgoingMessage) -> frozenset[str]:
    """The header names (lower case) a send of ``message`` sets."""
    names = {"from", "to", "subject", "date", "message-id"}
    if message.cc:
        names.add("cc")
    if message.in_reply_to:
        names.add("in-reply-to")
    if message.references:
        names.add("references")
    return frozenset(names)


def planned_addresses(message: OutgoingMessage) -> dict[str, tuple[str, ...]]:
    """Every address header a send of ``message`` may carry, with its addresses."""
    return {
        "from": (message.sender.address,),
        "to": tuple(a.address for a in message.to),
        "cc": tuple(a.address for a in message.cc),
    }


def check_handover(handover: Handover) -> tuple[str, ...]:
    """Why ``handover`` must not be handed to its channel (empty when it may)."""
    problems: list[str] = []
    if handover.mime is None and handover.recipients is None:
        problems.append(f"channel {handover.channel} showed neither MIME nor recipients to check")
    if handover.mime is not None:
        problems += check_mime(handover.message, handover.mime, handover.marker)
    if handover.recipients is not None:
        problems += _check_lists(handover.message, handover.recipients)
    if handover.envelope_recipients is not None:
        planned = planned_addresses(handover.message)
        wanted = sorted({*planned["to"], *planned["cc"]})
        given = sorted({a.strip().lower() for a in handover.envelope_recipients})
        if given != wanted:
            problems.append(f"SMTP envelope recipients {given} are not the plan {wanted}")
    return tuple(problems)


def _same(found: Iterable[str], planned: Iterable[str]) -> bool:
    return sorted(a.strip().lower() for a in found) == sorted(planned)


def _check_lists(
    message: OutgoingMessage, lists: tuple[tuple[str, tuple[str, ...]], ...]
) -> list[str]:
    planned = planned_addresses(message)
    problems: list[str] = []
    seen: set[str] = set()
    for name, addresses in lists:
        key = name.strip().lower()
        if key in seen:
            problems.append(f"recipient list {name} is given twice")
        seen.add(key)
        if not _same(addresses, planned.get(key, ())):
            problems.append(
                f"recipient list {name} holds {list(addresses)}, "
                f"not the plan {list(planned.get(key, ()))}"
            )
    for key in ("to", "cc"):
        if planned[key] and key not in seen:
            problems.append(f"recipient list {key} is missing (plan: {list(planned[key])})")
    return problems


def _header_lines(head: bytes) -> list[str]:
    problems: list[str] = []
    if b"\0" in head:
        problems.append("the header block holds a NUL byte")
    if re.search(rb"\r(?!\n)", head):
        problems.append("the header block holds a bare CR")
    if any(byte > 0x7E for byte in head):
        problems.append("the header block holds bytes outside ASCII (values must be encoded)")
    if re.search(rb"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]", head):
        problems.append("the header block holds a control character")
    for line in re.split(rb"\r?\n", head):
        if len(line) > MAX_LINE:
            problems.append(f"a header line is {len(line)} characters long (at most {MAX_LINE})")
        if line and line[:1] not in (b" ", b"\t") and not _FIELD.match(line):
            shown = line[:40].decode("ascii", "backslashreplace")
            problems.append(f"a header line is not a header field: {shown!r}")
    return problems


MARKER_HEADER = "x-outloop-send"
"""The header a channel whose marker is a header sets (its value: the marker's)."""


def check_mime(message: OutgoingMessage, mime: bytes, marker: Marker | None = None) -> list[str]:
    """Why these MIME bytes are not exactly ``message`` as planned, with the ``marker``
    header when the channel marks its copy by one (empty when they are)."""
    end = _BLANK_LINE.search(mime)
    if end is None:
        return ["the MIME has no end of its header block"]
    problems = _header_lines(mime[: end.start()])
    parsed = email.parser.BytesParser(policy=email.policy.default).parsebytes(
        mime[: end.end()], headersonly=True
    )
    names = [name.lower() for name in parsed]
    planned = planned_headers(message)
    if marker is not None and marker.kind is MarkerKind.HEADER:
        planned |= {MARKER_HEADER}
        if _raw(parsed, MARKER_HEADER) not in (None, marker.value):
            problems.append(f"header {MARKER_HEADER} is not the send's marker")
    allowed = planned | _STRUCTURE
    for name in sorted(set(names)):
        if names.count(name) > 1:
            problems.append(f"header {name} appears {names.count(name)} times")
        if name not in allowed:
            problems.append(f"header {name} was not set by this send")
    for name in sorted(planned - set(names)):
        problems.append(f"header {name} is missing")
    problems += _check_values(message, parsed)
    return problems


def _decoded(parsed: Message, name: str, raw: str) -> str:
    """A header value as a reader decodes it. Only a value with an encoded word (``=?``) or
    an RFC 2231 parameter (``*=``) can decode to other text than it is written in, so only
    those go through the library's (slow) structured decoding; any other is its written
    text unfolded, as the library unfolds it."""
    if "=?" in raw or "*=" in raw:
        return str(parsed.policy.header_fetch_parse(name, raw))
    return "".join(_LINE_SEPARATORS.split(raw))


_LINE_SEPARATORS = re.compile(r"\r\n|\r|\n")


def _check_values(message: OutgoingMessage, parsed: Message) -> list[str]:
    problems: list[str] = []
    for name, raw in parsed.raw_items():
        text = _decoded(parsed, name, str(raw))
        if any(ch in LINE_BREAKS or ch == "\0" for ch in text):
            problems.append(f"header {name} decodes to text with a line break or NUL")
    planned = planned_addresses(message)
    for name in sorted({n.lower() for n in parsed} & ADDRESS_HEADERS):
        values = [str(v) for k, v in parsed.raw_items() if k.lower() == name]
        found = [address for _, address in email.utils.getaddresses(values)]
        written = _written_addresses(_raw(parsed, name) or "")
        wanted = planned.get(name, ())
        if not _same(found, wanted) or not _same(written, wanted):
            problems.append(f"header {name} names {written}, not the plan {list(wanted)}")
    ids = {
        "message-id": (message.internet_message_id,),
        "in-reply-to": (message.in_reply_to,) if message.in_reply_to else (),
        "references": message.references,
    }
    for name, wanted in ids.items():
        raw = _raw(parsed, name)
        if raw is not None and (msg_ids(raw) != wanted or "".join(raw.split()) != "".join(wanted)):
            problems.append(f"header {name} is not {' '.join(wanted)}")
    subject = parsed.get("subject")
    if subject is not None and str(subject) != message.subject:
        problems.append("the subject does not read back as planned")
    return problems


_QUOTED_STRING = re.compile(r'"(?:[^"\\]|\\.)*"')
_ADDRESS_TOKEN = re.compile(r'[^\s<>(),;:"]+@[^\s<>(),;:"]+')


def _written_addresses(raw: str) -> list[str]:
    """Every address a header value writes, wherever it stands (in angle brackets, after
    them, in a comment): what a lenient reader could take for a recipient."""
    return _ADDRESS_TOKEN.findall(_QUOTED_STRING.sub(" ", raw))


def _raw(parsed: Message, name: str) -> str | None:
    for key, value in parsed.raw_items():
        if key.lower() == name:
            return str(value)
    return None
