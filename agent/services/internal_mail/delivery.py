"""Posting and delivering internal mail.

A send writes the sender's side first: the message, whole and flushed, as one claimed
outbox entry per recipient (hard links of one file, named by when it is due and whom it is
for; a delayed send also links its sent copy now and leaves the entries in the outbox).
Only then is each recipient delivered, one at a time, and the message becomes the sent
copy. A delivered copy is named by an id computed from the message and the recipient, so a
delivery repeated after a crash finds its earlier copy (in the inbox, the archive, or
deleted) and does not make a second one.

An entry being delivered is claimed: it moves to ``outbox/claimed`` with the claiming
process's pid in its name. A claim whose process died goes back to the outbox, so a
delivery interrupted by a crash, and a delayed one whose sender is gone, are delivered by the
next courier pass (any later session of the network), once.
"""

from __future__ import annotations

import base64
import errno
import hashlib
import os
import secrets
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

from agent import crashpoints
from agent.domain.internal_mail import (
    EVENT_BOUNCE,
    AttachmentRef,
    MailError,
    Mode,
    NetworkConfig,
    StoredMail,
    local_id,
)
from agent.services.internal_mail.network import MailboxDir, MailNetwork
from agent.storage import mailfiles

STAMP = "%Y%m%dT%H%M%S%f"


@dataclass(frozen=True)
class Recipient:
    address: str
    mode: Mode
    subscription: bool = False

    def encoded(self) -> str:
        kind = "sub" if self.subscription else self.mode
        raw = f"{kind}:{self.address}".encode()
        return base64.urlsafe_b64encode(raw).decode().rstrip("=")

    @classmethod
    def decoded(cls, text: str) -> Recipient:
        raw = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4)).decode()
        kind, _, address = raw.partition(":")
        if kind == "sub":
            return cls(address, "peer", subscription=True)
        return cls(address, "abs" if kind == "abs" else "peer")


@dataclass(frozen=True)
class Entry:
    """One outbox entry: a message due for one recipient."""

    due: str
    sent_id: str
    recipient: Recipient

    @property
    def name(self) -> str:
        return f"{self.due}~{self.sent_id}~{self.recipient.encoded()}.json"

    @classmethod
    def parsed(cls, name: str) -> Entry | None:
        parts = name.removesuffix(".json").split("~")
        if len(parts) != 3:
            return None
        try:
            return cls(parts[0], parts[1], Recipient.decoded(parts[2]))
        except (ValueError, UnicodeDecodeError):
            return None


@dataclass(frozen=True)
class Outgoing:
    """A message the sender has written, ready to be posted."""

    record: StoredMail
    recipients: list[Recipient]
    snapshot: dict[str, Path]
    """Attachment name -> file, copied for every recipient but the sender."""


def stamp(moment: datetime) -> str:
    """A moment as outbox entries name it (UTC, so names sort by time)."""
    return moment.astimezone(UTC).strftime(STAMP)


def new_uid() -> str:
    return secrets.token_hex(16)


def post(
    network: MailNetwork, sender: MailboxDir, outgoing: Outgoing, config: NetworkConfig
) -> str:
    """Write the sender's side, then deliver what is due now. Returns the sent copy's id."""
    record = outgoing.record
    sent_id = local_id(record.sent_at, record.uid, f"sent:{sender.address}")
    sent = sender.name_in("sent", f"{sent_id}.json")
    due = stamp(record.deliver_at or record.sent_at)
    immediate = record.deliver_at is None
    entries = [Entry(due, sent_id, r) for r in outgoing.recipients]
    claims = [(e, _claim_path(sender, e)) for e in entries]
    first = claims[0][1]
    mailfiles.write_new(first, _bytes(record))  # the whole message, or a claim that won't parse
    for _, claim in claims[1:]:
        mailfiles.link_new(first, claim)  # every recipient's claim, written before any delivery
    if not immediate:  # the sent copy now; each entry waits in the outbox until it is due
        mailfiles.link_new(first, sent)
        for entry, claim in claims:
            mailfiles.rename(claim, sender.name_in("outbox", entry.name))
    crashpoints.hit("mail_after_sender_state")
    if immediate:
        for entry, claim in claims:
            deliver(network, config, sender, entry, claim, record)
        mailfiles.rename(first, sent)  # delivered to each (or bounced): now the sent copy
        for _, claim in claims[1:]:
            mailfiles.unlink_quietly(claim)
    return sent_id


