"""A ``bench claims`` worker that counts its decision records into this process's metrics,
as a server with ``--metrics-port`` does (``outloop bench claims --metrics-rounds``)."""

from __future__ import annotations

from bench import claims
from mcp_server.observability import metrics

if __name__ == "__main__":
    metrics.count_decisions()
    claims.main()
