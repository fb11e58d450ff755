"""The ``internal_mail`` tool: one call, checked in full, then one action on the caller's
own mailbox. Front ends (the MCP tool, ``outloop mail``) hand it the raw call and show its
``MailResult``; the rules live here and in ``agent.domain.internal_mail``."""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from agent.domain.internal_mail import (
    BODY_CHAR_LIMIT,
    SUMMARIZED,
    AddContactInput,
    AddressInput,
    AttachmentRef,
    Call,
    CheckInput,
    EditContactInput,
    IdsInput,
    Kind,
    MailError,
    Mode,
    NetworkConfig,
    ReplyInput,
    SearchInput,
    SendInput,
    StoredMail,
    body_digest,
    checked_address,
    contact_address,
    guard_allows,
    invalid,
    matches,
    parse_call,
    reply_subject,
    searched,
    settings_rows,
    tokens,
)
from agent.services.internal_mail import delivery
from agent.services.internal_mail.delivery import Outgoing, Recipient
from agent.services.internal_mail.folders import FOLDER_NAMES, Folders
from agent.services.internal_mail.network import MailboxDir, MailboxMeta, MailNetwork
from agent.storage import mailfiles

MANUAL_REFERENCES = (
    "addressing-and-replies",
    "actions-and-storage",
    "notifications-and-delivery",
    "settings-reference",
)
NOT_ACCEPTANCE = (
    "sent is scheduling evidence, not acceptance: a delivery that fails arrives as an "
    "email.bounce event; do not resend blindly"
)


def manual_root() -> Path:
    return Path(str(resources.files("agent.services.internal_mail") / "manual"))


@dataclass
class MailResult:
    """What one call gives back: the action's answer and, for calls that touched the
    mailbox, the host metadata (the unread lane and new events)."""

    payload: dict[str, Any]
    meta: dict[str, Any] | None = None
    events: list[dict[str, Any]] = field(default_factory=list[dict[str, Any]])


SENDING = frozenset({"send", "reply", "reply_all"})


@dataclass(frozen=True)
class Context:
    """What one call reads once: the applied configuration and the caller's metadata."""

    config: NetworkConfig
    meta: MailboxMeta


@dataclass(frozen=True)
class Identity:
    """Who calls: the mailbox's address in the network and, for a new mailbox, what to
    register it as."""

    address: str
    kind: Kind = "agent"
    name: str = ""
    nickname: str = ""


