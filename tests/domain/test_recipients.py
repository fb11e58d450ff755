"""Recipient classification and recipient building (seed 000 sections 2 and 7).

A recipient's class comes only from the live Workspace Context (or, where the context permits
it, verified task/owner evidence). Domain resemblance and display names never classify;
conflicting evidence leaves the recipient unresolved.
"""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from agent.domain.context import WorkspaceContext, parse_context
from agent.domain.envelope import Address
from agent.domain.recipients import (
    Classified,
    Communication,
    OwnerEvidence,
    RecipientClass,
    RecipientPlan,
    build_recipients,
    classify_recipient,
)
from tests.conftest import context_yaml

CLIENT = "dana.levi@contoso.test"
INTERNAL = "noa.bar@fabrikam.test"
OWN_MAILBOX = "support@fabrikam.test"
STRANGER_AT_TEAM_DOMAIN = "someone@fabrikam.test"
STRANGER_AT_CLIENT_DOMAIN = "stranger@contoso.test"


def make_context(*extra_contacts: dict[str, Any], **changes: Any) -> WorkspaceContext:
    """The conftest context (Dana = client, Noa = internal approver and client manager, own
    mailbox support@fabrikam.test) with extra contacts appended and top-level keys replaced."""
    data: dict[str, Any] = yaml.safe_load(context_yaml())
    data["contacts"] = [*data["contacts"], *extra_contacts]
    data.update(changes)
    return parse_context(yaml.safe_dump(data, allow_unicode=True), "test context")


# -- classify_recipient: what classifies ----------------------------------------------------------


def test_a_client_contact_is_client_with_its_verified_by_evidence() -> None:
    result = classify_recipient(make_context(), CLIENT)
    assert result.recipient_class is RecipientClass.CLIENT
    assert result.conflict is None
    assert result.resolved and not result.internal
    assert any("verified_by=crm-record" in e for e in result.evidence)
    assert any("side=client" in e for e in result.evidence)


def test_an_internal_contact_is_internal() -> None:
    result = classify_recipient(make_context(), INTERNAL)
    assert result.recipient_class is RecipientClass.INTERNAL
    assert result.internal and result.resolved
    assert any("side=internal" in e for e in result.evidence)


def test_classification_ignores_case_and_surrounding_whitespace_of_the_address() -> None:
    result = classify_recipient(make_context(), "  Noa.Bar@Fabrikam.TEST ")
    assert result.address == INTERNAL
    assert result.recipient_class is RecipientClass.INTERNAL


def test_an_address_at_the_internal_teams_own_domain_that_is_not_a_contact_is_unknown() -> None:
    result = classify_recipient(make_context(), STRANGER_AT_TEAM_DOMAIN)
    assert result.recipient_class is RecipientClass.UNKNOWN
    assert not result.internal and not result.resolved
    # The team's own domain is known, so it is no lookalike either: nothing classifies it.
    assert result.flags == ()


def test_an_address_at_the_clients_domain_that_is_not_a_contact_is_unknown_not_client() -> None:
    result = classify_recipient(make_context(), STRANGER_AT_CLIENT_DOMAIN)
    assert result.recipient_class is RecipientClass.UNKNOWN


def test_a_display_name_never_classifies_a_recipient() -> None:
    context = make_context()
    posing = Address(address=STRANGER_AT_CLIENT_DOMAIN, name="Noa Bar")
    assert classify_recipient(context, posing.address).recipient_class is RecipientClass.UNKNOWN
    real = Address(address=INTERNAL, name="Dana Levi (client)")
    assert classify_recipient(context, real.address).recipient_class is RecipientClass.INTERNAL
    # A display name written where the address belongs is no address at all.
    named = classify_recipient(context, "Noa Bar")
    assert named.recipient_class is RecipientClass.UNKNOWN
    assert "malformed address" in named.flags


# -- classify_recipient: the context itself establishes an address as internal -------------------


def test_a_contact_without_side_listed_in_default_cc_is_internal() -> None:
    context = make_context({"address": "ops@fabrikam.test"}, default_cc=["ops@fabrikam.test"])
    result = classify_recipient(context, "ops@fabrikam.test")
    assert result.recipient_class is RecipientClass.INTERNAL
    assert result.internal
    assert any("default_cc" in e for e in result.evidence)


