"""An approver's reply approves only when every word the approver wrote, wherever it sits,
is an explicit approval: every inline text part a mail client shows, the lines under a
signature marker, a note written into the quoted request, the reply's subject. Anything that
could hold, withdraw, question or change it holds the approval for a person."""

from __future__ import annotations

from datetime import timedelta
from email.mime.multipart import MIMEMultipart
from email.mime.text import MIMEText
from email.utils import format_datetime
from typing import Any

import pytest
from mcp import Client

from tests.mcp.conftest import (
    APPROVER,
    CLIENT,
    MAILBOX,
    OperatorStation,
    call,
    intake_and_claim,
    refused,
    sent_messages,
    to_draft_ready,
    waiting_for_approval,
)

pytestmark = pytest.mark.anyio


def reply_with_parts(station: OperatorStation, request_id: str, *texts: str, subject: str) -> bytes:
    """The approver's reply: each text an inline text/plain part of a multipart/mixed."""
    message = MIMEMultipart("mixed")
    for text in texts:
        message.attach(MIMEText(text, "plain", "utf-8"))
    message["From"] = APPROVER
    message["To"] = MAILBOX
    message["Subject"] = subject
    message["Date"] = format_datetime(station.clock.now())
    message["Message-ID"] = f"<reply-{len(texts)}-{abs(hash(texts)) % 10**8}@fabrikam.test>"
    message["In-Reply-To"] = request_id
    message["References"] = request_id
    return message.as_bytes()


async def judged(
    station: OperatorStation, client: Client, request: dict[str, Any], raw: bytes
) -> dict[str, Any]:
    """Deliver the approver's reply; the task after intake judged it."""
    station.clock.advance(minutes=5)
    station.deliver_raw(raw)
    await intake_and_claim(client)
    return await call(client, "get_task", task_id=request["task_id"])


async def assert_not_approved(client: Client, task: dict[str, Any], draft_id: str) -> None:
    assert task["state"] != "APPROVED_TO_SEND", task
    assert [d["decision"] for d in task["approval_decisions"]] != ["approved"], task
    refusal = await refused(client, "send", task_id=task["task_id"], draft_id=draft_id, to=[CLIENT])
    assert refusal.data is not None and refusal.data["refused"] == "gate"


SUBJECT = "Re: Approval needed: Quote request"


async def answer_request(
    station: OperatorStation, *texts: str, subject: str = SUBJECT, held: bool
) -> dict[str, Any]:
    """A client request waits for approval and the approver answers it with ``texts`` (one
    inline part each); the task after intake judged the answer, checked to be held (no send
    goes) or not."""
    station.deliver(sender=CLIENT)
    async with station.client() as client:
        request = await waiting_for_approval(client)
        raw = reply_with_parts(station, request["request_message_id"], *texts, subject=subject)
        task = await judged(station, client, request, raw)
        if held:
            await assert_not_approved(client, task, request["draft_id"])
    return task


async def test_a_withdrawal_in_a_second_inline_text_part_holds_the_approval(
    station: OperatorStation,
) -> None:
    await answer_request(
        station, "Approved.", "Scratch that - hold it until finance signs off.", held=True
    )


async def test_the_host_is_shown_every_inline_text_part_of_a_message(
    station: OperatorStation,
) -> None:
    raw = reply_with_parts(
        station, "<none@x.test>", "First part.", "Second part, also shown.", subject="Two parts"
    )
    station.deliver_raw(raw.replace(f"From: {APPROVER}".encode(), f"From: {CLIENT}".encode()))
    async with station.client() as client:
        _, [claimed] = await intake_and_claim(client)
    shown = claimed["message"]["body_text"]
    assert "First part." in shown and "Second part, also shown." in shown


@pytest.mark.parametrize(
    "body",
    [
        "Approved.\n\n--\nNoa Bar\nOn second thought, let me check with finance first",
        "Approved.\n\nSent from my iPhone\nActually belay that, the numbers are off",
        "Approved.\n-- \nNoa\nP.S. give me an hour to look again",
        "Approved.\n-- \nNoa Bar\nRevoked",
        "Approved.\n-- \nNoa Bar\nBelay That",
    ],
)
async def test_a_retraction_below_a_signature_marker_holds_the_approval(
    station: OperatorStation, body: str
) -> None:
    await answer_request(station, body, held=True)


