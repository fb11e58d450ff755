"""What leaves is exactly what was planned: values copied from received mail (a Message-ID, a
References list, a subject) never add a header or a recipient to anything the server sends -
an approval request, an approved client reply, an automatic acknowledgement - however they
are encoded (RFC 2047 encoded words that decode to CR LF, CVE-2024-6923)."""

from __future__ import annotations

import base64
import re
from email.utils import format_datetime
from pathlib import Path
from typing import Any

import pytest
from mcp import Client

from agent.testing import FrozenClock
from tests.mcp.conftest import (
    APPROVER,
    CLIENT,
    MAILBOX,
    STRANGER,
    OperatorStation,
    approved_draft,
    call,
    intake_and_claim,
    sent_raw,
    station_context,
)

pytestmark = pytest.mark.anyio

FIELD = re.compile(rb"^([!-9;-~]+):", re.MULTILINE)
STRUCTURE = {b"mime-version", b"content-type", b"content-transfer-encoding"}
SENT_HEADERS = {b"from", b"to", b"cc", b"subject", b"date", b"message-id", b"in-reply-to"}
SENT_HEADERS |= {b"references"} | STRUCTURE

# An encoded word whose text is a line break and a Bcc header.
INJECTED = "=?utf-8?q?x=0D=0ABcc=3A_mallory=40evil.test?="
INJECTED_SUBJECT = "=?utf-8?q?Quote=0D=0ABcc:_mallory@evil.test?="


def crafted(
    *,
    message_id: str,
    station: OperatorStation,
    subject: str = "Quote request",
    headers: str = "",
) -> bytes:
    """A client's message with raw header values (as an attacker writes them)."""
    return (
        f"From: Dana Levi <{CLIENT}>\r\nTo: {MAILBOX}\r\nSubject: {subject}\r\n"
        f"Date: {format_datetime(station.clock.now())}\r\nMessage-ID: {message_id}\r\n"
        f"{headers}Content-Type: text/plain; charset=utf-8\r\n\r\n"
        "Could you send me a quote for the Q4 licences?\r\n"
    ).encode()


def head_of(raw: bytes) -> bytes:
    return re.split(rb"\r?\n\r?\n", raw, maxsplit=1)[0]


def assert_only_planned_headers(raw: bytes) -> None:
    head = head_of(raw)
    names = [n.lower() for n in FIELD.findall(head)]
    assert set(names) <= SENT_HEADERS, names
    assert len(names) == len(set(names)), names
    assert b"mallory" not in head.lower() or b"=?utf-8?" in head  # only inside encoded text
    for line in re.split(rb"\r?\n", head):
        assert line[:1] in (b" ", b"\t") or FIELD.match(line), line


async def approved_send(client: Client, station: OperatorStation) -> dict[str, Any]:
    """The client's (crafted) request worked to an approved, sent reply."""
    approved = await approved_draft(client, station)
    return await call(
        client, "send", task_id=approved["task_id"], draft_id=approved["draft_id"], to=[CLIENT]
    )


async def test_an_encoded_line_break_in_the_clients_message_id_adds_no_header_to_the_reply(
    station: OperatorStation,
) -> None:
    station.deliver_raw(crafted(message_id=f"<{INJECTED}@contoso.test>", station=station))
    async with station.client() as client:
        await approved_send(client, station)
    copies = sent_raw(station.maildir)
    assert len(copies) == 2  # the approval request and the client reply
    for raw in copies:
        assert_only_planned_headers(raw)
        assert b"In-Reply-To: <=?" not in raw  # an id not in msg-id form is left out


async def test_an_encoded_line_break_in_a_threads_references_adds_no_header_to_the_reply(
    station: OperatorStation,
) -> None:
    headers = f"References: <root@contoso.test> <{INJECTED}@contoso.test>\r\n"
    station.deliver_raw(crafted(message_id="<q1@contoso.test>", headers=headers, station=station))
    async with station.client() as client:
        await approved_send(client, station)
    [reply] = [raw for raw in sent_raw(station.maildir) if f"To: {CLIENT}".encode() in raw]
    assert_only_planned_headers(reply)
    references = re.search(rb"^References:([^\r\n]*(?:\r\n[ \t][^\r\n]*)*)", reply, re.MULTILINE)
    assert references is not None
    assert references.group(1).split() == [b"<root@contoso.test>", b"<q1@contoso.test>"]


async def test_a_double_encoded_subject_adds_no_header_to_the_approval_request_or_the_reply(
    station: OperatorStation,
) -> None:
    # Decoded once, the subject is text that is itself an encoded word of CR LF + Bcc.
    subject = "=?utf-8?b?" + base64.b64encode(INJECTED_SUBJECT.encode()).decode() + "?="
    station.deliver_raw(crafted(message_id="<q2@contoso.test>", subject=subject, station=station))
    async with station.client() as client:
        sent = await approved_send(client, station)
        read = await call(client, "read_back", send_id=sent["send_id"])
    copies = sent_raw(station.maildir)
    assert len(copies) == 2
    for raw in copies:
        assert_only_planned_headers(raw)
    checks = {c["name"]: c["ok"] for c in read["checks"]}
    assert checks["recipients.bcc"] and checks["recipients.other"] and read["ok"], read


async def test_an_automatic_acknowledgement_carries_no_header_a_client_message_injected(
    tmp_path: Path,
) -> None:
    station = OperatorStation(root=tmp_path / "station", clock=FrozenClock())
    acks = "receipt_ack: true\ncommunication: {ack_templates: {en: We got it.}}\n"
    station.register(station_context(extra=acks).replace("receipt_ack: false\n", ""))
    subject = "=?utf-8?b?" + base64.b64encode(INJECTED_SUBJECT.encode()).decode() + "?="
    headers = f"References: <{INJECTED}@contoso.test>\r\nIn-Reply-To: <{INJECTED}@contoso.test>\r\n"
    station.deliver_raw(
        crafted(message_id=f"<{INJECTED}@contoso.test>", subject=subject, headers=headers,
                station=station)
    )  # fmt: skip
    async with station.client() as client:
        _, claims = await intake_and_claim(client)
    assert claims[0]["disposition"] == "ACK_SENT", claims
    [ack] = sent_raw(station.maildir)
    assert_only_planned_headers(ack)
    assert STRANGER.encode() not in head_of(ack)
    assert APPROVER.encode() not in head_of(ack)
