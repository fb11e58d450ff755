"""Internal mail between the workstation's agents and operators: the call envelope, the
inputs of each action, addresses, the stored message, the settings inventory and the rules
that need no file (pure).

A call is ``{"action", "input", "reasoning"}`` plus the optional root ``summarize``. The
envelope and the action's input are checked here, in full, before any mailbox is touched:
an unknown root field, an input key of another action, a wrong type or a missing field is a
``MailError`` with code ``INVALID_INPUT`` and nothing has been read or written.
"""

from __future__ import annotations

import functools
import hashlib
import math
import re
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from agent.domain.errors import OutloopError

PRODUCER = "internal_mail"
EVENT_BOUNCE = "email.bounce"

BODY_CHAR_LIMIT = 50_000
DUPLICATE_FREE_PASSES = 2
CHECK_RESULT_TOKEN_LIMIT = 6_000
UNREAD_MAX_ENTRIES = 20
HEARTBEAT_FRESH_SECONDS = 120
"""A heartbeat older than this is stale: its mailbox receives nothing (the sender bounces)."""
CHARS_PER_TOKEN = 4
"""How the check budget counts: one token per four characters of the JSON result."""
PREVIEW_CHARS = 200
MAX_IDS = 100

Folder = Literal["inbox", "archive", "sent"]
Mode = Literal["peer", "abs"]
Kind = Literal["agent", "operator", "pseudo"]

SEGMENT = r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}"
PEER_ADDRESS = re.compile(rf"^{SEGMENT}(?:/{SEGMENT}){{0,7}}$")
RESERVED = frozenset({".", "..", "mailbox"})
"""Path parts no address may have (``mailbox`` is a mailbox's store)."""
LOCAL_ID = re.compile(r"^[0-9]{8}T[0-9]{12}-[0-9a-f]{12}$")


class MailError(OutloopError):
    """An internal mail call that cannot be done. ``code`` is one of the stable codes
    (INVALID_INPUT, NOT_FOUND, BODY_TOO_LONG, DUPLICATE_SEND, NOT_PERMITTED,
    SETTINGS_UNAVAILABLE, MAILBOX_UNAVAILABLE); nothing was changed."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


def invalid(message: str) -> MailError:
    return MailError("INVALID_INPUT", message)


# -- inputs -----------------------------------------------------------------------------

Text = Annotated[str, Field(min_length=1)]
AddressText = Annotated[str, Field(min_length=1, max_length=1024)]
EmailIds = Annotated[list[str], Field(min_length=1, max_length=MAX_IDS)]


class _Input(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


class MailFilter(_Input):
    """``check``'s structured filter: every given field must match."""

    from_: AddressText | None = Field(default=None, alias="from")
    to: AddressText | None = None
    subject: Annotated[str, Field(max_length=500)] | None = None
    """A regular expression searched in the subject."""
    unread: bool | None = None
    since: datetime | None = None
    until: datetime | None = None
    has_attachment: bool | None = None

    model_config = ConfigDict(extra="forbid", frozen=True, strict=False, populate_by_name=True)

    @field_validator("subject")
    @classmethod
    def _compiles(cls, value: str | None) -> str | None:
        compiled(value)
        return value

    @field_validator("since", "until")
    @classmethod
    def _aware(cls, value: datetime | None) -> datetime | None:
        return value.replace(tzinfo=UTC) if value and value.tzinfo is None else value


class SendInput(_Input):
    address: AddressText | Annotated[list[AddressText], Field(min_length=1, max_length=50)]
    message: str
    subject: Annotated[str, Field(max_length=500)] | None = None
    cc: Annotated[list[AddressText], Field(max_length=50)] | None = None
    attachments: Annotated[list[Text], Field(max_length=20)] | None = None
    delay: Annotated[int, Field(ge=0, le=366 * 86_400)] | None = None
    mode: Mode | None = None


class CheckInput(_Input):
    folder: Folder | None = None
    n: Annotated[int, Field(ge=1, le=MAX_IDS)] | None = None
    filter: MailFilter | None = None

    model_config = ConfigDict(extra="forbid", frozen=True, strict=False)


class IdsInput(_Input):
    email_id: EmailIds


class ReplyInput(_Input):
    email_id: Annotated[list[str], Field(min_length=1, max_length=1)]
    message: str
    attachments: Annotated[list[Text], Field(max_length=20)] | None = None


