"""Every outgoing message is checked in the exact form its channel would be handed, before it
is handed over: a header or recipient the plan does not have refuses the send, nothing is
ledgered or sent, and the task records why. Values copied from received mail, however they
are encoded, never add one."""

from __future__ import annotations

import base64
import email.policy
import email.utils
import re
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from agent.domain.automation import AckPlan
from agent.domain.context import WorkspaceContext, parse_context
from agent.domain.envelope import Address
from agent.domain.errors import HandoverRefused
from agent.domain.handover import check_handover
from agent.domain.headers import references_for
from agent.domain.mail import Handover, OutgoingMessage
from agent.domain.records import SendIntent
from agent.domain.untrusted import flag
from agent.providers import mime
from agent.rendering.render import reply_subject
from agent.services import acks, outbound
from agent.testing import InMemoryProvider
from tests.conftest import context_yaml
from tests.services.gates_world import CLIENT, MAILBOX, World, normalize_raw

pytestmark = pytest.mark.anyio

FIELD = re.compile(rb"^([!-9;-~]+):", re.MULTILINE)
STRUCTURE = {b"mime-version", b"content-type", b"content-transfer-encoding"}


def planned(**changes: object) -> OutgoingMessage:
    message = OutgoingMessage(
        provider_thread_id="thread-1",
        in_reply_to="<q1@contoso.test>",
        references=("<root@contoso.test>", "<q1@contoso.test>"),
        sender=Address(address=MAILBOX),
        to=(Address(address=CLIENT),),
        cc=(Address(address="noa.bar@fabrikam.test"),),
        subject="Re: Quote request",
        text="The quote is $1,200.",
        html="<p>The quote is $1,200.</p>",
        internet_message_id="<r1.outloop@fabrikam.test>",
    )
    return message.model_copy(update=changes)


def built(message: OutgoingMessage) -> bytes:
    return mime.build(message, datetime(2026, 12, 1, tzinfo=UTC))


def header_names(raw: bytes) -> list[bytes]:
    head = re.split(rb"\r?\n\r?\n", raw, maxsplit=1)[0]
    return [name.lower() for name in FIELD.findall(head)]


def test_the_built_message_is_exactly_the_plan() -> None:
    message = planned()
    assert check_handover(Handover(message=message, channel="t", mime=built(message))) == ()


_TO = b"To: " + CLIENT.encode()


def _insert(raw: bytes, line: bytes) -> bytes:
    return raw.replace(b"\r\nSubject:", b"\r\n" + line + b"\r\nSubject:", 1)


@pytest.mark.parametrize(
    ("tamper", "reason"),
    [
        (lambda raw: _insert(raw, b"Bcc: mallory@evil.test"), "bcc"),
        (lambda raw: _insert(raw, b"Reply-To: mallory@evil.test"), "reply-to"),
        (lambda raw: _insert(raw, b"Resent-To: mallory@evil.test"), "resent-to"),
        (lambda raw: _insert(raw, b"To: mallory@evil.test"), "appears 2 times"),
        (lambda raw: raw.replace(CLIENT.encode(), b"mallory@evil.test", 1), "header to"),
        (lambda raw: _insert(raw, b"X-Note: \xd7\xa9"), "outside ascii"),
        (lambda raw: _insert(raw, b"not a header line"), "not a header field"),
        (lambda raw: _insert(raw, b"X-Note: a\rBcc: m@evil.test"), "bare cr"),
        (lambda raw: raw.replace(b"<root@contoso.test>", b"<other@contoso.test>"), "references"),
        (lambda raw: raw.replace(_TO, _TO + b" (mallory@evil.test)", 1), "header to"),
        (lambda raw: raw.replace(_TO, b"To: <" + CLIENT.encode() + b">mallory@evil.test", 1), "to"),
        (lambda raw: raw.replace(_TO, _TO + b"\x0c", 1), "control character"),
        (
            lambda raw: _insert(raw, b"Comments: =?utf-8?q?a=0D=0ABcc=3A_m=40evil.test?="),
            "line break",
        ),
    ],
)
def test_a_handover_that_differs_from_the_plan_is_refused(
    tamper: Callable[[bytes], bytes], reason: str
) -> None:
    message = planned()
    problems = check_handover(Handover(message=message, channel="t", mime=tamper(built(message))))
    assert problems and any(reason in p.lower() for p in problems), problems


def test_recipient_lists_and_smtp_envelopes_passed_beside_the_mime_must_equal_the_plan() -> None:
    message = planned()
    raw = built(message)
    lists = (("To", (CLIENT,)), ("Cc", ("noa.bar@fabrikam.test",)))
    ok = Handover(message=message, channel="t", mime=raw, recipients=lists)
    assert check_handover(ok) == ()
    widened = (*lists, ("Bcc", ("mallory@evil.test",)))
    assert check_handover(ok.model_copy(update={"recipients": widened}))
    smtp = ok.model_copy(update={"envelope_recipients": (CLIENT, "mallory@evil.test")})
    assert any("SMTP envelope" in p for p in check_handover(smtp))
    assert check_handover(Handover(message=message, channel="t"))  # nothing shown to check


class Tampering(InMemoryProvider):
    """A channel that would hand over something other than what it was asked to send."""

    async def prepare(self, message: OutgoingMessage) -> Handover:
        handover = await super().prepare(message)
        assert handover.mime is not None
        return handover.model_copy(update={"mime": _insert(handover.mime, b"Bcc: m@evil.test")})


