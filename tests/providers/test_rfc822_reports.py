"""Delivery reports, attachment names and legacy auto-reply headers, as rfc822.normalize
reads them from messages built with the stdlib email package."""

from __future__ import annotations

import base64
from datetime import UTC, datetime
from email.message import EmailMessage, Message
from email.mime.application import MIMEApplication
from email.mime.message import MIMEMessage
from email.mime.multipart import MIMEMultipart
from email.mime.text import MIMEText

from agent.domain.envelope import Envelope
from agent.providers import rfc822

FALLBACK = datetime(2026, 11, 30, 9, 0, tzinfo=UTC)
MAILBOX = "support@fabrikam.test"
ORIGINAL_ID = "<reply-17@fabrikam.test>"


def normalize(raw: bytes) -> Envelope:
    return rfc822.normalize(
        raw,
        provider="memory",
        mailbox_id=MAILBOX,
        provider_message_id="pm-1",
        thread_id_for=lambda _mid, _irt, _refs: "t-1",
        fallback_received_at=FALLBACK,
    )


def _headers(message: Message, subject: str, message_id: str, sender: str) -> None:
    message["From"] = sender
    message["To"] = MAILBOX
    message["Subject"] = subject
    message["Date"] = "Mon, 30 Nov 2026 09:00:00 +0000"
    message["Message-ID"] = message_id


def original() -> EmailMessage:
    """The message the workspace sent, which the recipient's server bounced."""
    sent = EmailMessage()
    sent["From"] = MAILBOX
    sent["To"] = "nobody@contoso.test"
    sent["Subject"] = "Re: Invoice 4471"
    sent["Date"] = "Mon, 30 Nov 2026 08:55:00 +0000"
    sent["Message-ID"] = ORIGINAL_ID
    sent.set_content("Please find the corrected invoice attached.\n")
    return sent


def delivery_status() -> Message:
    """A message/delivery-status part: per-message fields, then one per-recipient block."""
    part = Message()
    part["Content-Type"] = "message/delivery-status"
    per_message = Message()
    per_message["Reporting-MTA"] = "dns; mx.contoso.test"
    per_recipient = Message()
    per_recipient["Final-Recipient"] = "rfc822; nobody@contoso.test"
    per_recipient["Action"] = "failed"
    per_recipient["Status"] = "5.1.1"
    part.set_payload([per_message, per_recipient])
    return part


def bounce(returned: Message | None) -> bytes:
    """An RFC 3464 report: explanation, delivery status and (optionally) the original."""
    report = MIMEMultipart("report", report_type="delivery-status")
    _headers(
        report,
        "Undelivered Mail Returned to Sender",
        "<bounce-1@mx.contoso.test>",
        "MAILER-DAEMON@mx.contoso.test",
    )
    report.attach(MIMEText("Your message could not be delivered.\n", "plain"))
    report.attach(delivery_status())
    if returned is not None:
        report.attach(returned)
    return report.as_bytes()


# -- delivery reports ----------------------------------------------------------------------


def test_a_bounce_returning_the_original_names_the_reported_message() -> None:
    raw = bounce(MIMEMessage(original()))
    envelope = normalize(raw)
    assert envelope.report_type == "delivery-status"
    assert envelope.reported_message_id == ORIGINAL_ID
    # The report's own identity is untouched.
    assert envelope.internet_message_id == "<bounce-1@mx.contoso.test>"
    assert envelope.provider_thread_id == "t-1"


def test_a_bounce_returning_only_the_original_headers_names_the_reported_message() -> None:
    headers_only = original().as_string().split("\n\n", 1)[0] + "\n"
    part = MIMEText(headers_only, "rfc822-headers")
    assert part.get_content_type() == "text/rfc822-headers"
    envelope = normalize(bounce(part))
    assert envelope.report_type == "delivery-status"
    assert envelope.reported_message_id == ORIGINAL_ID


def test_a_report_without_the_original_has_a_report_type_but_no_reported_message() -> None:
    envelope = normalize(bounce(None))
    assert envelope.report_type == "delivery-status"
    assert envelope.reported_message_id is None


def test_an_ordinary_message_is_no_report() -> None:
    envelope = normalize(original().as_bytes())
    assert envelope.report_type is None
    assert envelope.reported_message_id is None
    assert envelope.internet_message_id == ORIGINAL_ID


# -- attachment names ----------------------------------------------------------------------

HEBREW = "חשבונית מס.pdf"
ENCODED_WORD = "דוח שנתי.docx"
RLO = "invoice\u202efdp.exe"


def _attachment(data: bytes) -> MIMEApplication:
    return MIMEApplication(data, "octet-stream")


def with_attachments(*parts: Message) -> bytes:
    message = MIMEMultipart("mixed")
    _headers(message, "Documents", "<docs-1@contoso.test>", "dana.levi@contoso.test")
    message.attach(MIMEText("See the attached documents.\n", "plain"))
    for part in parts:
        message.attach(part)
    return message.as_bytes()


def test_attachment_names_are_decoded_in_order_whatever_their_encoding() -> None:
    plain = _attachment(b"1")
    plain.add_header("Content-Disposition", "attachment", filename="report.pdf")
    rfc2231 = _attachment(b"2")
    rfc2231.add_header("Content-Disposition", "attachment", filename=("utf-8", "he", HEBREW))
    rfc2047 = _attachment(b"3")
    word = base64.b64encode(ENCODED_WORD.encode("utf-8")).decode("ascii")
    rfc2047["Content-Disposition"] = f'attachment; filename="=?utf-8?b?{word}?="'
    rlo = _attachment(b"4")
    rlo.add_header("Content-Disposition", "attachment", filename=("utf-8", "", RLO))
    raw = with_attachments(plain, rfc2231, rfc2047, rlo)
    # The names really are encoded on the wire as each case says.
    assert b"filename*=" in raw and b"=?utf-8?b?" in raw and "דוח".encode() not in raw

    envelope = normalize(raw)
    assert envelope.attachment_names == ("report.pdf", HEBREW, ENCODED_WORD, RLO)
    # U+202E is kept as data: flagging a misleading name happens elsewhere.
    assert "\u202e" in envelope.attachment_names[3]
    assert envelope.attachment_refs == ("pm-1/0", "pm-1/1", "pm-1/2", "pm-1/3")


def test_a_nameless_attachment_gets_a_numbered_name() -> None:
    nameless = _attachment(b"data")
    nameless.add_header("Content-Disposition", "attachment")
    envelope = normalize(with_attachments(nameless))
    assert envelope.attachment_names == ("attachment-1",)
    assert envelope.attachment_refs == ("pm-1/0",)


# -- legacy auto-reply headers -------------------------------------------------------------


def _autoreply(auto_submitted: str | None) -> bytes:
    message = EmailMessage()
    _headers(message, "Out of office", "<ooo-1@contoso.test>", "dana.levi@contoso.test")
    message["X-Autoreply"] = "yes"
    if auto_submitted is not None:
        message["Auto-Submitted"] = auto_submitted
    message.set_content("I am out of the office until Monday.\n")
    return message.as_bytes()


def test_x_autoreply_without_auto_submitted_reads_as_auto_replied_with_a_note() -> None:
    envelope = normalize(_autoreply(None))
    assert envelope.auto_submitted == "auto-replied"
    assert any("legacy auto-reply" in note for note in envelope.normalization_notes)


def test_auto_submitted_wins_over_x_autoreply() -> None:
    envelope = normalize(_autoreply("auto-generated"))
    assert envelope.auto_submitted == "auto-generated"
    assert not any("legacy auto-reply" in note for note in envelope.normalization_notes)
