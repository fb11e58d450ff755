"""Decisions as structured log records: one record per decision that changes state or refuses.

Every record goes through ``emit``, on the standard ``logging`` logger ``outloop.<event>``.
It carries the event's name and named fields in ``record.outloop`` (a ``Fields`` mapping),
and its message is those fields written out (``claim outcome=CLAIMED workspace_id=...``), so
a record holds no text but its fields. A field is an id (workspace, task, run, send key,
item reference, mailbox address), a code the core decided (an outcome, a state, a blocker, a
channel) or a number. ``emit`` refuses any other name: a subject, a body, a display name or a
secret has no field to travel in. The command line formats the records (text or JSON lines);
the metrics layer counts them.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from enum import StrEnum
from typing import Final

ROOT = "outloop"
"""The loggers' common parent: a handler here sees every decision record."""


class Event(StrEnum):
    SCAN = "scan"
    """A mailbox was read for a run: ``scanned`` items."""
    CLAIM = "claim"
    """An occurrence's claim: ``outcome``, ``duration_seconds``."""
    DISPOSITION = "disposition"
    """A scanned item's disposition in its run."""
    RECONCILIATION = "reconciliation"
    """A run reconciled: scanned = terminal + non_terminal + claim_race, ``clean``."""
    GATE = "gate"
    """The send gate's verdict on a draft: ``verdict``, ``blockers``."""
    SEND = "send"
    """A send's state changed (``state``), through ``channel``; ``duration_seconds``."""
    READ_BACK = "read_back"
    """A sent copy was read back: ``result`` passed or failed, ``checks_failed``."""
    ACCESS = "access"
    """A channel of a mailbox was tried: ``outcome`` (used, refused, skipped), ``reason``."""
    LOGIN = "login"
    """Managed login of a mailbox: ``outcome`` (signed_in, challenge, failed), ``reason``."""
    LEASE = "lease"
    """A dispatcher's lease: ``role`` (active: taken, standby: held by another, stopped)."""
    TASK = "task"
    """A task moved to ``state``."""


Field = str | int | float | bool | None
Fields = Mapping[str, Field]

FIELDS: Final = frozenset(
    {
        # ids
        "workspace_id",
        "task_id",
        "run_id",
        "send_key",
        "item_ref",
        "mailbox_id",
        "provider",
        "channel",
        "holder",
        # codes the core decided
        "outcome",
        "state",
        "disposition",
        "verdict",
        "blockers",
        "reason",
        "result",
        "checks_failed",
        "role",
        "next_channel",
        "clean",
        # figures
        "duration_seconds",
        "scanned",
        "terminal",
        "non_terminal",
        "claim_race",
        "reconciliation_failed",
        "checks",
    }
)
"""Every field a record may carry."""

_LOGGERS: Final = {event: logging.getLogger(f"{ROOT}.{event.value}") for event in Event}


class Line:
    """A record's message: its event and fields, written out when a handler formats it."""

    __slots__ = ("event", "fields")

    def __init__(self, event: Event, fields: Fields) -> None:
        self.event = event
        self.fields = fields

    def __str__(self) -> str:
        shown = " ".join(f"{k}={v}" for k, v in self.fields.items() if v is not None)
        return f"{self.event.value} {shown}" if shown else self.event.value


class UnknownField(ValueError):
    """A record was given a field outside ``FIELDS``."""


def emit(event: Event, /, *, level: int = logging.INFO, **fields: Field) -> None:
    """Record the decision ``event`` with its ``fields`` (cheap when nobody listens)."""
    logger = _LOGGERS[event]
    if not logger.isEnabledFor(level):
        return
    if not FIELDS.issuperset(fields):
        unknown = sorted(fields.keys() - FIELDS)
        raise UnknownField(f"{event.value} records carry no {', '.join(unknown)}")
    # Made here, without the caller's frame looked up: a record's place is its event.
    record = logging.LogRecord(logger.name, level, "", 0, Line(event, fields), (), None)
    record.outloop = fields
    record.outloop_event = event.value
    logger.handle(record)


def of(record: logging.LogRecord) -> tuple[str, Fields] | None:
    """The event and fields of a decision record; None for any other record."""
    held = record.__dict__
    event, fields = held.get("outloop_event"), held.get("outloop")
    if isinstance(event, str) and isinstance(fields, dict):
        return event, fields  # pyright: ignore[reportUnknownVariableType]
    return None


def codes(values: Iterable[str]) -> str:
    """Codes as one field: sorted, comma separated (``""``: none)."""
    return ",".join(sorted(values))