def test_a_contact_without_side_that_is_the_escalation_contact_is_internal() -> None:
    context = make_context(
        {"address": "lead@fabrikam.test"}, escalation_contact="lead@fabrikam.test"
    )
    result = classify_recipient(context, "lead@fabrikam.test")
    assert result.recipient_class is RecipientClass.INTERNAL
    assert result.internal
    assert any("escalation_contact" in e for e in result.evidence)


def test_a_contact_without_side_holding_an_approval_role_is_internal() -> None:
    context = make_context({"address": "boss@fabrikam.test", "roles": ["approver"]})
    result = classify_recipient(context, "boss@fabrikam.test")
    assert result.recipient_class is RecipientClass.INTERNAL
    assert result.internal
    assert any("approver" in e for e in result.evidence)


def test_a_contact_without_side_and_without_any_internal_role_is_unknown() -> None:
    context = make_context({"address": "maybe@fabrikam.test", "roles": ["reviewer"]})
    result = classify_recipient(context, "maybe@fabrikam.test")
    assert result.recipient_class is RecipientClass.UNKNOWN


def test_a_role_that_is_not_an_approval_role_of_this_context_does_not_classify() -> None:
    context = make_context(
        {"address": "boss@fabrikam.test", "roles": ["approver"]},
        approval={"roles": ["director"], "standing": []},
    )
    assert classify_recipient(context, "boss@fabrikam.test").recipient_class is (
        RecipientClass.UNKNOWN
    )


# -- classify_recipient: conflicting evidence stays unresolved -------------------------------------


def test_the_same_address_listed_as_both_internal_and_client_is_a_conflict() -> None:
    context = make_context({"address": "Dana.Levi@Contoso.test", "side": "internal"})
    result = classify_recipient(context, CLIENT)
    assert result.conflict is not None
    assert result.recipient_class is RecipientClass.UNKNOWN
    assert not result.resolved
    assert not result.internal


def test_a_client_contact_also_listed_in_default_cc_is_a_conflict() -> None:
    context = make_context(default_cc=[CLIENT])
    result = classify_recipient(context, CLIENT)
    assert result.conflict is not None and "default_cc" in result.conflict
    assert not result.resolved
    assert not result.internal


def test_a_client_contact_that_is_the_escalation_contact_is_a_conflict() -> None:
    context = make_context(escalation_contact=CLIENT)
    result = classify_recipient(context, CLIENT)
    assert result.conflict is not None
    assert not result.internal and not result.resolved


# -- classify_recipient: task/owner evidence only where the context permits it -------------------


def test_owner_evidence_classifies_internal_when_the_context_permits_it() -> None:
    context = make_context(classification={"task_owner_evidence": True})
    evidence = [OwnerEvidence(address="Owner@Fabrikam.test", evidence="task owner on the board")]
    result = classify_recipient(context, "owner@fabrikam.test", evidence)
    assert result.recipient_class is RecipientClass.INTERNAL
    assert result.internal
    assert any("task owner on the board" in e for e in result.evidence)


def test_owner_evidence_does_not_classify_when_the_context_does_not_permit_it() -> None:
    context = make_context(classification={"task_owner_evidence": False})
    evidence = [OwnerEvidence(address="owner@fabrikam.test", evidence="task owner on the board")]
    result = classify_recipient(context, "owner@fabrikam.test", evidence)
    assert result.recipient_class is RecipientClass.UNKNOWN
    assert not result.internal
    assert any("task_owner_evidence" in e for e in result.evidence)


def test_owner_evidence_for_another_address_does_not_classify() -> None:
    context = make_context(classification={"task_owner_evidence": True})
    evidence = [OwnerEvidence(address="owner@fabrikam.test", evidence="task owner")]
    result = classify_recipient(context, "other@fabrikam.test", evidence)
    assert result.recipient_class is RecipientClass.UNKNOWN


def test_owner_evidence_never_overrides_a_recorded_client_side() -> None:
    context = make_context(classification={"task_owner_evidence": True})
    evidence = [OwnerEvidence(address=CLIENT, evidence="task owner")]
    result = classify_recipient(context, CLIENT, evidence)
    assert result.recipient_class is RecipientClass.CLIENT
    assert not result.internal


# -- classify_recipient: malformed and lookalike addresses -----------------------------------------


