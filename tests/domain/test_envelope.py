from __future__ import annotations

from datetime import datetime

import pydantic
import pytest

from agent.domain.envelope import OccurrenceScope, occurrence_key, work_key
from agent.testing import make_envelope

MAILBOX = "support@fabrikam.test"


def test_work_key_is_workspace_provider_mailbox_and_provider_thread() -> None:
    env = make_envelope(mailbox_id=MAILBOX, message_no=1, thread_no=7)
    key = work_key("ws-a", env)
    for part in ("ws-a", "memory", MAILBOX, "thread-7"):
        assert part in key
    assert work_key("ws-b", env) != key


def test_messages_in_one_provider_thread_share_the_work_key() -> None:
    first = make_envelope(mailbox_id=MAILBOX, message_no=1, thread_no=3)
    second = make_envelope(mailbox_id=MAILBOX, message_no=2, thread_no=3)
    assert work_key("ws", first) == work_key("ws", second)
    assert occurrence_key("ws", first) != occurrence_key("ws", second)


def test_subject_sender_and_timing_never_link_messages() -> None:
    a = make_envelope(mailbox_id=MAILBOX, message_no=1, thread_no=1, subject="Invoice")
    b = make_envelope(
        mailbox_id=MAILBOX, message_no=2, thread_no=2, subject="Invoice", received_at=a.received_at
    )
    assert a.sender == b.sender
    assert work_key("ws", a) != work_key("ws", b)


def test_key_parts_cannot_collide_by_shifting_separators() -> None:
    a = make_envelope(mailbox_id="a|b", message_no=1, thread_no=1)
    b = make_envelope(mailbox_id="a", message_no=1, thread_no=1)
    assert work_key("x", a) != work_key("x|b", b)


def test_thread_scope_occurrence_covers_the_whole_thread() -> None:
    first = make_envelope(mailbox_id=MAILBOX, message_no=1, thread_no=3)
    second = make_envelope(mailbox_id=MAILBOX, message_no=2, thread_no=3)
    scope = OccurrenceScope.THREAD
    assert occurrence_key("ws", first, scope) == occurrence_key("ws", second, scope)


def test_the_envelope_is_frozen_and_requires_an_aware_time() -> None:
    env = make_envelope(mailbox_id=MAILBOX, message_no=1, thread_no=1)
    with pytest.raises(pydantic.ValidationError):
        env.subject = "changed"  # type: ignore[misc]
    with pytest.raises(pydantic.ValidationError, match="timezone-aware"):
        env.model_validate({**env.model_dump(by_alias=True), "received_at": datetime(2026, 1, 1)})


def test_the_envelope_serializes_sender_as_from() -> None:
    env = make_envelope(mailbox_id=MAILBOX, message_no=1, thread_no=1)
    data = env.model_dump(by_alias=True)
    assert data["from"]["address"] == "client@example.test"
    assert data["origin"] == "mail"
