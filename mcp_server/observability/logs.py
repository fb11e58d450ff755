"""Where a command's log records go, and in which form: text lines or JSON lines on stderr
(stdout of a stdio server carries the protocol), and JSON lines appended to the file
``OUTLOOP_LOG_FILE`` names, when set."""

from __future__ import annotations

import json
import logging
import os
import sys
from datetime import UTC, datetime
from typing import Any, Final, TextIO

from agent import events

FORMATS: Final = ("text", "json")
LEVELS: Final = ("debug", "info", "warning", "error")
FORMAT_ENV: Final = "OUTLOOP_LOG_FORMAT"
LEVEL_ENV: Final = "OUTLOOP_LOG_LEVEL"
FILE_ENV: Final = "OUTLOOP_LOG_FILE"

_MARK: Final = "outloop_handler"


def _moment(record: logging.LogRecord) -> str:
    stamp = datetime.fromtimestamp(record.created, UTC)
    return stamp.isoformat(timespec="milliseconds").replace("+00:00", "Z")


class JsonLines(logging.Formatter):
    """One JSON object per record: ``ts``, ``level``, ``logger``, ``message`` and, for a
    decision record, ``event`` and its fields; an exception as its type only."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "ts": _moment(record),
            "level": record.levelname.lower(),
            "logger": record.name,
        }
        found = events.of(record)
        if found is not None:
            line["event"] = found[0]
            line.update({k: v for k, v in found[1].items() if v is not None})
        line["message"] = record.getMessage()
        if record.exc_info and record.exc_info[0] is not None:
            line["error"] = record.exc_info[0].__name__
        return json.dumps(line, ensure_ascii=False, default=str)


class TextLines(logging.Formatter):
    """``2026-12-05T09:00:00.000Z INFO outloop.claim: claim outcome=CLAIMED ...``."""

    def format(self, record: logging.LogRecord) -> str:
        text = f"{_moment(record)} {record.levelname} {record.name}: {record.getMessage()}"
        if record.exc_info and record.exc_info[0] is not None:
            text += f" ({record.exc_info[0].__name__})"
        return text


def _handler(handler: logging.Handler, formatter: logging.Formatter, level: int) -> logging.Handler:
    handler.setFormatter(formatter)
    handler.setLevel(level)
    setattr(handler, _MARK, True)
    return handler


class _Stderr:
    """stderr as it is when a record is written (a test runner may swap it meanwhile)."""

    def write(self, text: str) -> int:
        return sys.stderr.write(text)

    def flush(self) -> None:
        sys.stderr.flush()


def _decisions_or_warnings(record: logging.LogRecord) -> bool:
    return record.name.startswith(f"{events.ROOT}.") or record.levelno >= logging.WARNING


def _lower(logger: logging.Logger, level: int) -> None:
    """Let ``logger`` make records from ``level`` up (never fewer than it made)."""
    if logger.level == logging.NOTSET or logger.level > level:
        logger.setLevel(level)


def configure(
    form: str = "text",
    level: str = "info",
    stream: TextIO | None = None,
    *,
    decisions: bool = False,
) -> None:
    """Send this process's records to ``stream`` (stderr) as ``form`` from ``level`` up, and
    its decision records from INFO up (and every other from WARNING up) to the
    ``OUTLOOP_LOG_FILE`` file as JSON lines. ``decisions``: decision records are made
    whatever the level (the metrics count them)."""
    root = logging.getLogger()
    for old in [h for h in root.handlers if getattr(h, _MARK, False)]:
        root.removeHandler(old)
        old.close()
    threshold = logging.getLevelNamesMapping()[level.upper()]
    formatter = JsonLines() if form == "json" else TextLines()
    out: Any = stream if stream is not None else _Stderr()
    root.addHandler(_handler(logging.StreamHandler(out), formatter, threshold))
    path = os.environ.get(FILE_ENV, "").strip()
    if path:
        try:
            sink = logging.FileHandler(path, encoding="utf-8")
        except OSError as exc:
            logging.getLogger(__name__).warning(
                "%s=%s cannot be written (%s): records go to stderr only", FILE_ENV, path,
                exc.strerror,
            )  # fmt: skip
        else:
            sink.addFilter(_decisions_or_warnings)
            root.addHandler(_handler(sink, JsonLines(), min(threshold, logging.INFO)))
            threshold = min(threshold, logging.INFO)
    # Libraries speak from WARNING up; the decision loggers from the level asked for.
    _lower(root, max(threshold, logging.WARNING))
    _lower(logging.getLogger(events.ROOT), min(threshold, logging.INFO) if decisions else threshold)