@pytest.mark.parametrize(
    "address",
    [
        "noa.bar.fabrikam.test",  # no @
        "noa.bar@fabrikam.test\r\nBcc: x@evil.test",  # CRLF inside (header injection)
        "noa\r\n.bar@fabrikam.test",  # CRLF inside the local part
        "noa.bar@evil.test@fabrikam.test",  # two @
        "noa bar@fabrikam.test",  # space inside the local part
        "noa.bar@fabrikam .test",  # space inside the domain
        "Noa Bar <noa.bar@fabrikam.test>",  # a display name with the address
        "noa.bar@fabrikam.test, dana.levi@contoso.test",  # two addresses
        "",
    ],
)
def test_a_malformed_address_is_unknown_and_flagged_malformed(address: str) -> None:
    result = classify_recipient(make_context(), address)
    assert result.recipient_class is RecipientClass.UNKNOWN
    assert "malformed address" in result.flags
    assert not result.internal and not result.resolved


@pytest.mark.parametrize(
    "address",
    [
        "noa.bar@fabr1kam.test",  # digit one for i
        "noa.bar@fabrikarn.test",  # rn for m
        "noa.bar@fabirkam.test",  # one transposition
        "noa.bar@fabrikma.test",  # one transposition at the end
        "dana.levi@c0ntoso.test",  # digit zero for o, at the client's domain
    ],
)
def test_a_lookalike_of_a_known_domain_is_flagged_and_stays_unknown(address: str) -> None:
    result = classify_recipient(make_context(), address)
    assert result.recipient_class is RecipientClass.UNKNOWN
    assert not result.internal
    assert any("looks like" in f for f in result.flags), result.flags


def test_a_cyrillic_a_in_the_team_domain_is_flagged_as_a_lookalike_and_stays_unknown() -> None:
    address = "noa.bar@f\u0430brikam.test"  # CYRILLIC SMALL LETTER A
    result = classify_recipient(make_context(), address)
    assert result.recipient_class is RecipientClass.UNKNOWN
    assert not result.internal
    # The reader must be told what the address imitates, not only that it is odd.
    assert any("looks like fabrikam.test" in f for f in result.flags), result.flags


def test_a_lookalike_flag_names_the_domain_it_imitates() -> None:
    result = classify_recipient(make_context(), "noa.bar@fabr1kam.test")
    assert any("fabrikam.test" in f for f in result.flags)


def test_a_known_domain_is_never_flagged_as_a_lookalike() -> None:
    context = make_context()
    for address in (CLIENT, INTERNAL, STRANGER_AT_TEAM_DOMAIN, STRANGER_AT_CLIENT_DOMAIN):
        assert classify_recipient(context, address).flags == ()


# -- build_recipients ------------------------------------------------------------------------------


def _addresses(items: tuple[Classified, ...]) -> tuple[str, ...]:
    return tuple(r.address for r in items)


def test_to_and_cc_are_exactly_the_addresses_given() -> None:
    plan = build_recipients(make_context(), to=[CLIENT], cc=[INTERNAL], internal_only=False)
    assert plan.addresses() == ((CLIENT,), (INTERNAL,))
    assert plan.removed == ()
    assert plan.added_default_cc == ()


def test_recipients_are_deduplicated_case_insensitively_and_to_wins_over_cc() -> None:
    plan = build_recipients(
        make_context(),
        to=[CLIENT, "DANA.LEVI@contoso.test"],
        cc=["Dana.Levi@Contoso.Test", INTERNAL, "noa.BAR@fabrikam.test"],
        internal_only=False,
    )
    assert plan.addresses() == ((CLIENT,), (INTERNAL,))


def test_recipient_order_is_kept_as_given() -> None:
    plan = build_recipients(
        make_context(), to=[INTERNAL, CLIENT], cc=[STRANGER_AT_CLIENT_DOMAIN], internal_only=False
    )
    assert plan.addresses() == ((INTERNAL, CLIENT), (STRANGER_AT_CLIENT_DOMAIN,))


def test_internal_only_strips_client_unknown_and_conflicted_recipients_with_reasons() -> None:
    conflicted = "both@contoso.test"
    context = make_context(
        {"address": conflicted, "side": "client"}, {"address": conflicted, "side": "internal"}
    )
    plan = build_recipients(
        context,
        to=[INTERNAL, CLIENT],
        cc=[STRANGER_AT_TEAM_DOMAIN, conflicted],
        internal_only=True,
    )
    assert plan.addresses() == ((INTERNAL,), ())
    reasons = {r.address: r.reason for r in plan.removed}
    assert set(reasons) == {CLIENT, STRANGER_AT_TEAM_DOMAIN, conflicted}
    assert "client" in reasons[CLIENT]
    assert "unknown" in reasons[STRANGER_AT_TEAM_DOMAIN]
    assert "unresolved" in reasons[conflicted]
    assert plan.communication is Communication.INTERNAL


