"""The composition root: settings are read here, once, and everything is built from them.

The entry point (the ``outloop`` CLI; later the dispatcher and the console) calls
``read_settings`` once with its command line's values; nothing below it reads the
environment. ``open_station`` builds what every front end runs on from those settings: the
data directory, the store and the mail provider adapters.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import cache, partial
from pathlib import Path
from typing import TYPE_CHECKING

from agent.domain.context import MailboxBinding
from agent.domain.errors import AccessRefused, AuthenticationExpired, ContextError, Unsupported
from agent.domain.internal_mail import Kind
from agent.domain.mail import Channel
from agent.domain.pack import Drift, WheelPin, code_digest
from agent.domain.secrets import CredentialRef, Secret
from agent.ports import Clock, EmbeddedStore, Health, MailProvider, TaskBoard, Vault
from agent.providers.imap_smtp import ImapSmtpProvider
from agent.providers.maildir import MaildirProvider
from agent.services import challenges
from agent.services import pack as pack_service
from agent.services.access import AccessRoute, Action, Candidate, Refusal
from agent.services.clock import SystemClock
from agent.services.intake import ProviderFactory
from agent.services.internal_mail import Identity, InternalMail, MailNetwork
from agent.services.schedule import Installation
from agent.services.workspaces import DataDir
from agent.storage.backend import DATABASE_URL_SETTING, open_store
from managed_login import vault

if TYPE_CHECKING:
    from browser_adapters.session import Browsers
    from browser_adapters.webmail import WebMail

DATA_DIR_ENV = "OUTLOOP_DATA_DIR"
XDG_DATA_HOME_ENV = "XDG_DATA_HOME"
MAIL_AS_ENV = "OUTLOOP_MAIL_AS"
MAIL_POLL_ENV = "OUTLOOP_MAIL_POLL_SECONDS"
MCP_TOKEN_ENV = "OUTLOOP_MCP_TOKEN"  # noqa: S105 - the name of the variable, not a token
METRICS_TOKEN_ENV = "OUTLOOP_METRICS_TOKEN"  # noqa: S105 - the name of the variable, not a token
CRASHPOINT_ENV = "OUTLOOP_CRASHPOINT"
VAULT_DIR_ENV = "OUTLOOP_VAULT_DIR"
VAULT_BACKEND_ENV = "OUTLOOP_VAULT_BACKEND"
VAULT_KEY_FILE_ENV = "OUTLOOP_VAULT_KEY_FILE"
VAULT_KEY_ENV = "OUTLOOP_VAULT_KEY"
BROWSER_EXECUTABLE_ENV = "OUTLOOP_BROWSER_EXECUTABLE"
BROWSER_CONNECT_ENV = "OUTLOOP_BROWSER_CONNECT"
BROWSER_STATE_DIR_ENV = "OUTLOOP_BROWSER_STATE_DIR"

__all__ = [
    "BROWSER_CONNECT_ENV",
    "BROWSER_EXECUTABLE_ENV",
    "BROWSER_STATE_DIR_ENV",
    "CRASHPOINT_ENV",
    "DATABASE_URL_SETTING",
    "DATA_DIR_ENV",
    "MCP_TOKEN_ENV",
    "METRICS_TOKEN_ENV",
    "VAULT_BACKEND_ENV",
    "VAULT_DIR_ENV",
    "VAULT_KEY_ENV",
    "VAULT_KEY_FILE_ENV",
    "Providers",
    "Settings",
    "Station",
    "open_station",
    "open_vault",
    "provider_for",
    "read_settings",
]


@dataclass(frozen=True)
class Settings:
    """What the entry point read from its command line and the environment, once."""

    data_dir: Path
    database_url: str | None = field(default=None, repr=False)
    """OUTLOOP_DATABASE_URL: unset, the embedded SQLite store in the data directory; a
    postgresql:// URL, the shared PostgreSQL store. It may hold a password: never shown."""
    mcp_token: str | None = field(default=None, repr=False)
    """OUTLOOP_MCP_TOKEN: the bearer token the HTTP transport requires. Never shown."""
    metrics_token: str | None = field(default=None, repr=False)
    """OUTLOOP_METRICS_TOKEN: the bearer token ``/metrics``, ``/healthz`` and ``/readyz``
    require (a scraper's, apart from the MCP token). Never shown."""
    crashpoint: str | None = None
    """OUTLOOP_CRASHPOINT: the crash point a crash test arms (``name`` or ``name:skip``)."""
    vault_dir: Path | None = None
    """OUTLOOP_VAULT_DIR: the vault's directory (unset: ``vault`` in the data directory)."""
    vault_backend: str = "file"
    """OUTLOOP_VAULT_BACKEND: ``file``, the encrypted file (needs a key), or ``plain``, an
    unencrypted file for tests and throwaway demo vaults."""
    vault_key_file: Path | None = None
    """OUTLOOP_VAULT_KEY_FILE: the file holding the encrypted vault's key (read when the
    vault is opened)."""
    vault_key: Secret | None = field(default=None, repr=False)
    """OUTLOOP_VAULT_KEY: the encrypted vault's key itself, when no key file is given. Never
    shown."""

    browser_executable: str | None = None
    """OUTLOOP_BROWSER_EXECUTABLE: the Chromium the browser channel drives (unset: `chromium`
    on PATH, else Playwright's own)."""
    browser_connect: str | None = None
    """OUTLOOP_BROWSER_CONNECT: a Playwright browser server's ws:// URL, used instead of a
    local Chromium."""
    browser_state_dir: Path | None = None
    """OUTLOOP_BROWSER_STATE_DIR: where each mailbox's browser session is kept (unset:
    ``browser`` in the data directory)."""
    browser_headless: bool = True
    """False only for ``outloop login --headed`` (a person completes a challenge)."""
    mail_as: str | None = None
    """OUTLOOP_MAIL_AS: the internal mailbox this process acts as (the MCP server's default
    is ``agent``; ``outloop mail``'s is ``operator``)."""
    mail_poll_seconds: float = 2.0
    """OUTLOOP_MAIL_POLL_SECONDS: how often a running server delivers due internal mail,
    renews its heartbeat's freshness check and looks for new unread mail."""

    @property
    def browser_directory(self) -> Path:
        """Where browser sessions are kept: OUTLOOP_BROWSER_STATE_DIR, else
        ``<data_dir>/browser``."""
        if self.browser_state_dir is not None:
            return self.browser_state_dir
        return self.data_dir / "browser"

    @property
    def vault_directory(self) -> Path:
        """Where the vault lives: OUTLOOP_VAULT_DIR, else ``<data_dir>/vault``."""
        return self.vault_dir if self.vault_dir is not None else self.data_dir / "vault"