class InternalMail:
    """The tool for one mailbox of one network."""

    def __init__(self, network: MailNetwork, identity: Identity) -> None:
        self.network = network
        self.identity = identity
        self.box: MailboxDir = network.box(identity.address)
        self.folders = Folders(self.box)
        self._guard_file = mailfiles.HeldLock.of(self.box.folder(".guard"))
        self._actions: dict[str, Callable[[Any, Context], dict[str, Any]]] = {
            "send": self._send,
            "check": self._check,
            "read": lambda i, _: self._read(i),
            "dismiss": lambda i, _: self._dismiss(i),
            "reply": lambda i, c: self._reply(i, c, everyone=False),
            "reply_all": lambda i, c: self._reply(i, c, everyone=True),
            "search": self._search,
            "archive": lambda i, _: self._archive(i),
            "delete": lambda i, _: self._delete(i),
            "contacts": lambda _, __: self._contacts(),
            "add_contact": lambda i, _: self._add_contact(i),
            "remove_contact": lambda i, _: self._remove_contact(i),
            "edit_contact": lambda i, _: self._edit_contact(i),
        }

    # -- the call ----------------------------------------------------------------------------

    def call(self, raw: Mapping[str, Any]) -> MailResult:
        """Check the whole call first (nothing is read or written for a bad one), then act."""
        parsed = parse_call(raw)
        if parsed.action == "settings":
            return MailResult({"status": "ok", "settings": settings_rows(self.network.config())})
        if parsed.action == "manual":
            return MailResult(self.manual())
        context = Context(self.network.config(), self.ensure_mailbox())
        if parsed.action not in SENDING:  # what is due lands before it is read
            delivery.deliver_due(self.network, [self.box], context.config)
        payload = self._actions[parsed.action](parsed.input, context)
        if parsed.summarize and parsed.action in SUMMARIZED:
            payload = _summary(parsed, payload)
        return self._with_meta(payload, context.config)

    def _with_meta(self, payload: dict[str, Any], config: NetworkConfig) -> MailResult:
        events = self.folders.take_events()
        block = self.folders.unread_block(config.settings.unread_max_entries)
        agent_meta: dict[str, Any] = {"notifications": {"persistent": {"email": block}}}
        if events:
            agent_meta["events"] = events
        return MailResult(payload, {"agent_meta": agent_meta}, events)

    def ensure_mailbox(self) -> MailboxMeta:
        """The caller's mailbox, created on its first call as what the identity says."""
        meta = self.box.meta()
        if meta is not None:
            return meta
        if self.box.exists():
            raise MailError(
                "MAILBOX_UNAVAILABLE",
                f"mailbox {self.box.address}'s agent.json "
                "is not valid: an operator re-registers it with 'outloop mail "
                "register'",
            )
        name = self.identity.name or self.identity.address.rsplit("/", 1)[-1]
        self.network.register(self.box.address, self.identity.kind, name, self.identity.nickname)
        return self.box.meta() or MailboxMeta(kind=self.identity.kind, name=name)

    def manual(self) -> dict[str, Any]:
        root = manual_root()
        return {
            "status": "ok",
            "path": str(root / "SKILL.md"),
            "manual": (root / "SKILL.md").read_text(encoding="utf-8"),
            "references": [
                {"name": name, "path": str(root / "reference" / name / "SKILL.md")}
                for name in MANUAL_REFERENCES
            ],
        }

    # -- sending -------------------------------------------------------------------------------

    def _send(self, inp: SendInput, context: Context) -> dict[str, Any]:
        to = [inp.address] if isinstance(inp.address, str) else list(inp.address)
        return self._post(
            context,
            to,
            list(inp.cc or []),
            inp.message,
            inp.subject or "",
            inp.attachments or [],
            inp.mode or "peer",
            inp.delay,
            None,
        )

    def _post(
        self,
        context: Context,
        to: list[str],
        cc: list[str],
        message: str,
        subject: str,
        attachments: list[str],
        mode: Mode,
        delay: int | None,
        in_reply_to: str | None,
    ) -> dict[str, Any]:
        config, meta = context.config, context.meta
        if meta.kind == "pseudo":
            raise MailError("NOT_PERMITTED", "a read-only subscriber mailbox cannot send")
        limit = BODY_CHAR_LIMIT
        if len(message) > limit:
            raise MailError(
                "BODY_TOO_LONG",
                f"the message has {len(message):,} characters; "
                f"the limit is {limit:,}: shorten it or attach a file",
            )
        to = [checked_address(a, mode) for a in to]
        cc = [checked_address(a, mode) for a in cc if a not in to]
        refs, snapshot = _attachments(attachments)
        digest = body_digest(to + cc, message)
        with self._guard_file.hold() as guard:
            count = self._guard(guard, digest, config)
            record = StoredMail.model_validate(
                {
                    "uid": delivery.new_uid(),
                    "from": self._own_address(mode),
                    "sender_name": meta.name,
                    "sender_nickname": meta.nickname,
                    "mode": mode,
                    "to": to,
                    "cc": cc,
                    "subject": subject,
                    "message": message,
                    "attachments": refs,
                    "sent_at": self.network.clock.now(),
                    "deliver_at": delivery.due_at(self.network, delay),
                    "in_reply_to": in_reply_to,
                }
            )
            recipients = self._recipients(to + cc, mode, config)
            outgoing = Outgoing(record, recipients, snapshot)
            sent_id = delivery.post(self.network, self.box, outgoing, config)
            mailfiles.rewrite(guard, f"{digest}:{count:010d}".encode())
        answer: dict[str, Any] = {
            "status": "sent",
            "email_id": sent_id,
            "to": to,
            "cc": cc,
            "note": NOT_ACCEPTANCE,
        }
        if record.deliver_at is not None:
            answer["deliver_at"] = record.deliver_at.isoformat()
        return answer

    def _own_address(self, mode: Mode) -> str:
        return str(self.box.root.resolve()) if mode == "abs" else self.box.address

    def _recipients(
        self, addresses: list[str], mode: Mode, config: NetworkConfig
    ) -> list[Recipient]:
        found = [Recipient(a, mode) for a in dict.fromkeys(addresses)]
        if all(delivery.same_box(self.network.box(a, mode), self.box) for a in addresses):
            return found  # a note to self is nobody else's
        named = set(addresses)
        for sub in config.pseudo_agent_subscriptions:
            if sub.covers(self.box.address) and sub.subscriber not in named | {self.box.address}:
                found.append(Recipient(sub.subscriber, "peer", subscription=True))
        return found

    def _guard(self, guard: int, digest: str, config: NetworkConfig) -> int:
        """The loop guard's count for this send (its state is the guard file's content,
        read and written under its lock), or DUPLICATE_SEND."""
        last_digest, _, last_count = os.pread(guard, 64, 0).decode().partition(":")
        last = (last_digest, int(last_count)) if last_count.isdigit() else None
        free = config.settings.duplicate_free_passes
        count = guard_allows(last, digest, free)
        if count is None:
            raise MailError(
                "DUPLICATE_SEND",
                f"this is the same message to the same recipients {free + 1} times in a row; "
                "the loop guard refuses it. Change the message or check whether the earlier "
                "ones arrived",
            )
        return count

    def _reply(self, inp: ReplyInput, context: Context, *, everyone: bool) -> dict[str, Any]:
        [(folder, email_id)] = self.folders.locate(inp.email_id, ("inbox", "archive"))
        original = self.folders.load(folder, email_id)
        if original is None:
            raise MailError(
                "NOT_FOUND",
                f"message {email_id!r} cannot be read (moved meanwhile, "
                "or not a message this tool wrote): check, then reply to another id",
            )
        mode = original.mode
        me = {self._own_address(mode), self.box.address}
        cc = [a for a in original.to + original.cc if a not in me] if everyone else []
        answer = self._post(
            context,
            [original.from_],
            cc,
            inp.message,
            reply_subject(original.subject),
            inp.attachments or [],
            mode,
            None,
            original.uid,
        )
        if folder == "inbox":
            self.folders.mark_read(email_id)  # a reply handles the message it answers
        self.folders.refresh_mirror(self._now())
        return answer | {"in_reply_to": email_id}

    # -- reading -------------------------------------------------------------------------------

    def _check(self, inp: CheckInput, context: Context) -> dict[str, Any]:
        folder = inp.folder or "inbox"
        read = self.folders.read_ids()
        hits = [
            self.folders.entry(f, i, m, unread=unread, full=False)
            for f, i, m in self.folders.listed((folder,))
            if matches(m, unread := f == "inbox" and i not in read, inp.filter)
        ]
        self.folders.refresh_mirror(self._now())
        return _budgeted({"folder": folder}, hits, inp.n or 10, context.config)

    def _read(self, inp: IdsInput) -> dict[str, Any]:
        found = self.folders.locate(inp.email_id, FOLDER_NAMES)
        emails: list[dict[str, Any]] = []
        for folder, email_id in found:
            mail = self.folders.load(folder, email_id)
            if mail is not None:  # read now: an inbox message is marked read below
                emails.append(self.folders.entry(folder, email_id, mail, unread=False, full=True))
        for folder, email_id in found:
            if folder == "inbox":
                self.folders.mark_read(email_id)
        self.folders.refresh_mirror(self._now())
        return {"status": "ok", "emails": emails}

    def _dismiss(self, inp: IdsInput) -> dict[str, Any]:
        found = self.folders.locate(inp.email_id, ("inbox", "archive"))
        for folder, email_id in found:
            if folder == "inbox":
                self.folders.mark_read(email_id)
        self.folders.refresh_mirror(self._now())
        return {"status": "ok", "dismissed": [i for _, i in found]}

    def _search(self, inp: SearchInput, context: Context) -> dict[str, Any]:
        pattern = re.compile(inp.query)
        folders = (inp.folder,) if inp.folder else FOLDER_NAMES
        read = self.folders.read_ids()
        hits = [
            self.folders.entry(f, i, m, unread=f == "inbox" and i not in read, full=False)
            for f, i, m in self.folders.listed(folders)
            if searched(m, pattern)
        ]
        return _budgeted({"query": inp.query}, hits, inp.n or 20, context.config)

    # -- moving ----------------------------------------------------------------------------------

    def _archive(self, inp: IdsInput) -> dict[str, Any]:
        found = self.folders.locate(inp.email_id, ("inbox",))
        for _, email_id in found:
            self.folders.archive(email_id)
        self.folders.refresh_mirror(self._now())
        return {"status": "ok", "archived": [i for _, i in found]}

    def _delete(self, inp: IdsInput) -> dict[str, Any]:
        sent = [i for i in inp.email_id if self.folders.path("sent", i).exists()]
        if sent:
            raise MailError(
                "NOT_PERMITTED",
                f"{sent[0]!r} is sent mail: sent mail is never "
                "deleted (it is the record of what you said)",
            )
        found = self.folders.locate(inp.email_id, ("inbox", "archive"))
        for folder, email_id in found:
            self.folders.delete(folder, email_id)
        self.folders.refresh_mirror(self._now())
        return {"status": "ok", "deleted": [i for _, i in found]}

    # -- contacts ----------------------------------------------------------------------------------

    def _contact_book(self) -> dict[str, dict[str, str]]:
        data = mailfiles.read_json(self.box.folder("contacts.json"))
        return dict(data) if isinstance(data, dict) else {}  # pyright: ignore[reportUnknownArgumentType]

    def _save_contacts(self, book: dict[str, dict[str, str]]) -> None:
        mailfiles.write_atomic(self.box.folder("contacts.json"), mailfiles.dump(book))

    def _contacts(self) -> dict[str, Any]:
        book = self._contact_book()
        rows = [{"address": a, **book[a]} for a in sorted(book)]
        return {"status": "ok", "contacts": rows}

    def _add_contact(self, inp: AddContactInput) -> dict[str, Any]:
        address = contact_address(inp.address)
        with mailfiles.locked(self.box.folder(".lock")):
            book = self._contact_book()
            book[address] = {"name": inp.name, "note": inp.note or ""}
            self._save_contacts(book)
        return {"status": "ok", "contact": {"address": address, **book[address]}}

    def _remove_contact(self, inp: AddressInput) -> dict[str, Any]:
        with mailfiles.locked(self.box.folder(".lock")):
            book = self._contact_book()
            if book.pop(inp.address, None) is None:
                raise MailError("NOT_FOUND", f"no contact {inp.address!r}; contacts lists them")
            self._save_contacts(book)
        return {"status": "ok", "removed": inp.address}

    def _edit_contact(self, inp: EditContactInput) -> dict[str, Any]:
        if inp.name is None and inp.note is None:
            raise invalid("edit_contact: give name, note or both")
        with mailfiles.locked(self.box.folder(".lock")):
            book = self._contact_book()
            if inp.address not in book:
                raise MailError("NOT_FOUND", f"no contact {inp.address!r}; add_contact adds one")
            changed = {k: v for k, v in (("name", inp.name), ("note", inp.note)) if v is not None}
            book[inp.address] = book[inp.address] | changed
            self._save_contacts(book)
        return {"status": "ok", "contact": {"address": inp.address, **book[inp.address]}}

    def _now(self) -> str:
        return self.network.clock.now().isoformat()


