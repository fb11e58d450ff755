"""The workstation's internal mail network: a folder (``<data dir>/mail``) holding one
folder per mailbox, addressed by its path below the network folder.

A mailbox folder holds ``agent.json`` (its metadata: kind, name, nickname), ``heartbeat.json``
(kept fresh by the session that acts as the mailbox), for an operator ``presence.json``, the
store ``mailbox/`` and the notification mirror ``.notification/email.json``.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from functools import cached_property
from pathlib import Path
from typing import Any, cast

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from agent.domain.internal_mail import (
    HEARTBEAT_FRESH_SECONDS,
    Kind,
    MailError,
    Mode,
    NetworkConfig,
    checked_address,
)
from agent.ports import Clock
from agent.storage import mailfiles

CONFIG_FILE = "network.json"
FOLDERS = ("inbox", "archive", "sent", "outbox", "read", "deleted", "events", "attachments")


class MailboxMeta(BaseModel):
    """What a mailbox is: valid metadata is a condition of receiving mail."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    kind: Kind
    name: str = Field(min_length=1, max_length=200)
    nickname: str = Field(default="", max_length=200)


def _meta_of(data: Any) -> MailboxMeta | None:
    try:
        return MailboxMeta.model_validate(data) if data is not None else None
    except ValidationError:
        return None


def _stamp_of(key: str) -> Callable[[Any], datetime | None]:
    def parse(data: Any) -> datetime | None:
        value = cast(Any, data.get(key) if isinstance(data, dict) else None)  # pyright: ignore[reportUnknownMemberType]
        try:
            moment = datetime.fromisoformat(value) if isinstance(value, str) else None
        except ValueError:
            return None
        return moment if moment is not None and moment.tzinfo is not None else None

    return parse


_HEARTBEAT_AT = _stamp_of("at")
_PRESENT_SINCE = _stamp_of("since")


@dataclass(frozen=True)
class MailboxDir:
    """One mailbox's folder and what is in it."""

    address: str
    """How this network addresses it: its path below the network (or, outside, absolute)."""
    root: Path
    _folders: dict[str, Path] = field(
        default_factory=dict[str, Path], compare=False, repr=False, hash=False
    )
    _names: dict[str, str] = field(
        default_factory=dict[str, str], compare=False, repr=False, hash=False
    )

    @cached_property
    def store(self) -> Path:
        return self.root / "mailbox"

    def folder(self, name: str) -> Path:
        """A folder of the store (``claimed`` is the outbox's entries being delivered)."""
        found = self._folders.get(name)
        if found is None:
            where = self.store / "outbox" / "claimed" if name == "claimed" else self.store / name
            found = self._folders[name] = where
        return found

    def name_in(self, folder: str, name: str) -> str:
        """The path of file ``name`` in a folder of the store, as a string (see
        ``mailfiles.Where``)."""
        key = f"{folder}/"
        found = self._names.get(key)
        if found is None:
            found = self._names[key] = f"{os.fspath(self.folder(folder))}/"
        return found + name

    def file(self, name: str) -> Path:
        """A file of the mailbox folder itself (agent.json, heartbeat.json, ...)."""
        key = f"/{name}"
        found = self._folders.get(key)
        if found is None:
            found = self._folders[key] = self.root / name
        return found

    @cached_property
    def notifications(self) -> Path:
        return self.root / ".notification"

    def meta(self) -> MailboxMeta | None:
        try:
            return cast(MailboxMeta | None, mailfiles.parsed(self.file("agent.json"), _meta_of))
        except (ValueError, OSError):
            return None

    def exists(self) -> bool:
        return (self.file("agent.json")).is_file()