def read_settings(
    *, data_dir: Path | None = None, environ: Mapping[str, str] | None = None
) -> Settings:
    """The settings from the command line's values and the environment (``os.environ``
    unless given); the only place either is read. The data directory is ``data_dir`` (the
    command line's --data-dir), else OUTLOOP_DATA_DIR, else $XDG_DATA_HOME/outloop, else
    ~/.local/share/outloop."""
    env = os.environ if environ is None else environ
    return Settings(
        data_dir=data_dir if data_dir is not None else _default_data_dir(env),
        database_url=env.get(DATABASE_URL_SETTING) or None,
        mcp_token=env.get(MCP_TOKEN_ENV) or None,
        metrics_token=env.get(METRICS_TOKEN_ENV) or None,
        crashpoint=env.get(CRASHPOINT_ENV) or None,
        vault_dir=Path(env[VAULT_DIR_ENV]) if env.get(VAULT_DIR_ENV) else None,
        vault_backend=env.get(VAULT_BACKEND_ENV) or "file",
        vault_key_file=Path(env[VAULT_KEY_FILE_ENV]) if env.get(VAULT_KEY_FILE_ENV) else None,
        vault_key=Secret(env[VAULT_KEY_ENV]) if env.get(VAULT_KEY_ENV) else None,
        browser_executable=env.get(BROWSER_EXECUTABLE_ENV) or None,
        browser_connect=env.get(BROWSER_CONNECT_ENV) or None,
        browser_state_dir=(
            Path(env[BROWSER_STATE_DIR_ENV]) if env.get(BROWSER_STATE_DIR_ENV) else None
        ),
        mail_as=env.get(MAIL_AS_ENV) or None,
        mail_poll_seconds=float(env.get(MAIL_POLL_ENV) or 2.0),
    )


def _default_data_dir(env: Mapping[str, str]) -> Path:
    explicit = env.get(DATA_DIR_ENV)
    if explicit:
        return Path(explicit)
    xdg = env.get(XDG_DATA_HOME_ENV)
    base = Path(xdg) if xdg else Path.home() / ".local" / "share"
    return base / "outloop"


