"""The Workspace Context: everything tenant-specific, loaded from the operator's YAML file.

Nothing tenant-specific is hard-coded anywhere else. The file is re-read on every run; an
agent can only propose changes (``submit_learning``), never write it.
"""

from __future__ import annotations

import re
from datetime import date, datetime
from enum import StrEnum
from typing import Any
from urllib.parse import urlsplit
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from agent.domain.errors import ContextError
from agent.domain.mail import CANONICAL_ORDER, Channel
from agent.domain.secrets import NAME_PATTERN

WORKSPACE_ID_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{1,63}$")
WEEKDAYS = ("mon", "tue", "wed", "thu", "fri", "sat", "sun")


class Side(StrEnum):
    """Which side of the relationship a contact is on."""

    INTERNAL = "internal"
    CLIENT = "client"


class _Model(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


DEFAULT_CHANNELS: dict[str, tuple[Channel, ...]] = {
    "maildir": (Channel.LOCAL,),
    "imap": (Channel.IMAP,),
}
"""The channel a mailbox of these mail systems is reached by when its context names none;
any other mail system defaults to its API."""


class Security(StrEnum):
    """How a connection to a mail server is protected."""

    TLS = "tls"
    """TLS from the first byte (IMAP 993, SMTP submission 465; RFC 8314 prefers it)."""
    STARTTLS = "starttls"
    """A plain connection upgraded by STARTTLS before anything else is said (SMTP 587)."""
    NONE = "none"
    """No encryption: only to a server on this machine (127.0.0.1, ::1, localhost)."""


LOOPBACK_HOSTS = frozenset({"127.0.0.1", "::1", "localhost"})
DEFAULT_PORTS = {
    ("imap", Security.TLS): 993,
    ("imap", Security.NONE): 143,
    ("smtp", Security.TLS): 465,
    ("smtp", Security.STARTTLS): 587,
    ("smtp", Security.NONE): 587,
}


class Endpoint(_Model):
    """One server: host, port (default from the protocol and security) and security."""

    host: str = Field(min_length=1)
    port: int | None = Field(default=None, ge=1, le=65535)
    security: Security = Security.TLS

    @model_validator(mode="after")
    def _no_plain_text_off_this_machine(self) -> Endpoint:
        if self.security is Security.NONE and self.host.lower() not in LOOPBACK_HOSTS:
            raise ValueError(
                f"security 'none' sends the password in clear text: it is allowed only for a "
                f"server on this machine, not {self.host!r}; use 'tls' (or 'starttls' for SMTP)"
            )
        return self

    def port_for(self, protocol: str) -> int:
        return self.port or DEFAULT_PORTS[(protocol, self.security)]


class MailServer(_Model):
    """How a mailbox is reached over IMAP (reading, sent copies) and SMTP submission
    (sending). The password is a name in the vault, never a value."""

    imap: Endpoint
    smtp: Endpoint
    username: str | None = Field(
        default=None, description="the login name for both servers (default: the mailbox address)"
    )
    password: str = Field(
        default="password", description="the vault name of the password (or app password)"
    )
    submission_keeps_sent_copy: bool = Field(
        default=False,
        description="the submission server files a copy of each message it accepts in the "
        "mailbox's Sent folder itself (Gmail's and Microsoft 365's SMTP do); otherwise "
        "Outloop appends the copy after the server accepted the message",
    )
    sent_copy_latency_seconds: int = Field(
        default=120,
        ge=0,
        le=86400,
        description="the longest the submission server's own copy takes to appear in Sent "
        "(used only when it keeps one)",
    )
    timeout_seconds: float = Field(default=30.0, gt=0, le=600)
    ca_file: str | None = Field(
        default=None,
        description="a PEM file of the certificate authorities trusted for these servers (an "
        "internal CA); default: the system's. Certificates are always verified",
    )

    @field_validator("imap")
    @classmethod
    def _imap_security(cls, value: Endpoint) -> Endpoint:
        if value.security is Security.STARTTLS:
            raise ValueError(
                "IMAP is reached over TLS from the first byte (port 993, RFC 8314), not "
                "STARTTLS; set imap.security to 'tls'"
            )
        return value

    @field_validator("password")
    @classmethod
    def _password_name(cls, value: str) -> str:
        if not re.fullmatch(NAME_PATTERN, value):
            raise ValueError(f"password names a vault entry ({value!r} is not a name)")
        return value


def _https_or_loopback(url: str) -> str:
    parsed = urlsplit(url)
    if parsed.username or parsed.password or parsed.query or parsed.fragment:
        raise ValueError(
            f"{parsed.scheme}://{parsed.hostname}...: an API or token endpoint is a plain URL "
            "(no user, password, query or fragment; secrets live in the vault)"
        )
    host = (parsed.hostname or "").lower()
    if parsed.scheme == "https" and host:
        return url
    if parsed.scheme == "http" and host in LOOPBACK_HOSTS:
        return url
    raise ValueError(
        f"{url!r}: an API or token endpoint is reached over https (plain http only to a "
        "server on this machine, such as the local mock providers)"
    )


class ApiAccess(_Model):
    """How a mailbox is reached through its mail system's API with OAuth: the endpoints
    (default: the provider's published ones) and the vault names of its OAuth secrets."""

    base_url: str | None = Field(
        default=None,
        description="the API's base URL (default: https://gmail.googleapis.com/gmail/v1 for "
        "google, https://graph.microsoft.com/v1.0 for microsoft)",
    )
    token_url: str | None = Field(
        default=None,
        description="the OAuth token endpoint (default: the provider's; for microsoft, the "
        "tenant's under login.microsoftonline.com)",
    )
    tenant: str = Field(
        default="common",
        pattern=r"^[A-Za-z0-9.-]{1,100}$",
        description="the Entra ID tenant (id or domain) the app is registered in (microsoft)",
    )
    user: str = Field(
        default="me",
        min_length=1,
        description="whose mailbox the API reads: 'me' (the signed-in account), or a user "
        "id or address the app may read",
    )
    scopes: tuple[str, ...] = Field(
        default=(), description="the OAuth scopes to ask for at refresh (default: none named)"
    )
    client_id: str = Field(default="oauth_client_id", pattern=NAME_PATTERN)
    client_secret: str = Field(default="oauth_client_secret", pattern=NAME_PATTERN)
    refresh_token: str = Field(default="oauth_refresh_token", pattern=NAME_PATTERN)
    sent_copy_latency_seconds: int = Field(
        default=120,
        ge=0,
        le=86400,
        description="the longest a sent message takes to appear among the mailbox's sent mail",
    )
    parallel: int = Field(
        default=8, ge=1, le=64, description="requests in flight at once for this mailbox"
    )
    timeout_seconds: float = Field(default=30.0, gt=0, le=600)

    @field_validator("base_url", "token_url")
    @classmethod
    def _secure(cls, value: str | None) -> str | None:
        return None if value is None else _https_or_loopback(value.rstrip("/"))


DIALECTS: dict[str, str] = {"ms365": "microsoft"}
"""The provider MCP tool shapes this version speaks, and the mail system each reaches:
``ms365``, the Microsoft Graph passthrough tools of the ms-365-mcp-server family
(``list-mail-messages``, ``get-mail-message-mime``, ``create-reply-draft``, ...)."""


class BrowserAccess(_Model):
    """How a mailbox is reached through its provider's own web app (the browser channel):
    the app's address, the dedicated worker account that signs in, and the vault names of
    its password and authenticator secret (managed login reads them; no value is here)."""

    url: str | None = Field(
        default=None,
        description="the web app's mail address (default: https://outlook.office.com/mail/ "
        "for microsoft)",
    )
    account: str | None = Field(
        default=None,
        description="the worker account that signs in (default: the mailbox's own address)",
    )
    password: str = Field(default="password", pattern=NAME_PATTERN)
    totp: str = Field(
        default="totp", pattern=NAME_PATTERN, description="the authenticator's setup key"
    )
    sent_copy_latency_seconds: int = Field(
        default=120,
        ge=0,
        le=86400,
        description="the longest a sent message takes to show in the app's search",
    )

    @field_validator("url")
    @classmethod
    def _secure(cls, value: str | None) -> str | None:
        return None if value is None else _https_or_loopback(value)

    @field_validator("account")
    @classmethod
    def _lower(cls, value: str | None) -> str | None:
        return None if value is None else value.strip().lower()


class ProviderMcpAccess(_Model):
    """How a mailbox is reached through a provider's MCP server the workspace permits: the
    server (its command, run over stdio, or its streamable HTTP URL), the tool shapes it
    speaks, the tool names it gives them, and the vault names of what it signs in with."""

    command: tuple[str, ...] = Field(
        default=(), description="the server's command line, run over stdio (its argv)"
    )
    url: str | None = Field(
        default=None,
        description="the server's streamable HTTP endpoint (https, or http on this machine)",
    )
    dialect: str = Field(
        default="ms365", description=f"the tool shapes it speaks: {', '.join(DIALECTS)}"
    )
    tools: dict[str, str] = Field(
        default_factory=dict[str, str],
        description="this server's name for a tool whose name differs from the dialect's",
    )
    env: dict[str, str] = Field(
        default_factory=dict[str, str],
        description="environment variables of the stdio server, each set from the vault "
        "entry named (its own sign-in)",
    )
    token: str | None = Field(
        default=None,
        pattern=NAME_PATTERN,
        description="the vault name of the bearer token sent to the HTTP endpoint",
    )
    sent_copy_latency_seconds: int = Field(default=120, ge=0, le=86400)
    timeout_seconds: float = Field(default=60.0, gt=0, le=600)

    @field_validator("url")
    @classmethod
    def _secure(cls, value: str | None) -> str | None:
        return None if value is None else _https_or_loopback(value)

    @field_validator("dialect")
    @classmethod
    def _known(cls, value: str) -> str:
        if value not in DIALECTS:
            raise ValueError(
                f"dialect {value!r} is not one this version speaks ({', '.join(DIALECTS)})"
            )
        return value

    @field_validator("tools")
    @classmethod
    def _tool_names(cls, value: dict[str, str]) -> dict[str, str]:
        for ours, theirs in value.items():
            if not re.fullmatch(r"[A-Za-z0-9_.-]{1,128}", f"{ours}") or not re.fullmatch(
                r"[A-Za-z0-9_./-]{1,128}", theirs
            ):
                raise ValueError(f"tool name {ours!r} -> {theirs!r}: letters, digits, _ . - /")
        return value

    @field_validator("env")
    @classmethod
    def _env_names(cls, value: dict[str, str]) -> dict[str, str]:
        for variable, name in value.items():
            if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]{0,127}", variable):
                raise ValueError(f"{variable!r} is not an environment variable name")
            if not re.fullmatch(NAME_PATTERN, name):
                raise ValueError(f"env {variable}: {name!r} is not a vault entry name")
        return value

    @model_validator(mode="after")
    def _one_server(self) -> ProviderMcpAccess:
        if bool(self.command) == (self.url is not None):
            raise ValueError(
                "name the provider MCP server by exactly one of command: (run over stdio) "
                "or url: (streamable HTTP)"
            )
        if self.command and self.token is not None:
            raise ValueError("token: is sent to an HTTP server; a stdio server signs in with env:")
        if self.url is not None and self.env:
            raise ValueError("env: is given to a stdio server; an HTTP server gets token:")
        return self


