"""Prometheus metrics: the decision records counted, and the station's state read from the
store when scraped.

Counters and histograms are fed by ``Counting``, a logging handler on the decision loggers
(``agent.events``): a metric moves exactly when a record is made, and carries only fields a
record may carry (ids and codes, never text from mail). Gauges are read from the store at
scrape time (``StationGauges``), so every process of a station shows the same figures.

Several processes on one host (a dispatcher per workspace, stdio servers a host starts)
share their counters when ``PROMETHEUS_MULTIPROC_DIR`` names a directory for them all before
they start: each process writes its values there, and any process serving ``/metrics`` shows
their sums (clear the directory when the station is restarted as a whole).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import cache
from typing import Any, Final

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest, values
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.registry import Collector

from agent import events
from agent.events import Event
from agent.services.status import WorkspaceStatus
from mcp_server.observability import multiprocess_dir

CONTENT_TYPE: Final = "text/plain; version=0.0.4; charset=utf-8"
LATENCY_BUCKETS: Final = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)

Fields = Mapping[str, events.Field]
UNCHANGED: Final = frozenset({"already_sent", "in_progress"})
"""Send outcomes that changed no send's state (not counted in ``outloop_sends_total``)."""


def _label(fields: Fields, name: str) -> str:
    value = fields.get(name)
    return "" if value is None else str(value)


_CHILDREN: dict[tuple[int, tuple[str, ...]], Any] = {}
"""Each metric's child per label values, looked up once (a record moves several)."""


def _child(metric: Counter | Histogram, *labels: str) -> Any:
    key = (id(metric), labels)
    child = _CHILDREN.get(key)
    if child is None:
        child = _CHILDREN[key] = metric.labels(*labels) if labels else metric
    return child


@dataclass(frozen=True)
class Meters:
    """Every counter and histogram of a process."""

    registry: CollectorRegistry
    items_scanned: Counter
    claims: Counter
    claim_seconds: Histogram
    dispositions: Counter
    reconciliations: Counter
    reconciliation_failures: Counter
    gate_checks: Counter
    sends: Counter
    send_seconds: Histogram
    read_backs: Counter
    read_back_seconds: Histogram
    access_steps: Counter
    access_fallbacks: Counter
    logins: Counter
    lease_changes: Counter
    task_transitions: Counter


COUNTERS: Final = {
    "items_scanned": (
        "outloop_items_scanned", "Mail items read for runs.", ("workspace", "channel"),
    ),
    "claims": ("outloop_claims", "Occurrence claims by outcome.", ("workspace", "outcome")),
    "dispositions": (
        "outloop_dispositions", "Scanned items' dispositions.", ("workspace", "disposition"),
    ),
    "reconciliations": (
        "outloop_reconciliations", "Runs reconciled, clean or not.", ("workspace", "clean"),
    ),
    "reconciliation_failures": (
        "outloop_reconciliation_failures",
        "Runs whose reconciliation failed (RECONCILIATION_FAILED).",
        ("workspace",),
    ),
    "gate_checks": ("outloop_gate_checks", "Send gate verdicts.", ("workspace", "verdict")),
    "sends": (
        "outloop_sends", "Sends whose state changed, by the state reached and channel.",
        ("workspace", "state", "channel"),
    ),
    "read_backs": ("outloop_read_backs", "Read-backs by result.", ("workspace", "result")),
    "access_steps": (
        "outloop_access_steps", "Channel steps: passed over, fallback, refused.",
        ("channel", "outcome"),
    ),
    "access_fallbacks": (
        "outloop_access_fallbacks", "Moves to another permitted channel.", ("channel",),
    ),
    "logins": ("outloop_logins", "Managed logins by outcome.", ("workspace", "outcome")),
    "lease_changes": (
        "outloop_dispatcher_lease_changes", "A dispatcher's role changes.", ("workspace", "role"),
    ),
    "task_transitions": (
        "outloop_task_transitions", "Tasks moved by a person or host.", ("workspace", "state"),
    ),
}  # fmt: skip
"""Each counter: its name (``_total`` is added), help and labels."""

HISTOGRAMS: Final = {
    "claim_seconds": (
        "outloop_claim_duration_seconds", "Time to claim an occurrence (and write its task).", (),
    ),
    "send_seconds": ("outloop_send_duration_seconds", "Time to send once.", ("channel",)),
    "read_back_seconds": (
        "outloop_read_back_duration_seconds", "Time to read a sent copy back.", (),
    ),
}  # fmt: skip