@dataclass(frozen=True)
class Station:
    """Everything one data directory needs, built once."""

    data_dir: DataDir
    store: EmbeddedStore
    """Every storage role; services take the roles they use from it."""
    provider_for: ProviderFactory

    async def aclose_channels(self) -> None:
        """Stop what the channels started in this process (a browser)."""
        if isinstance(self.provider_for, Providers):
            await self.provider_for.aclose()

    @property
    def board(self) -> TaskBoard:
        """Where humans see and move tasks: the embedded store's task table."""
        return self.store

    def close(self) -> None:
        self.store.close()


def open_station(settings: Settings) -> Station:
    """The data directory, the store the settings select (no database URL: SQLite in the
    data directory; a postgresql:// URL: the shared PostgreSQL database; anything else fails
    naming OUTLOOP_DATABASE_URL) and the mail provider adapters."""
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    running_code()  # what this process runs, read now: an upgrade on disk later is not it
    data_dir = DataDir(settings.data_dir)
    store = open_store(settings.database_url, data_dir.database)
    return Station(data_dir=data_dir, store=store, provider_for=Providers(settings, store))


def open_vault(settings: Settings) -> Vault:
    """The vault the settings select: the encrypted file (OUTLOOP_VAULT_BACKEND=file, the
    default) opened with the key from OUTLOOP_VAULT_KEY_FILE or OUTLOOP_VAULT_KEY, or the
    plain file (``plain``). Each missing or conflicting setting fails naming the variable
    that fixes it; a wrong key fails here, before anything is read."""
    backend = _vault_backend(settings.vault_backend)
    return vault.open_vault(settings.vault_directory, backend, _vault_key(settings, backend))


def _vault_backend(name: str) -> vault.Backend:
    for backend in vault.BACKENDS:
        if backend == name:
            return backend
    raise ContextError(
        f"{VAULT_BACKEND_ENV} is {name!r}; use 'file' (encrypted, with a key) or 'plain' "
        "(unencrypted, for tests and throwaway demo vaults)"
    )


def _vault_key(settings: Settings, backend: vault.Backend) -> Secret | None:
    """The key the backend needs (none for ``plain``), from the one place it was given."""
    key_file, key = settings.vault_key_file, settings.vault_key
    if key_file is not None and key is not None:
        raise ContextError(
            f"both {VAULT_KEY_FILE_ENV} and {VAULT_KEY_ENV} are set; unset one "
            f"({VAULT_KEY_FILE_ENV} keeps the key out of every process's environment)"
        )
    if backend == "plain":
        if key_file is not None or key is not None:
            raise ContextError(
                f"{VAULT_BACKEND_ENV} is 'plain' (unencrypted) but a vault key is set; "
                f"unset {VAULT_KEY_FILE_ENV} and {VAULT_KEY_ENV}, or use the 'file' backend"
            )
        return None
    if key_file is not None:
        return vault.read_key_file(key_file)
    if key is not None:
        return key
    raise ContextError(
        f"the encrypted vault needs its key: write it to a file only you can read and set "
        f"{VAULT_KEY_FILE_ENV} to its path (or set {VAULT_KEY_ENV}); for a throwaway demo "
        f"vault set {VAULT_BACKEND_ENV}=plain"
    )