class SearchInput(_Input):
    query: Annotated[str, Field(min_length=1, max_length=500)]
    folder: Folder | None = None
    n: Annotated[int, Field(ge=1, le=MAX_IDS)] | None = None

    @field_validator("query")
    @classmethod
    def _compiles(cls, value: str) -> str:
        compiled(value)
        return value


class NoInput(_Input):
    pass


class AddContactInput(_Input):
    address: AddressText
    name: Annotated[str, Field(min_length=1, max_length=200)]
    note: Annotated[str, Field(max_length=2000)] | None = None


class AddressInput(_Input):
    address: AddressText


class EditContactInput(_Input):
    address: AddressText
    name: Annotated[str, Field(min_length=1, max_length=200)] | None = None
    note: Annotated[str, Field(max_length=2000)] | None = None


ACTIONS: dict[str, type[_Input]] = {
    "send": SendInput,
    "check": CheckInput,
    "read": IdsInput,
    "dismiss": IdsInput,
    "reply": ReplyInput,
    "reply_all": ReplyInput,
    "search": SearchInput,
    "archive": IdsInput,
    "delete": IdsInput,
    "contacts": NoInput,
    "add_contact": AddContactInput,
    "remove_contact": AddressInput,
    "edit_contact": EditContactInput,
    "settings": NoInput,
    "manual": NoInput,
}
ROOT_FIELDS = ("action", "input", "reasoning", "summarize")
SUMMARIZED = frozenset({"check", "read", "search"})
"""The actions whose result ``summarize`` shortens; the others always answer in full."""


def compiled(pattern: str | None) -> re.Pattern[str] | None:
    if pattern is None:
        return None
    try:
        return re.compile(pattern)
    except re.error as exc:
        raise ValueError(f"not a valid regular expression: {exc}") from exc


class Call(BaseModel):
    """One checked call."""

    model_config = ConfigDict(frozen=True, arbitrary_types_allowed=True)

    action: str
    input: Any
    reasoning: str
    summarize: bool = False


def _keys(model: type[_Input]) -> frozenset[str]:
    return frozenset(f.alias or name for name, f in model.model_fields.items())


INPUT_KEYS: dict[str, frozenset[str]] = {action: _keys(m) for action, m in ACTIONS.items()}


def _foreign_key_error(action: str, key: str) -> MailError:
    owners = [a for a in ACTIONS if key in INPUT_KEYS[a]]
    where = f" (it belongs to {', '.join(owners)})" if owners else ""
    accepted = ", ".join(sorted(INPUT_KEYS[action])) or "no fields: pass {}"
    return invalid(
        f"input field {key!r} is not an input of {action}{where}; {action} takes {accepted}"
    )


def parse_call(raw: Mapping[str, Any]) -> Call:
    """The call, checked in full, or INVALID_INPUT naming what to fix."""
    unknown = sorted(set(raw) - set(ROOT_FIELDS))
    if unknown:
        raise invalid(
            f"unknown root field(s) {', '.join(unknown)}; a call has action, input, "
            "reasoning and the optional summarize"
        )
    action = raw.get("action")
    if not isinstance(action, str) or action not in ACTIONS:
        raise invalid(f"action must be one of {', '.join(ACTIONS)}")
    reasoning = raw.get("reasoning")
    if not isinstance(reasoning, str) or not reasoning.strip():
        raise invalid("reasoning is required: say in a sentence why you make this call")
    summarize = raw.get("summarize")
    if summarize is not None and not isinstance(summarize, bool):
        raise invalid("summarize is true or false (or omitted)")
    data = raw.get("input")
    if not isinstance(data, Mapping):
        raise invalid(f"input is required: an object with {action}'s fields ({{}} if none)")
    items: Mapping[Any, Any] = data  # pyright: ignore[reportUnknownVariableType]
    present = {str(k): v for k, v in items.items() if v is not None}  # null means omitted
    foreign = present.keys() - INPUT_KEYS[action]
    if foreign:
        raise _foreign_key_error(action, sorted(foreign)[0])
    try:
        parsed = ACTIONS[action].model_validate(present)
    except ValidationError as exc:
        raise invalid(f"{action}: {_first_problem(exc)}") from None
    _check_values(parsed)
    return Call(action=action, input=parsed, reasoning=reasoning, summarize=bool(summarize))


