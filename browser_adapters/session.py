"""The browser machinery every web adapter shares.

- ``BrowserSettings``: which Chromium (an executable path: Debian's here, Playwright's own
  elsewhere) or a remote Playwright browser server (``connect``), headless or not, where
  sessions are kept, and the bound on every wait.
- ``Browsers``: one Playwright and one browser per process, started on first need. It
  refuses to start under Playwright's debug logs (they print what pages are given).
- ``MailboxBrowser``: one mailbox's browser: its storage state (session cookies) in a file
  of its own outside the repository (mode 600, in a directory of mode 700, never logged),
  a lock so two workers never drive one mailbox's session at once, the working context
  made from that state, and ``sign_in_context`` for managed login: a context of its own
  that never traces, records HAR or video, and is closed before work goes on.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import tempfile
import time
from collections.abc import AsyncGenerator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import IO, Any

import anyio
from playwright.async_api import Browser, BrowserContext, Playwright, async_playwright
from pydantic import BaseModel, ConfigDict, Field

from agent.domain.errors import TransientFailure, Unsupported
from managed_login.entry import refuse_recording

LAUNCH_ARGS = (
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--no-default-browser-check",
    "--password-store=basic",
    "--disable-features=PasswordManagerOnboarding,AutofillServerCommunication",
)
"""Headless Chromium on a server: no background traffic, no password manager prompts."""
LOCK_POLL_SECONDS = 0.05


class BrowserSettings(BaseModel):
    """How this station's browser is started, and where its sessions are kept."""

    model_config = ConfigDict(frozen=True)

    state_dir: Path = Field(description="where each mailbox's session is kept (mode 700)")
    executable: str | None = Field(
        default=None,
        description="the Chromium to drive (default: `chromium` on PATH, else Playwright's own)",
    )
    connect: str | None = Field(
        default=None, description="a Playwright browser server's ws:// URL, used instead"
    )
    headless: bool = True
    timeout_seconds: float = Field(default=20.0, gt=0, le=300)
    """The bound on every wait for a page, an element or the mailbox's lock."""

    @property
    def timeout_ms(self) -> float:
        return self.timeout_seconds * 1000


class Browsers:
    """One Playwright and one browser for this process, started when first asked for."""

    def __init__(self, settings: BrowserSettings) -> None:
        self.settings = settings
        self._playwright: Playwright | None = None
        self._browser: Browser | None = None
        self._lock = anyio.Lock()

    async def browser(self) -> Browser:
        async with self._lock:
            if self._browser is None or not self._browser.is_connected():
                self._browser = await self._start()
            return self._browser

    async def _start(self) -> Browser:
        refuse_recording()
        if self._playwright is None:
            self._playwright = await async_playwright().start()
        chromium = self._playwright.chromium
        if self.settings.connect:
            return await chromium.connect(self.settings.connect)
        return await chromium.launch(
            executable_path=self._executable(),
            headless=self.settings.headless,
            args=list(LAUNCH_ARGS),
            env=browser_env(),
        )

    def _executable(self) -> str | None:
        configured = self.settings.executable
        if configured:
            if not (Path(configured).is_file() and os.access(configured, os.X_OK)):
                raise Unsupported(
                    f"the browser {configured!r} is not an executable file: set the station's "
                    "browser executable to a Chromium, or leave it unset"
                )
            return configured
        return shutil.which("chromium")  # None: Playwright's own, where it is installed

    async def aclose(self) -> None:
        if self._browser is not None:
            await self._browser.close()
            self._browser = None
        if self._playwright is not None:
            await self._playwright.stop()
            self._playwright = None


SOCKET_DIR_MAX = 48
"""Chromium makes its singleton socket under TMPDIR (``.org.chromium.Chromium.XXXXXX/
SingletonSocket``); a Unix socket's path holds at most 107 bytes, so under a longer TMPDIR
Chromium stops at launch ("Socket path too long")."""


def browser_env() -> dict[str, str | float | bool] | None:
    """The browser's environment: this process's, with a TMPDIR short enough for Chromium's
    socket when this process's is not (None: unchanged)."""
    if len(tempfile.gettempdir()) <= SOCKET_DIR_MAX:
        return None
    return {**os.environ, "TMPDIR": "/tmp"}  # noqa: S108 - Chromium makes its own 0700 dir in it