def _attachments(paths: list[str]) -> tuple[list[AttachmentRef], dict[str, Path]]:
    """Each attached file, checked to exist before anything is written."""
    refs: list[AttachmentRef] = []
    files: dict[str, Path] = {}
    for text in paths:
        path = Path(text).expanduser().resolve()
        if not path.is_file() or not os.access(path, os.R_OK):
            raise MailError(
                "NOT_FOUND",
                f"attachment {text!r} is not a readable file: give "
                "the path of a file you may share",
            )
        name = _unique(path.name, files)
        files[name] = path
        refs.append(AttachmentRef(name=name, size=path.stat().st_size, path=str(path)))
    return refs, files


def _unique(name: str, taken: Mapping[str, Path]) -> str:
    stem, dot, suffix = name.partition(".")
    candidate, n = name, 1
    while candidate in taken:
        n += 1
        candidate = f"{stem}-{n}{dot}{suffix}"
    return candidate


def _summary(call: Call, payload: dict[str, Any]) -> dict[str, Any]:
    """The gist without ids, addresses or bodies: for when those are not needed."""
    emails: list[dict[str, Any]] = payload.get("emails", [])
    lines = [
        f"{e['sender_nickname'] or e['sender_name']}: {e['subject'] or '(no subject)'}"
        + (" [unread]" if e["unread"] else "")
        + (f" - {str(e['message'])[:160]}" if call.action == "read" else "")
        for e in emails
    ]
    summary = {
        "status": "ok",
        "summarized": True,
        "count": len(emails),
        "unread": sum(1 for e in emails if e["unread"]),
        "lines": lines,
    }
    if "total" in payload:
        summary["total"] = payload["total"]
    return summary


def _budgeted(
    head: dict[str, Any], hits: list[dict[str, Any]], n: int, config: NetworkConfig
) -> dict[str, Any]:
    """At most ``n`` entries, newest first, within the check result token limit."""
    budget = config.settings.check_result_token_limit
    shown: list[dict[str, Any]] = []
    used = tokens(json.dumps(head))
    for hit in hits[:n]:
        cost = tokens(json.dumps(hit, ensure_ascii=False))
        if used + cost > budget and shown:
            break
        shown.append(hit)
        used += cost
    return {
        "status": "ok",
        **head,
        "total": len(hits),
        "returned": len(shown),
        "truncated": len(shown) < min(n, len(hits)),
        "emails": shown,
    }
