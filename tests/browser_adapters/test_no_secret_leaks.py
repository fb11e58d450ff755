"""The worker's password, its authenticator secret and every code managed login generated
reach nothing but the vault, through a whole browser run of the real composition - for
each web app (Outlook on the web with Microsoft's sign-in, Gmail with Google's).

The run keeps everything it writes under one scan root: TMPDIR (Playwright's artifacts and
Chromium's profile, which the driver makes there), HOME and the XDG directories (Chromium's
NSS database, caches and crash reports), the data directory (the store, the kept browser
sessions) and its plain vault. The environment moves before Playwright starts, so the
driver and Chromium inherit it.

The run: ``outloop login``'s path (``Providers.browser``) meets a challenge after the
password (its exception kept); then the MCP server in-process: a login meets a refused
code (the provider's clock ahead) before the next step's code signs in, and a whole reply
goes out (intake, claim, render, a standing approval, send, read-back) with the session
expiring before the send, so a second login types the password and a third code. Kept for
the scan: every MCP result, error and server notification, every log record (DEBUG, with
tracebacks), every exception, and the captured output. Screenshots, aria and page snapshots
and traces fail the run if the adapter takes one; no context records HAR or video.

Then every file under the root - while Chromium runs, after the server stopped, after the
browser closed (its profile gone with it) - and every text kept are searched for the
password (a canary), the seed and every code generated, in every form the scanner knows:
no finding, no unreadable file. Chromium's stores of typed values (saved passwords, which it
encrypts, and form entries) are empty. The scan proves it sees: the vault's own file holds
the password and the seed, and a canary planted on purpose in an artifact is found.

The password leaves out the canary's non-ASCII character: the mock's sign-in answers a
non-ASCII password with HTTP 500 (``secrets.compare_digest`` on ``str``).
"""

from __future__ import annotations

import email.policy
import logging
import quopri
import sqlite3
import tempfile
import traceback
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from email.message import EmailMessage
from email.utils import format_datetime, make_msgid
from functools import partial
from pathlib import Path
from typing import Any

import pyotp
import pytest
from mcp import Client
from mcp.client.session import IncomingMessage
from mcp.shared.exceptions import MCPError
from mcp.types import CallToolResult, LoggingMessageNotificationParams
from playwright.async_api import Browser, BrowserContext, Locator, Page
from playwright.async_api._generated import Tracing
from pyotp.totp import TOTP

from agent.domain.errors import AuthChallengeUnresolved
from agent.domain.records import TaskAmendment
from agent.domain.secrets import CredentialRef, Secret
from agent.services import challenges, workspaces
from agent.storage.sqlite import SqliteStore
from agent.testing.contexts import context_yaml
from agent.testing.leaks import (
    Canary,
    Needle,
    TotpCodes,
    TotpSeed,
    scan_file,
    scan_text,
    scan_tree,
)
from browser_adapters import webmail
from browser_adapters.session import Browsers
from fixtures.admin import MockAdmin
from managed_login.totp import STEP_SECONDS, Codes
from managed_login.vault import KeyringVault
from mcp_server import composition
from mcp_server.composition import Settings, read_settings
from mcp_server.server import build_server
from tests.browser import chromium_executable
from tests.browser_adapters.outlook_mock import CLOCK, WebClock
from tests.conftest import session_mock
from tests.mcp.test_imap_scenarios import MailServerTime

pytestmark = pytest.mark.anyio

WORKSPACE = "ws-leaks-0001"
CLIENT = "dana.levi@contoso.test"
APPROVER = "noa.bar@fabrikam.test"
STANDING = (
    "approval: {roles: [approver], standing: [{scope: message_class, class: "
    f"receipt-confirmation, granted_by: {APPROVER}}}]}}"
)


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


class RecordedCodes(Codes):
    """The worker's codes, each one generated kept by the test (never by the product)."""

    def __init__(self, secret: Secret, *, given: list[str], **kwargs: Any) -> None:
        super().__init__(secret, **kwargs)
        self._given = given

    async def next(self) -> Secret:
        code = await super().next()
        self._given.append(code.reveal())
        return code


class Recorder(logging.Handler):
    """Every log record, formatted with its traceback as a handler would write it."""

    def __init__(self, texts: list[tuple[str, str]]) -> None:
        super().__init__(logging.DEBUG)
        self.texts = texts
        self.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))

    def emit(self, record: logging.LogRecord) -> None:
        self.texts.append(
            (f"a log record of {record.name} ({record.levelname})", self.format(record))
        )