class Providers:
    """The installed mail adapters, as the intake and the tools reach a workspace's mailbox:
    the first of its permitted channels, in the canonical order, that an adapter reaches.
    The vault is opened on first need (IMAP's password and the APIs' OAuth secrets are read
    from it; a refresh token the provider rotates is written back to it)."""

    def __init__(
        self,
        settings: Settings,
        health: Health | None = None,
        clock: Clock | None = None,
        *,
        registered: bool = True,
    ) -> None:
        self._settings = settings
        self._registered = registered
        """False while a workspace is bootstrapped: 'outloop connect' needs it registered,
        so a missing secret is named for 'outloop vault set'."""
        self._vault: Vault | None = None
        self._health = health
        self._clock: Clock = clock or SystemClock()
        self._browsers: Browsers | None = None
        self._refusals: dict[str, Refusal] = {}
        """Refusals met by this process's routes, by mailbox and binding (a changed binding
        is asked again)."""

    def __call__(self, workspace_id: str, binding: MailboxBinding) -> MailProvider:
        """The mailbox's one permitted channel, or a route through its permitted channels
        in the canonical order when it has several (``agent.services.access``)."""
        channels = binding.permitted_channels
        if len(channels) == 1:
            return self._build(workspace_id, binding, channels[0])
        return self.route(workspace_id, binding)

    def route(
        self,
        workspace_id: str,
        binding: MailboxBinding,
        channels: tuple[Channel, ...] | None = None,
    ) -> AccessRoute:
        """The access route through every permitted channel of the mailbox (or through
        ``channels`` of them), each step recorded in the health records when a store was
        given."""

        def record(channel: Channel, detail: str) -> None:
            if self._health is not None:
                key = f"access {workspace_id} {binding.mailbox_id} {channel}"
                self._health.record_health(key, detail, self._clock.now())

        key = f"{workspace_id} {_digest(binding)}"
        if key not in self._refusals:
            kept = self._kept_refusal(workspace_id, binding.mailbox_id, key)
            if kept is not None:
                self._refusals[key] = kept
        return AccessRoute(
            binding.provider,
            binding.mailbox_id,
            [
                Candidate(channel, partial(self._build, workspace_id, binding, channel))
                for channel in channels or binding.permitted_channels
            ],
            clock=self._clock,
            reads_after_refusal=binding.reads_after_refusal,
            record=record,
            refusals=self._refusals,
            key=key,
            keep_refusal=partial(self._keep_refusal, workspace_id, binding.mailbox_id, key),
            workspace_id=workspace_id,
        )

    def _keep_refusal(self, workspace_id: str, mailbox_id: str, key: str, refusal: Refusal) -> None:
        """A refusal, kept in the health records so every process of the station honours
        it (for ``REFUSAL_HOLD``, or until the mailbox's binding changes)."""
        if self._health is None:
            return
        detail = json.dumps(
            {
                "channel": refusal.channel.value,
                "action": refusal.action.value,
                "binding": key,
                "reason": refusal.reason,
            },
            ensure_ascii=False,
        )
        self._health.record_health(
            f"access refusal {workspace_id} {mailbox_id}", detail, refusal.at
        )

    def _kept_refusal(self, workspace_id: str, mailbox_id: str, key: str) -> Refusal | None:
        if self._health is None:
            return None
        wanted = f"access refusal {workspace_id} {mailbox_id}"
        for record in self._health.list_health():
            if record.key != wanted:
                continue
            try:
                kept = json.loads(record.detail)
                if kept["binding"] != key:
                    return None  # refused under another binding: the new one is asked
                return Refusal(
                    Channel(kept["channel"]),
                    Action(kept["action"]),
                    str(kept["reason"]),
                    record.recorded_at,
                )
            except (ValueError, KeyError, TypeError):
                return None
        return None

    def _build(self, workspace_id: str, binding: MailboxBinding, channel: Channel) -> MailProvider:
        """The adapter of one channel of the mailbox; ``Unsupported`` when this version has
        none, ``AuthenticationExpired`` when a secret it needs is not in the vault."""
        if binding.provider == "maildir" and channel is Channel.LOCAL:
            assert binding.path is not None  # the context model requires it
            return MaildirProvider(Path(binding.path), binding.mailbox_id)
        if channel is Channel.IMAP and binding.server is not None:
            name = binding.server.password
            self._secret(workspace_id, binding, name)  # a missing one fails here, named
            # Read again at each sign-in, so a password changed in the vault is used.
            password = partial(self._secret, workspace_id, binding, name)
            return ImapSmtpProvider(
                binding.server, binding.mailbox_id, password, provider=binding.provider
            )
        if channel is Channel.API and binding.provider in API_PROVIDERS:
            return self._api(workspace_id, binding)
        if channel is Channel.PROVIDER_MCP:
            return self._provider_mcp(workspace_id, binding)
        if channel is Channel.BROWSER and binding.provider in WEB_APPS:
            return self._browser(workspace_id, binding)
        raise Unsupported(
            f"mailbox {binding.mailbox_id}: no installed adapter reaches mail system "
            f"{binding.provider!r} through channel {channel}; this version has the embedded "
            "'maildir' (local files, with a path), 'imap' (an IMAP and SMTP server), the APIs "
            "of 'google' (Gmail) and 'microsoft' (Graph), a provider MCP server of a "
            "'microsoft' mailbox, and the web apps of both (Gmail, Outlook on the web)"
        )

    def _provider_mcp(self, workspace_id: str, binding: MailboxBinding) -> MailProvider:
        """The provider MCP server's channel; the vault entries it signs in with are read
        when a session opens (a missing one fails here, named)."""
        access = binding.provider_mcp
        if access is not None:
            for name in (*access.env.values(), *([access.token] if access.token else [])):
                self._secret(workspace_id, binding, name)
        # Imported when first needed: a station that reaches no MCP server never loads it.
        from agent.providers.provider_mcp import open_provider_mcp  # noqa: PLC0415

        return open_provider_mcp(binding, read=partial(self._secret, workspace_id, binding))

    def only(self, channel: Channel) -> ProviderFactory:
        """Each mailbox through ``channel`` alone (``outloop run --access browser``): a
        mailbox whose context does not permit it is not read, and a refusal the mailbox's
        other channels met holds here too (the route's own rules, on one channel)."""

        def build(workspace_id: str, binding: MailboxBinding) -> MailProvider:
            if channel not in binding.permitted_channels:
                raise AccessRefused(
                    f"mailbox {binding.mailbox_id} does not permit the {channel} channel in "
                    f"workspace {workspace_id}'s context"
                )
            if binding.permitted_channels == (channel,):
                return self(workspace_id, binding)  # as every run reaches it (its cursor)
            return self.route(workspace_id, binding, (channel,))

        return build

    def browser(
        self, workspace_id: str, binding: MailboxBinding, *, person_seconds: float | None = None
    ) -> WebMail:
        """The mailbox's browser channel (``outloop login``): ``person_seconds`` is how long a
        person has to complete a challenge in a visible browser."""
        if Channel.BROWSER not in binding.permitted_channels:
            raise AccessRefused(
                f"mailbox {binding.mailbox_id} does not permit the browser channel in workspace "
                f"{workspace_id}'s context; add 'browser' to its channels first"
            )
        if binding.provider not in WEB_APPS:
            raise Unsupported(
                f"mailbox {binding.mailbox_id}: this version drives the web app of "
                f"{', '.join(WEB_APPS)} mailboxes only"
            )
        return self._browser(workspace_id, binding, person_seconds)

    def _browser(
        self, workspace_id: str, binding: MailboxBinding, person_seconds: float | None = None
    ) -> WebMail:
        """The provider's web app in this process's browser; the worker's password and
        authenticator secret are read from the vault when a login needs them (a missing
        one fails here, named)."""
        access = binding.browser
        for name in (access.password, access.totp):
            self._secret(workspace_id, binding, name)
        # Imported when first needed: a station that never opens a browser never loads it.
        from browser_adapters.gmail import open_gmail_web  # noqa: PLC0415
        from browser_adapters.outlook import open_outlook_web  # noqa: PLC0415

        if self._browsers is None:
            self._browsers = browser_pool(self._settings)
        opened = open_outlook_web if WEB_APPS[binding.provider] == "outlook" else open_gmail_web
        return opened(
            self._browsers,
            workspace_id,
            binding,
            read=partial(self._secret, workspace_id, binding),
            person_seconds=person_seconds,
            challenges=None
            if self._health is None
            else challenges.Keeper(
                self._health, workspace_id, binding.mailbox_id, Channel.BROWSER, self._clock
            ),
        )

    async def aclose(self) -> None:
        """Stop this process's browser, if one was started."""
        if self._browsers is not None:
            browsers, self._browsers = self._browsers, None
            await browsers.aclose()

    def _api(self, workspace_id: str, binding: MailboxBinding) -> MailProvider:
        """The provider's API with the mailbox's OAuth secrets, each read from the vault
        when the credential needs it (a missing one fails here, named)."""
        names = (binding.api.client_id, binding.api.client_secret, binding.api.refresh_token)
        for name in names:
            self._secret(workspace_id, binding, name)
        return api_adapter(binding.provider)(
            binding,
            read=partial(self._secret, workspace_id, binding),
            write=partial(self._store_secret, workspace_id, binding),
            reconnect=connect_command(workspace_id, binding.mailbox_id),
        )

    def _store_secret(
        self, workspace_id: str, binding: MailboxBinding, name: str, value: Secret
    ) -> None:
        ref = CredentialRef(workspace_id=workspace_id, mailbox_id=binding.mailbox_id, name=name)
        if self._vault is None:
            self._vault = open_vault(self._settings)
        self._vault.set_secret(ref, value)

    def _secret(self, workspace_id: str, binding: MailboxBinding, name: str) -> Secret:
        ref = CredentialRef(workspace_id=workspace_id, mailbox_id=binding.mailbox_id, name=name)
        try:
            if self._vault is None:
                self._vault = open_vault(self._settings)
            return self._vault.secret(ref)
        except ContextError as exc:
            fix = (
                connect_command(workspace_id, binding.mailbox_id)
                if self._registered
                and binding.provider in API_PROVIDERS
                and Channel.API in binding.permitted_channels
                else f"outloop vault set {workspace_id} {binding.mailbox_id} {name}"
            )
            raise AuthenticationExpired(
                f"mailbox {binding.mailbox_id}: its {name!r} cannot be read from the vault "
                f"({exc}); store it with '{fix}'"
            ) from None