def _private_dir(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    path.chmod(0o700)
    return path


class MailboxBrowser:
    """One mailbox's browser session: its kept state, its lock and its contexts."""

    def __init__(self, browsers: Browsers, workspace_id: str, mailbox_id: str) -> None:
        self._browsers = browsers
        self.mailbox_id = mailbox_id
        digest = hashlib.sha256(f"{workspace_id}\0{mailbox_id}".encode()).hexdigest()[:24]
        self._dir = browsers.settings.state_dir
        self.state_file = self._dir / f"{digest}.json"
        self._lock_file: IO[bytes] | None = None
        self._context: BrowserContext | None = None
        self._turn = anyio.Lock()
        """One task of this process at a time drives the session (the MCP server runs each
        request as a task of its own)."""
        self._driver: int | None = None

    @property
    def timeout_ms(self) -> float:
        return self._browsers.settings.timeout_ms

    def __repr__(self) -> str:
        return f"MailboxBrowser({self.mailbox_id!r})"

    @asynccontextmanager
    async def driving(self) -> AsyncGenerator[None]:
        """Hold the mailbox's lock (bounded) while the block drives its session: no other
        worker, and no other task of this process, drives it meanwhile (the task holding it
        may go on into another operation)."""
        task = anyio.get_current_task().id
        if self._driver == task:
            yield
            return
        try:
            with anyio.fail_after(self._browsers.settings.timeout_seconds * 2):
                await self._turn.acquire()
        except TimeoutError:
            raise TransientFailure(
                f"mailbox {self.mailbox_id}: another operation is using its browser session; "
                "try again when it is done"
            ) from None
        try:
            self._driver = task
            await self._take_lock()
            try:
                yield
            finally:
                self._release_lock()
        finally:
            self._driver = None
            self._turn.release()

    async def _take_lock(self) -> None:
        _private_dir(self._dir)
        handle = self.state_file.with_suffix(".lock").open("ab")
        deadline = time.monotonic() + self._browsers.settings.timeout_seconds
        while True:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                self._lock_file = handle
                return
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    handle.close()
                    raise TransientFailure(
                        f"mailbox {self.mailbox_id}: another worker is using its browser "
                        "session; try again when it is done"
                    ) from None
                await anyio.sleep(LOCK_POLL_SECONDS)

    def _release_lock(self) -> None:
        if self._lock_file is not None:
            handle, self._lock_file = self._lock_file, None
            fcntl.flock(handle, fcntl.LOCK_UN)
            handle.close()

    async def context(self) -> BrowserContext:
        """The working context, made from the kept session (used inside ``driving``)."""
        if self._context is None:
            self._context = await self._new_context()
        return self._context

    async def _new_context(self) -> BrowserContext:
        browser = await self._browsers.browser()
        state = str(self.state_file) if self.state_file.is_file() else None
        context = await browser.new_context(storage_state=state, accept_downloads=True)
        context.set_default_timeout(self.timeout_ms)
        context.set_default_navigation_timeout(self.timeout_ms)
        return context

    @asynccontextmanager
    async def sign_in_context(self) -> AsyncGenerator[BrowserContext]:
        """A context for managed login only: made from the kept session (a remembered
        device), never traced or recorded; its session is kept when the block ends well,
        and the working context is made again from it (used inside ``driving``)."""
        await self._close_context()
        context = await self._new_context()
        try:
            yield context
            self.keep(await context.storage_state())
        finally:
            await context.close()

    def keep(self, state: Any) -> None:
        """Write the session state (cookies: live credentials) where only this user reads
        it, replacing the old file atomically."""
        _private_dir(self._dir)
        fd, name = tempfile.mkstemp(dir=self._dir, prefix=".state-", suffix=".json")
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as out:
                json.dump(state, out)
            Path(name).chmod(0o600)
            Path(name).replace(self.state_file)
        except BaseException:
            Path(name).unlink(missing_ok=True)
            raise

    def last_code_step(self) -> int | None:
        """The last authenticator step a login of this mailbox submitted (no code: the
        step's number), so no process submits one code twice."""
        try:
            return int(self._code_step_file.read_text(encoding="ascii"))
        except (OSError, ValueError):
            return None

    def keep_code_step(self, step: int | None) -> None:
        if step is not None:
            _private_dir(self._dir)
            self._code_step_file.write_text(str(step), encoding="ascii")

    @property
    def _code_step_file(self) -> Path:
        return self.state_file.with_suffix(".step")

    @property
    def _refused_file(self) -> Path:
        return self.state_file.with_suffix(".refused")

    def password_refused_at(self) -> str | None:
        """When the provider refused the stored password, if it did since the last
        successful login (kept across processes: no worker types it again by itself)."""
        try:
            return self._refused_file.read_text(encoding="ascii").strip() or "earlier"
        except OSError:
            return None

    def note_password_refused(self, at: str) -> None:
        _private_dir(self._dir)
        self._refused_file.write_text(at, encoding="ascii")

    def clear_password_refused(self) -> None:
        self._refused_file.unlink(missing_ok=True)

    def forget(self) -> None:
        """Drop the kept session (a signed-out or refused session is not reused)."""
        self.state_file.unlink(missing_ok=True)

    async def _close_context(self) -> None:
        if self._context is not None:
            context, self._context = self._context, None
            await context.close()

    async def aclose(self) -> None:
        await self._close_context()
        self._release_lock()