@dataclass(frozen=True)
class WebApp:
    """A mail system's web app on the mock: where it is, the challenge its sign-in meets
    first, and its sign-in's host."""

    provider: str
    path: str
    challenge: str
    signin_host: str


WEB_APPS = [
    WebApp("microsoft", "/web/outlook/mail/", "approve_sign_in", "login.microsoftonline.com"),
    WebApp("google", "/web/gmail/mail/u/0/", "verify_its_you", "accounts.google.com"),
]


@dataclass
class Run:
    """The scan root, the station's settings and what the run kept to be scanned."""

    root: Path
    admin: MockAdmin
    address: str
    settings: Settings
    password: Canary
    seed: str
    clock: WebClock
    web: WebApp
    codes: list[str] = field(default_factory=list[str])
    texts: list[tuple[str, str]] = field(default_factory=list[tuple[str, str]])
    pools: list[Browsers] = field(default_factory=list[Browsers])
    forbidden: list[str] = field(default_factory=list[str])
    contexts: list[dict[str, Any]] = field(default_factory=list[dict[str, Any]])

    def kept(self, where: str, text: object) -> None:
        self.texts.append((where, str(text)))

    def exception(self, where: str, exc: BaseException) -> None:
        """An exception: its message, repr, every attribute a handler might print, and
        its traceback."""
        self.kept(f"{where} (message)", exc)
        self.kept(f"{where} (repr)", repr(exc))
        self.kept(f"{where} (attributes)", vars(exc))
        self.kept(f"{where} (traceback)", "".join(traceback.format_exception(exc)))

    def result(self, where: str, result: object) -> None:
        self.kept(where, result)
        self.kept(f"{where} (repr)", repr(result))
        dump = getattr(result, "model_dump_json", None)
        if callable(dump):
            self.kept(f"{where} (JSON)", dump())
        data = getattr(result, "data", None)
        if data is not None:
            self.kept(f"{where} (data)", data)

    @property
    def vault_file(self) -> Path:
        vault = composition.open_vault(self.settings)
        assert isinstance(vault, KeyringVault)
        return vault.keyring_file

    def store(self) -> SqliteStore:
        return SqliteStore(workspaces.DataDir(self.settings.data_dir).database)


@pytest.fixture(params=WEB_APPS, ids=[f"{w.provider}_web" for w in WEB_APPS])
async def run(
    tmp_path_factory: pytest.TempPathFactory,
    monkeypatch: pytest.MonkeyPatch,
    request: pytest.FixtureRequest,
    anyio_backend: str,
) -> AsyncIterator[Run]:
    """A scan root holding everything the run writes, the environment pointing there, a
    workspace whose mailbox (Microsoft's, Google's) permits only the browser channel, and
    the worker's password (a canary) and a fresh authenticator secret in its plain vault."""
    del anyio_backend
    web: WebApp = request.param
    admin = session_mock()  # the provider, started before the environment moves: not ours
    chromium = chromium_executable()
    # Short: Chromium's singleton socket lies in TMPDIR, and a socket's path is 107 bytes.
    root = tmp_path_factory.mktemp("leaks")
    home = root / "home"
    env = {
        "TMPDIR": root / "tmp",
        "HOME": home,
        "XDG_CONFIG_HOME": home / ".config",
        "XDG_CACHE_HOME": home / ".cache",
        "XDG_DATA_HOME": home / ".local" / "share",
        "XDG_STATE_HOME": home / ".local" / "state",
    }
    for name, path in env.items():
        path.mkdir(parents=True, exist_ok=True)
        monkeypatch.setenv(name, str(path))
    monkeypatch.setattr(tempfile, "tempdir", str(env["TMPDIR"]))
    settings = read_settings(
        environ={
            "XDG_DATA_HOME": str(env["XDG_DATA_HOME"]),
            "OUTLOOP_VAULT_BACKEND": "plain",
            "OUTLOOP_BROWSER_EXECUTABLE": chromium,
        }
    )
    assert settings.data_dir.is_relative_to(root) and settings.browser_directory.is_relative_to(
        root
    )

    address = f"leaks-{uuid.uuid4().hex[:10]}@fabrikam.test"
    # ASCII only: the mock's sign-in refuses a non-ASCII password (see above).
    password, seed = Canary.plant(ascii_only=True), pyotp.random_base32(32)
    password.what = "the password"
    admin.account(address, web.provider, password=password.value, totp_secret=seed)
    found = Run(root, admin, address, settings, password, seed, WebClock(admin), web)

    codes = partial(RecordedCodes, given=found.codes, clock=found.clock, sleep=found.clock.sleep)
    monkeypatch.setattr(webmail, "Codes", codes)
    browser_pool = composition.browser_pool

    def kept_pool(settings: Settings) -> Browsers:
        found.pools.append(browser_pool(settings))
        return found.pools[-1]

    monkeypatch.setattr(composition, "browser_pool", kept_pool)
    _refuse_recordings(monkeypatch, found)

    fields = f"channels: [browser], browser: {{url: '{admin.base_url}{web.path}'}}"
    text = context_yaml(WORKSPACE, mailbox=address, provider=web.provider, mailbox_fields=fields)
    text = text.replace("approval: {roles: [approver], standing: []}", STANDING)
    source = root / "contexts" / f"{WORKSPACE}.yaml"
    source.parent.mkdir()
    source.write_text(text, encoding="utf-8")
    station = composition.open_station(settings)
    try:
        workspaces.add_workspace(station.store, station.data_dir, source, datetime.now(UTC))
    finally:
        station.close()
    vault = composition.open_vault(settings)
    for name, value in (("password", password.value), ("totp", seed)):
        ref = CredentialRef(workspace_id=WORKSPACE, mailbox_id=address, name=name)
        vault.set_secret(ref, Secret(value))

    recorder = Recorder(found.texts)
    root_logger = logging.getLogger()
    level = root_logger.level
    root_logger.addHandler(recorder)
    root_logger.setLevel(logging.DEBUG)
    try:
        yield found
    finally:
        for pool in found.pools:  # closed by the test; here too when it failed first
            await pool.aclose()
        root_logger.removeHandler(recorder)
        root_logger.setLevel(level)
        admin.clear_faults()


