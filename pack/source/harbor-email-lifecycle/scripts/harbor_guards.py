#!/usr/bin/env python3
"""harbor_guards: the lifecycle's internal guards, evaluated over verified evidence.

Usage: harbor_guards.py [EVIDENCE.json]  (or the evidence on stdin)

    {"context": "workspace-context.yaml",
     "requester": "an internal requester's address, or null",
     "requester_loop_closed": false,
     "closing": true,
     "attachments": ["report.pages"],
     "draft_text": "the reply about to go out",
     "other_contexts": ["another-workspace.yaml"]}

It answers with Harbor's own gate functions (``agent.domain.gates``): may the occurrence be
released (an internal requester hears back first, for partial results too), which
attachments need a clarification in an accepted format, and whether the draft carries
another workspace's data. It grants no authority, sends nothing and stores nothing.
Exit 0: nothing blocks; 3: something does (each reason listed); 2: unreadable evidence.
"""

from __future__ import annotations

import sys
from typing import Any

sys.dont_write_bytecode = True  # a helper stores nothing, not even compiled bytecode

from hb_evidence import HbEvidenceError, context_at, flag, run, strings  # noqa: E402

from agent.domain import gates  # noqa: E402


def hb_evaluate_guards(evidence: dict[str, Any]) -> tuple[dict[str, Any], bool]:
    """The guards' verdict on this evidence, and whether anything blocks."""
    context = context_at(evidence.get("context"))
    others = [context_at(p) for p in strings(evidence, "other_contexts")]
    requester = evidence.get("requester")
    if requester is not None and not isinstance(requester, str):
        raise HbEvidenceError("'requester' is an address or null")
    release = gates.requester_guard(
        requester, flag(evidence, "requester_loop_closed"), flag(evidence, "closing")
    )
    names = strings(evidence, "attachments")
    refused = gates.unaccepted_attachments(context, names)
    markers = gates.foreign_markers(context, others)
    foreign = gates.foreign_content(str(evidence.get("draft_text", "")), markers)
    verdict: dict[str, Any] = {
        "workspace_id": context.workspace_id,
        "release": {"allowed": release is None, "reason": release},
        "attachments": {
            "unaccepted": list(refused),
            "clarification": gates.clarification_request(context, names, refused)
            if refused
            else None,
        },
        "foreign_content": list(foreign),
        "authority": "none: this verdict grants nothing, sends nothing and stores nothing",
    }
    return verdict, release is not None or bool(refused) or bool(foreign)


if __name__ == "__main__":
    raise SystemExit(run(hb_evaluate_guards, sys.argv[1:]))
