"""The file operations internal mail is built from: the lock held open between uses."""

from __future__ import annotations

import multiprocessing
from pathlib import Path

from agent.storage.mailfiles import HeldLock
from tests.conftest import wait_for


def _append(path: Path, line: str) -> None:
    with path.open("a") as handle:
        handle.write(line + "\n")


def _child_takes_the_lock(lock: HeldLock, log: Path) -> None:
    _append(log, "child waits")
    with lock.hold():
        _append(log, "child holds")


def test_a_forked_process_waits_for_a_lock_its_parent_holds_open(tmp_path: Path) -> None:
    lock, log = HeldLock(tmp_path / ".guard"), tmp_path / "log"
    with lock.hold():  # the descriptor the child inherits is the one holding the lock
        child = multiprocessing.get_context("fork").Process(
            target=_child_takes_the_lock, args=(lock, log)
        )
        child.start()
        wait_for(lambda: log.exists() and "child waits" in log.read_text(), "the child to start")
        _append(log, "parent lets go")
    child.join(timeout=30)
    assert child.exitcode == 0
    assert log.read_text().splitlines() == ["child waits", "parent lets go", "child holds"]
