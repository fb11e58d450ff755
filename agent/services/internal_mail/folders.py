"""One mailbox's folders, read state, contacts, events and notifications.

Folders are directories of one JSON file per message (``inbox``, ``archive``, ``sent``);
read state is one empty marker file per read message (``read/<id>``); a deleted message
leaves a tombstone (``deleted/<id>``) so a delivery repeated after a crash never brings it
back. The notification mirror ``.notification/email.json`` is written whole by the owner's
own calls; it carries the unread ids, while the unread block of each tool result carries
the messages in full.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from agent.domain.internal_mail import (
    PREVIEW_CHARS,
    PRODUCER,
    Folder,
    MailError,
    StoredMail,
    checked_ids,
)
from agent.services.internal_mail.network import MailboxDir
from agent.storage import mailfiles

FOLDER_NAMES: tuple[Folder, ...] = ("inbox", "archive", "sent")
SPILL_FILE = "email.overflow.json"
MIRROR_FILE = "email.json"


class Folders:
    """What the owner of one mailbox can see and change in it."""

    def __init__(self, box: MailboxDir) -> None:
        self.box = box
        self._lane: tuple[tuple[object, ...], int, dict[str, Any]] | None = None
        """The lane last built: what its folders were, when (ns), and the lane."""
        self._no_events: tuple[tuple[int, int, int], int] | None = None
        """The events folder when it was last found empty, and when (ns)."""

    def ids(self, folder: Folder) -> list[str]:
        """The folder's message ids, newest first."""
        return sorted(mailfiles.names(self.box.folder(folder)), reverse=True)

    def path(self, folder: Folder, email_id: str) -> Path:
        return self.box.folder(folder) / f"{email_id}.json"

    def load(self, folder: Folder, email_id: str) -> StoredMail | None:
        try:
            return StoredMail.model_validate_json(self.path(folder, email_id).read_bytes())
        except FileNotFoundError:
            return None
        except (ValidationError, ValueError):
            return None  # not a message this tool wrote; listed by nothing

    def locate(self, ids: list[str], allowed: tuple[Folder, ...]) -> list[tuple[Folder, str]]:
        """Each id with the folder it is in, or NOT_FOUND for the first that is in none of
        ``allowed`` (so a call with one wrong id changes nothing)."""
        found: list[tuple[Folder, str]] = []
        for email_id in checked_ids(ids):
            folder: Folder | None = next(
                (f for f in allowed if self.path(f, email_id).exists()), None
            )
            if folder is None:
                where = " or ".join(allowed)
                raise MailError(
                    "NOT_FOUND",
                    f"no message {email_id!r} in {where}: pass ids "
                    "from your own check, read or notification",
                )
            found.append((folder, email_id))
        return found

    def mark_read(self, email_id: str) -> None:
        mailfiles.touch_new(self.box.folder("read") / email_id)

    def archive(self, email_id: str) -> None:
        try:
            self.path("inbox", email_id).rename(self.path("archive", email_id))
        except FileNotFoundError:
            raise MailError(
                "NOT_FOUND",
                f"message {email_id!r} left the inbox meanwhile "
                "(another call archived or deleted it): check again",
            ) from None

    def delete(self, folder: Folder, email_id: str) -> None:
        """Tombstone first, then the file: a repeated delivery finds the tombstone."""
        mailfiles.touch_new(self.box.folder("deleted") / email_id)
        mailfiles.unlink_quietly(self.path(folder, email_id))
        shutil.rmtree(self.box.folder("attachments") / email_id, ignore_errors=True)
        mailfiles.unlink_quietly(self.box.folder("read") / email_id)

    def read_ids(self) -> set[str]:
        """The inbox ids marked read."""
        return set(mailfiles.names(self.box.folder("read"), suffix=""))

    def unread_ids(self) -> list[str]:
        """Unread inbox ids, oldest first."""
        inbox = list(mailfiles.names(self.box.folder("inbox")))
        if not inbox:
            return []
        read = self.read_ids()
        return sorted(i for i in inbox if i not in read)

    # -- views ---------------------------------------------------------------------------

    def attachment_paths(self, email_id: str, mail: StoredMail) -> list[dict[str, Any]]:
        snapshot = self.box.folder("attachments") / email_id
        return [
            {"name": a.name, "size": a.size, "path": a.path or str(snapshot / a.name)}
            for a in mail.attachments
        ]

    def entry(
        self, folder: Folder, email_id: str, mail: StoredMail, *, unread: bool, full: bool
    ) -> dict[str, Any]:
        view: dict[str, Any] = {
            "email_id": email_id,
            "folder": folder,
            "from": mail.from_,
            "sender_name": mail.sender_name,
            "sender_nickname": mail.sender_nickname,
            "to": mail.to,
            "cc": mail.cc,
            "subject": mail.subject,
            "sent_at": mail.sent_at.isoformat(),
            "unread": unread,
            "mode": mail.mode,
        }
        if full:
            view["message"] = mail.message
            view["attachments"] = self.attachment_paths(email_id, mail)
        else:
            view["preview"] = mail.message[:PREVIEW_CHARS]
            view["attachments"] = len(mail.attachments)
        return view

    def listed(self, folders: tuple[Folder, ...]) -> Iterator[tuple[Folder, str, StoredMail]]:
        """Every message of these folders, newest first within each folder."""
        for folder in folders:
            for email_id in self.ids(folder):
                mail = self.load(folder, email_id)
                if mail is not None:
                    yield folder, email_id, mail

    # -- notifications -----------------------------------------------------------------------

    def unread_block(self, max_entries: int) -> dict[str, Any]:
        """The persistent unread lane: every unread message in full up to ``max_entries``
        (oldest first), the total always, and past the limit an overflow marker pointing to
        the spill file that holds them all. Built again unless the inbox and the read
        markers are what they were when it was last built (a message is never changed in
        place), and it did not overflow (its spill file is rewritten every time)."""
        now = time.time_ns()
        key = (
            mailfiles.settled(self.box.folder("inbox")),
            mailfiles.settled(self.box.folder("read")),
            max_entries,
        )
        lane = self._lane
        if lane is not None and lane[0] == key and now >= lane[1]:  # no clock step back
            return dict(lane[2])
        block = self._built_block(max_entries)
        kept = None not in key and "overflow" not in block
        self._lane = (key, now, block) if kept else None
        return dict(block)

    def _built_block(self, max_entries: int) -> dict[str, Any]:
        ids = self.unread_ids()
        entries = [e for e in self._full_entries(ids[:max_entries])]
        block: dict[str, Any] = {"total": len(ids), "entries": entries}
        spill = self.box.notifications / SPILL_FILE
        if len(ids) <= max_entries:
            mailfiles.unlink_quietly(spill)  # no unread body outlives its overflow
        else:
            every = {"producer": PRODUCER, "total": len(ids), "entries": self._full_entries(ids)}
            mailfiles.write_atomic(spill, mailfiles.dump(every))
            block["overflow"] = {
                "omitted": len(ids) - max_entries,
                "spill": str(spill),
                "hint": "the rest of the unread mail is in the spill file; or check, read "
                "and dismiss it (do not guess what it says)",
            }
        return block

    def _full_entries(self, ids: list[str]) -> list[dict[str, Any]]:
        entries: list[dict[str, Any]] = []
        for email_id in ids:
            mail = self.load("inbox", email_id)
            if mail is not None:
                entries.append(self.entry("inbox", email_id, mail, unread=True, full=True))
        return entries

    def refresh_mirror(self, now: str) -> None:
        """Rewrite the producer-owned mirror: the unread ids and their count."""
        ids = self.unread_ids()
        mirror = {"producer": PRODUCER, "updated_at": now, "unread": len(ids), "ids": ids}
        self.box.notifications.mkdir(exist_ok=True)
        mailfiles.write_atomic(self.box.notifications / MIRROR_FILE, mailfiles.dump(mirror))

    def take_events(self) -> list[dict[str, Any]]:
        """The events not shown yet (bounces), each shown once, oldest first. The folder is
        read only when it changed since it was last found empty."""
        events: list[dict[str, Any]] = []
        folder = self.box.folder("events")
        now = time.time_ns()
        signature = mailfiles.settled(folder)
        empty = self._no_events
        if empty is not None and signature == empty[0] and now >= empty[1]:  # as found empty
            return events
        names = sorted(mailfiles.names(folder))
        self._no_events = (signature, now) if signature is not None and not names else None
        for name in names:
            seen = folder / "seen" / f"{name}.json"
            try:
                (folder / f"{name}.json").rename(seen)  # taken by this call, or by another
            except FileNotFoundError:
                continue
            event = mailfiles.read_json(seen)
            if isinstance(event, dict):
                events.append(event)  # pyright: ignore[reportUnknownArgumentType]
        return events
