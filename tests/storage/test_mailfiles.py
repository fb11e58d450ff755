"""The file operations internal mail is built from: the lock held open between uses."""

from __future__ import annotations

import fcntl
import multiprocessing
import os
from pathlib import Path

import pytest

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
    fork = multiprocessing.get_context("fork")
    with lock.hold():  # the descriptor the child inherits is the one holding the lock
        child = fork.Process(target=_child_takes_the_lock, args=(lock, log), daemon=True)
        child.start()
        try:
            wait_for(lambda: log.exists() and "child waits" in log.read_text(), "the child")
            _append(log, "parent lets go")
        except BaseException:
            child.kill()
            raise
    child.join(timeout=30)
    child.kill()  # a child that never got the lock fails the test instead of hanging it
    assert child.exitcode == 0
    assert log.read_text().splitlines() == ["child waits", "parent lets go", "child holds"]


@pytest.mark.parametrize("how", ["removed", "moved aside"])
def test_a_held_lock_locks_the_file_that_has_its_name_now(tmp_path: Path, how: str) -> None:
    path = tmp_path / ".guard"
    lock = HeldLock(path)
    with lock.hold():
        pass
    if how == "removed":
        path.unlink()
    else:
        path.rename(tmp_path / ".guard.old")
    with HeldLock(path).hold():  # another process makes the new file first
        pass
    with lock.hold():
        fd = os.open(path, os.O_RDWR)  # another process's look at the file named .guard
        try:
            with pytest.raises(BlockingIOError):
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        finally:
            os.close(fd)