async def test_a_send_whose_handover_differs_from_the_plan_is_refused_and_recorded(
    make_world: Callable[..., World],
) -> None:
    world = make_world()
    world.box = Tampering(MAILBOX)
    world.deliver(sender=CLIENT, thread=1, text="Please send the quote.")
    await world.intake()
    task = world.only_task()
    intent, message = outbound.outgoing(
        key="probe|1",
        kind="internal_reply",
        workspace_id=world.workspace_id,
        task_id=task.task_id,
        mailbox_id=MAILBOX,
        to=("noa.bar@fabrikam.test",),
        subject="Note",
        text="note",
    )
    with pytest.raises(HandoverRefused) as refused:
        await outbound.send_once(world.store, world.box, intent, message, world.clock)
    assert any("bcc" in p for p in refused.value.problems)
    assert world.box.sent == []
    assert world.store.get_send("probe|1") is None  # nothing ledgered
    events = [e for _, _, e in world.store.task_events(task.task_id)]
    assert any("refused before handover" in e and "bcc" in e for e in events), events


# -- the property: nothing copied from mail adds a header or a recipient ----------------------

_ENCODED_BREAKS = [
    "=?utf-8?q?x=0D=0ABcc=3A_mallory=40evil.test?=",
    "=?utf-8?b?" + base64.b64encode(b"x\r\nBcc: mallory@evil.test").decode() + "?=",
    "=?iso-8859-1?q?=0A=0DReply-To:_m=40evil.test?=",
]
_PIECES = st.sampled_from(
    [*_ENCODED_BREAKS, "\r\n", "\r", "\n", "\u2028", "\x00", "\x85", "Bcc: m@evil.test", " "]
)
_MAIL_TEXT = st.lists(st.one_of(_PIECES, st.text(max_size=30)), max_size=8).map("".join)
_LONG = st.integers(0, 3).map(lambda n: "word " * (60 * n))


def _double_encoded(value: str) -> str:
    return "=?utf-8?b?" + base64.b64encode(value.encode("utf-8", "surrogatepass")).decode() + "?="


def _inbound(subject: str, ids: str, name: str) -> bytes:
    raw_subject = _double_encoded(subject)
    raw_name = _double_encoded(name)
    return (
        f"From: {raw_name} <{CLIENT}>\r\nTo: {MAILBOX}\r\nSubject: {raw_subject}\r\n"
        f"Date: Tue, 01 Dec 2026 09:00:00 +0000\r\nMessage-ID: <{ids}@contoso.test>\r\n"
        f"In-Reply-To: <{ids}@contoso.test>\r\nReferences: <root@contoso.test> {ids}\r\n\r\n"
        "Hello\r\n"
    ).encode("utf-8", "surrogateescape")


def _context() -> WorkspaceContext:
    text = context_yaml(extra="communication: {ack_templates: {en: We got it.}}\n")
    return parse_context(text.replace("receipt_ack: false", "receipt_ack: true"))


CONTEXT = _context()


def _task_message(key: str, kind: str, **fields: Any) -> tuple[SendIntent, OutgoingMessage]:
    """``outbound.outgoing`` for task-1 of the test workspace, from its mailbox."""
    return outbound.outgoing(
        key=key,
        kind=kind,
        workspace_id=CONTEXT.workspace_id,
        task_id="task-1",
        mailbox_id=MAILBOX,
        **fields,
    )


def _every_kind(envelope_raw: bytes) -> list[OutgoingMessage]:
    """What the core sends that copies from this message: an acknowledgement, an approval
    request titled by its subject, a reply in its thread."""
    envelope = normalize_raw(
        envelope_raw,
        provider="memory",
        provider_message_id="pm-1",
        thread_id="thread-1",
        received_at=datetime(2026, 12, 1, tzinfo=UTC),
    )
    plan = AckPlan(key="ack|1", to=CLIENT, text="We got it.", language="en")
    _, ack = acks.ack_message(CONTEXT, envelope, "task-1", plan)
    _, request = _task_message(
        "approval|1",
        "approval_request",
        to=("noa.bar@fabrikam.test",),
        subject=f"Approval needed: {flag(envelope.subject).shown}",
        text="draft",
    )
    _, reply = _task_message(
        "reply|1",
        "client_reply",
        to=(CLIENT,),
        subject=reply_subject(envelope.subject),
        text="answer",
        in_reply_to=envelope.internet_message_id,
        references=references_for(
            envelope.internet_message_id, envelope.references, envelope.in_reply_to
        ),
    )
    named = reply.model_copy(update={"to": (Address(address=CLIENT, name=envelope.sender.name),)})
    return [ack, request, reply, named]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@example(subject=" Re: price", ids="", name="")  # a subject that starts with a space
@example(subject="\u2028Re:\x0b price\x00", ids="a\r\nb", name="\x85")
@given(subject=st.tuples(_MAIL_TEXT, _LONG).map("".join), ids=_MAIL_TEXT, name=_MAIL_TEXT)
def test_no_outgoing_message_carries_a_header_or_recipient_copied_from_mail(
    subject: str, ids: str, name: str
) -> None:
    for message in _every_kind(_inbound(subject, ids.replace(">", ""), name)):
        raw = built(message)
        assert check_handover(Handover(message=message, channel="t", mime=raw)) == ()
        names = header_names(raw)
        allowed = {b"from", b"to", b"cc", b"subject", b"date", b"message-id"}
        allowed |= {b"in-reply-to", b"references"} | STRUCTURE
        assert set(names) <= allowed and len(names) == len(set(names)), names
        parsed = email.message_from_bytes(raw, policy=email.policy.default)
        recipients = [str(v) for k in ("to", "cc", "bcc") for v in parsed.get_all(k) or []]
        addresses = {a for _, a in email.utils.getaddresses(recipients)}
        assert addresses == {a.address for a in (*message.to, *message.cc)}