def _check_values(parsed: _Input) -> None:
    """The checks of addresses and ids that need no file, so a call they refuse has read
    and written nothing."""
    if isinstance(parsed, SendInput):
        to = [parsed.address] if isinstance(parsed.address, str) else parsed.address
        for address in [*to, *(parsed.cc or [])]:
            checked_address(address, parsed.mode or "peer")
    elif isinstance(parsed, IdsInput | ReplyInput):
        checked_ids(parsed.email_id)
    elif isinstance(parsed, AddContactInput | AddressInput | EditContactInput):
        contact_address(parsed.address)


def contact_address(address: str) -> str:
    """A contact is a peer address or an absolute mailbox path."""
    return checked_address(address, "abs" if address.startswith("/") else "peer")


def _first_problem(exc: ValidationError) -> str:
    error = exc.errors()[0]
    where = ".".join(str(p) for p in error["loc"] if not isinstance(p, int)) or "input"
    return f"{where}: {error['msg']}"


# -- addresses ----------------------------------------------------------------------------


def checked_address(address: str, mode: Mode) -> str:
    """A peer address (a bare name or path inside this network) or, in ``abs`` mode, an
    absolute path; anything with ``@`` is internet mail and refused."""
    if "@" in address:
        raise invalid(
            f"{address!r} looks like an internet address: internal mail is addressed "
            "by bare names or paths inside the workstation (internet email goes "
            "through the lifecycle tools)"
        )
    if mode == "abs":
        if not address.startswith("/") or "/../" in address + "/" or "\x00" in address:
            raise invalid(f"{address!r}: mode abs takes an absolute path to a mailbox")
        return address.rstrip("/") or "/"
    if not PEER_ADDRESS.match(address) or any(s in RESERVED for s in address.split("/")):
        raise invalid(
            f"{address!r} is not a peer address: a bare name or path of names "
            "(letters, digits, '.', '_', '-'; not 'mailbox'), no leading '/'"
        )
    return address


def checked_ids(ids: list[str]) -> list[str]:
    bad = [i for i in ids if not LOCAL_ID.match(i)]
    if bad:
        raise MailError(
            "NOT_FOUND",
            f"no message {bad[0]!r} in this mailbox: pass ids from "
            "your own check, read or notification",
        )
    return list(dict.fromkeys(ids))


def local_id(sent_at: datetime, uid: str, mailbox: str) -> str:
    """A message's id in one mailbox: sortable by time, different in every mailbox."""
    digest = hashlib.sha256(f"{uid}\0{mailbox}".encode()).hexdigest()[:12]
    return f"{_id_time(sent_at, sent_at.utcoffset())}-{digest}"


@functools.lru_cache(maxsize=64)
def _id_time(sent_at: datetime, offset: timedelta | None) -> str:
    """One send names its sent copy and each delivery from the same moment (``offset``
    keys the cache too: equal moments in two time zones are written differently)."""
    return f"{sent_at:%Y%m%dT%H%M%S%f}"


# -- stored messages ------------------------------------------------------------------------


class AttachmentRef(BaseModel):
    model_config = ConfigDict(frozen=True)

    name: str
    size: int
    path: str | None = None
    """Set for a referenced file (self-send, the sender's own copy); a delivered snapshot
    lives in the mailbox's attachments folder."""


class StoredMail(BaseModel):
    """One message as stored. A delivered copy holds exactly what the sender wrote; ids and
    folders come from where the file is."""

    model_config = ConfigDict(frozen=True, populate_by_name=True)

    uid: str
    from_: str = Field(alias="from")
    sender_name: str
    sender_nickname: str = ""
    mode: Mode = "peer"
    to: list[str]
    cc: list[str] = []
    subject: str = ""
    message: str
    attachments: list[AttachmentRef] = []
    sent_at: datetime
    deliver_at: datetime | None = None
    in_reply_to: str | None = None

    @property
    def sender(self) -> str:
        """How to address the sender: the nickname when set, else the name."""
        return self.sender_nickname or self.sender_name