CODE_PACKAGES = ("agent", "mcp_server", "browser_adapters", "managed_login", "fixtures", "bench")
"""The import packages of the Outloop distribution: its running code."""


def installation(pack_target: Path | None = None) -> Installation:
    """Where this Outloop runs from: the interpreter, the directory its packages are
    installed in, and the distribution's version with the public pack release installed in
    ``pack_target`` (what a dispatcher records and verify compares: a dispatcher started
    before a pack install runs the previous installation)."""
    import sys  # noqa: PLC0415

    import agent  # noqa: PLC0415

    version = running_code()[0]
    release = pack_service.current_release(pack_target) if pack_target is not None else None
    if release is not None:
        version = f"{version} (pack {release})"
    install = str(Path(agent.__file__).resolve().parent.parent)
    return Installation(executable=sys.executable, install=install, version=version)


@cache
def running_code() -> tuple[str, dict[str, str]]:
    """The distribution's version and each of its modules' SHA-256, read once, when the
    station opens (what runs does not change under a process; files upgraded on disk after
    that are not what it runs)."""
    import importlib.metadata  # noqa: PLC0415
    import importlib.util  # noqa: PLC0415

    try:
        version = importlib.metadata.version("outloop")
    except importlib.metadata.PackageNotFoundError:
        version = "unknown"
    roots: list[Path] = []
    for name in CODE_PACKAGES:
        spec = importlib.util.find_spec(name)
        if spec is not None and spec.submodule_search_locations:
            roots.append(Path(next(iter(spec.submodule_search_locations))))
    return version, pack_service.code_files(roots)


