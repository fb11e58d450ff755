"""What operators monitor a station with: log record formats, Prometheus metrics, and the
probe routes (``/metrics``, ``/healthz``, ``/readyz``)."""

import os

MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"
"""The directory a host's processes share their counters in (the Prometheus client's)."""


def multiprocess_dir() -> str | None:
    """The shared directory of a host's processes, when set."""
    return os.environ.get(MULTIPROC_ENV) or None
