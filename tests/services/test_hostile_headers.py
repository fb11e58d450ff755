"""Headers received mail can carry to mislead: a From header with more than one address, or
an encoded or empty one, gives no sender at all; a line separator in a subject neither crashes
intake nor reaches a header; a bounce whose original has a broken Message-ID still
normalizes."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent.domain.envelope import Address, Envelope
from agent.domain.mail import OutgoingMessage
from tests.services.gates_world import CLIENT, MAILBOX, normalize_raw

pytestmark = pytest.mark.anyio


@pytest.mark.parametrize(
    "sender",
    [
        "noa.bar@fabrikam.test <attacker@evil.test>",
        "Noa <noa.bar@fabrikam.test> <attacker@evil.test>",
        "<noa.bar@fabrikam.test>@evil.test",
    ],
)
def test_an_ambiguous_from_header_gives_no_sender_at_all(sender: str) -> None:
    raw = f"From: {sender}\r\nTo: {MAILBOX}\r\nSubject: x\r\nMessage-ID: <a@b>\r\n\r\nx\r\n"
    envelope: Envelope = normalize_raw(raw.encode())
    assert envelope.sender.address == "unknown-sender@invalid"
    assert any("exactly one mailbox" in n for n in envelope.normalization_notes)


@pytest.mark.parametrize(
    "sender", ["noa@=?utf-8?q?ours=2Ecom?=", "=?utf-8?q?noa?=@ours.com", "noa@ours.com <>", "<@>"]
)
def test_an_encoded_or_empty_address_gives_no_sender(sender: str) -> None:
    raw = f"From: {sender}\r\nTo: {MAILBOX}\r\nSubject: x\r\nMessage-ID: <a@b>\r\n\r\nx\r\n"
    envelope = normalize_raw(raw.encode())
    assert envelope.sender.address == "unknown-sender@invalid"


async def test_a_line_separator_in_a_subject_neither_crashes_intake_nor_reaches_a_header(
    tmp_path: Path,
) -> None:
    raw = (
        b"From: Dana Levi <dana.levi@contoso.test>\r\nTo: support@fabrikam.test\r\n"
        b"Subject: =?utf-8?q?Quote=E2=80=A8Bcc:_x=40evil.test?=\r\n"
        b"Message-ID: <ls@contoso.test>\r\n\r\nHello\r\n"
    )
    envelope = normalize_raw(raw, provider_message_id="p1")
    assert "\u2028" not in envelope.subject and "Bcc:" in envelope.subject
    message = OutgoingMessage(
        provider_thread_id="t",
        sender=Address(address=MAILBOX),
        to=(Address(address=CLIENT),),
        subject="Re: a\u2029b\rc",
        text="x",
        internet_message_id="<o@x>",
    )
    assert message.subject == "Re: a b c"


@pytest.mark.parametrize("mid", ["<", "<@", "<a@", "<[>", "<a@["])
def test_a_bounce_whose_original_has_a_broken_message_id_still_normalizes(mid: str) -> None:
    raw = (
        "From: MAILER-DAEMON@mx.test\r\nTo: support@fabrikam.test\r\nSubject: failure\r\n"
        "Message-ID: <dsn@mx.test>\r\nMIME-Version: 1.0\r\n"
        'Content-Type: multipart/report; report-type=delivery-status; boundary="b"\r\n\r\n'
        "--b\r\nContent-Type: text/plain\r\n\r\nfailed\r\n"
        "--b\r\nContent-Type: message/delivery-status\r\n\r\n"
        "Reporting-MTA: dns; mx.test\r\n\r\nFinal-Recipient: rfc822; x@y.test\r\n"
        "Action: failed\r\nStatus: 5.1.1\r\n\r\n"
        f"--b\r\nContent-Type: message/rfc822\r\n\r\nMessage-ID: {mid}\r\nSubject: hi\r\n\r\nbody\r\n"
        "--b--\r\n"
    )
    envelope = normalize_raw(raw.encode())
    assert envelope.report_failed and envelope.report_type == "delivery-status"