@cache
def meters() -> Meters:
    """This process's meters, made once (in the shared directory when one is set)."""
    registry = CollectorRegistry()
    own = None if multiprocess_dir() else registry
    if multiprocess_dir() and values.ValueClass is values.MutexValue:
        # The client chose its value class when it was imported, before this process was
        # given the directory (a worker forked from a parent that imported it): choose again.
        values.ValueClass = values.get_value_class()
    made: dict[str, Counter | Histogram] = {
        key: Counter(name, doc, list(labels), registry=own)
        for key, (name, doc, labels) in COUNTERS.items()
    }
    for key, (name, doc, labels) in HISTOGRAMS.items():
        made[key] = Histogram(name, doc, list(labels), registry=own, buckets=LATENCY_BUCKETS)
    return Meters(registry=registry, **made)  # pyright: ignore[reportArgumentType]


def _scan(m: Meters, f: Fields) -> None:
    _child(m.items_scanned, _label(f, "workspace_id"), _label(f, "channel")).inc(
        float(f.get("scanned") or 0)
    )


def _claim(m: Meters, f: Fields) -> None:
    _child(m.claims, _label(f, "workspace_id"), _label(f, "outcome")).inc()
    _observe(m.claim_seconds, f)


def _disposition(m: Meters, f: Fields) -> None:
    if f.get("disposition") is not None:  # else the item failed: a later run decides it
        _child(m.dispositions, _label(f, "workspace_id"), _label(f, "disposition")).inc()


def _reconciliation(m: Meters, f: Fields) -> None:
    ws, clean = _label(f, "workspace_id"), f.get("clean") is True
    _child(m.reconciliations, ws, "true" if clean else "false").inc()
    if not clean:
        _child(m.reconciliation_failures, ws).inc()


def _send(m: Meters, f: Fields) -> None:
    if f.get("outcome") in UNCHANGED:
        return  # found decided, or another worker's: no state changed here
    channel = _label(f, "channel")
    _child(m.sends, _label(f, "workspace_id"), _label(f, "state"), channel).inc()
    _observe(m.send_seconds, f, channel)


def _read_back(m: Meters, f: Fields) -> None:
    _child(m.read_backs, _label(f, "workspace_id"), _label(f, "result")).inc()
    _observe(m.read_back_seconds, f)


def _access(m: Meters, f: Fields) -> None:
    _child(m.access_steps, _label(f, "channel"), _label(f, "outcome")).inc()
    if f.get("outcome") == "fallback":
        _child(m.access_fallbacks, _label(f, "channel")).inc()


def _observe(histogram: Histogram, f: Fields, *labels: str) -> None:
    seconds = f.get("duration_seconds")
    if isinstance(seconds, float):
        _child(histogram, *labels).observe(seconds)


def _by(name: str, field: str) -> Callable[[Meters, Fields], None]:
    """A counter labelled by workspace and one field of the record."""

    def count(m: Meters, f: Fields) -> None:
        _child(getattr(m, name), _label(f, "workspace_id"), _label(f, field)).inc()

    return count


COUNT: Final[dict[str, Callable[[Meters, Fields], None]]] = {
    Event.SCAN: _scan,
    Event.CLAIM: _claim,
    Event.DISPOSITION: _disposition,
    Event.RECONCILIATION: _reconciliation,
    Event.GATE: _by("gate_checks", "verdict"),
    Event.SEND: _send,
    Event.READ_BACK: _read_back,
    Event.ACCESS: _access,
    Event.LOGIN: _by("logins", "outcome"),
    Event.LEASE: _by("lease_changes", "role"),
    Event.TASK: _by("task_transitions", "state"),
}
"""What each decision record moves."""


class Counting(logging.Handler):
    """Counts every decision record into this process's meters."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.meters = meters()

    def emit(self, record: logging.LogRecord) -> None:
        found = events.of(record)
        if found is not None:
            COUNT[found[0]](self.meters, found[1])

    def handle(self, record: logging.LogRecord) -> bool:
        # No lock: the metrics have their own, and a record holds nothing to format. A
        # failure to count never reaches the decision that was recorded.
        try:
            self.emit(record)
        except Exception:
            self.handleError(record)
        return True


def count_decisions() -> Counting:
    """Start counting this process's decision records (once; the handler is returned)."""
    logger = logging.getLogger(events.ROOT)
    for handler in logger.handlers:
        if isinstance(handler, Counting):
            return handler
    handler = Counting()
    logger.addHandler(handler)
    if logger.getEffectiveLevel() > logging.INFO:
        logger.setLevel(logging.INFO)
    return handler


