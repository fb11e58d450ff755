"""Holder liveness: provably dead only on this host, in this PID namespace."""

from __future__ import annotations

import socket
import subprocess
import sys

from agent.services.holder import _pid_namespace, current_holder, holder_alive


def _holder_of(proc: subprocess.Popen[str]) -> str:
    assert proc.stdout is not None
    return proc.stdout.readline().strip()


def test_a_running_process_is_alive_and_a_finished_one_is_dead() -> None:
    proc = subprocess.Popen(
        [sys.executable, "-c", "from agent.services.holder import current_holder as h;"
         " print(h(), flush=True); import sys; sys.stdin.read()"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    holder = _holder_of(proc)
    assert holder_alive(holder)
    proc.communicate(timeout=30)  # closes stdin; the child exits and is reaped
    assert not holder_alive(holder)


def test_a_reused_pid_is_not_the_same_holder() -> None:
    host, ns, pid, ticks, nonce = current_holder().split("/")
    assert holder_alive(current_holder())
    assert not holder_alive(f"{host}/{ns}/{pid}/{int(ticks) + 1}/{nonce}")


def test_holders_elsewhere_count_as_alive_and_leave_it_to_the_lease() -> None:
    assert holder_alive(f"another-host.test/{_pid_namespace()}/1/1/x")
    assert holder_alive(f"{socket.gethostname()}/other-pid-namespace/999999999/1/x")
    assert holder_alive("not a holder id")
