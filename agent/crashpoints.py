"""Named crash points for the crash tests.

Production code calls ``hit(name)`` at the points where a worker may die. Nothing happens
unless the entry point armed that point (the CLI reads ``OUTLOOP_CRASHPOINT=name:skip`` in
test runs only); then the process kills itself with SIGKILL after ``skip`` passes.
"""

from __future__ import annotations

import os
import signal

POINTS = (
    # inside the claim transaction, task written, not committed (PostgreSQL's one-statement
    # claim: just before the statement, which writes and commits together)
    "after_task_write",
    "after_claim_txn",  # claim and task committed, nothing reported
    "before_report",  # work done, report not yet written
    "after_report",  # report committed, the run continues
    "mid_reconcile",  # inside the reconcile transaction, not committed
    "before_provider_send",  # the send is ledgered as an intent, the provider not asked
    "after_provider_send",  # the provider took the message, the ledger not yet updated
)
MAIL_POINTS = (
    "mail_mid_write",  # half of an internal mail file's bytes written, not yet named
    "mail_after_sender_state",  # an internal mail's sent copy and outbox written, not delivered
)
#: The points every intake run passes (the sending points are hit only when mail is sent).
INTAKE_POINTS = POINTS[:5]

_armed: dict[str, int] = {}


def arm(name: str, skip: int = 0) -> None:
    """Kill this process with SIGKILL the (skip+1)-th time ``name`` is hit."""
    if name not in POINTS + MAIL_POINTS:
        known = ", ".join(POINTS + MAIL_POINTS)
        raise ValueError(f"unknown crash point {name!r}; known: {known}")
    _armed[name] = skip


def arm_from_spec(spec: str) -> None:
    """Arm from ``name`` or ``name:skip`` (the value of OUTLOOP_CRASHPOINT)."""
    name, _, skip = spec.partition(":")
    arm(name.strip(), int(skip) if skip else 0)


def armed(name: str) -> bool:
    return name in _armed


def hit(name: str) -> None:
    remaining = _armed.get(name)
    if remaining is None:
        return
    if remaining > 0:
        _armed[name] = remaining - 1
        return
    os.kill(os.getpid(), signal.SIGKILL)
