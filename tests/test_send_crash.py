"""Crash: workers sending automated mail die by SIGKILL just before and just after the
provider takes the message. Afterwards every inbound request has exactly one receipt
acknowledgement and every task waiting on the client exactly one reminder: nothing lost,
nothing sent twice.
"""

from __future__ import annotations

import mailbox
import signal
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from agent.domain.records import SendState
from agent.domain.states import TaskState
from agent.providers.maildir import SENT_FOLDER
from agent.services import workspaces
from tests.conftest import REPORTED, context_yaml
from tests.test_crash import WS, World, _wait

KILLS_PER_POINT = 5
SENDING = """\
receipt_ack: true
automation: {max_per_recipient_per_day: 100}
communication:
  ack_templates: {en: "We received your message and will get back to you."}
"""


class SendingWorld(World):
    def __init__(self, root: Path) -> None:
        super().__init__(root)
        ctx = root / "context.yaml"
        text = context_yaml(WS, provider="maildir", path=str(self.maildir), extra=SENDING)
        ctx.write_text(text.replace("receipt_ack: false\n", ""), encoding="utf-8")
        store = self.store()
        try:
            workspaces.update_workspace(store, self.data_dir, ctx, datetime.now(UTC))
        finally:
            store.close()

    def waiting_on_the_client(self) -> int:
        """Put every open task in WAITING_CLIENT as of ten days ago (reminders are due)."""
        store = self.store()
        long_ago = datetime.now(UTC) - timedelta(days=10)
        moved = 0
        try:
            for task in store.list_queue(WS):
                if task.state is TaskState.TASK_RESOLVED:
                    store.transition_task(task.task_id, TaskState.WAITING_CLIENT, "asked", long_ago)
                    moved += 1
        finally:
            store.close()
        return moved

    def sent(self) -> list[mailbox.MaildirMessage]:
        box = mailbox.Maildir(str(self.maildir), create=False)
        if SENT_FOLDER not in box.list_folders():
            return []
        return list(box.get_folder(SENT_FOLDER))


@pytest.mark.slow
@pytest.mark.parametrize("point", ["before_provider_send", "after_provider_send"])
def test_workers_killed_around_the_provider_send_send_each_automated_message_exactly_once(
    point: str, tmp_path: Path
) -> None:
    world = SendingWorld(tmp_path)
    world.deliver(new_threads=4, follow_ups=0)
    kills = rounds = reminder_kills = 0
    waiting = 0
    while kills < KILLS_PER_POINT or reminder_kills < 2:
        rounds += 1
        assert rounds <= 40, f"only {kills} kills at {point} in 40 rounds"
        # Tasks triaged so far wait on the client. Odd rounds bring new mail (workers
        # acknowledge it); even rounds bring none, so the only sends are reminders.
        waiting_now = world.waiting_on_the_client()
        waiting += waiting_now
        if rounds % 2:
            world.deliver(new_threads=2, follow_ups=0)
        codes = _wait([world.worker(f"{point}:{world.rng.randint(0, 1)}") for _ in range(2)])
        killed = codes.count(-signal.SIGKILL)
        kills += killed
        if rounds % 2 == 0 and waiting_now:  # a kill while reminders were due
            reminder_kills += killed
    # Clean workers take over what the dead ones left.
    assert _wait([world.worker() for _ in range(2)]) == [0, 0]
    assert _wait([world.worker()]) == [0]
    sent = world.sent()
    acks = Counter(str(m["In-Reply-To"]) for m in sent if m["In-Reply-To"])
    reminders = Counter(str(m["Subject"]) for m in sent if str(m["Subject"]).startswith("Reminder"))
    assert len(acks) == len(world.threads)  # every request acknowledged...
    assert set(acks.values()) == {1}  # ...exactly once
    assert waiting > 0 and len(reminders) == waiting and set(reminders.values()) == {1}
    store = world.store()
    try:
        ledger = store.list_sends(WS)
        assert {s.state for s in ledger} == {SendState.CONFIRMED}
        assert len(ledger) == len(sent)
    finally:
        store.close()
    REPORTED[f"send crash {point}"] = {
        "sigkills": kills,
        "of_them_during_reminders": reminder_kills,
        "rounds": rounds,
        "acks": sum(acks.values()),
        "reminders": sum(reminders.values()),
    }
