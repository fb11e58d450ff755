"""The composition root: settings are read here, once, and everything is built from them."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from agent.domain.context import MailboxBinding
from agent.domain.errors import ProviderError
from agent.ports import MailProvider, Store
from agent.providers.maildir import MaildirProvider
from agent.services.workspaces import DataDir
from agent.storage.backend import DATABASE_URL_SETTING, open_store

DATA_DIR_ENV = "OUTLOOP_DATA_DIR"


def default_data_dir() -> Path:
    """OUTLOOP_DATA_DIR, else $XDG_DATA_HOME/outloop, else ~/.local/share/outloop."""
    explicit = os.environ.get(DATA_DIR_ENV)
    if explicit:
        return Path(explicit)
    xdg = os.environ.get("XDG_DATA_HOME")
    base = Path(xdg) if xdg else Path.home() / ".local" / "share"
    return base / "outloop"


@dataclass(frozen=True)
class Station:
    """Everything one data directory needs, built once."""

    data_dir: DataDir
    store: Store

    def close(self) -> None:
        self.store.close()


def open_station(root: Path) -> Station:
    """The data directory, and the store OUTLOOP_DATABASE_URL selects (unset: SQLite in the
    data directory; a postgresql:// URL: the shared PostgreSQL database)."""
    root.mkdir(parents=True, exist_ok=True)
    data_dir = DataDir(root)
    store = open_store(os.environ.get(DATABASE_URL_SETTING), data_dir.database)
    return Station(data_dir=data_dir, store=store)


def provider_for(binding: MailboxBinding) -> MailProvider:
    """The adapter for one mailbox binding of a Workspace Context."""
    if binding.provider == "maildir":
        assert binding.path is not None  # the context model requires it
        return MaildirProvider(Path(binding.path), binding.mailbox_id)
    raise ProviderError(
        f"mailbox {binding.mailbox_id}: no adapter for provider {binding.provider!r} is "
        "installed in this version; the embedded provider is 'maildir' (with a path)"
    )
