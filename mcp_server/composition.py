"""The composition root: settings are read here, once, and everything is built from them.

The entry point (the ``outloop`` CLI; later the dispatcher and the console) calls
``read_settings`` once with its command line's values; nothing below it reads the
environment. ``open_station`` builds what every front end runs on from those settings: the
data directory, the store and the mail provider adapters.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from agent.domain.context import MailboxBinding
from agent.domain.errors import ProviderError
from agent.ports import EmbeddedStore, MailProvider, TaskBoard
from agent.providers.maildir import MaildirProvider
from agent.services.intake import ProviderFactory
from agent.services.workspaces import DataDir
from agent.storage.backend import DATABASE_URL_SETTING, open_store

DATA_DIR_ENV = "OUTLOOP_DATA_DIR"
XDG_DATA_HOME_ENV = "XDG_DATA_HOME"
MCP_TOKEN_ENV = "OUTLOOP_MCP_TOKEN"  # noqa: S105 - the name of the variable, not a token
CRASHPOINT_ENV = "OUTLOOP_CRASHPOINT"

__all__ = [
    "CRASHPOINT_ENV",
    "DATABASE_URL_SETTING",
    "DATA_DIR_ENV",
    "MCP_TOKEN_ENV",
    "Settings",
    "Station",
    "open_station",
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
    crashpoint: str | None = None
    """OUTLOOP_CRASHPOINT: the crash point a crash test arms (``name`` or ``name:skip``)."""


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
        crashpoint=env.get(CRASHPOINT_ENV) or None,
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
    data_dir = DataDir(settings.data_dir)
    store = open_store(settings.database_url, data_dir.database)
    return Station(data_dir=data_dir, store=store, provider_for=provider_for)


def provider_for(binding: MailboxBinding) -> MailProvider:
    """The adapter for one mailbox binding of a Workspace Context."""
    if binding.provider == "maildir":
        assert binding.path is not None  # the context model requires it
        return MaildirProvider(Path(binding.path), binding.mailbox_id)
    raise ProviderError(
        f"mailbox {binding.mailbox_id}: no adapter for provider {binding.provider!r} is "
        "installed in this version; the embedded provider is 'maildir' (with a path)"
    )
