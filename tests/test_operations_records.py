"""Decision records and the metrics they move: a record carries only allowed fields, its
JSON line is one object, the text and JSON forms go to stderr from the level asked for, the
counting handler moves the conventional Prometheus metrics, and the session's leak watch
fails a session whose records hold text from mail."""

from __future__ import annotations

import io
import json
import logging
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from agent import events
from agent.events import Event, UnknownField, emit
from mcp_server.observability import logs, metrics

ROOT = Path(__file__).resolve().parents[1]


class Kept(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@pytest.fixture
def kept() -> Iterator[Kept]:
    handler = Kept()
    logger = logging.getLogger(events.ROOT)
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    yield handler
    logger.removeHandler(handler)
    logger.setLevel(level)


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of an exposition, parsed by the Prometheus client's own parser."""
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def test_a_record_carries_its_event_and_fields_and_says_them_in_its_message(kept: Kept) -> None:
    emit(Event.CLAIM, workspace_id="ws-1", run_id="run-1", outcome="CLAIMED", task_id=None)
    [record] = kept.records
    assert record.name == "outloop.claim"
    assert events.of(record) == ("claim", {"workspace_id": "ws-1", "run_id": "run-1",
                                           "outcome": "CLAIMED", "task_id": None})  # fmt: skip
    assert record.getMessage() == "claim workspace_id=ws-1 run_id=run-1 outcome=CLAIMED"


def test_a_field_outside_the_allowed_ones_is_refused_before_anything_is_logged(
    kept: Kept,
) -> None:
    with pytest.raises(UnknownField, match="subject"):
        emit(Event.SEND, workspace_id="ws-1", subject="Quote for Q4")  # type: ignore[arg-type]
    assert kept.records == []
    assert "subject" not in events.FIELDS and "body" not in events.FIELDS


def test_nothing_is_made_when_no_one_listens_at_that_level() -> None:
    logger = logging.getLogger(events.ROOT)
    level = logger.level
    logger.setLevel(logging.WARNING)
    try:
        # An unknown field would raise if the record were made: none is.
        emit(Event.CLAIM, level=logging.INFO, nonsense="x")  # type: ignore[arg-type]
    finally:
        logger.setLevel(level)


def test_json_lines_are_one_object_per_record_with_the_fields_at_top_level() -> None:
    record = logging.LogRecord("outloop.send", logging.WARNING, __file__, 1, "x", None, None)
    record.outloop_event = "send"
    record.outloop = {"send_key": "k-1", "state": "UNCERTAIN", "channel": "api", "task_id": None}
    line = logs.JsonLines().format(record)
    assert "\n" not in line
    parsed = json.loads(line)
    assert parsed["event"] == "send" and parsed["level"] == "warning"
    assert parsed["send_key"] == "k-1" and parsed["state"] == "UNCERTAIN"
    assert "task_id" not in parsed  # a field with no value is left out
    assert parsed["logger"] == "outloop.send" and parsed["ts"].endswith("Z")


def test_configured_logging_writes_the_chosen_form_from_the_chosen_level(kept: Kept) -> None:
    for form in logs.FORMATS:
        out = io.StringIO()
        logs.configure(form, "warning", out)
        emit(Event.CLAIM, workspace_id="ws-1", outcome="CLAIMED")
        emit(Event.READ_BACK, level=logging.WARNING, workspace_id="ws-1", result="failed")
        lines = out.getvalue().splitlines()
        assert len(lines) == 1, lines
        if form == "json":
            assert json.loads(lines[0])["result"] == "failed"
        else:
            assert (
                "WARNING outloop.read_back: read_back workspace_id=ws-1 result=failed" in lines[0]
            )
    logs.configure("text", "warning")  # stderr again


def test_configuring_never_makes_a_logger_quieter_than_it_was() -> None:
    logger = logging.getLogger(events.ROOT)
    level = logger.level
    logger.setLevel(logging.DEBUG)
    try:
        logs.configure("text", "error", io.StringIO())
        assert logger.level == logging.DEBUG
    finally:
        logger.setLevel(level)
        logs.configure("text", "warning")


def test_decision_records_move_the_conventional_metrics(kept: Kept) -> None:
    metrics.count_decisions()  # once per process (the session's leak watch started it)
    before = samples(metrics.exposition().decode())
    emit(Event.SCAN, workspace_id="ws-m", channel="api", scanned=3)
    emit(Event.CLAIM, workspace_id="ws-m", outcome="CLAIMED", duration_seconds=0.02)
    emit(Event.CLAIM, workspace_id="ws-m", outcome="EXECUTION_ALREADY_DONE",
         duration_seconds=0.001)  # fmt: skip
    emit(Event.SEND, workspace_id="ws-m", state="CONFIRMED", channel="api",
         duration_seconds=0.3)  # fmt: skip
    emit(Event.RECONCILIATION, workspace_id="ws-m", clean=False)
    emit(Event.ACCESS, channel="browser", outcome="fallback", reason="from_api")
    after = samples(metrics.exposition().decode())

    def moved(name: str, **labels: str) -> float:
        key = (name, tuple(sorted(labels.items())))
        return after.get(key, 0.0) - before.get(key, 0.0)

    assert moved("outloop_items_scanned_total", workspace="ws-m", channel="api") == 3
    assert moved("outloop_claims_total", workspace="ws-m", outcome="CLAIMED") == 1
    assert moved("outloop_claims_total", workspace="ws-m", outcome="EXECUTION_ALREADY_DONE") == 1
    assert moved("outloop_claim_duration_seconds_count") == 2
    assert moved("outloop_claim_duration_seconds_bucket", le="0.025") == 2
    assert moved("outloop_sends_total", workspace="ws-m", state="CONFIRMED", channel="api") == 1
    assert moved("outloop_send_duration_seconds_count", channel="api") == 1
    assert moved("outloop_reconciliation_failures_total", workspace="ws-m") == 1
    assert moved("outloop_access_fallbacks_total", channel="browser") == 1


LEAKY = """
    import logging

    from agent.events import Event, emit


    def test_a_clean_record():
        emit(Event.CLAIM, workspace_id="ws-1", outcome="CLAIMED")


    def test_a_subject_slipped_into_a_record():
        logging.getLogger("outloop.send").info(
            "send", extra={"outloop_event": "send", "outloop": {"subject": "Your Q4 quote"}}
        )


    def test_a_forbidden_text_in_a_code():
        from tests.leak_canary import forbid
        forbid("mallory@evil.test")
        emit(Event.ACCESS, channel="api", outcome="refused", reason="to_mallory@evil.test")
"""


def test_the_session_leak_watch_fails_a_session_whose_records_hold_mail_text(
    tmp_path: Path,
) -> None:
    (tmp_path / "pytest.ini").write_text("[pytest]\n", encoding="utf-8")
    (tmp_path / "test_inner.py").write_text(textwrap.dedent(LEAKY), encoding="utf-8")
    command = [sys.executable, "-m", "pytest", "-p", "tests.leak_canary", "-p", "no:cacheprovider",
               f"--basetemp={tmp_path / 'basetemp'}", "-c", "pytest.ini", "test_inner.py"]  # fmt: skip
    done = subprocess.run(
        command, capture_output=True, text=True, cwd=tmp_path, timeout=120, check=False,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )  # fmt: skip
    assert done.returncode == 1, done.stdout + done.stderr
    section = done.stdout[done.stdout.index("= leak canary =") :]
    assert "fields outside agent.events.FIELDS ['subject']" in section
    assert "test_a_subject_slipped_into_a_record" in section
    assert "holds the forbidden text 'mallory@evil.test'" in section
    assert "test_a_clean_record" not in section


def test_a_counter_that_fails_never_reaches_the_decision_it_counts(
    kept: Kept, monkeypatch: pytest.MonkeyPatch
) -> None:
    metrics.count_decisions()

    def broken(m: metrics.Meters, f: metrics.Fields) -> None:
        raise OSError("the shared metrics directory is full")

    monkeypatch.setitem(metrics.COUNT, Event.CLAIM, broken)
    monkeypatch.setattr(logging, "raiseExceptions", False)  # as in production
    emit(Event.CLAIM, workspace_id="ws-1", outcome="CLAIMED")  # the claim goes on
    assert [r.name for r in kept.records] == ["outloop.claim"]  # and is still logged
