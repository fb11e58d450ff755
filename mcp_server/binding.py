"""Where a server may listen, and the error when it may not: shared by every server of the
station (the MCP server, the console, the probes) without loading any of them."""

from __future__ import annotations

import ipaddress

from agent.domain.errors import OutloopError

MIN_TOKEN_CHARS = 24


class ServeError(OutloopError):
    """A server refuses to start as configured."""


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False
