"""Identifiers copied from mail: only RFC 5322 msg-ids, and References built as section 3.6.4
says, bounded, keeping the thread's root."""

from __future__ import annotations

import pytest

from agent.domain.headers import MAX_MSG_ID, MAX_REFERENCES, msg_id, msg_ids, references_for


@pytest.mark.parametrize(
    "value",
    [
        "<a1.b2@contoso.test>",
        "<CAF=x+y_z@mail.gmail.com>",
        "<local@[192.0.2.1]>",
        "<" + "a" * (MAX_MSG_ID - 12) + "@contoso.t>",
    ],
)
def test_a_message_id_in_msg_id_form_is_kept(value: str) -> None:
    assert msg_id(value) == value


@pytest.mark.parametrize(
    "value",
    [
        "<=?utf-8?q?x=0D=0ABcc=3A_m=40evil.test?=@contoso.test>",  # an encoded word
        "<a b@contoso.test>",  # whitespace
        "<a\r\nBcc: m@evil.test@contoso.test>",
        "<a@b\u2028c>",
        "<a\x00@b>",
        "<no-at-sign>",
        "a@contoso.test",  # no angle brackets
        "<דנה@contoso.test>",  # not ASCII
        "<" + "a" * MAX_MSG_ID + "@contoso.test>",  # too long
    ],
)
def test_anything_else_is_left_out(value: str) -> None:
    assert msg_id(value) is None
    assert msg_ids(value) == ()


def test_a_list_of_ids_keeps_each_well_formed_one_once() -> None:
    assert msg_ids("<a@b><c@d> <a b@x> <a@b>") == ("<a@b>", "<c@d>")


def test_references_keep_the_parents_references_then_its_own_id() -> None:
    assert references_for("<p@x>", ("<root@x>", "<m@x>"), "<m@x>") == (
        "<root@x>",
        "<m@x>",
        "<p@x>",
    )


def test_references_fall_back_to_the_parents_in_reply_to() -> None:
    assert references_for("<p@x>", (), "<m@x>") == ("<m@x>", "<p@x>")


def test_references_drop_ids_not_in_msg_id_form() -> None:
    refs = ("<root@x>", "<=?utf-8?q?a=0D=0A?=@x>", "<m@x>")
    assert references_for("<p@x>", refs, None) == ("<root@x>", "<m@x>", "<p@x>")


def test_long_references_are_bounded_and_keep_the_root() -> None:
    refs = tuple(f"<m{i}@x>" for i in range(100))
    built = references_for("<p@x>", refs, None)
    assert len(built) == MAX_REFERENCES
    assert built[0] == "<m0@x>" and built[-1] == "<p@x>" and built[-2] == "<m99@x>"