def _refuse_recordings(monkeypatch: pytest.MonkeyPatch, run: Run) -> None:
    """Screenshots, aria and page snapshots, and traces fail the run when taken; every
    context's options are kept (no HAR, no video)."""

    def refused(name: str) -> Callable[..., Awaitable[Any]]:
        async def call(*args: Any, **kwargs: Any) -> Any:
            del args, kwargs
            run.forbidden.append(name)
            raise AssertionError(f"the adapter called {name}")

        return call

    for owner, name in (
        (Page, "screenshot"),
        (Page, "content"),
        (Locator, "screenshot"),
        (Locator, "aria_snapshot"),
        (Tracing, "start"),
        (Tracing, "start_chunk"),
    ):
        monkeypatch.setattr(owner, name, refused(f"{owner.__name__}.{name}"))
    new_context = Browser.new_context

    async def recorded_context(self: Browser, **kwargs: Any) -> BrowserContext:
        run.contexts.append(kwargs)
        return await new_context(self, **kwargs)

    monkeypatch.setattr(Browser, "new_context", recorded_context)


def _request(address: str) -> bytes:
    """The client's request, as her mail server delivers it."""
    message = EmailMessage(policy=email.policy.SMTP)
    message["From"] = f"Dana Levi <{CLIENT}>"
    message["To"] = address
    message["Subject"] = "Quote request"
    message["Date"] = format_datetime(datetime.now(UTC))
    message["Message-ID"] = make_msgid(domain="contoso.test")
    message.set_content("Could you send me a quote for the Q4 licences?")
    return message.as_bytes()


async def _challenged_login(run: Run) -> None:
    """``outloop login``'s path (``Providers.browser``): the sign-in meets a challenge after
    the password; the exception is kept."""
    run.admin.faults(web_challenge=run.web.challenge)
    station = composition.open_station(run.settings)
    try:
        [binding] = workspaces.load_context(station.store, WORKSPACE).mailboxes
        providers = station.provider_for
        assert isinstance(providers, composition.Providers)
        channel = providers.browser(WORKSPACE, binding)
        try:
            with pytest.raises(AuthChallengeUnresolved) as stopped:
                await channel.login()
            run.exception("the challenged login's exception", stopped.value)
            assert stopped.value.challenge == run.web.challenge, str(stopped.value)
            [kept] = challenges.listed(station.store, WORKSPACE)  # kept for every process
            assert kept.open and kept.challenge == run.web.challenge
            # a person resolves it in a visible browser: `outloop login --headed` records so
            done = challenges.signed_in(
                station.store, WORKSPACE, binding.mailbox_id, "browser", datetime.now(UTC)
            )
            assert done is not None and not done.open
        finally:
            await channel.aclose()
            await providers.aclose()
    finally:
        station.close()
        run.admin.faults(web_challenge=None)