class MailNetwork:
    """The network folder, its configuration and the mailboxes in it."""

    def __init__(self, root: Path, clock: Clock) -> None:
        self.root = root
        self.clock = clock
        self._boxes: dict[tuple[str, Mode], MailboxDir] = {}
        self._config_file = root / CONFIG_FILE

    @classmethod
    def of_data_dir(cls, data_dir: Path, clock: Clock) -> MailNetwork:
        return cls(data_dir / "mail", clock)

    def config(self) -> NetworkConfig:
        """The applied configuration, or SETTINGS_UNAVAILABLE when it cannot be known."""
        try:
            return cast(NetworkConfig, mailfiles.parsed(self._config_file, _config_of))
        except (ValueError, ValidationError, OSError) as exc:
            raise MailError(
                "SETTINGS_UNAVAILABLE",
                f"the internal mail settings cannot be read ({_problem(exc)}): an operator "
                f"fixes {CONFIG_FILE} in the mail folder; nothing was done",
            ) from None

    def box(self, address: str, mode: Mode = "peer") -> MailboxDir:
        """The mailbox at ``address`` (kept: its paths are built once)."""
        found = self._boxes.get((address, mode))
        if found is None:
            checked = checked_address(address, mode)
            root = Path(checked) if mode == "abs" else self.root / checked
            found = MailboxDir(checked, root)
            if len(self._boxes) < 10_000:
                self._boxes[(address, mode)] = found
        return found

    def authorized(self, box: MailboxDir, config: NetworkConfig) -> bool:
        """An absolute target must be listed; a peer is inside the network by construction."""
        if not box.address.startswith("/"):
            return True
        return any(Path(t).resolve() == box.root.resolve() for t in config.abs_targets)

    def register(self, address: str, kind: Kind, name: str, nickname: str = "") -> MailboxDir:
        box = self.box(address)
        meta = MailboxMeta(kind=kind, name=name, nickname=nickname)
        for folder in FOLDERS:
            box.folder(folder).mkdir(parents=True, exist_ok=True)
        (box.folder("outbox") / "claimed").mkdir(exist_ok=True)
        (box.folder("events") / "seen").mkdir(exist_ok=True)
        box.notifications.mkdir(exist_ok=True)
        mailfiles.write_atomic(box.file("agent.json"), mailfiles.dump(meta.model_dump()))
        return box

    def beat(self, box: MailboxDir, session: str) -> None:
        """The session acting as this mailbox is alive now."""
        stamp = {"at": self.clock.now().isoformat(), "pid": os.getpid(), "session": session}
        mailfiles.write_atomic(box.file("heartbeat.json"), mailfiles.dump(stamp))

    def end_session(self, box: MailboxDir) -> None:
        heartbeat: Any = mailfiles.read_json(box.file("heartbeat.json"))
        if isinstance(heartbeat, dict) and heartbeat.get("pid") == os.getpid():  # pyright: ignore[reportUnknownMemberType]
            mailfiles.unlink_quietly(box.file("heartbeat.json"))

    def set_presence(self, box: MailboxDir, reachable: bool) -> None:
        if reachable:
            stamp = {"reachable": True, "since": self.clock.now().isoformat()}
            mailfiles.write_atomic(box.file("presence.json"), mailfiles.dump(stamp))
        else:
            mailfiles.unlink_quietly(box.file("presence.json"))

    def unreachable_reason(self, box: MailboxDir) -> str | None:
        """Why ``box`` cannot receive mail now, or None when it can."""
        meta = box.meta()
        if meta is None:
            return (
                "no mailbox there (no valid agent metadata)"
                if not box.exists()
                else "its agent metadata is not valid"
            )
        if meta.kind == "pseudo":
            return "it is a read-only subscriber: it receives only its subscriptions"
        if meta.kind == "operator" and self._present(box):
            return None
        if not self._fresh(box):
            return (
                "its heartbeat is stale or missing: no session of it is running. Try again "
                "once it runs, or reach whoever acts for it (say in that mail why)"
            )
        return None

    def _fresh(self, box: MailboxDir) -> bool:
        """A heartbeat at most HEARTBEAT_FRESH_SECONDS old (one from further in the future
        than that, a clock gone wrong, counts as stale too)."""
        at = _stamp(box.file("heartbeat.json"), _HEARTBEAT_AT)
        limit = timedelta(seconds=HEARTBEAT_FRESH_SECONDS)
        return at is not None and abs(self.clock.now() - at) <= limit

    def _present(self, box: MailboxDir) -> bool:
        return _stamp(box.file("presence.json"), _PRESENT_SINCE) is not None

    def mailboxes(self) -> list[MailboxDir]:
        """Every mailbox of the network (folders holding agent.json)."""
        found: list[MailboxDir] = []
        self._walk(self.root, found)
        return found

    def _walk(self, folder: Path, found: list[MailboxDir]) -> None:
        try:
            entries = [e for e in os.scandir(folder) if e.is_dir() and e.name[0] != "."]
        except FileNotFoundError:
            return
        for entry in entries:
            if entry.name == "mailbox":
                continue
            path = Path(entry.path)
            if (path / "agent.json").is_file():
                found.append(MailboxDir(path.relative_to(self.root).as_posix(), path))
            self._walk(path, found)


def _stamp(path: Path, parse: Callable[[Any], datetime | None]) -> datetime | None:
    try:
        return cast(datetime | None, mailfiles.parsed(path, parse))
    except (ValueError, OSError):
        return None


def _problem(exc: Exception) -> str:
    if isinstance(exc, ValidationError):
        error = exc.errors()[0]
        where = ".".join(str(p) for p in error["loc"]) or "the file"
        return f"{where}: {error['msg']}"
    return f"{type(exc).__name__}: {exc}" if isinstance(exc, ValueError) else type(exc).__name__


def _config_of(data: Any) -> NetworkConfig:
    return NetworkConfig.model_validate(data if data is not None else {})
