"""The file operations internal mail is built from. Every file is written whole or not at
all: its bytes go to a hidden temporary file in the same folder, are flushed to the disk
(fsync), and only then get their name (rename, or a hard link when the name must be new).
A reader never sees a partial file; a crash leaves at most a hidden temporary file, which
the footprint procedure removes.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import secrets
import threading
import time
import weakref
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeAlias

from agent import crashpoints

TMP_PREFIX = ".tmp-"

Where: TypeAlias = str | os.PathLike[str]
"""A file's path: a send's own files are named by plain strings (a ``Path`` per name costs
more than the system call that uses it)."""


def _tmp_for(path: Path) -> Path:
    return path.parent / f"{TMP_PREFIX}{os.getpid()}-{secrets.token_hex(6)}-{path.name}"


def write_tmp(path: Path, data: bytes) -> Path:
    """A hidden temporary file beside ``path`` holding ``data``, flushed to disk: the caller
    names it (rename or link) and removes it."""
    tmp = _tmp_for(path)
    write_new(tmp, data)
    return tmp


def write_new(path: Where, data: bytes) -> None:
    """Create ``path`` (it must not exist) with ``data``, flushed to disk. Until this
    returns the file may be partial: only a name no reader trusts may be written so."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        view = memoryview(data)
        if crashpoints.armed("mail_mid_write"):
            view = view[os.write(fd, data[: len(data) // 2]) :]
            crashpoints.hit("mail_mid_write")
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(path: Path, data: bytes) -> None:
    """Write ``path`` whole (replacing any earlier version)."""
    tmp = write_tmp(path, data)
    tmp.replace(path)


def create_atomic(path: Path, data: bytes) -> bool:
    """Create ``path`` whole, only if no file has that name; False when one had."""
    tmp = write_tmp(path, data)
    try:
        return link_new(tmp, path)
    finally:
        tmp.unlink()


def link_new(source: Where, name: Where) -> bool:
    """Give ``source`` the new name ``name`` too; False when ``name`` exists already."""
    try:
        os.link(source, name)
    except FileExistsError:
        return False
    return True


def touch_new(path: Path) -> bool:
    """Create an empty marker file; False when it exists already."""
    try:
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
    except FileExistsError:
        return False
    return True


def rename(source: Where, name: Where) -> None:
    """Give ``source`` the name ``name`` (replacing a file of that name)."""
    os.rename(source, name)  # noqa: PTH104 - a string path (see Where)


def read_json(path: Path) -> Any:
    """The file's JSON, or None when there is no such file."""
    try:
        with path.open("rb") as handle:
            return json.loads(handle.read())
    except FileNotFoundError:
        return None


_PARSED: dict[tuple[str, int], tuple[tuple[int, int, int, int], Any]] = {}


def parsed(path: Path, parse: Callable[[Any], Any]) -> Any:
    """``parse`` of the file's JSON (None when there is no file), kept while the file is the
    same: a file is only ever replaced whole, so a new version has a new inode or time."""
    try:
        info = path.stat()
        signature = (info.st_ino, info.st_mtime_ns, info.st_size, info.st_ctime_ns)
    except FileNotFoundError:
        signature = (0, 0, 0, 0)
    key = (str(path), id(parse))
    hit = _PARSED.get(key)
    if hit is not None and hit[0] == signature:
        return hit[1]
    value = parse(read_json(path) if signature[0] else None)
    if len(_PARSED) > 4096:
        _PARSED.clear()
    _PARSED[key] = (signature, value)
    return value


def dump(value: Any) -> bytes:
    return json.dumps(value, ensure_ascii=False, sort_keys=True, separators=(",", ":")).encode()


def _entries(folder: Path) -> Iterator[os.DirEntry[str]]:
    """What ``folder`` holds (nothing when there is no such folder)."""
    try:
        entries = os.scandir(folder)
    except FileNotFoundError:
        return
    with entries:
        yield from entries


def names(folder: Path, suffix: str = ".json") -> Iterator[str]:
    """The visible file names in ``folder`` ending in ``suffix``, without it."""
    for entry in _entries(folder):
        if entry.name.endswith(suffix) and not entry.name.startswith("."):
            yield entry.name[: len(entry.name) - len(suffix)]


def unlink_quietly(path: Where) -> bool:
    try:
        os.unlink(path)  # noqa: PTH108 - a string path (see Where)
    except FileNotFoundError:
        return False
    return True


@contextlib.contextmanager
def locked(path: Path) -> Generator[int]:
    """Hold an exclusive lock on ``path`` (created if missing) for the block; the block gets
    its descriptor, to keep a small state in the file itself (``rewrite``)."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield fd
    finally:
        os.close(fd)


class HeldLock:
    """An exclusive lock on a small file that stays open between uses (``locked`` opens and
    closes it every time): one per file in a process (``HeldLock.of``). Threads take turns on
    a mutex, processes on the file's lock. A file removed or moved aside while it was open is
    let go, and the file that has the name now is locked; a forked child opens its own (every
    copy of a descriptor shares one lock) and gets a mutex of its own."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._mutex = threading.Lock()
        self._fd: int | None = None
        _HELD.every.add(self)

    @classmethod
    def of(cls, path: Path) -> HeldLock:
        """The process's lock of ``path``."""
        with _HELD.mutex:
            found = _HELD.locks.get(str(path))
            if found is None:
                found = _HELD.locks[str(path)] = cls(path)
            return found

    @contextlib.contextmanager
    def hold(self) -> Generator[int]:
        """Hold the lock for the block; the block gets the descriptor (see ``rewrite``)."""
        with self._mutex:
            fd = self._locked()
            try:
                yield fd
            finally:
                fcntl.flock(fd, fcntl.LOCK_UN)

    def _locked(self) -> int:
        while True:
            fd = self._open()
            fcntl.flock(fd, fcntl.LOCK_EX)
            try:
                if self._named(fd):
                    return fd
            except BaseException:
                fcntl.flock(fd, fcntl.LOCK_UN)
                raise
            self.close()  # removed or moved aside: lock the file that has the name now

    def _named(self, fd: int) -> bool:
        """Whether the open file is still the one the path names."""
        held = os.fstat(fd)
        try:
            named = self.path.stat()
        except FileNotFoundError:
            return False
        return (held.st_dev, held.st_ino) == (named.st_dev, named.st_ino)

    def _open(self) -> int:
        if self._fd is None:
            self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        return self._fd

    def close(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)

    def after_fork(self) -> None:
        """In a forked child: its own mutex (the parent's may have been held by another
        thread), and its copy of the descriptor closed (the parent's stays open)."""
        self._mutex = threading.Lock()
        with contextlib.suppress(OSError):
            self.close()


@dataclass
class _Held:
    locks: dict[str, HeldLock] = field(default_factory=dict[str, HeldLock])
    """One lock per file, kept for the process's life."""
    every: weakref.WeakSet[HeldLock] = field(default_factory=weakref.WeakSet[HeldLock])
    """Every lock, to be made the child's own after a fork."""
    mutex: threading.Lock = field(default_factory=threading.Lock)


_HELD = _Held()


def _after_fork_in_child() -> None:
    _HELD.mutex = threading.Lock()
    for lock in list(_HELD.every):
        lock.after_fork()


os.register_at_fork(after_in_child=_after_fork_in_child)


SETTLED_NS = 3_000_000_000
"""How old a folder's last change must be before its time identifies its content: a file
system's clock ticks coarsely (up to two seconds on some), and a change within the tick of
the last one would keep the same time."""


def settled(folder: Path) -> tuple[int, int, int] | None:
    """The folder's identity and the time of its last change (an entry added, removed or
    renamed), when that change is SETTLED_NS old or more, so any later change shows as a new
    time; None when it is more recent (or there is no such folder): read the folder."""
    try:
        info = folder.stat()
    except FileNotFoundError:
        return None
    if time.time_ns() - info.st_mtime_ns < SETTLED_NS:
        return None
    return (info.st_ino, info.st_mtime_ns, info.st_ctime_ns)


def rewrite(fd: int, data: bytes) -> None:
    """Replace a locked file's small content (a state kept under its lock; give it a fixed
    length, so the file never needs truncating)."""
    os.pwrite(fd, data, 0)


def stale_temporaries(folder: Path) -> Iterator[Path]:
    """The temporary files a crashed writer left in ``folder``."""
    for entry in _entries(folder):
        if entry.name.startswith(TMP_PREFIX):
            pid = entry.name[len(TMP_PREFIX) :].split("-", 1)[0]
            if pid.isdigit() and not alive(int(pid)):
                yield Path(entry.path)


def alive(pid: int) -> bool:
    """Whether a process with this pid runs on this machine."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
