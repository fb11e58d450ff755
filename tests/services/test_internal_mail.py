"""Internal mail, action by action and rule by rule, on real files with a driven clock."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from agent.domain.internal_mail import ACTIONS, MailError
from agent.services.internal_mail import Identity, InternalMail, deliver_due, delivery
from agent.services.internal_mail.delivery import Entry, Recipient, deliver
from agent.services.internal_mail.footprint import clean, footprint
from tests.mail_world import (
    MailWorld,
    call,
    inbox_ids,
    lane,
    refused,
    refused_call,
    settle,
    tree,
)


@pytest.fixture
def world(tmp_path: Path) -> MailWorld:
    return MailWorld(tmp_path / "data")


def sent_to(world: MailWorld, message: str = "hello", **fields: Any) -> tuple[Any, Any]:
    triage = world.box("triage", name="Triage", nickname="Tri")
    noa = world.box("ops/noa", "operator", name="Noa Bar")
    call(triage, "send", address="ops/noa", message=message, **fields)
    return triage, noa


# -- the call envelope ----------------------------------------------------------------------


@pytest.mark.parametrize("extra", ["extra", "folder", "summary", "email_id"])
def test_an_unknown_root_field_is_refused_before_any_file_changes(
    world: MailWorld, extra: str
) -> None:
    triage, _ = sent_to(world)
    before = tree(world.data_dir)
    raw = {"action": "check", "input": {}, "reasoning": "r", extra: "x"}
    error = refused(triage, raw)
    assert error.code == "INVALID_INPUT" and extra in str(error)
    assert tree(world.data_dir) == before


CROSS_ACTION = [
    ("send", {"address": "ops/noa", "message": "m", "query": "x"}, "query"),
    ("send", {"address": "ops/noa", "message": "m", "email_id": ["x"]}, "email_id"),
    ("check", {"message": "m"}, "message"),
    ("read", {"email_id": ["x"], "folder": "inbox"}, "folder"),
    ("dismiss", {"email_id": ["x"], "n": 3}, "n"),
    ("reply", {"email_id": ["x"], "message": "m", "delay": 5}, "delay"),
    ("reply_all", {"email_id": ["x"], "message": "m", "mode": "abs"}, "mode"),
    ("search", {"query": "x", "filter": {}}, "filter"),
    ("archive", {"email_id": ["x"], "note": "n"}, "note"),
    ("delete", {"email_id": ["x"], "address": "a"}, "address"),
    ("contacts", {"name": "n"}, "name"),
    ("add_contact", {"address": "a", "name": "n", "message": "m"}, "message"),
    ("remove_contact", {"address": "a", "name": "n"}, "name"),
    ("edit_contact", {"address": "a", "query": "q"}, "query"),
    ("settings", {"folder": "inbox"}, "folder"),
    ("manual", {"n": 1}, "n"),
    ("check", {"summarize": True}, "summarize"),
]


@pytest.mark.parametrize(("action", "fields", "foreign"), CROSS_ACTION)
def test_an_input_field_of_another_action_is_refused_before_any_file_changes(
    world: MailWorld, action: str, fields: dict[str, Any], foreign: str
) -> None:
    triage, noa = sent_to(world)
    before = tree(world.data_dir)
    error = refused(noa, {"action": action, "input": fields, "reasoning": "r"})
    assert error.code == "INVALID_INPUT" and repr(foreign) in str(error)
    assert tree(world.data_dir) == before
    assert lane(call(noa, "check"))["total"] == 1  # the unread mail is still unread
    del triage


def test_every_action_of_the_seed_is_offered() -> None:
    assert set(ACTIONS) == {
        "send",
        "check",
        "read",
        "dismiss",
        "reply",
        "reply_all",
        "search",
        "archive",
        "delete",
        "contacts",
        "add_contact",
        "remove_contact",
        "edit_contact",
        "settings",
        "manual",
    }


@pytest.mark.parametrize(
    "raw",
    [
        {"input": {}, "reasoning": "r"},
        {"action": "check", "reasoning": "r"},
        {"action": "check", "input": {}},
        {"action": "check", "input": {}, "reasoning": "  "},
        {"action": "fetch", "input": {}, "reasoning": "r"},
        {"action": "check", "input": [], "reasoning": "r"},
        {"action": "check", "input": {}, "reasoning": "r", "summarize": "yes"},
    ],
)
def test_a_call_without_its_required_envelope_is_refused_before_any_io(
    tmp_path: Path, raw: dict[str, Any]
) -> None:
    world = MailWorld(tmp_path / "fresh")
    mail = InternalMail(world.network, Identity("triage"))
    assert refused(mail, raw).code == "INVALID_INPUT"
    assert not world.data_dir.exists()  # not even the mailbox was created


def test_an_input_field_set_to_null_counts_as_omitted(world: MailWorld) -> None:
    triage, _ = sent_to(world)
    answer = triage.call(
        {
            "action": "check",
            "input": {"folder": None, "n": None, "filter": None},
            "reasoning": "r",
            "summarize": None,
        }
    )
    assert answer.payload["folder"] == "inbox"


def test_a_wrongly_typed_input_is_refused_naming_the_field(world: MailWorld) -> None:
    triage, _ = sent_to(world)
    error = refused(triage, {"action": "check", "input": {"n": "ten"}, "reasoning": "r"})
    assert error.code == "INVALID_INPUT" and "n" in str(error)


# -- send and delivery ------------------------------------------------------------------------


def test_send_writes_the_senders_copy_and_delivers_to_a_reachable_agent(world: MailWorld) -> None:
    triage, noa = sent_to(world, "the report is ready", subject="Report")
    [sent] = call(triage, "check", folder="sent").payload["emails"]
    [got] = call(noa, "read", email_id=inbox_ids(noa)).payload["emails"]
    assert sent["subject"] == got["subject"] == "Report"
    assert got["message"] == "the report is ready"
    assert (got["from"], got["sender_name"], got["sender_nickname"]) == ("triage", "Triage", "Tri")


def test_the_send_answer_is_scheduling_evidence_not_acceptance(world: MailWorld) -> None:
    triage = world.box("triage")
    answer = call(triage, "send", address="gone", message="x")
    assert answer.payload["status"] == "sent"
    assert "not acceptance" in answer.payload["note"]
    [bounce] = answer.events
    assert bounce["type"] == "email.bounce" and bounce["address"] == "gone"


def test_a_body_of_exactly_the_limit_goes_and_one_character_more_is_refused(
    world: MailWorld,
) -> None:
    triage = world.box("triage")
    world.box("ops/noa", "operator")
    assert call(triage, "send", address="ops/noa", message="x" * 50_000).payload["status"] == "sent"
    before = tree(world.data_dir)
    error = refused(
        triage,
        {
            "action": "send",
            "input": {"address": "ops/noa", "message": "y" * 50_001},
            "reasoning": "r",
        },
    )
    assert error.code == "BODY_TOO_LONG" and "50,000" in str(error)
    assert tree(world.data_dir) == before


def test_the_duplicate_guard_refuses_past_its_free_passes_and_resets_on_another_send(
    world: MailWorld,
) -> None:
    triage = world.box("triage")
    world.box("ops/noa", "operator")
    same = {"action": "send", "input": {"address": "ops/noa", "message": "ping"}, "reasoning": "r"}
    triage.call(same)
    triage.call(same)  # the default allows two identical sends in a row
    assert refused(triage, same).code == "DUPLICATE_SEND"
    call(triage, "send", address="ops/noa", message="something else")
    triage.call(same)
    assert call(world.box("ops/noa", "operator"), "check").payload["total"] == 4


def test_the_duplicate_guard_counts_identical_sends_from_many_threads_exactly(
    world: MailWorld,
) -> None:
    triage = world.box("triage")
    world.box("ops/noa", "operator")
    same = {"action": "send", "input": {"address": "ops/noa", "message": "ping"}, "reasoning": "r"}

    def attempt(_: int) -> str:
        try:
            triage.call(same)
        except MailError as exc:
            return exc.code
        return "sent"

    with ThreadPoolExecutor(max_workers=8) as pool:
        outcomes = list(pool.map(attempt, range(16)))
    assert sorted(outcomes) == ["DUPLICATE_SEND"] * 14 + ["sent"] * 2


@pytest.mark.parametrize("how", ["removed", "moved aside"])
def test_the_duplicate_guard_holds_when_its_file_is_replaced_between_sends(
    world: MailWorld, how: str
) -> None:
    one = world.box("triage")
    world.box("ops/noa", "operator")
    call(one, "send", address="ops/noa", message="ping")
    guard = one.box.store / ".guard"  # the file the tool holds open goes
    if how == "removed":
        guard.unlink()
    else:
        guard.rename(guard.with_name(".guard.old"))
    two = InternalMail(world.network, Identity("triage"))
    call(two, "send", address="ops/noa", message="ping")
    call(one, "send", address="ops/noa", message="ping")  # counts on the new file
    assert refused_call(two, "send", address="ops/noa", message="ping") == "DUPLICATE_SEND"


def test_the_duplicate_guard_counts_recipients_and_body_together(world: MailWorld) -> None:
    world.configure(settings={"send.duplicate_free_passes": 1})
    triage = world.box("triage")
    world.box("a")
    world.box("b")
    call(triage, "send", address="a", message="same")
    call(triage, "send", address="b", message="same")  # another recipient: not a repeat
    assert refused_call(triage, "send", address="b", message="same") == "DUPLICATE_SEND"


def test_a_target_with_a_stale_heartbeat_bounces(world: MailWorld) -> None:
    triage = world.box("triage")
    noa = world.box("agents/noa")
    world.clock.advance(seconds=121)
    world.network.beat(triage.box, "test")
    answer = call(triage, "send", address="agents/noa", message="are you there?")
    [bounce] = answer.events
    assert bounce["type"] == "email.bounce" and "heartbeat" in bounce["reason"]
    assert bounce["email_id"] == answer.payload["email_id"]
    world.network.beat(noa.box, "test")
    assert call(noa, "check").payload["total"] == 0  # a bounce is not queued for later


def test_a_bounce_event_is_shown_once(world: MailWorld) -> None:
    triage = world.box("triage")
    assert len(call(triage, "send", address="nobody", message="x").events) == 1
    assert call(triage, "check").events == []


def test_a_target_without_valid_metadata_bounces(world: MailWorld) -> None:
    triage = world.box("triage")
    broken = world.data_dir / "mail" / "broken"
    broken.mkdir(parents=True)
    (broken / "agent.json").write_text('{"kind": "robot"}')
    [bounce] = call(triage, "send", address="broken", message="x").events
    assert "metadata" in bounce["reason"]


def test_an_operator_is_reachable_while_present_without_a_session(world: MailWorld) -> None:
    triage = world.box("triage")
    noa = world.box("ops/noa", "operator", alive=False)
    assert call(triage, "send", address="ops/noa", message="one").events  # no session: bounce
    world.network.set_presence(noa.box, True)
    assert call(triage, "send", address="ops/noa", message="two").events == []
    world.network.set_presence(noa.box, False)
    assert call(triage, "send", address="ops/noa", message="three").events
    assert [e["preview"] for e in call(noa, "check").payload["emails"]] == ["two"]


def test_an_agent_is_not_reachable_by_presence_alone(world: MailWorld) -> None:
    triage = world.box("triage")
    helper = world.box("helper", alive=False)
    world.network.set_presence(helper.box, True)
    assert call(triage, "send", address="helper", message="x").events


@pytest.mark.parametrize("address", ["noa@fabrikam.test", "../escape", "/abs/path", "a//b", ""])
def test_an_address_that_is_not_a_peer_path_is_refused_and_nothing_is_written(
    world: MailWorld, address: str
) -> None:
    triage = world.box("triage")
    before = tree(world.data_dir)
    error = refused(
        triage, {"action": "send", "input": {"address": address, "message": "x"}, "reasoning": "r"}
    )
    assert error.code == "INVALID_INPUT"
    assert tree(world.data_dir) == before


def test_abs_mode_reaches_only_an_authorized_target_and_still_needs_its_heartbeat(
    tmp_path: Path,
) -> None:
    here = MailWorld(tmp_path / "here")
    there = MailWorld(tmp_path / "there", here.clock)
    triage = here.box("triage")
    remote = there.box("intake")
    target = str(remote.box.root)
    [bounce] = call(triage, "send", address=target, message="x", mode="abs").events
    assert "not authorized" in bounce["reason"]
    here.configure(abs_targets=[target])
    assert call(triage, "send", address=target, message="y", mode="abs").events == []
    here.clock.advance(seconds=300)
    here.network.beat(triage.box, "t")
    [stale] = call(triage, "send", address=target, message="z", mode="abs").events
    assert "heartbeat" in stale["reason"]
    there.network.beat(remote.box, "t")
    [got] = call(remote, "read", email_id=inbox_ids(remote)).payload["emails"]
    assert got["message"] == "y" and got["mode"] == "abs"
    assert got["from"] == str(triage.box.root.resolve())  # the way back


def test_a_pseudo_subscriber_gets_a_copy_of_others_mail_but_cannot_send(
    world: MailWorld,
) -> None:
    world.configure(pseudo_agent_subscriptions=[{"subscriber": "audit", "senders": ["*"]}])
    audit = world.box("audit", "pseudo", alive=False)
    triage = world.box("triage")
    world.box("ops/noa", "operator")
    call(triage, "send", address="ops/noa", message="for the record")
    call(triage, "send", address="triage", message="private note")
    [copy] = call(audit, "check").payload["emails"]
    assert copy["preview"] == "for the record" and copy["to"] == ["ops/noa"]
    assert refused_call(audit, "send", address="triage", message="x") == "NOT_PERMITTED"
    [direct] = call(triage, "send", address="audit", message="hi").events
    assert "read-only" in direct["reason"]


# -- self-send, delay, attachments --------------------------------------------------------------


def test_a_self_send_is_a_durable_unread_note(world: MailWorld) -> None:
    triage = world.box("triage", alive=False)  # a note to self needs no heartbeat
    call(triage, "send", address="triage", message="remember the invoice")
    [entry] = lane(call(triage, "check"))["entries"]
    assert entry["message"] == "remember the invoice"
    assert lane(call(triage, "check"))["total"] == 1  # still there until handled


def test_a_delayed_self_send_is_delivered_once_when_it_is_due(world: MailWorld) -> None:
    triage = world.box("triage")
    answer = call(triage, "send", address="triage", message="capsule", delay=3600)
    assert answer.payload["deliver_at"] == "2026-11-30T10:00:00+00:00"
    assert lane(call(triage, "check"))["total"] == 0
    world.clock.advance(seconds=3599)
    assert deliver_due(world.network) == 0
    world.clock.advance(seconds=1)
    assert deliver_due(world.network) == 1
    assert deliver_due(world.network) == 0
    assert [e["preview"] for e in call(triage, "check").payload["emails"]] == ["capsule"]


def test_a_courier_failing_unexpectedly_gives_its_claim_back_for_the_next_pass(
    world: MailWorld, monkeypatch: pytest.MonkeyPatch
) -> None:
    triage = world.box("triage")
    call(triage, "send", address="triage", message="capsule", delay=60)
    world.clock.advance(seconds=61)

    def broken(*_: object) -> bool:
        raise RuntimeError("a fault nobody planned for")

    with monkeypatch.context() as fault:
        fault.setattr(delivery, "_deliver", broken)
        with pytest.raises(RuntimeError):
            deliver_due(world.network)
    outbox = triage.box.store / "outbox"
    assert len([p for p in outbox.iterdir() if p.is_file()]) == 1
    assert list((outbox / "claimed").iterdir()) == []
    assert deliver_due(world.network) == 1
    assert deliver_due(world.network) == 0
    assert [e["preview"] for e in call(triage, "check").payload["emails"]] == ["capsule"]


def test_a_delayed_send_to_another_is_checked_when_it_is_due(world: MailWorld) -> None:
    triage = world.box("triage")
    noa = world.box("agents/noa")
    call(triage, "send", address="agents/noa", message="later", delay=600)
    world.clock.advance(seconds=601)
    world.network.beat(triage.box, "t")
    [bounce] = call(triage, "check").events  # noa's heartbeat went stale meanwhile
    assert "heartbeat" in bounce["reason"]
    world.network.beat(noa.box, "t")
    assert call(noa, "check").payload["total"] == 0


def test_attachments_are_copied_for_others_and_referred_to_for_self(
    world: MailWorld, tmp_path: Path
) -> None:
    report = tmp_path / "report.csv"
    report.write_text("a,b\n1,2\n")
    triage = world.box("triage")
    noa = world.box("ops/noa", "operator")
    call(
        triage, "send", address=["ops/noa", "triage"], message="see file", attachments=[str(report)]
    )
    report.write_text("changed later")
    [theirs] = call(noa, "read", email_id=inbox_ids(noa)).payload["emails"]
    [mine] = call(triage, "read", email_id=inbox_ids(triage)).payload["emails"]
    assert Path(theirs["attachments"][0]["path"]).read_text() == "a,b\n1,2\n"
    assert mine["attachments"][0]["path"] == str(report.resolve())


def test_a_missing_attachment_refuses_the_send_and_writes_nothing(
    world: MailWorld, tmp_path: Path
) -> None:
    triage = world.box("triage")
    world.box("ops/noa", "operator")
    before = tree(world.data_dir)
    error = refused(
        triage,
        {
            "action": "send",
            "input": {
                "address": "ops/noa",
                "message": "x",
                "attachments": [str(tmp_path / "nope.pdf")],
            },
            "reasoning": "r",
        },
    )
    assert error.code == "NOT_FOUND"
    assert tree(world.data_dir) == before


# -- reading ------------------------------------------------------------------------------------


def test_check_lists_newest_first_up_to_n_in_the_chosen_folder(world: MailWorld) -> None:
    triage = world.box("triage")
    noa = world.box("ops/noa", "operator")
    for n in range(5):
        call(triage, "send", address="ops/noa", message=f"m{n}")
        world.clock.advance(seconds=1)
    listed = call(noa, "check", n=3).payload
    assert [e["preview"] for e in listed["emails"]] == ["m4", "m3", "m2"]
    assert listed["total"] == 5 and "message" not in listed["emails"][0]
    assert len(call(triage, "check", folder="sent").payload["emails"]) == 5
    assert lane(call(noa, "check"))["total"] == 5  # check marks nothing read


def test_check_filters_by_sender_recipient_subject_unread_time_and_attachment(
    world: MailWorld, tmp_path: Path
) -> None:
    file = tmp_path / "f.txt"
    file.write_text("x")
    triage = world.box("triage")
    billing = world.box("billing")
    noa = world.box("ops/noa", "operator")
    call(triage, "send", address="ops/noa", message="a", subject="Invoice 7")
    world.clock.advance(hours=1)
    world.network.set_presence(noa.box, True)
    call(
        billing,
        "send",
        address="ops/noa",
        message="b",
        subject="Lunch",
        cc=["triage"],
        attachments=[str(file)],
    )
    first = inbox_ids(noa)[-1]
    call(noa, "dismiss", email_id=[first])

    def subjects(**flt: Any) -> list[str]:
        return [e["subject"] for e in call(noa, "check", filter=flt).payload["emails"]]

    assert subjects(**{"from": "billing"}) == ["Lunch"]
    assert subjects(to="triage") == ["Lunch"]
    assert subjects(subject="^Inv.*\\d$") == ["Invoice 7"]
    assert subjects(unread=True) == ["Lunch"]
    assert subjects(since="2026-11-30T09:30:00+00:00") == ["Lunch"]
    assert subjects(until="2026-11-30T09:30:00") == ["Invoice 7"]
    assert subjects(has_attachment=True) == ["Lunch"]
    assert (
        refused(noa, {"action": "check", "input": {"filter": {"body": "x"}}, "reasoning": "r"}).code
        == "INVALID_INPUT"
    )


def test_check_stays_within_its_token_limit(world: MailWorld) -> None:
    world.configure(settings={"check.result_token_limit": 400})
    triage = world.box("triage")
    noa = world.box("ops/noa", "operator")
    for n in range(10):
        call(triage, "send", address="ops/noa", message=f"{n} " + "x" * 150)
    listed = call(noa, "check", n=10).payload
    assert listed["truncated"] is True and 0 < listed["returned"] < 10
    assert len(json.dumps(listed["emails"])) / 4 <= 400


def test_read_returns_bodies_and_marks_inbox_mail_read(world: MailWorld) -> None:
    _, noa = sent_to(world, "full body")
    ids = inbox_ids(noa)
    [email] = call(noa, "read", email_id=ids).payload["emails"]
    assert email["message"] == "full body" and email["unread"] is False
    assert lane(call(noa, "check"))["total"] == 0


def test_dismiss_marks_mail_read_without_returning_bodies(world: MailWorld) -> None:
    _, noa = sent_to(world, "secret body")
    answer = call(noa, "dismiss", email_id=inbox_ids(noa))
    assert "secret body" not in json.dumps(answer.payload)
    assert lane(answer)["total"] == 0


def test_an_unknown_id_refuses_the_whole_call_and_changes_nothing(world: MailWorld) -> None:
    _, noa = sent_to(world)
    ids = inbox_ids(noa)
    for action in ("read", "dismiss", "archive", "delete"):
        before = tree(world.data_dir)
        raw = {
            "action": action,
            "input": {"email_id": [*ids, "20261130T090000000000-000000000000"]},
            "reasoning": "r",
        }
        assert refused(noa, raw).code == "NOT_FOUND"
        assert tree(world.data_dir) == before


def test_an_id_that_is_a_path_is_refused(world: MailWorld) -> None:
    _, noa = sent_to(world)
    raw = {"action": "read", "input": {"email_id": ["../../triage/agent"]}, "reasoning": "r"}
    assert refused(noa, raw).code == "NOT_FOUND"


def test_search_finds_by_regular_expression_in_one_or_every_folder(world: MailWorld) -> None:
    triage = world.box("triage")
    noa = world.box("ops/noa", "operator")
    call(triage, "send", address="ops/noa", message="invoice INV-2044 is late")
    call(noa, "send", address="triage", message="ask about INV-2045")
    assert len(call(noa, "search", query=r"INV-\d{4}").payload["emails"]) == 2
    assert len(call(noa, "search", query=r"INV-\d{4}", folder="sent").payload["emails"]) == 1
    bad = {"action": "search", "input": {"query": "(unclosed"}, "reasoning": "r"}
    assert refused(noa, bad).code == "INVALID_INPUT"


def test_summarize_gives_the_gist_without_ids_addresses_or_bodies(world: MailWorld) -> None:
    _, noa = sent_to(world, "the whole body text", subject="Status")
    raw = {"action": "check", "input": {}, "reasoning": "r", "summarize": True}
    summary = noa.call(raw).payload
    text = json.dumps(summary)
    assert summary["summarized"] is True and summary["count"] == 1
    assert summary["lines"] == ["Tri: Status [unread]"]  # the nickname before the name
    assert "triage" not in text and "whole body" not in text and inbox_ids(noa)[0] not in text


# -- replies ------------------------------------------------------------------------------------


def test_reply_goes_to_the_sender_and_marks_the_answered_message_read(world: MailWorld) -> None:
    triage, noa = sent_to(world, "please confirm", subject="Q")
    [original] = inbox_ids(noa)
    answer = call(noa, "reply", email_id=[original], message="confirmed")
    assert answer.payload["to"] == ["triage"]
    assert lane(answer)["total"] == 0
    [got] = call(triage, "read", email_id=inbox_ids(triage)).payload["emails"]
    assert (got["subject"], got["message"], got["from"]) == ("Re: Q", "confirmed", "ops/noa")


def test_reply_all_reaches_every_other_recipient_but_not_the_replier(world: MailWorld) -> None:
    triage = world.box("triage")
    noa = world.box("ops/noa", "operator")
    world.box("billing")
    call(triage, "send", address="ops/noa", cc=["billing"], message="who takes it?")
    answer = call(noa, "reply_all", email_id=inbox_ids(noa), message="I do")
    assert answer.payload["to"] == ["triage"] and answer.payload["cc"] == ["billing"]


def test_reply_takes_exactly_one_id(world: MailWorld) -> None:
    triage = world.box("triage")
    noa = world.box("ops/noa", "operator")
    call(triage, "send", address="ops/noa", message="a")
    call(triage, "send", address="ops/noa", message="b")
    raw = {
        "action": "reply",
        "input": {"email_id": inbox_ids(noa), "message": "x"},
        "reasoning": "r",
    }
    assert refused(noa, raw).code == "INVALID_INPUT"


def test_a_reply_to_a_sender_who_can_no_longer_receive_bounces(world: MailWorld) -> None:
    _, noa = sent_to(world)
    world.clock.advance(seconds=200)
    world.network.set_presence(noa.box, True)
    answer = call(noa, "reply", email_id=inbox_ids(noa), message="too late?")
    [bounce] = answer.events
    assert bounce["address"] == "triage" and "heartbeat" in bounce["reason"]


def test_a_sent_copy_cannot_be_replied_to(world: MailWorld) -> None:
    triage, _ = sent_to(world)
    [sent] = [e["email_id"] for e in call(triage, "check", folder="sent").payload["emails"]]
    raw = {"action": "reply", "input": {"email_id": [sent], "message": "x"}, "reasoning": "r"}
    assert refused(triage, raw).code == "NOT_FOUND"


# -- moving and deleting ------------------------------------------------------------------------


def test_archive_moves_inbox_mail_out_of_the_inbox_and_the_unread_lane(world: MailWorld) -> None:
    _, noa = sent_to(world)
    answer = call(noa, "archive", email_id=inbox_ids(noa))
    assert lane(answer)["total"] == 0
    assert call(noa, "check").payload["total"] == 0
    [archived] = call(noa, "check", folder="archive").payload["emails"]
    assert (
        refused(
            noa,
            {"action": "archive", "input": {"email_id": [archived["email_id"]]}, "reasoning": "r"},
        ).code
        == "NOT_FOUND"
    )


def test_delete_removes_inbox_and_archive_mail(world: MailWorld) -> None:
    triage = world.box("triage")
    noa = world.box("ops/noa", "operator")
    call(triage, "send", address="ops/noa", message="a")
    call(triage, "send", address="ops/noa", message="b")
    first, second = inbox_ids(noa)
    call(noa, "archive", email_id=[first])
    call(noa, "delete", email_id=[first, second])
    assert call(noa, "search", query=".").payload["total"] == 0


def test_delete_refuses_sent_mail_and_changes_nothing(world: MailWorld) -> None:
    triage, noa = sent_to(world)
    [sent] = [e["email_id"] for e in call(triage, "check", folder="sent").payload["emails"]]
    call(noa, "send", address="triage", message="reply")
    mine = inbox_ids(triage)
    before = tree(world.data_dir)
    error = refused(
        triage, {"action": "delete", "input": {"email_id": [*mine, sent]}, "reasoning": "r"}
    )
    assert error.code == "NOT_PERMITTED"
    assert tree(world.data_dir) == before


def test_a_repeated_delivery_never_brings_back_archived_or_deleted_mail(world: MailWorld) -> None:
    triage = world.box("triage")
    noa = world.box("ops/noa", "operator")
    call(triage, "send", address="ops/noa", message="once")
    [sent] = list((triage.box.folder("sent")).glob("*.json"))
    entry = Entry("x", sent.stem, Recipient("ops/noa", "peer"))
    config = world.network.config()
    [copy] = inbox_ids(noa)
    call(noa, "archive", email_id=[copy])
    deliver(world.network, config, triage.box, entry, sent)
    assert call(noa, "check").payload["total"] == 0
    call(noa, "delete", email_id=[copy])
    deliver(world.network, config, triage.box, entry, sent)
    assert call(noa, "search", query=".").payload["total"] == 0


# -- ids, names and text -----------------------------------------------------------------------


def test_ids_are_local_to_each_mailbox_and_never_written_into_mail(world: MailWorld) -> None:
    triage, noa = sent_to(world, "plain words")
    [sent] = [e["email_id"] for e in call(triage, "check", folder="sent").payload["emails"]]
    [received] = inbox_ids(noa)
    assert sent != received
    for folder in ("sent", "inbox"):
        for path in (world.data_dir / "mail").rglob(f"{folder}/*.json"):
            text = path.read_text()
            assert sent not in text and received not in text


# -- contacts -------------------------------------------------------------------------------------


def test_contacts_are_added_edited_listed_and_removed(world: MailWorld) -> None:
    noa = world.box("ops/noa", "operator")
    call(noa, "add_contact", address="triage", name="Triage desk", note="first line")
    call(noa, "edit_contact", address="triage", note="first line, weekdays")
    assert call(noa, "contacts").payload["contacts"] == [
        {"address": "triage", "name": "Triage desk", "note": "first line, weekdays"}
    ]
    call(noa, "remove_contact", address="triage")
    assert call(noa, "contacts").payload["contacts"] == []
    missing = {"action": "remove_contact", "input": {"address": "triage"}, "reasoning": "r"}
    assert refused(noa, missing).code == "NOT_FOUND"
    bad = {"action": "add_contact", "input": {"address": "x@y.test", "name": "n"}, "reasoning": "r"}
    assert refused(noa, bad).code == "INVALID_INPUT"


# -- settings and manual -----------------------------------------------------------------------


def test_settings_show_exactly_five_rows_of_exactly_five_fields(world: MailWorld) -> None:
    world.configure(
        pseudo_agent_subscriptions=[{"subscriber": "audit-secret-name"}],
        settings={"unread.max_entries": 7},
    )
    triage = world.box("triage")
    rows = call(triage, "settings").payload["settings"]
    assert [r["key"] for r in rows] == [
        "send.body_char_limit",
        "send.duplicate_free_passes",
        "check.result_token_limit",
        "unread.max_entries",
        "manifest.pseudo_agent_subscriptions",
    ]
    assert all(set(r) == {"key", "current", "default", "configurable", "comment"} for r in rows)
    assert rows[0]["current"] == rows[0]["default"] == 50_000
    assert rows[3]["current"] == 7 and rows[3]["default"] == 20
    text = json.dumps(rows)
    assert "audit-secret-name" not in text and str(world.data_dir) not in text
    assert "triage" not in text


def test_settings_and_manual_touch_no_mailbox(tmp_path: Path) -> None:
    world = MailWorld(tmp_path / "fresh")
    mail = InternalMail(world.network, Identity("triage"))
    assert call(mail, "settings").meta is None
    manual = call(mail, "manual")
    assert manual.meta is None
    assert not world.data_dir.exists()
    assert Path(manual.payload["path"]).read_text() == manual.payload["manual"]
    assert "# Internal mail" in manual.payload["manual"]
    for ref in manual.payload["references"]:
        assert Path(ref["path"]).is_file()


def test_unreadable_settings_fail_the_whole_inventory_with_no_partial_rows(
    world: MailWorld,
) -> None:
    triage = world.box("triage")
    (world.data_dir / "mail" / "network.json").write_text(
        '{"settings": {"unread.max_entries": -1}}'
    )
    error = refused(triage, {"action": "settings", "input": {}, "reasoning": "r"})
    assert error.code == "SETTINGS_UNAVAILABLE"
    (world.data_dir / "mail" / "network.json").write_text("{not json")
    assert refused(triage, {"action": "settings", "input": {}, "reasoning": "r"}).code == (
        "SETTINGS_UNAVAILABLE"
    )
    assert call(triage, "manual").payload["status"] == "ok"


# -- notifications -----------------------------------------------------------------------------


def three_unread(world: MailWorld, lane_limit: int) -> InternalMail:
    """An operator's mailbox holding three unread messages ("body 0" oldest), with a lane
    of ``lane_limit`` entries."""
    world.configure(settings={"unread.max_entries": lane_limit})
    triage = world.box("triage")
    noa = world.box("ops/noa", "operator")
    for n in range(3):
        call(triage, "send", address="ops/noa", message=f"body {n}")
        world.clock.advance(seconds=1)
    return noa


def test_unread_mail_is_in_the_lane_in_full_up_to_the_limit_then_an_overflow_marker(
    world: MailWorld,
) -> None:
    noa = three_unread(world, lane_limit=2)
    block = lane(call(noa, "check"))
    assert block["total"] == 3
    assert [e["message"] for e in block["entries"]] == ["body 0", "body 1"]
    assert block["overflow"]["omitted"] == 1
    spill = json.loads(Path(block["overflow"]["spill"]).read_text())
    assert [e["message"] for e in spill["entries"]] == ["body 0", "body 1", "body 2"]


def test_the_lane_follows_mail_and_read_marks_from_other_callers_of_a_quiet_mailbox(
    world: MailWorld,
) -> None:
    triage = world.box("triage")
    noa = world.box("ops/noa", "operator")
    settle(noa, 60)
    assert lane(call(noa, "contacts"))["total"] == 0
    call(triage, "send", address="ops/noa", message="new")
    assert [e["message"] for e in lane(call(noa, "contacts"))["entries"]] == ["new"]
    call(triage, "send", address="ops/noa", message="newer")  # changed again just now
    assert lane(call(noa, "contacts"))["total"] == 2
    settle(noa, 50)  # quiet again: a new time, so the lane is built anew
    call(triage, "send", address="ops/noa", message="newest")
    settle(noa, 40)
    assert lane(call(noa, "contacts"))["total"] == 3
    other_session = world.box("ops/noa", "operator")
    call(other_session, "dismiss", email_id=inbox_ids(noa))
    settle(noa, 30)
    assert lane(call(noa, "contacts")) == {"total": 0, "entries": []}


def test_the_overflow_marker_of_a_quiet_mailbox_points_at_a_spill_file_that_exists(
    world: MailWorld,
) -> None:
    noa = three_unread(world, lane_limit=1)
    settle(noa, 60)
    spill = Path(lane(call(noa, "contacts"))["overflow"]["spill"])
    spill.unlink()  # say the host cleared the notification folder
    assert Path(lane(call(noa, "contacts"))["overflow"]["spill"]) == spill
    assert len(json.loads(spill.read_text())["entries"]) == 3


def test_a_bounce_reaches_a_quiet_mailbox_whose_events_were_found_empty(
    world: MailWorld,
) -> None:
    triage = world.box("triage")
    world.box("agents/noa")
    call(triage, "send", address="agents/noa", message="later", delay=600)
    settle(triage, 60)
    assert call(triage, "contacts").events == []
    world.clock.advance(seconds=601)  # noa's heartbeat is stale by then
    assert deliver_due(world.network) == 0  # another session's courier bounces it
    settle(triage, 50)
    [bounce] = call(triage, "contacts").events
    assert bounce["type"] == "email.bounce" and "heartbeat" in bounce["reason"]


def test_read_dismiss_archive_and_delete_refresh_the_mirror_file(world: MailWorld) -> None:
    triage = world.box("triage")
    noa = world.box("ops/noa", "operator")
    for n in range(4):
        call(triage, "send", address="ops/noa", message=f"m{n}")
    mirror = noa.box.root / ".notification" / "email.json"
    ids = sorted(inbox_ids(noa))
    for action, email_id, left in zip(
        ("read", "dismiss", "archive", "delete"), ids, (3, 2, 1, 0), strict=True
    ):
        call(noa, action, email_id=[email_id])
        state = json.loads(mirror.read_text())
        assert state["producer"] == "internal_mail" and state["unread"] == left
        assert email_id not in state["ids"]


# -- footprint -----------------------------------------------------------------------------------


def test_cleanup_removes_leftovers_but_never_mail(world: MailWorld, tmp_path: Path) -> None:
    file = tmp_path / "f.txt"
    file.write_text("x")
    triage = world.box("triage")
    noa = world.box("ops/noa", "operator")
    call(triage, "send", address="ops/noa", message="keep", attachments=[str(file)])
    call(triage, "send", address="ops/noa", message="drop", attachments=[str(file)])
    keep, drop = sorted(inbox_ids(noa))
    (noa.box.folder("inbox") / ".tmp-999999999-abc-x.json").write_text("{half")
    (noa.box.folder("attachments") / drop).mkdir(exist_ok=True)  # as a crash could leave it
    call(noa, "delete", email_id=[drop])
    (noa.box.folder("attachments") / drop).mkdir()
    assert footprint(noa.box)["removable"]["count"] == 2
    report = clean(noa.box)
    assert report["removed"] == 2
    assert inbox_ids(noa) == [keep]
    assert (noa.box.folder("attachments") / keep).is_dir()


# -- failures a delivery meets, and several callers at once -------------------------------------


def test_an_attachment_removed_before_a_delayed_delivery_bounces_naming_it(
    world: MailWorld, tmp_path: Path
) -> None:
    report = tmp_path / "report.pdf"
    report.write_bytes(b"%PDF-1.7")
    triage = world.box("triage")
    noa = world.box("ops/noa", "operator")
    world.network.set_presence(noa.box, True)
    call(triage, "send", address="ops/noa", message="see file", attachments=[str(report)], delay=60)
    report.unlink()
    world.clock.advance(seconds=61)
    assert deliver_due(world.network) == 0
    world.network.beat(triage.box, "t")
    [bounce] = call(triage, "check").events
    assert "report.pdf" in bounce["reason"] and str(tmp_path) not in bounce["reason"]
    assert list(triage.box.folder("outbox").glob("*.json")) == []
    assert list(triage.box.folder("claimed").iterdir()) == []


def test_a_heartbeat_without_a_timezone_or_from_the_future_counts_as_stale(
    world: MailWorld,
) -> None:
    triage = world.box("triage")
    helper = world.box("helper")
    (helper.box.root / "heartbeat.json").write_text('{"at": "2026-11-30T09:00:00"}')
    [naive] = call(triage, "send", address="helper", message="a").events
    assert "heartbeat" in naive["reason"]
    (helper.box.root / "heartbeat.json").write_text('{"at": "2027-01-01T00:00:00+00:00"}')
    [future] = call(triage, "send", address="helper", message="b").events
    assert "heartbeat" in future["reason"]


def test_one_tool_called_from_many_threads_delivers_each_message_once(world: MailWorld) -> None:
    triage = world.box("triage")
    noa = world.box("ops/noa", "operator")

    def sender(n: int) -> None:
        for k in range(25):
            call(triage, "send", address="ops/noa", message=f"thread {n} message {k}")
            call(triage, "check")

    with ThreadPoolExecutor(max_workers=8) as pool:
        list(pool.map(sender, range(8)))
    bodies = [m.message for m in (noa.folders.load("inbox", i) for i in inbox_all(noa)) if m]
    assert sorted(bodies) == sorted(f"thread {n} message {k}" for n in range(8) for k in range(25))


def inbox_all(mail: Any) -> list[str]:
    return mail.folders.ids("inbox")


def test_a_subscription_copies_only_the_senders_it_names(world: MailWorld) -> None:
    world.configure(pseudo_agent_subscriptions=[{"subscriber": "audit", "senders": ["billing"]}])
    audit = world.box("audit", "pseudo", alive=False)
    world.box("ops/noa", "operator")
    call(world.box("triage"), "send", address="ops/noa", message="not copied")
    call(world.box("billing"), "send", address="ops/noa", message="copied")
    assert [e["preview"] for e in call(audit, "check").payload["emails"]] == ["copied"]


def test_edit_contact_needs_a_name_or_a_note(world: MailWorld) -> None:
    noa = world.box("ops/noa", "operator")
    call(noa, "add_contact", address="triage", name="Triage")
    raw = {"action": "edit_contact", "input": {"address": "triage"}, "reasoning": "r"}
    assert refused(noa, raw).code == "INVALID_INPUT"


def test_only_the_body_limit_is_fixed_among_the_settings(world: MailWorld) -> None:
    rows = call(world.box("triage"), "settings").payload["settings"]
    assert [r["configurable"] for r in rows] == [False, True, True, True, True]
    world.configure(settings={"send.body_char_limit": 10})
    raw = {"action": "settings", "input": {}, "reasoning": "r"}
    error = refused(world.box("triage"), raw)
    assert error.code == "SETTINGS_UNAVAILABLE" and "send.body_char_limit" in str(error)


def test_an_address_reaching_into_a_mailbox_store_is_refused(world: MailWorld) -> None:
    triage = world.box("triage")
    raw = {
        "action": "send",
        "input": {"address": "ops/mailbox/inbox", "message": "x"},
        "reasoning": "r",
    }
    assert refused(triage, raw).code == "INVALID_INPUT"


def test_the_spill_file_goes_once_the_unread_mail_fits_the_lane(world: MailWorld) -> None:
    world.configure(settings={"unread.max_entries": 1})
    triage = world.box("triage")
    noa = world.box("ops/noa", "operator")
    call(triage, "send", address="ops/noa", message="one")
    call(triage, "send", address="ops/noa", message="two")
    spill = Path(lane(call(noa, "check"))["overflow"]["spill"])
    assert spill.is_file()
    call(noa, "dismiss", email_id=inbox_ids(noa)[:1])
    assert not spill.exists()


def test_a_refused_input_creates_no_mailbox(tmp_path: Path) -> None:
    world = MailWorld(tmp_path / "fresh")
    mail = InternalMail(world.network, Identity("newcomer"))
    raw = {"action": "send", "input": {"address": "a@b.test", "message": "x"}, "reasoning": "r"}
    assert refused(mail, raw).code == "INVALID_INPUT"
    assert not world.data_dir.exists()
