"""Workspace Context text for tests: complete, with switches that turn parts of it off."""

from __future__ import annotations

import textwrap


def context_yaml(
    workspace_id: str = "ws-test-0001",
    *,
    mailbox: str = "support@fabrikam.test",
    provider: str = "memory",
    path: str | None = None,
    extra: str = "",
    kpis: bool = True,
    licence: str = "active",
    shared: bool = False,
    bind_to: tuple[str, ...] = (),
    mailbox_fields: str = "",
) -> str:
    """A complete Workspace Context; switches turn parts of it off for gap scenarios."""
    mailbox_line = f"{{mailbox_id: {mailbox}, provider: {provider}"
    if path:
        mailbox_line += f", path: {path}"
    if shared:
        mailbox_line += f", shared: true, bind_to: [{', '.join(bind_to)}]"
    if mailbox_fields:
        mailbox_line += f", {mailbox_fields}"
    mailbox_line += "}"
    text = f"""\
        workspace_id: {workspace_id}
        label: Test workspace {workspace_id}
        timezone: Asia/Jerusalem
        language: he
        calendar: {{weekend: [fri, sat], holidays: [2026-12-25]}}
        mailboxes:
          - {mailbox_line}
        contacts:
          - {{address: dana.levi@contoso.test, name: Dana Levi, side: client, verified_by: crm-record}}
          - {{address: noa.bar@fabrikam.test, name: Noa Bar, side: internal, roles: [approver, client_manager]}}
        approval: {{roles: [approver], standing: []}}
        default_cc: []
        escalation_contact: noa.bar@fabrikam.test
        unresolved_queue: unresolved
        receipt_ack: false
        reminder_business_days: 2
        grants: {{licence: {licence}, mailboxes: [{mailbox}]}}
        client_send_policy: draft_for_internal_approval
        classification: {{task_owner_evidence: false}}
        task_board: {{provider: embedded, project_id: contoso-support, intake_location_id: inbox}}
        attachments: {{accepted: [pdf, docx]}}
        """
    text = textwrap.dedent(text)
    if kpis:
        text += "kpis: {official: {first_response_hours: 8}}\n"
    return text + textwrap.dedent(extra)