def matches(mail: StoredMail, unread: bool, flt: MailFilter | None) -> bool:
    if flt is None:
        return True
    checks = (
        flt.from_ is None or mail.from_ == flt.from_,
        flt.to is None or flt.to in mail.to or flt.to in mail.cc,
        flt.subject is None or re.search(flt.subject, mail.subject) is not None,
        flt.unread is None or flt.unread == unread,
        flt.since is None or mail.sent_at >= flt.since,
        flt.until is None or mail.sent_at <= flt.until,
        flt.has_attachment is None or flt.has_attachment == bool(mail.attachments),
    )
    return all(checks)


def searched(mail: StoredMail, pattern: re.Pattern[str]) -> bool:
    fields = (mail.subject, mail.message, mail.from_, mail.sender_name, mail.sender_nickname)
    return any(pattern.search(f) for f in fields)


def tokens(text: str) -> int:
    return math.ceil(len(text) / CHARS_PER_TOKEN)


def reply_subject(subject: str) -> str:
    return subject if subject.lower().startswith("re:") else f"Re: {subject}".rstrip()


def body_digest(recipients: list[str], message: str) -> str:
    key = "\n".join(sorted(recipients)) + "\0" + message
    return hashlib.sha256(key.encode()).hexdigest()[:32]


def guard_allows(last: tuple[str, int] | None, digest: str, free_passes: int) -> int | None:
    """The count of consecutive identical sends this one makes, or None when the guard
    refuses it (the first ``free_passes`` identical sends in a row go)."""
    count = last[1] + 1 if last is not None and last[0] == digest else 1
    return count if count <= free_passes else None


# -- settings -----------------------------------------------------------------------------


class MailSettings(BaseModel):
    """The applied settings of this network."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    duplicate_free_passes: int = Field(
        default=DUPLICATE_FREE_PASSES, ge=1, le=1000, alias="send.duplicate_free_passes"
    )
    check_result_token_limit: int = Field(
        default=CHECK_RESULT_TOKEN_LIMIT, ge=100, le=1_000_000, alias="check.result_token_limit"
    )
    unread_max_entries: int = Field(
        default=UNREAD_MAX_ENTRIES, ge=1, le=1000, alias="unread.max_entries"
    )


class Subscription(BaseModel):
    """A read-only subscriber (a pseudo-agent mailbox such as an audit mailbox) that gets a
    copy of what the listed senders send (``*``: every sender)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    subscriber: str
    senders: list[str] = ["*"]

    def covers(self, sender: str) -> bool:
        return "*" in self.senders or sender in self.senders


class NetworkConfig(BaseModel):
    """``<data dir>/mail/network.json``: the settings, the subscriptions, and the absolute
    paths of mailboxes outside this network that ``abs`` mode may reach."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    settings: MailSettings = MailSettings()
    pseudo_agent_subscriptions: list[Subscription] = []
    abs_targets: list[str] = []


SETTING_ROWS: tuple[tuple[str, str, bool, str], ...] = (
    (
        "send.duplicate_free_passes",
        "duplicate_free_passes",
        True,
        "Duplicate send loop guard: identical recipient+body sends allowed in a row.",
    ),
    (
        "check.result_token_limit",
        "check_result_token_limit",
        True,
        "Check result token limit: the budget of one check result (4 characters a token).",
    ),
    (
        "unread.max_entries",
        "unread_max_entries",
        True,
        "Unread notification entry limit: entries shown in full; the total is always kept.",
    ),
)


def settings_rows(config: NetworkConfig) -> list[dict[str, Any]]:
    """Every row with exactly key, current, default, configurable, comment."""
    defaults = MailSettings()
    rows: list[dict[str, Any]] = [
        {
            "key": "send.body_char_limit",
            "current": BODY_CHAR_LIMIT,
            "default": BODY_CHAR_LIMIT,
            "configurable": False,
            "comment": "Send body character limit: the installed cap of a send or reply body.",
        }
    ]
    rows += [
        {
            "key": key,
            "current": getattr(config.settings, attr),
            "default": getattr(defaults, attr),
            "configurable": configurable,
            "comment": comment,
        }
        for key, attr, configurable, comment in SETTING_ROWS
    ]
    rows.append(
        {
            "key": "manifest.pseudo_agent_subscriptions",
            "current": {
                "subscriptions": len(config.pseudo_agent_subscriptions),
                "detail": "redacted",
            },
            "default": {"subscriptions": 0, "detail": "redacted"},
            "configurable": True,
            "comment": "Pseudo-agent subscriptions: read-only subscribers, listed redacted.",
        }
    )
    return rows
