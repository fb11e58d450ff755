#!/usr/bin/env python3
"""harbor_recipient_check: check verified recipient evidence before a send.

Usage: harbor_recipient_check.py [EVIDENCE.json]  (or the evidence on stdin)

    {"context": "workspace-context.yaml",
     "to": ["client@example.com"],
     "cc": [],
     "internal_only": false,
     "owner_evidence": [{"address": "owner@example.org", "evidence": "the task's named owner"}],
     "other_contexts": ["another-workspace.yaml"]}

It builds To and Cc from exactly these addresses and classifies each one with Harbor's own
gate functions (``agent.domain.gates.check_recipients``): internal, client or unresolved,
with the evidence, what was removed and why, and every reason the send would be held. It
does not discover identities, grant authority or send.
Exit 0: the recipients pass; 3: they do not (each reason listed); 2: unreadable evidence.
"""

from __future__ import annotations

import sys
from typing import Any, cast

sys.dont_write_bytecode = True  # a helper stores nothing, not even compiled bytecode

from hb_evidence import HbEvidenceError, context_at, flag, run, strings  # noqa: E402

from agent.domain import gates  # noqa: E402
from agent.domain.recipients import OwnerEvidence  # noqa: E402


def owner_evidence(evidence: dict[str, Any]) -> list[OwnerEvidence]:
    raw: object = evidence.get("owner_evidence", [])
    if not isinstance(raw, list):
        raise HbEvidenceError("'owner_evidence' is a list of {address, evidence}")
    try:
        return [OwnerEvidence.model_validate(item) for item in cast("list[object]", raw)]
    except ValueError as exc:
        raise HbEvidenceError(
            f"'owner_evidence' is a list of {{address, evidence}}: {exc}"
        ) from None


def hb_evaluate_recipients(evidence: dict[str, Any]) -> tuple[dict[str, Any], bool]:
    """The recipient verdict on this evidence, and whether the send would be held."""
    context = context_at(evidence.get("context"))
    plan, reasons = gates.check_recipients(
        context,
        to=strings(evidence, "to"),
        cc=strings(evidence, "cc"),
        internal_only=flag(evidence, "internal_only"),
        owner_evidence=owner_evidence(evidence),
        others=[context_at(p) for p in strings(evidence, "other_contexts")],
    )
    verdict: dict[str, Any] = {
        "workspace_id": context.workspace_id,
        "communication": plan.communication.value,
        "to": [r.model_dump(mode="json") for r in plan.to],
        "cc": [r.model_dump(mode="json") for r in plan.cc],
        "removed": [r.model_dump(mode="json") for r in plan.removed],
        "added_default_cc": list(plan.added_default_cc),
        "passes": not reasons,
        "reasons": [r.model_dump(mode="json") for r in reasons],
        "authority": "none: this verdict grants nothing, sends nothing and stores nothing",
    }
    return verdict, bool(reasons)


if __name__ == "__main__":
    raise SystemExit(run(hb_evaluate_recipients, sys.argv[1:]))
