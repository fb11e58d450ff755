"""Internal mail across real processes: concurrent senders into one mailbox, senders killed
with SIGKILL at a crash point or at a random moment, and delayed mail that outlives the
process that sent it."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
from datetime import datetime, timedelta
from pathlib import Path

from agent.domain.internal_mail import StoredMail
from agent.services.internal_mail import MailboxDir, MailNetwork, deliver_due
from agent.testing import FrozenClock
from agent.testing.clocks import UtcClock
from bench import mail as bench_mail
from tests.conftest import wait_for


def outloop(
    data_dir: Path, *args: str, crash: str | None = None
) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "OUTLOOP_DATA_DIR": str(data_dir)}
    env.pop("OUTLOOP_CRASHPOINT", None)
    if crash:
        env["OUTLOOP_CRASHPOINT"] = crash
    return subprocess.run(
        [sys.executable, "-m", "mcp_server.cli", "mail", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def present_operator(network: MailNetwork, address: str) -> MailboxDir:
    """An operator's mailbox, marked reachable."""
    box = network.register(address, "operator", address.title())
    network.set_presence(box, True)
    return box


def visible_messages(folder: Path) -> list[StoredMail]:
    """Every message file a reader sees in ``folder``: each must parse whole."""
    return [
        StoredMail.model_validate_json(p.read_bytes())
        for p in folder.glob("*.json")
        if not p.name.startswith(".")
    ]


def test_eight_processes_sending_a_thousand_each_into_one_mailbox_deliver_each_once(
    tmp_path: Path,
) -> None:
    network = bench_mail.setup(tmp_path, senders=8)
    workers = bench_mail.Workers(tmp_path, senders=8, count=1000)
    workers.round("product", 0, 1000)
    workers.close()
    assert bench_mail.tally(network, senders=8, count=1000) == {
        "delivered": 8000,
        "duplicates": 0,
        "lost": 0,
        "corrupt": 0,
    }
    inbox = network.box(bench_mail.TARGET).folder("inbox")
    assert not [p for p in inbox.iterdir() if p.name.startswith(".")]  # no temporaries left


def test_a_sender_killed_mid_write_leaves_no_partial_message_and_sends_nothing(
    tmp_path: Path,
) -> None:
    network = MailNetwork.of_data_dir(tmp_path, FrozenClock())
    hub = present_operator(network, "hub")
    triage = network.register("triage", "agent", "Triage")  # the kill hits the message
    killed = outloop(
        tmp_path, "send", "--as", "triage", "hub", "-m", "half of me", crash="mail_mid_write"
    )
    assert killed.returncode == -signal.SIGKILL
    [partial] = list(triage.folder("claimed").iterdir())  # the half-written claim
    assert partial.stat().st_size > 0
    for folder in ("sent", "inbox", "archive"):
        assert visible_messages(triage.folder(folder)) == []
    assert visible_messages(hub.folder("inbox")) == []
    assert deliver_due(network) == 0  # the unfinished write is recognised and dropped
    assert list(triage.folder("claimed").iterdir()) == []
    assert visible_messages(hub.folder("inbox")) == []


def test_a_sender_killed_before_delivering_to_two_recipients_reaches_both_once(
    tmp_path: Path,
) -> None:
    network = MailNetwork.of_data_dir(tmp_path, UtcClock())  # the sender's clock is real
    for name in ("hub", "desk"):
        present_operator(network, name)
    killed = outloop(
        tmp_path,
        "send",
        "--as",
        "triage",
        "hub",
        "desk",
        "-m",
        "to both",
        crash="mail_after_sender_state",
    )
    assert killed.returncode == -signal.SIGKILL
    assert deliver_due(network) == 2
    assert deliver_due(network) == 0
    for name in ("hub", "desk"):
        assert [m.message for m in visible_messages(network.box(name).folder("inbox"))] == [
            "to both"
        ]


def test_a_sender_killed_after_writing_its_side_is_delivered_once_by_the_next_pass(
    tmp_path: Path,
) -> None:
    network = MailNetwork.of_data_dir(tmp_path, FrozenClock())
    hub = present_operator(network, "hub")
    killed = outloop(
        tmp_path, "send", "--as", "triage", "hub", "-m", "handoff", crash="mail_after_sender_state"
    )
    assert killed.returncode == -signal.SIGKILL
    triage = network.box("triage")
    [claim] = list(triage.folder("claimed").iterdir())  # the whole message, not delivered
    sent = StoredMail.model_validate_json(claim.read_bytes())
    assert visible_messages(hub.folder("inbox")) == []
    first = outloop(tmp_path, "deliver")
    assert first.returncode == 0 and "delivered 1" in first.stdout
    assert "delivered 0" in outloop(tmp_path, "deliver").stdout
    [got] = visible_messages(hub.folder("inbox"))
    assert got.uid == sent.uid and got.message == "handoff"
    assert [m.uid for m in visible_messages(triage.folder("sent"))] == [sent.uid]


def test_senders_killed_at_random_moments_leave_only_whole_messages_each_delivered_once(
    tmp_path: Path,
) -> None:
    network = bench_mail.setup(tmp_path, senders=4)
    inbox = network.box(bench_mail.TARGET).folder("inbox")
    workers = bench_mail.Workers(tmp_path, senders=4, count=400)
    procs = workers.procs
    workers.start("product", 0, 400)
    rng = random.Random(23)
    victims = procs[:2]
    for victim, threshold in zip(victims, sorted(rng.sample(range(100, 600), 2)), strict=True):
        wait_for(lambda t=threshold: len(list(inbox.iterdir())) >= t, "more mail arrives")
        victim.send_signal(signal.SIGKILL)
    codes = workers.close(expect_killed=2)
    assert codes[:2] == [-signal.SIGKILL] * 2
    deliver_due(network)  # the next pass finishes what the killed senders left in flight
    delivered = visible_messages(inbox)
    sent = [
        m for i in range(4) for m in visible_messages(network.box(f"sender-{i}").folder("sent"))
    ]
    assert sorted(m.uid for m in delivered) == sorted(m.uid for m in sent)  # once each
    assert len(sent) < 1600  # the kills did cut the senders short


def test_a_delayed_self_send_outlives_its_process_and_is_delivered_once(tmp_path: Path) -> None:
    sent = outloop(
        tmp_path, "send", "--as", "triage", "triage", "-m", "capsule", "--delay", "3600", "--json"
    )
    assert sent.returncode == 0, sent.stderr
    due = json.loads(sent.stdout)["deliver_at"]
    clock = FrozenClock()
    network = MailNetwork.of_data_dir(tmp_path, clock)
    inbox = network.box("triage").folder("inbox")
    clock.moment = datetime.fromisoformat(due) - timedelta(seconds=1)
    assert deliver_due(network) == 0
    clock.advance(seconds=1)
    assert deliver_due(network) == 1
    assert deliver_due(network) == 0
    assert [m.message for m in visible_messages(inbox)] == ["capsule"]