async def test_a_signature_of_name_phone_and_address_under_the_marker_still_approves(
    station: OperatorStation,
) -> None:
    body = "Approved.\n\n--\nNoa Bar\nTel: +972-3-555-0100\nnoa.bar@fabrikam.test"
    task = await answer_request(station, body, held=False)
    assert task["state"] == "APPROVED_TO_SEND", task["approval_decisions"]


def outlook_reply(station: OperatorStation, note: str | None) -> str:
    """'Approved.' above the quoted request as Outlook quotes it, with ``note`` written into
    the quoted text when given."""
    [request] = sent_messages(station.maildir)
    part = request.get_body(("plain",))
    assert part is not None
    quoted = part.get_content().splitlines()
    if note is not None:
        quoted.insert(len(quoted) // 2, note)
    header = [
        "-----Original Message-----",
        f"From: {MAILBOX}",
        "Sent: Monday, November 30, 2026 09:00 AM",
        f"To: {APPROVER}",
        "Subject: Approval needed: Quote request",
        "",
    ]
    return "\n".join(["Approved.", "", *header, *quoted])


async def test_a_note_written_into_the_quoted_request_holds_the_approval(
    station: OperatorStation,
) -> None:
    station.deliver(sender=CLIENT)
    async with station.client() as client:
        request = await waiting_for_approval(client)
        body = outlook_reply(station, "[Noa] the price is wrong here, do not send")
        raw = reply_with_parts(station, request["request_message_id"], body, subject=SUBJECT)
        task = await judged(station, client, request, raw)
        await assert_not_approved(client, task, request["draft_id"])


async def test_an_approval_above_the_unchanged_quoted_request_approves(
    station: OperatorStation,
) -> None:
    station.deliver(sender=CLIENT)
    async with station.client() as client:
        request = await waiting_for_approval(client)
        body = outlook_reply(station, None)
        raw = reply_with_parts(station, request["request_message_id"], body, subject=SUBJECT)
        task = await judged(station, client, request, raw)
    assert task["state"] == "APPROVED_TO_SEND", task["approval_decisions"]


async def test_the_reply_subject_is_read_and_a_do_not_send_there_holds_the_approval(
    station: OperatorStation,
) -> None:
    await answer_request(station, "Approved.", subject="DO NOT SEND - wrong price", held=True)


async def test_an_approval_stamped_in_the_same_second_as_the_request_counts(
    station: OperatorStation,
) -> None:
    station.clock.moment += timedelta(microseconds=600_000)  # the request goes out at .6 s
    station.deliver(sender=CLIENT)
    async with station.client() as client:
        request = await waiting_for_approval(client)
        # Mail dates have whole seconds: this reply's Date is the request's own second.
        raw = reply_with_parts(station, request["request_message_id"], "Approved.", subject=SUBJECT)
        station.deliver_raw(raw)
        await intake_and_claim(client)
        task = await call(client, "get_task", task_id=request["task_id"])
    assert task["state"] == "APPROVED_TO_SEND", task["approval_decisions"]


async def test_the_approval_request_shows_the_clients_bidi_controls_written_out(
    station: OperatorStation,
) -> None:
    station.deliver(sender=CLIENT, subject="Invoice \u202efdp.exe\u202c for Q4")
    async with station.client() as client:
        _, [claimed] = await intake_and_claim(client)
        await to_draft_ready(client, claimed["task_id"])
        draft = await call(client, "render", task_id=claimed["task_id"], body_markdown="Done.")
        await call(
            client, "request_approval", task_id=claimed["task_id"], draft_id=draft["draft_id"]
        )
    [request] = sent_messages(station.maildir)
    shown = [request["Subject"]]
    for kind in ("plain", "html"):
        part = request.get_body((kind,))
        assert part is not None
        shown.append(part.get_content())
    for text in shown:
        assert "\u202e" not in text and "\u202c" not in text
    assert all("[U+202E]" in text for text in shown), shown
