"""Claim holder identity and liveness.

A holder is ``host/pid-namespace/pid/start-ticks/nonce``. On the same host and in the same
PID namespace a holder is dead as soon as its process is gone (or its pid now belongs to
another process, or it is a zombie); anywhere else liveness cannot be seen, so the lease on
the execution record decides.
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
    # Fields after the parenthesised command name: state is the first, starttime the 20th.
    fields = stat.rsplit(")", 1)[-1].split()
    if not fields or fields[0] in {"Z", "X"}:  # a zombie or dead process holds nothing
        return None
    return fields[19] if len(fields) > 19 else None


@cache
def _pid_namespace() -> str:
    """This process's PID namespace, or "unseen" when /proc shows another namespace's
    numbering (then no holder here can be proven dead, and only leases decide)."""
    try:
        if Path("/proc/self").readlink().name != str(os.getpid()):
            return "unseen"
        return str(Path("/proc/self/ns/pid").stat().st_ino)
    except OSError:
        return "unseen"


@cache
def current_holder() -> str:
    pid = os.getpid()
    return (
        f"{socket.gethostname()}/{_pid_namespace()}/{pid}/{_start_ticks(pid) or '0'}/"
        f"{uuid.uuid4().hex[:8]}"
    )


def holder_alive(holder: str) -> bool:
    """False only when the holder is provably dead; a holder we cannot see counts as alive."""
    parts = holder.split("/")
    namespace = _pid_namespace()
    if (
        len(parts) != 5
        or parts[0] != socket.gethostname()
        or parts[1] != namespace
        or namespace == "unseen"
    ):
        return True
    if holder == current_holder():
        return True
    try:
        pid = int(parts[2])
    except ValueError:
        return True
    ticks = _start_ticks(pid)
    if ticks is None:
        return not Path("/proc").is_dir()  # no /proc: cannot tell, rely on the lease
    return ticks == parts[3]


def holder_where(holder: str) -> str:
    """Where a holder runs, as an operator finds it: ``host pid N``."""
    parts = holder.split("/")
    return f"{parts[0]} pid {parts[2]}" if len(parts) >= 3 else holder