class MailboxBinding(_Model):
    """One mailbox this workspace reads. A shared mailbox binds items by exact rules.

    ``provider`` is the mail system (google, microsoft, imap, maildir); ``channels`` the
    ways it may be reached, always in the canonical order (API, provider MCP, browser).
    """

    mailbox_id: str
    provider: str
    path: str | None = None
    shared: bool = False
    bind_to: tuple[str, ...] = Field(
        default=(), description="exact recipient addresses that bind an item of a shared mailbox"
    )
    channels: tuple[Channel, ...] = Field(
        default=(),
        description="the permitted channels, in the canonical order (default: the mail "
        "system's API, or local files for a Maildir)",
    )
    reads_after_refusal: bool = Field(
        default=False,
        description="reads and evidence collection may go on after a channel explicitly "
        "refused (seed 000 s.9: only if separately authorized)",
    )
    credentials: tuple[str, ...] = Field(
        default=(),
        description="names of this mailbox's secrets in the vault (values never appear here)",
    )
    server: MailServer | None = Field(
        default=None, description="the IMAP and SMTP servers (a mailbox reached over IMAP)"
    )
    api: ApiAccess = Field(
        default_factory=ApiAccess,
        description="the API's endpoints and OAuth secrets (a mailbox reached through its "
        "provider's API)",
    )
    provider_mcp: ProviderMcpAccess | None = Field(
        default=None,
        description="the provider MCP server the workspace permits (a mailbox reached "
        "through the provider_mcp channel)",
    )
    browser: BrowserAccess = Field(
        default_factory=BrowserAccess,
        description="the provider's web app and the worker account managed login signs in "
        "with (a mailbox reached through the browser channel)",
    )

    @field_validator("channels")
    @classmethod
    def _canonical_order(cls, value: tuple[Channel, ...]) -> tuple[Channel, ...]:
        if len(set(value)) != len(value):
            raise ValueError("each channel may be listed once")
        ordered = tuple(sorted(value, key=CANONICAL_ORDER.index))
        if ordered != value:
            raise ValueError(
                f"channels are tried in the canonical order {', '.join(CANONICAL_ORDER)}; "
                f"list them as [{', '.join(ordered)}]"
            )
        return value

    @field_validator("credentials")
    @classmethod
    def _names(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for name in value:
            if not re.fullmatch(NAME_PATTERN, name):
                raise ValueError(f"credential name {name!r}: letters, digits, '_', '.', '-'")
        return value

    @property
    def permitted_channels(self) -> tuple[Channel, ...]:
        """The channels to try, in order."""
        return self.channels or DEFAULT_CHANNELS.get(self.provider, (Channel.API,))

    @field_validator("mailbox_id")
    @classmethod
    def _lower(cls, value: str) -> str:
        return value.strip().lower()

    @field_validator("bind_to")
    @classmethod
    def _lower_all(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        return tuple(v.strip().lower() for v in value)

    @model_validator(mode="after")
    def _maildir_path(self) -> MailboxBinding:
        if self.provider == "maildir" and not self.path:
            raise ValueError(f"mailbox {self.mailbox_id}: provider maildir needs a path")
        return self

    @model_validator(mode="after")
    def _imap_server(self) -> MailboxBinding:
        if Channel.IMAP in self.permitted_channels and self.server is None:
            raise ValueError(
                f"mailbox {self.mailbox_id}: the imap channel needs server: with imap: and "
                "smtp: (host, port, security) and the vault name of its password"
            )
        return self


class Contact(_Model):
    """A known person. ``side`` and ``verified_by`` are the classification evidence."""

    address: str
    name: str = ""
    side: Side | None = None
    verified_by: str | None = None
    roles: tuple[str, ...] = ()

    @field_validator("address")
    @classmethod
    def _lower(cls, value: str) -> str:
        return value.strip().lower()


class StandingApproval(_Model):
    scope: str = "message_class"
    message_class: str = Field(alias="class")
    granted_by: str


class Approval(_Model):
    roles: tuple[str, ...] = ("approver",)
    standing: tuple[StandingApproval, ...] = ()


class Calendar(_Model):
    weekend: tuple[str, ...] = ("sat", "sun")
    holidays: tuple[date, ...] = ()

    @field_validator("weekend")
    @classmethod
    def _days(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        days = tuple(v.strip().lower()[:3] for v in value)
        for day in days:
            if day not in WEEKDAYS:
                raise ValueError(f"unknown weekday {day!r}; use one of {', '.join(WEEKDAYS)}")
        if len(set(days)) == len(WEEKDAYS):
            raise ValueError("a weekend of all seven days leaves no business day")
        return days

    def is_business_day(self, day: date) -> bool:
        return WEEKDAYS[day.weekday()] not in self.weekend and day not in self.holidays


class Communication(_Model):
    greeting: str = ""
    signature: str = ""
    tone: str = ""
    ack_template: str = ""
    """The receipt acknowledgement in the workspace's own language, sent verbatim."""
    ack_templates: dict[str, str] = Field(
        default_factory=dict[str, str],
        description="receipt acknowledgements by language code, sent verbatim",
    )
    rules: tuple[str, ...] = ()

    def ack_text(self, language: str, default_language: str) -> str | None:
        """The acknowledgement for a sender writing in ``language``, or None if the context
        has none in that language (then no acknowledgement is sent)."""
        text = self.ack_templates.get(language)
        if text is None and language == default_language:
            text = self.ack_template
        return text.strip() or None if text else None


class Automation(_Model):
    max_per_recipient_per_day: int = Field(default=3, ge=1, le=100)
    """The most automated messages (acknowledgements, reminders) one address receives in
    any 24 hours, across every task of the workspace."""


class Grants(_Model):
    licence: str = "inactive"
    mailboxes: tuple[str, ...] = ()

    @field_validator("mailboxes")
    @classmethod
    def _lower_all(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        return tuple(v.strip().lower() for v in value)


class ClientSendPolicy(StrEnum):
    DRAFT_FOR_INTERNAL_APPROVAL = "draft_for_internal_approval"
    SENDS_DISABLED = "sends_disabled"


class Classification(_Model):
    task_owner_evidence: bool = False


class Kpis(_Model):
    official: dict[str, float] = Field(default_factory=dict[str, float])


class TaskBoardConfig(_Model):
    provider: str = "embedded"
    project_id: str | None = None
    intake_location_id: str | None = None


class Schedule(_Model):
    timezone: str | None = Field(
        default=None,
        description="the timezone the schedule runs in (default: the workspace timezone)",
    )

    @field_validator("timezone")
    @classmethod
    def _tz(cls, value: str | None) -> str | None:
        if value is None:
            return value
        try:
            ZoneInfo(value)
        except (ZoneInfoNotFoundError, ValueError) as exc:
            raise ValueError(f"unknown timezone {value!r} (use an IANA name such as UTC)") from exc
        return value


class Attachments(_Model):
    accepted: tuple[str, ...] = ()
    outgoing_dirs: tuple[str, ...] = Field(
        default=(),
        description="directories whose files a reply may attach (file:<path> under one of "
        "them); an inbound attachment of the workspace's own mail may always be attached",
    )

    @field_validator("accepted")
    @classmethod
    def _extensions(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        return tuple(v.strip().lower().lstrip(".") for v in value if v.strip())


class WorkspaceContext(_Model):
    """The live Workspace Context of one workspace (keys fixed by ARCHITECTURE.md)."""

    workspace_id: str
    label: str = ""
    timezone: str = "UTC"
    language: str = "en"
    calendar: Calendar = Calendar()
    mailboxes: tuple[MailboxBinding, ...] = ()
    contacts: tuple[Contact, ...] = ()
    approval: Approval = Approval()
    default_cc: tuple[str, ...] = ()
    escalation_contact: str | None = None
    unresolved_queue: str | None = None
    receipt_ack: bool = False
    reminder_business_days: int = Field(default=2, ge=1, le=60)
    communication: Communication = Communication()
    grants: Grants = Grants()
    client_send_policy: ClientSendPolicy = ClientSendPolicy.DRAFT_FOR_INTERNAL_APPROVAL
    classification: Classification = Classification()
    kpis: Kpis = Kpis()
    task_board: TaskBoardConfig = TaskBoardConfig()
    schedule: Schedule = Schedule()
    attachments: Attachments = Attachments()
    automation: Automation = Automation()

    @field_validator("workspace_id")
    @classmethod
    def _immutable_id(cls, value: str) -> str:
        if not WORKSPACE_ID_PATTERN.match(value):
            raise ValueError(
                "workspace_id must be 2-64 characters of letters, digits, '.', '_' or '-', "
                "starting with a letter or digit"
            )
        return value

    @field_validator("timezone")
    @classmethod
    def _tz(cls, value: str) -> str:
        try:
            ZoneInfo(value)
        except (ZoneInfoNotFoundError, ValueError) as exc:
            raise ValueError(f"unknown timezone {value!r} (use an IANA name such as UTC)") from exc
        return value

    @field_validator("default_cc")
    @classmethod
    def _lower_all(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        return tuple(v.strip().lower() for v in value)

    @field_validator("escalation_contact")
    @classmethod
    def _lower(cls, value: str | None) -> str | None:
        return value.strip().lower() if value else value

    @property
    def tz(self) -> ZoneInfo:
        return ZoneInfo(self.timezone)

    @property
    def schedule_timezone(self) -> str:
        """The timezone the schedule runs in: ``schedule.timezone``, else the workspace's."""
        return self.schedule.timezone or self.timezone

    def contact(self, address: str) -> Contact | None:
        wanted = address.strip().lower()
        for contact in self.contacts:
            if contact.address == wanted:
                return contact
        return None

    def client_manager(self) -> str | None:
        """The recorded client manager: the internal contact holding ``client_manager``."""
        for contact in self.contacts:
            if contact.side is Side.INTERNAL and "client_manager" in contact.roles:
                return contact.address
        return None

    def work_owner(self) -> str | None:
        """Who owns new work: the client manager, else the escalation contact."""
        return self.client_manager() or self.escalation_contact

    def mailbox(self, provider: str, mailbox_id: str) -> MailboxBinding | None:
        wanted = mailbox_id.strip().lower()
        for binding in self.mailboxes:
            if binding.provider == provider and binding.mailbox_id == wanted:
                return binding
        return None

    def local_date(self, moment: datetime) -> date:
        return moment.astimezone(self.tz).date()

    def missing_for_intake(self) -> tuple[str, ...]:
        """Context keys whose absence is a context gap: intake continues, discovery starts."""
        missing: list[str] = []
        if not self.kpis.official:
            missing.append("kpis.official")
        if not self.escalation_contact:
            missing.append("escalation_contact")
        if not self.unresolved_queue:
            missing.append("unresolved_queue")
        if not any(
            "approver" in c.roles or set(c.roles) & set(self.approval.roles)
            for c in self.contacts
            if c.side is Side.INTERNAL
        ):
            missing.append("approval.roles (no internal contact holds an approval role)")
        return tuple(missing)


class StationConfig(_Model):
    """The station file beside the registry: where items no workspace owns go."""

    unresolved_queue: str | None = None
    escalation_contact: str | None = None


def _format_validation(source: str, exc: ValidationError) -> str:
    problems: list[str] = []
    for err in exc.errors():
        where = ".".join(str(p) for p in err["loc"]) or "(top level)"
        problems.append(f"{where}: {err['msg']}")
    return f"{source} is not a valid Workspace Context: " + "; ".join(problems)


def parse_context(text: str, source: str = "context") -> WorkspaceContext:
    """Parse a Workspace Context from YAML text, with errors that name the key to fix."""
    try:
        data: Any = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ContextError(f"{source} is not valid YAML: {exc}") from exc
    if not isinstance(data, dict):
        raise ContextError(f"{source} must be a YAML mapping with at least 'workspace_id'")
    try:
        return WorkspaceContext.model_validate(data)
    except ValidationError as exc:
        raise ContextError(_format_validation(source, exc)) from exc


def parse_station(text: str, source: str = "station file") -> StationConfig:
    try:
        data: Any = yaml.safe_load(text) or {}
    except yaml.YAMLError as exc:
        raise ContextError(f"{source} is not valid YAML: {exc}") from exc
    if not isinstance(data, dict):
        raise ContextError(f"{source} must be a YAML mapping")
    try:
        return StationConfig.model_validate(data)
    except ValidationError as exc:
        raise ContextError(_format_validation(source, exc)) from exc
