"""What operators monitor a station with: log record formats, Prometheus metrics, and the
probe routes (``/metrics``, ``/healthz``, ``/readyz``)."""