def test_internal_only_strips_a_client_contact_that_is_also_in_default_cc() -> None:
    context = make_context(default_cc=[CLIENT])
    plan = build_recipients(context, to=[INTERNAL], cc=[CLIENT], internal_only=True)
    assert plan.addresses() == ((INTERNAL,), ())
    assert CLIENT in {r.address for r in plan.removed}


def test_client_facing_communication_keeps_client_and_unknown_recipients() -> None:
    plan = build_recipients(
        make_context(), to=[CLIENT], cc=[STRANGER_AT_TEAM_DOMAIN], internal_only=False
    )
    assert plan.addresses() == ((CLIENT,), (STRANGER_AT_TEAM_DOMAIN,))
    assert plan.communication is Communication.CLIENT_FACING


def test_the_workspaces_own_mailbox_is_removed() -> None:
    plan = build_recipients(
        make_context(), to=["Support@Fabrikam.test", CLIENT], cc=[OWN_MAILBOX], internal_only=False
    )
    assert plan.addresses() == ((CLIENT,), ())
    assert [r.address for r in plan.removed] == [OWN_MAILBOX]
    assert "own mailbox" in plan.removed[0].reason


def test_the_workspaces_own_mailbox_is_not_added_even_when_listed_in_default_cc() -> None:
    context = make_context(default_cc=[OWN_MAILBOX])
    plan = build_recipients(context, to=[INTERNAL], internal_only=True)
    assert OWN_MAILBOX not in _addresses(plan.everyone)
    assert plan.added_default_cc == ()


def test_internal_default_ccs_are_added_to_cc() -> None:
    context = make_context(default_cc=["ops@fabrikam.test"])
    plan = build_recipients(context, to=[CLIENT], internal_only=False)
    assert plan.addresses() == ((CLIENT,), ("ops@fabrikam.test",))
    assert plan.added_default_cc == ("ops@fabrikam.test",)


def test_a_default_cc_already_given_is_not_added_twice() -> None:
    context = make_context(default_cc=[INTERNAL])
    plan = build_recipients(context, to=["NOA.BAR@fabrikam.test"], internal_only=True)
    assert plan.addresses() == ((INTERNAL,), ())
    assert plan.added_default_cc == ()


def test_a_default_cc_that_does_not_classify_internal_is_not_added() -> None:
    context = make_context(default_cc=[CLIENT, "not-an-address"])
    plan = build_recipients(context, to=[INTERNAL], internal_only=False)
    assert plan.addresses() == ((INTERNAL,), ())
    assert plan.added_default_cc == ()
    reasons = {r.address: r.reason for r in plan.removed}
    assert set(reasons) == {CLIENT, "not-an-address"}
    assert all("default_cc" in reason for reason in reasons.values())


def test_only_context_default_ccs_are_added_never_other_internal_contacts() -> None:
    # Noa is the escalation contact, an approver and the client manager: none of it adds her.
    plan = build_recipients(make_context(), to=[CLIENT], internal_only=False)
    assert plan.addresses() == ((CLIENT,), ())
    assert plan.added_default_cc == ()


def test_communication_is_internal_only_when_every_recipient_is_verified_internal() -> None:
    context = make_context(
        {"address": "ops@fabrikam.test"}, default_cc=["ops@fabrikam.test"]
    )  # internal by context, without a side
    all_internal = build_recipients(context, to=[INTERNAL], internal_only=False)
    assert _addresses(all_internal.everyone) == (INTERNAL, "ops@fabrikam.test")
    assert all_internal.communication is Communication.INTERNAL

    cases: list[RecipientPlan] = [
        build_recipients(context, to=[INTERNAL], cc=[CLIENT], internal_only=False),
        build_recipients(context, to=[INTERNAL], cc=[STRANGER_AT_TEAM_DOMAIN], internal_only=False),
        build_recipients(
            make_context(default_cc=[CLIENT]), to=[INTERNAL], cc=[CLIENT], internal_only=False
        ),
    ]
    for plan in cases:
        assert plan.communication is Communication.CLIENT_FACING, plan.addresses()


def test_a_plan_with_no_recipients_is_not_internal_communication() -> None:
    plan = build_recipients(make_context(), to=[CLIENT], internal_only=True)
    assert plan.everyone == ()
    assert plan.communication is Communication.CLIENT_FACING
