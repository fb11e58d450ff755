"""Noise signals come from normalized headers only; list mail from a known contact is not
silenced (a human decides)."""

from __future__ import annotations

import pytest

from agent.domain.envelope import Envelope
from agent.domain.noise import Noise, NoiseKind, noise
from agent.testing import make_envelope

MAILBOX = "support@fabrikam.test"
OWN = frozenset({MAILBOX, "ops@fabrikam.test"})
CLIENT = "dana.levi@contoso.test"


def message(
    *,
    sender: str = CLIENT,
    subject: str = "Quote request",
    auto_submitted: str | None = None,
    precedence: str | None = None,
    list_id: str | None = None,
    report_type: str | None = None,
    report_failed: bool = False,
) -> Envelope:
    envelope = make_envelope(
        mailbox_id=MAILBOX,
        message_no=1,
        thread_no=1,
        sender=sender,
        subject=subject,
        auto_submitted=auto_submitted,
    )
    return Envelope.model_validate(
        {
            **envelope.model_dump(),
            "precedence": precedence,
            "list_id": list_id,
            "report_type": report_type,
            "report_failed": report_failed,
        }
    )


def classify(envelope: Envelope, *, known_sender: bool = False) -> Noise | None:
    return noise(envelope, own_addresses=OWN, known_sender=known_sender)


def test_an_ordinary_message_is_not_noise() -> None:
    assert classify(message()) is None
    assert classify(message(), known_sender=True) is None
    assert classify(message(), known_sender=False) is None


def test_body_like_wording_in_the_subject_never_makes_noise() -> None:
    envelope = message(subject="Automatic reply: Out of office - undeliverable mailer-daemon")
    assert classify(envelope) is None


@pytest.mark.parametrize(
    "value", ["auto-generated", "Auto-Generated", " auto-generated ", "auto-notified"]
)
def test_auto_submitted_other_than_no_and_auto_replied_is_automated(value: str) -> None:
    found = classify(message(auto_submitted=value))
    assert found is not None
    assert found.kind is NoiseKind.AUTOMATED
    assert found.clear


@pytest.mark.parametrize("value", ["auto-replied", "Auto-Replied", "auto-replied; owner=noa"])
def test_auto_submitted_auto_replied_is_an_auto_reply(value: str) -> None:
    found = classify(message(auto_submitted=value))
    assert found is not None
    assert found.kind is NoiseKind.AUTO_REPLY
    assert found.clear


@pytest.mark.parametrize("value", ["no", "No", " no ", "no; comment"])
def test_auto_submitted_no_is_not_noise(value: str) -> None:
    assert classify(message(auto_submitted=value)) is None


def test_precedence_auto_reply_is_an_auto_reply() -> None:
    found = classify(message(precedence="auto_reply"))
    assert found is not None and found.kind is NoiseKind.AUTO_REPLY


@pytest.mark.parametrize("value", ["bulk", "list", "junk", "Bulk", " LIST "])
def test_precedence_bulk_list_or_junk_from_an_unknown_sender_is_clear_bulk(value: str) -> None:
    found = classify(message(precedence=value))
    assert found is not None
    assert found.kind is NoiseKind.BULK
    assert found.clear
    assert found.reason == f"list or bulk mail (Precedence: {value.strip().lower()})"


@pytest.mark.parametrize("value", ["bulk", "list", "junk"])
def test_precedence_bulk_from_a_known_contact_is_bulk_but_not_clear(value: str) -> None:
    found = classify(message(precedence=value), known_sender=True)
    assert found is not None
    assert found.kind is NoiseKind.BULK
    assert not found.clear
    assert "human" in found.reason


def test_a_list_id_from_an_unknown_sender_is_clear_bulk() -> None:
    found = classify(message(list_id="<news.contoso.test>"))
    assert found is not None
    assert found.kind is NoiseKind.BULK
    assert found.clear
    assert "List-Id" in found.reason


def test_a_list_id_from_a_known_contact_is_bulk_but_not_clear() -> None:
    found = classify(message(list_id="<news.contoso.test>"), known_sender=True)
    assert found is not None
    assert found.kind is NoiseKind.BULK
    assert not found.clear


def test_an_unrecognised_precedence_is_not_noise() -> None:
    assert classify(message(precedence="first-class")) is None


def test_a_failed_delivery_report_is_a_delivery_report() -> None:
    found = classify(message(report_type="delivery-status", report_failed=True), known_sender=True)
    assert found is not None
    assert found.kind is NoiseKind.DELIVERY_REPORT
    assert found.clear
    assert "delivery-status" in found.reason


@pytest.mark.parametrize("report_type", ["delivery-status", "disposition-notification"])
def test_a_report_of_no_failure_is_automated_noise_not_a_bounce(report_type: str) -> None:
    """A delayed or delivered status, or a read receipt, never escalates a task."""
    found = classify(message(report_type=report_type), known_sender=True)
    assert found is not None
    assert found.kind is NoiseKind.AUTOMATED and found.clear


@pytest.mark.parametrize(
    "sender", ["mailer-daemon@mx.contoso.test", "MAILER-DAEMON@fabrikam.test", "postmaster@x.test"]
)
def test_a_message_from_mailer_daemon_or_postmaster_is_a_delivery_report(sender: str) -> None:
    found = classify(message(sender=sender))
    assert found is not None
    assert found.kind is NoiseKind.DELIVERY_REPORT
    assert found.clear


def test_a_sender_that_merely_contains_postmaster_is_not_a_delivery_report() -> None:
    assert classify(message(sender="postmaster.jobs@contoso.test")) is None


@pytest.mark.parametrize("sender", [MAILBOX, "Ops@Fabrikam.test"])
def test_a_message_from_an_own_address_is_a_loop(sender: str) -> None:
    found = classify(message(sender=sender))
    assert found is not None
    assert found.kind is NoiseKind.LOOP
    assert found.clear


def test_an_own_address_at_the_same_domain_that_is_not_own_is_no_loop() -> None:
    assert classify(message(sender="noa.bar@fabrikam.test")) is None


def test_the_noise_reason_names_the_header_signal_and_a_persons_message_has_none() -> None:
    found = classify(message(auto_submitted="auto-replied"))
    assert found is not None and found.reason == "Auto-Submitted: auto-replied"
    assert classify(message(auto_submitted="no")) is None