def wheel_pin() -> WheelPin:
    """The running Outloop as the pack's pinned dependency."""
    version, files = running_code()
    return WheelPin(name="outloop", version=version, code_sha256=code_digest(files), files=files)


def pack_status(pack_target: Path) -> Drift:
    """The installed pack against the running code (a task record shows it)."""
    return pack_service.status(pack_target, running_code())


def _digest(binding: MailboxBinding) -> str:
    """The binding as it stands (a changed binding is another)."""
    return hashlib.sha256(binding.model_dump_json().encode()).hexdigest()[:16]


WEB_APPS = {"microsoft": "outlook", "google": "gmail"}
"""The mail systems whose own web app this version drives: Outlook on the web, Gmail."""


def browser_pool(settings: Settings) -> Browsers:
    """This process's browser, as the settings name it."""
    from browser_adapters.session import Browsers, BrowserSettings  # noqa: PLC0415

    return Browsers(
        BrowserSettings(
            state_dir=settings.browser_directory,
            executable=settings.browser_executable,
            connect=settings.browser_connect,
            headless=settings.browser_headless,
        )
    )


API_PROVIDERS = ("google", "microsoft")
"""The mail systems reached through their own API (Gmail API, Microsoft Graph)."""


def api_adapter(provider: str) -> Callable[..., MailProvider]:
    """The adapter that reaches mail system ``provider`` through its API, called with the
    binding and ``read``/``write``/``reconnect`` (its OAuth secrets by name)."""
    # Imported when first needed: a station that reaches no API never loads its client.
    from agent.providers import gmail_api, msgraph  # noqa: PLC0415

    return {"google": gmail_api.open_gmail, "microsoft": msgraph.open_graph}[provider]


def connect_command(workspace_id: str, mailbox_id: str) -> str:
    """The command that stores (or replaces) a mailbox's OAuth client and refresh token."""
    return f"outloop connect --workspace {workspace_id} --mailbox {mailbox_id}"


def provider_for(workspace_id: str, binding: MailboxBinding) -> MailProvider:
    """The channel a mailbox binding is read and sent through, with the settings of this
    process's environment (see ``Providers``)."""
    return Providers(read_settings())(workspace_id, binding)


def internal_mail(
    settings: Settings, default_as: str, clock: Clock | None = None, *, kind: Kind = "agent"
) -> InternalMail:
    """The internal mail tool of the mailbox this process acts as (OUTLOOP_MAIL_AS, else
    ``default_as``) in the data directory's mail network."""
    network = MailNetwork.of_data_dir(settings.data_dir, clock or SystemClock())
    return InternalMail(network, Identity(settings.mail_as or default_as, kind=kind))