def settle(owner: MailboxDir, entry: Entry, claim: str) -> None:
    """An entry delivered (or bounced) by a courier: its message is the sender's sent copy
    (kept if it was one already), and the entry goes."""
    mailfiles.link_new(claim, owner.name_in("sent", f"{entry.sent_id}.json"))
    mailfiles.unlink_quietly(claim)


def _claim_path(owner: MailboxDir, entry: Entry) -> str:
    return owner.name_in("claimed", f"{entry.name}.{os.getpid()}")


def _bytes(record: StoredMail) -> bytes:
    return record.model_dump_json(by_alias=True).encode()


def deliver(
    network: MailNetwork,
    config: NetworkConfig,
    owner: MailboxDir,
    entry: Entry,
    source: mailfiles.Where,
    fresh: StoredMail | None = None,
) -> bool:
    """Deliver one entry (``source`` holds the message; ``fresh``, the message itself when
    it was written just now, so no copy of it can exist yet). False when it bounced: a
    delivery that cannot be made is a bounce, never an error that leaves it hanging."""
    try:
        record = fresh or StoredMail.model_validate_json(Path(source).read_bytes())
    except (OSError, ValueError):
        return False  # not a message this tool wrote: nothing to deliver or bounce about
    try:
        return _deliver(network, config, owner, entry, source, record, fresh is not None)
    except OSError as exc:
        return _bounce(network, owner, entry, record, _unwritable(exc, record))


def _unwritable(exc: OSError, record: StoredMail) -> str:
    attached = {a.path: a.name for a in record.attachments if a.path}
    if str(exc.filename) in attached:
        return (
            f"the attachment {attached[str(exc.filename)]} could not be read when it was "
            "delivered (moved or removed since the send): send it again with the file"
        )
    return (
        f"it could not be written to its mailbox ({exc.strerror or type(exc).__name__}): "
        "an operator checks that mailbox's folder"
    )


def _deliver(
    network: MailNetwork,
    config: NetworkConfig,
    owner: MailboxDir,
    entry: Entry,
    source: mailfiles.Where,
    record: StoredMail,
    fresh: bool,
) -> bool:
    recipient = entry.recipient
    try:
        box = network.box(recipient.address, recipient.mode)
    except MailError as exc:
        return _bounce(network, owner, entry, record, str(exc))
    own = same_box(box, owner)
    reason = None if own else _refusal(network, config, box, recipient)
    if reason is not None:
        return _bounce(network, owner, entry, record, reason)
    copy_id = local_id(record.sent_at, record.uid, _copy_key(box))
    if not fresh and delivered_before(box, copy_id):
        return True
    inbox = box.name_in("inbox", f"{copy_id}.json")
    if record.attachments and not own:
        shared = _snapshot(box, copy_id, record)
        mailfiles.create_atomic(Path(inbox), _bytes(shared))
    else:
        _link_or_copy(source, inbox)
    return True


def _copy_key(box: MailboxDir) -> str:
    """What a copy's id is computed from: the same in every process, however it spells the
    data directory (a peer's address; an absolute target's real path)."""
    return str(box.root.resolve()) if box.address.startswith("/") else f"peer:{box.address}"


def same_box(one: MailboxDir, other: MailboxDir) -> bool:
    if not one.address.startswith("/") and not other.address.startswith("/"):
        return one.address == other.address
    return one.root.resolve() == other.root.resolve()


def _refusal(
    network: MailNetwork, config: NetworkConfig, box: MailboxDir, recipient: Recipient
) -> str | None:
    if not network.authorized(box, config):
        return (
            "this absolute target is not authorized for abs mode here: an operator adds "
            "its path to abs_targets in the network's network.json"
        )
    if recipient.subscription:
        return None if box.meta() is not None else "the subscriber has no valid metadata"
    return network.unreachable_reason(box)


def delivered_before(box: MailboxDir, copy_id: str) -> bool:
    """A message moves only forward (inbox, then archive, then deleted): checked in that
    order, a copy delivered earlier is found wherever it is now."""
    return (
        (box.folder("inbox") / f"{copy_id}.json").exists()
        or (box.folder("archive") / f"{copy_id}.json").exists()
        or (box.folder("deleted") / copy_id).exists()
    )


