"""Seed 000: the licence and grant preflight gates work on every item; only automated mail is
recognised as noise first. A colleague's note that only copies the mailbox is held like a
client's request while the preflight fails."""

from __future__ import annotations

from email.utils import format_datetime
from pathlib import Path

import pytest

from agent.testing import FrozenClock
from tests.mcp.conftest import (
    CLIENT,
    COLLEAGUE,
    MAILBOX,
    OperatorStation,
    call,
    intake_and_claim,
    station_context,
)

pytestmark = pytest.mark.anyio


def suspended_station(tmp_path: Path) -> OperatorStation:
    station = OperatorStation(root=tmp_path / "station", clock=FrozenClock())
    station.register(station_context().replace("licence: active", "licence: suspended"))
    return station


def colleague_fyi(station: OperatorStation) -> bytes:
    """An internal colleague's message to a client that only copies the mailbox."""
    return (
        f"From: Eli Tal <{COLLEAGUE}>\r\nTo: {CLIENT}\r\nCc: {MAILBOX}\r\n"
        f"Subject: FYI: the Q4 renewal\r\nDate: {format_datetime(station.clock.now())}\r\n"
        "Message-ID: <fyi-1@fabrikam.test>\r\n\r\nFor your records.\r\n"
    ).encode()


async def test_a_failed_preflight_escalates_an_internal_note_like_client_mail(
    tmp_path: Path,
) -> None:
    station = suspended_station(tmp_path)
    station.deliver_raw(colleague_fyi(station))
    station.deliver(sender=CLIENT)
    async with station.client() as client:
        scanned, claims = await intake_and_claim(client)
        tasks = [await call(client, "get_task", task_id=c["task_id"]) for c in claims]
        reconciled = await call(client, "reconcile", run_id=scanned["run_id"])
    assert [c["disposition"] for c in claims] == ["ESCALATED", "ESCALATED"], claims
    for task in tasks:
        assert task["state"] != "COMPLETED"
        assert "preflight" in [g["kind"] for g in task["open_gates"]], task
    assert reconciled["clean"]


async def test_with_the_licence_active_an_internal_note_that_only_copies_the_mailbox_closes(
    station: OperatorStation,
) -> None:
    station.deliver_raw(colleague_fyi(station))
    async with station.client() as client:
        _, [claim] = await intake_and_claim(client)
    assert claim["disposition"] == "CLOSED_NO_REPLY_NEEDED"
