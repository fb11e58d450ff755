"""Claim holder identity and liveness.

A holder is ``host/pid/start-ticks/nonce``. On the same host a holder is dead as soon as its
process is gone (or its pid was reused by another process); on other hosts only the lease on
the execution record can tell, so it expires.
"""

from __future__ import annotations

import os
import socket
import uuid
from functools import cache
from pathlib import Path


def _start_ticks(pid: int) -> str | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # Field 22 (starttime) counted after the parenthesised command name.
    fields = stat.rsplit(")", 1)[-1].split()
    if not fields or fields[0] in {"Z", "X"}:  # a zombie or dead process holds nothing
        return None
    return fields[19] if len(fields) > 19 else None


@cache
def current_holder() -> str:
    pid = os.getpid()
    return f"{socket.gethostname()}/{pid}/{_start_ticks(pid) or '0'}/{uuid.uuid4().hex[:8]}"


def holder_alive(holder: str) -> bool:
    """False only when the holder is provably dead; unknown holders count as alive."""
    parts = holder.split("/")
    if len(parts) != 4 or parts[0] != socket.gethostname():
        return True
    try:
        pid = int(parts[1])
    except ValueError:
        return True
    if holder == current_holder():
        return True
    ticks = _start_ticks(pid)
    if ticks is None:
        return not Path("/proc").is_dir()  # no /proc: cannot tell, rely on the lease
    return ticks == parts[2]