def _link_or_copy(source: mailfiles.Where, name: str) -> None:
    try:
        mailfiles.link_new(source, name)
    except OSError as exc:
        if exc.errno != errno.EXDEV:  # another file system (an abs target): copy instead
            raise
        mailfiles.create_atomic(Path(name), Path(source).read_bytes())


def _snapshot(box: MailboxDir, copy_id: str, record: StoredMail) -> StoredMail:
    """Copy each attached file into the recipient's mailbox; its copy names no path."""
    folder = box.folder("attachments") / copy_id
    folder.mkdir(parents=True, exist_ok=True)
    refs: list[AttachmentRef] = []
    for ref in record.attachments:
        if ref.path is not None:
            mailfiles.write_atomic(folder / ref.name, Path(ref.path).read_bytes())
        refs.append(AttachmentRef(name=ref.name, size=ref.size))
    return record.model_copy(update={"attachments": refs})


def _bounce(
    network: MailNetwork, owner: MailboxDir, entry: Entry, record: StoredMail, reason: str
) -> bool:
    """An ``email.bounce`` event in the sender's mailbox (once per recipient and message)."""
    digest = hashlib.sha256(entry.recipient.encoded().encode()).hexdigest()[:12]
    event = {
        "type": EVENT_BOUNCE,
        "email_id": entry.sent_id,
        "address": "[subscription]" if entry.recipient.subscription else entry.recipient.address,
        "reason": reason,
        "subject": record.subject,
        "at": network.clock.now().isoformat(),
    }
    path = owner.folder("events") / f"bounce-{entry.sent_id}-{digest}.json"
    if not (owner.folder("events") / "seen" / path.name).exists():
        mailfiles.create_atomic(path, mailfiles.dump(event))
    return False


# -- the courier ------------------------------------------------------------------------------


def deliver_due(
    network: MailNetwork,
    boxes: list[MailboxDir] | None = None,
    config: NetworkConfig | None = None,
) -> int:
    """Deliver every entry that is due, in the given mailboxes' outboxes (all by default),
    after returning the claims of dead processes. Returns how many were delivered."""
    now = stamp(network.clock.now())
    done = 0
    for owner in boxes if boxes is not None else network.mailboxes():
        recover_claims(owner)
        for name in sorted(mailfiles.names(owner.folder("outbox"))):
            entry = Entry.parsed(name + ".json")
            if entry is None or entry.due > now:
                continue
            config = config or network.config()
            done += _deliver_claimed(network, config, owner, entry)
    return done


def _deliver_claimed(
    network: MailNetwork, config: NetworkConfig, owner: MailboxDir, entry: Entry
) -> int:
    """Claim one due entry and deliver it; an unexpected failure gives the claim back."""
    claim = _claim_path(owner, entry)
    waiting = owner.name_in("outbox", entry.name)
    try:
        mailfiles.rename(waiting, claim)
    except FileNotFoundError:
        return 0  # another courier took it
    try:
        delivered = deliver(network, config, owner, entry, claim)
    except BaseException:
        mailfiles.rename(claim, waiting)
        raise
    settle(owner, entry, claim)
    return int(delivered)


def recover_claims(owner: MailboxDir) -> int:
    """Put back the entries claimed by processes that died before finishing them. A claim
    that is not a whole message is a send that never finished writing: it goes (a prefix of
    a JSON object never parses; the message was not sent)."""
    claimed = owner.folder("claimed")
    back = 0
    for name in mailfiles.names(claimed, suffix=""):
        entry_name, _, pid = name.rpartition(".")
        if not pid.isdigit() or mailfiles.alive(int(pid)):
            continue
        entry = Entry.parsed(entry_name)
        if entry is None or not _whole(claimed / name):
            mailfiles.unlink_quietly(claimed / name)
            continue
        try:
            (claimed / name).rename(owner.folder("outbox") / entry_name)
            back += 1
        except FileNotFoundError:
            continue
    return back


def _whole(path: Path) -> bool:
    try:
        StoredMail.model_validate_json(path.read_bytes())
    except (OSError, ValueError):
        return False
    return True


def due_at(network: MailNetwork, delay: int | None) -> datetime | None:
    return network.clock.now() + timedelta(seconds=delay) if delay else None
