from __future__ import annotations

import re
from datetime import date
from pathlib import Path

import pytest

from agent.domain.context import Side, parse_context, parse_station
from agent.domain.errors import ContextError
from tests.conftest import context_yaml

DOCS = Path(__file__).resolve().parents[2] / "docs" / "workspace-context.md"


def test_the_documented_full_example_is_a_valid_context() -> None:
    blocks = re.findall(r"```yaml\n(.*?)```", DOCS.read_text(encoding="utf-8"), re.S)
    context = parse_context(blocks[0], "docs example")
    assert context.workspace_id == "ws-2f6c1a9e"
    assert context.calendar.weekend == ("fri", "sat")
    assert context.mailboxes[1].shared and context.mailboxes[1].bind_to == (
        "contoso@fabrikam.test",
    )
    assert context.approval.standing[0].message_class == "delivery_confirmation"
    assert parse_station(blocks[1]).escalation_contact == "ops-lead@fabrikam.test"


def test_contacts_carry_side_roles_and_verification() -> None:
    context = parse_context(context_yaml())
    dana = context.contact("Dana.Levi@Contoso.test")
    assert dana is not None and dana.side is Side.CLIENT and dana.verified_by == "crm-record"
    noa = context.contact("noa.bar@fabrikam.test")
    assert noa is not None and noa.side is Side.INTERNAL and "approver" in noa.roles
    assert context.contact("stranger@contoso.test") is None


def test_the_working_calendar_knows_weekends_and_holidays() -> None:
    calendar = parse_context(context_yaml()).calendar
    assert not calendar.is_business_day(date(2026, 12, 4))  # a Friday
    assert not calendar.is_business_day(date(2026, 12, 25))  # a listed holiday
    assert calendar.is_business_day(date(2026, 12, 6))  # a Sunday


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("label: x\n", "workspace_id: Field required"),
        ("workspace_id: a b c\n", "workspace_id: Value error, workspace_id must be"),
        ("workspace_id: ws-1\ntimezone: Mars/Base\n", "unknown timezone 'Mars/Base'"),
        ("workspace_id: ws-1\nmailbox: []\n", "mailbox: Extra inputs are not permitted"),
        ("workspace_id: ws-1\ncalendar: {weekend: [funday]}\n", "unknown weekday 'fun'"),
        (
            "workspace_id: ws-1\nmailboxes: [{mailbox_id: a@b.test, provider: maildir}]\n",
            "provider maildir needs a path",
        ),
        ("workspace_id: [unclosed\n", "is not valid YAML"),
        ("- just\n- a list\n", "must be a YAML mapping"),
    ],
)
def test_an_invalid_context_is_refused_with_an_error_naming_the_key(
    text: str, message: str
) -> None:
    with pytest.raises(ContextError, match=re.escape(message)):
        parse_context(text, "ctx.yaml")


def test_missing_kpis_and_destinations_are_context_gaps_not_errors() -> None:
    context = parse_context("workspace_id: ws-thin\n")
    assert context.missing_for_intake() == (
        "kpis.official",
        "escalation_contact",
        "unresolved_queue",
        "approval.roles (no internal contact holds an approval role)",
    )
    assert parse_context(context_yaml()).missing_for_intake() == ()


def _with_channels(channels: str) -> str:
    return context_yaml(provider="google").replace(
        "provider: google}", f"provider: google, channels: {channels}}}"
    )


def test_a_mailboxs_channels_are_tried_in_the_canonical_order_and_a_list_out_of_it_is_refused() -> (
    None
):
    [binding] = parse_context(_with_channels("[api, provider_mcp, browser]")).mailboxes
    assert [c.value for c in binding.permitted_channels] == ["api", "provider_mcp", "browser"]
    assert not binding.reads_after_refusal  # only if separately authorized
    with pytest.raises(ContextError, match=r"canonical order .*list them as \[api, browser\]"):
        parse_context(_with_channels("[browser, api]"))
    with pytest.raises(ContextError, match="each channel may be listed once"):
        parse_context(_with_channels("[api, api]"))
    [default] = parse_context(context_yaml(provider="maildir", path="Maildir")).mailboxes
    assert [c.value for c in default.permitted_channels] == ["local"]


@pytest.mark.parametrize(
    "url",
    [
        "http://graph.example.com/v1.0",  # clear text off this machine
        "https://user:secret@graph.example.com/v1.0",  # a credential in the URL
        "https://graph.example.com/v1.0?token=abc",  # a query
    ],
)
def test_an_api_endpoint_is_refused_unless_a_plain_https_url_or_loopback(url: str) -> None:
    from agent.domain.context import ApiAccess  # noqa: PLC0415

    with pytest.raises(ValueError, match=r"plain URL|https"):
        ApiAccess(base_url=url)
    assert ApiAccess(base_url="http://127.0.0.1:8080/graph/v1.0").base_url is not None
