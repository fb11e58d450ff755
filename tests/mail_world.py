"""A mail network in a temporary folder, with a clock the test drives, and the helpers the
internal mail tests share (calls, file-system snapshots)."""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agent.domain.internal_mail import Kind, MailError
from agent.services.internal_mail import Identity, InternalMail, MailNetwork, MailResult
from agent.testing import FrozenClock


@dataclass
class MailWorld:
    data_dir: Path
    clock: FrozenClock = field(default_factory=FrozenClock)

    @property
    def network(self) -> MailNetwork:
        return MailNetwork.of_data_dir(self.data_dir, self.clock)

    def box(
        self,
        address: str,
        kind: Kind = "agent",
        name: str = "",
        nickname: str = "",
        *,
        alive: bool = True,
    ) -> InternalMail:
        """A mailbox acting as ``address`` (registered, with a fresh heartbeat if alive)."""
        mail = InternalMail(
            self.network, Identity(address, kind=kind, name=name, nickname=nickname)
        )
        if name or nickname or not mail.box.exists():
            self.network.register(address, kind, name or address, nickname)
        if alive:
            self.network.beat(mail.box, "test")
        return mail

    def configure(self, **config: Any) -> None:
        root = self.data_dir / "mail"
        root.mkdir(parents=True, exist_ok=True)
        (root / "network.json").write_text(json.dumps(config))


def call(
    mail: InternalMail, action: str, reasoning: str = "a test call", **fields: Any
) -> MailResult:
    return mail.call({"action": action, "input": fields, "reasoning": reasoning})


def refused(mail: InternalMail, raw: dict[str, Any]) -> MailError:
    try:
        mail.call(raw)
    except MailError as exc:
        return exc
    raise AssertionError(f"the call was not refused: {raw}")


def refused_call(mail: InternalMail, action: str, **fields: Any) -> str:
    """The code of the refusal a call with these input fields gets."""
    return refused(mail, {"action": action, "input": fields, "reasoning": "a test call"}).code


def lane(result: MailResult) -> dict[str, Any]:
    assert result.meta is not None
    return result.meta["agent_meta"]["notifications"]["persistent"]["email"]


def tree(root: Path) -> dict[str, tuple[int, int, str]]:
    """Every file and folder under ``root`` with its size, change time and link target: two
    equal trees mean nothing was written."""
    found: dict[str, tuple[int, int, str]] = {}
    if not root.exists():
        return found
    for base, dirs, files in os.walk(root):
        for name in dirs + files:
            path = Path(base) / name
            info = path.lstat()
            target = str(path.readlink()) if path.is_symlink() else ""
            found[str(path.relative_to(root))] = (info.st_size, info.st_mtime_ns, target)
    return found


def inbox_ids(mail: InternalMail) -> list[str]:
    return [e["email_id"] for e in call(mail, "check", n=100).payload["emails"]]


def settle(mail: InternalMail, seconds_ago: int) -> None:
    """Date the last change of every folder of the mailbox's store ``seconds_ago`` back, as
    if nothing had changed since (what a mailbox left alone for a while looks like)."""
    then = time.time_ns() - seconds_ago * 1_000_000_000
    for folder in [mail.box.store, *mail.box.store.rglob("*")]:
        if folder.is_dir():
            os.utime(folder, ns=(then, then))