# -- what the store says at scrape time --------------------------------------------------------


class StationGauges(Collector):
    """The station's gauges, read from the store when scraped (``read`` returns None when
    the store does not answer; ``outloop_store_up`` says so)."""

    def __init__(
        self,
        read: Callable[[], list[WorkspaceStatus] | None],
        roles: Callable[[], Mapping[str, str]] = dict,
    ) -> None:
        self._read = read
        self._roles = roles

    def collect(self) -> Iterable[Metric]:
        statuses = self._read()
        up = GaugeMetricFamily("outloop_store_up", "1 when the store answered this scrape.")
        up.add_metric([], 0.0 if statuses is None else 1.0)
        yield up
        yield from _dispatcher_roles(self._roles())
        if statuses is not None:
            yield from workspace_gauges(statuses, datetime.now(UTC))


def _dispatcher_roles(roles: Mapping[str, str]) -> Iterable[Metric]:
    if not roles:
        return
    family = GaugeMetricFamily(
        "outloop_dispatcher_role",
        "This dispatcher's role per workspace (1 for the role it has now).",
        labels=["workspace", "role"],
    )
    for workspace, role in sorted(roles.items()):
        family.add_metric([workspace, role], 1.0)
    yield family


def workspace_gauges(statuses: list[WorkspaceStatus], now: datetime) -> Iterable[Metric]:
    """The gauges of every workspace's status."""
    families = {
        "open": GaugeMetricFamily(
            "outloop_open_tasks", "Non-terminal tasks by state.", labels=["workspace", "state"]
        ),
        "unsettled": GaugeMetricFamily(
            "outloop_unsettled_sends",
            "Sends whose outcome is not known (UNCERTAIN) or waits on a person (WITH_PERSON).",
            labels=["workspace", "state"],
        ),
        "age": GaugeMetricFamily(
            "outloop_last_clean_run_age_seconds",
            "Seconds since the workspace's last clean run.",
            labels=["workspace"],
        ),
        "clean": GaugeMetricFamily(
            "outloop_last_clean_run_timestamp_seconds",
            "When the workspace's last clean run was reconciled (0: never).",
            labels=["workspace"],
        ),
        "missed": GaugeMetricFamily(
            "outloop_missed_scheduled_runs",
            "Scheduled runs since the last clean run that ended no clean run (15 min grace).",
            labels=["workspace"],
        ),
        "challenges": GaugeMetricFamily(
            "outloop_auth_challenges_unresolved",
            "Sign-in challenges (AUTH_CHALLENGE_UNRESOLVED) a person has not resolved.",
            labels=["workspace"],
        ),
    }
    for s in statuses:
        _add_workspace(families, s, now)
    return families.values()


def _add_workspace(
    families: dict[str, GaugeMetricFamily], s: WorkspaceStatus, now: datetime
) -> None:
    ws = s.workspace_id
    for state, count in sorted(s.open_tasks.items()):
        families["open"].add_metric([ws, state], float(count))
    for state in ("UNCERTAIN", "WITH_PERSON"):
        families["unsettled"].add_metric([ws, state], float(s.unsettled_sends.get(state, 0)))
    clean = s.last_clean_run_at
    families["clean"].add_metric([ws], clean.timestamp() if clean else 0.0)
    if clean is not None:
        families["age"].add_metric([ws], max(0.0, (now - clean).total_seconds()))
    if s.missed_runs is not None:
        families["missed"].add_metric([ws], float(s.missed_runs))
    families["challenges"].add_metric([ws], float(s.unresolved_challenges))


class _Own(Collector):
    def __init__(self, registry: CollectorRegistry) -> None:
        self._registry = registry

    def collect(self) -> Iterable[Metric]:
        return self._registry.collect()


def exposition(*extra: Collector) -> bytes:
    """The text ``/metrics`` answers: this process's counters (or, with a shared directory,
    every process's sums), then ``extra`` collectors."""
    registry = CollectorRegistry()
    shared = multiprocess_dir()
    if shared:
        MultiProcessCollector(registry, path=shared)
    else:
        registry.register(_Own(meters().registry))
    for collector in extra:
        registry.register(collector)
    return generate_latest(registry)