@dataclass
class Tools:
    """The MCP client, each result and error kept for the scan."""

    client: Client
    run: Run

    async def call(self, tool: str, **arguments: Any) -> dict[str, Any]:
        try:
            result = await self.client.call_tool(tool, arguments)
        except MCPError as exc:
            self.run.exception(f"the MCP error of {tool}", exc)
            raise
        self.run.result(f"the MCP result of {tool}", result)
        assert isinstance(result, CallToolResult)
        assert not result.is_error, f"{tool} failed: {result.content}"
        assert result.structured_content is not None
        return result.structured_content


async def _reply_through_the_browser(run: Run, tools: Tools) -> None:
    """The whole lifecycle of one client request over the browser channel: the first
    login meets a refused code, the session expires before the send."""
    run.admin.faults(web_clock=CLOCK + 5 * STEP_SECONDS)  # the provider's clock is ahead
    access = await tools.call("access_status", workspace_id=WORKSPACE)
    [mailbox] = access["mailboxes"]
    assert mailbox["ok"] is True and mailbox["path"] == "browser", mailbox

    run.admin.deliver(run.address, _request(run.address))
    scanned = await tools.call("intake", mailbox_id=run.address)
    assert scanned["access_errors"] == [], scanned
    [item] = scanned["items"]
    claim = await tools.call("claim", run_id=item["run_id"], item_ref=item["item_ref"])
    task_id = claim["task_id"]
    for state in ("EXECUTING", "VERIFYING", "DRAFT_READY"):
        await tools.call("transition_task", task_id=task_id, state=state, evidence=f"w {state}")
    draft = await tools.call(
        "render", task_id=task_id, body_markdown="We got your request.", language="en"
    )
    store = run.store()
    try:
        store.amend_task(
            task_id,
            TaskAmendment(event="classified", message_class="receipt-confirmation"),
            datetime.now(UTC),
        )
    finally:
        store.close()
    await tools.call("record_approval", task_id=task_id, standing_class="receipt-confirmation")

    # Signed out: the send signs in again, asked for a code even on a remembered device.
    run.admin.faults(expire_web_sessions=True, web_totp_again=True)
    sent = await tools.call("send", task_id=task_id, draft_id=draft["draft_id"], to=[CLIENT])
    assert sent["status"] == "sent" and sent["channel"] == "browser", sent
    checked = await tools.call("read_back", send_id=sent["send_id"])
    # Exchange and Gmail give a message sent through their web apps a Message-ID of their
    # own: the read-back's message_id check is the browser channel's to settle, not this
    # test's.
    failed = [c for c in checked["checks"] if not c["ok"] and c["name"] != "message_id"]
    assert failed == [], failed
    for run_id in scanned["run_ids"]:
        await tools.call("reconcile", run_id=run_id)


async def _signed_in_pages_hold_no_secret(run: Run) -> None:
    """After the logins: only the working context is open (each sign-in context was
    closed), none of its pages is a sign-in page, and no password field holds a value."""
    [pool] = run.pools[-1:]
    browser = await pool.browser()
    [context] = browser.contexts
    for page in context.pages:
        assert run.web.signin_host not in page.url, page.url
        typed = "input[type=password], input[name=otc], input[autocomplete=one-time-code]"
        values = await page.locator(typed).evaluate_all("els => els.map(e => e.value)")
        assert not any(values)


def _profiles(run: Run) -> list[Path]:
    """Chromium's profiles: the driver makes each in its TMPDIR, the root's."""
    return sorted((run.root / "tmp").glob("playwright_chromiumdev_profile-*"))


SAVED = {
    "Login Data": ("logins", "stats", "password_notes", "insecure_credentials"),
    "Login Data For Account": ("logins", "stats", "password_notes", "insecure_credentials"),
    "Web Data": ("autocomplete", "autofill"),
}
"""The profile's stores of what a person typed: saved passwords (each one encrypted, so a
scan of the bytes would not see it), save-prompt statistics, form entries."""


def _saved_entries(profile: Path) -> dict[str, int]:
    """The rows of each store in the profile (read as it lies, without Chromium's lock)."""
    rows: dict[str, int] = {}
    for name, tables in SAVED.items():
        path = profile / "Default" / name
        if not path.exists():
            continue
        db = sqlite3.connect(f"{path.as_uri()}?mode=ro&immutable=1", uri=True)
        try:
            present = {r[0] for r in db.execute("SELECT name FROM sqlite_master")}
            for table in (t for t in tables if t in present):
                [(count,)] = db.execute(f"SELECT count(*) FROM {table}").fetchall()
                rows[f"{name}/{table}"] = count
        finally:
            db.close()
    return rows


