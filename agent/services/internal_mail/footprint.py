"""What a mailbox keeps on disk, and the one cleanup that needs no consent: removing what
is nobody's only copy (temporary files of crashed writers anywhere in the mailbox's folder,
and the attachment copies and read markers of messages that were deleted, the ones with a
tombstone). Mail itself goes only by ``delete``, one message at a time, by its owner: the
only copy of a decision is never removed in bulk."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

from agent.services.internal_mail.network import FOLDERS, MailboxDir
from agent.storage import mailfiles


def _size(folder: Path) -> tuple[int, int]:
    files = size = 0
    for base, _, names in os.walk(folder):
        for name in names:
            files += 1
            size += (Path(base) / name).stat().st_size
    return files, size


def footprint(box: MailboxDir) -> dict[str, Any]:
    """Files and bytes per folder, and what a cleanup would remove (a dry run)."""
    folders = {
        name: dict(zip(("files", "bytes"), _size(box.folder(name)), strict=True))
        for name in FOLDERS
    }
    return {"mailbox": box.address, "folders": folders, "removable": _removable_summary(box)}


def _removable(box: MailboxDir) -> list[Path]:
    found = [t for base, _, _ in os.walk(box.root) for t in mailfiles.stale_temporaries(Path(base))]
    deleted = set(mailfiles.names(box.folder("deleted"), suffix=""))
    for folder in (box.folder("attachments"), box.folder("read")):
        found += [folder / i for i in mailfiles.names(folder, suffix="") if i in deleted]
    return found


def _removable_summary(box: MailboxDir) -> dict[str, int]:
    return {"count": len(_removable(box))}


def clean(box: MailboxDir) -> dict[str, Any]:
    """Remove what ``footprint`` lists as removable; report what went."""
    removed = 0
    for path in _removable(box):
        if path.is_dir():
            shutil.rmtree(path, ignore_errors=True)
        else:
            mailfiles.unlink_quietly(path)
        removed += 1
    return {"mailbox": box.address, "removed": removed, **footprint(box)}