@dataclass
class Coverage:
    """What the scans read, and what they found."""

    findings: list[str] = field(default_factory=list[str])
    files: set[Path] = field(default_factory=set[Path])
    texts: int = 0

    def files_now(self, root: Path, needles: list[Needle], skip: Path, when: str) -> None:
        """Every file under the root (the vault's own file aside), scanned now."""
        report = scan_tree(needles, root, skip=[skip])
        self.findings += [f"{when}: {line}" for line in report.lines()]
        self.files |= {p for p in root.rglob("*") if p.is_file() and not p.is_symlink()}

    def texts_kept(self, run: Run, needles: list[Needle]) -> None:
        for where, text in run.texts:
            self.findings += [str(f) for f in scan_text(needles, text, where)]
            self.texts += 1


def _needles(run: Run) -> list[Needle]:
    """The password, the seed, and every code generated: each one the worker's codes gave,
    and every step's code between the run's first and last clock (a superset)."""
    totp = TOTP(run.seed, interval=STEP_SECONDS)
    first, last = int(CLOCK // STEP_SECONDS), int(run.clock.now // STEP_SECONDS)
    every = [totp.at(step * STEP_SECONDS) for step in range(first, last + 1)]
    return [run.password, TotpSeed(run.seed), TotpCodes([*run.codes, *every])]


async def test_a_browser_run_leaves_no_password_seed_or_code_anywhere_but_the_vault(
    run: Run, capfd: pytest.CaptureFixture[str]
) -> None:
    await _challenged_login(run)
    scanned = Coverage()
    server = build_server(run.settings, clock=MailServerTime())

    async def logged(params: LoggingMessageNotificationParams) -> None:
        run.kept("an MCP log notification", params.model_dump_json())

    async def notified(message: IncomingMessage) -> None:
        run.kept("an MCP notification", repr(message))

    client = Client(server, logging_callback=logged, message_handler=notified, log_level="debug")
    async with client:
        await _reply_through_the_browser(run, Tools(client, run))
        await _signed_in_pages_hold_no_secret(run)
        needles = _needles(run)
        [profile] = _profiles(run)  # Chromium's profile, under the root while it runs
        scanned.files_now(run.root, needles, run.vault_file, "while the browser ran")
    # The server closed its channels (their contexts); Chromium still runs: its profile
    # scanned again, and its stores of typed values hold nothing.
    scanned.files_now(run.root, needles, run.vault_file, "after the server stopped")
    saved = _saved_entries(profile)  # those Chromium made by now (it makes them lazily)
    assert saved == dict.fromkeys(saved, 0), saved
    for pool in run.pools:
        await pool.aclose()
    assert _profiles(run) == [], "Chromium's profile outlived the browser"
    scanned.files_now(run.root, needles, run.vault_file, "after the browser closed")

    captured = capfd.readouterr()
    run.kept("the captured standard output", captured.out)
    run.kept("the captured standard error", captured.err)
    scanned.texts_kept(run, needles)

    codes = needles[-1]
    assert isinstance(codes, TotpCodes)
    assert len(run.codes) == 3, "a refused code, the next step's, and the second login's"
    assert run.codes[0] != run.codes[1], "the refused code and the accepted one"
    assert run.forbidden == []
    assert [k for k in run.contexts if {"record_har_path", "record_video_dir"} & set(k)] == []
    covered = f"{len(scanned.files)} files, {scanned.texts} texts, {len(codes.codes)} codes"
    assert scanned.findings == [], "\n".join([covered, *scanned.findings])
    assert scanned.texts > 30 and len(scanned.files) > 50

    # The scan sees: the vault's file holds the password and the seed (base64, as the
    # plain keyring writes them), and a canary planted in an artifact is found.
    held = {(f.what, f.form) for f in scan_file(needles, run.vault_file)}
    assert held == {("the password", "base64"), ("the TOTP seed", "base64")}, held
    planted = Canary.plant()
    artifact = run.root / "tmp" / "downloaded.eml"
    body = quopri.encodestring(f"{'x' * 70}{planted.value}".encode())
    artifact.write_bytes(b"Content-Transfer-Encoding: quoted-printable\r\n\r\n" + body)
    report = scan_tree([*needles, planted], run.root, skip=[run.vault_file])
    assert [(f.where, f.what, f.form) for f in report.findings] == [
        (str(artifact), "the canary", "quoted-printable")
    ]
