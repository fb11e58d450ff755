"""``outloop bench browser``: one reply and the read-back of its stored copy through the
Outlook on the web adapter, against the same page actions scripted directly with Playwright
in the same run, in the same browser.

The bench starts its own throwaway mock providers (``outloop fixtures serve`` on a free
loopback port, its own process: ``fixtures/admin.py``'s ``MockServer``, handed in by the
CLI) and creates one Microsoft account with a password and an authenticator secret of its
own. The TOTP clock is the mock's ``web_clock`` fault, moved by the worker's codes instead
of waiting (as the adapter's tests do). Chromium is the station's (``BrowserSettings``:
``OUTLOOP_BROWSER_EXECUTABLE``, else ``chromium`` on PATH), headless.

Outlook on the web is built by the CLI as the station builds it (``OutlookWeb`` on a
``MailboxBrowser`` of ``Browsers``, the worker's password and codes): the bench imports
nothing of ``browser_adapters`` or ``managed_login`` (the dependency rule in
ARCHITECTURE.md); it is handed the channel, the page objects of
``browser_adapters/outlook_pages.py`` and a second context of the same browser made from
the kept session.

- **adapter** (the product): the channel signs in once (managed login) before anything is
  timed, and the same instance serves every round, so its browser, context and page are
  warm. A round is ``prepare`` + ``send`` + ``find_sent`` of a reply to a client message
  delivered for the round, as the lifecycle's send and read-back call them. The channel
  reads the new parent before the clock starts (``changes``, as the intake that took it in
  read it), as the baseline looks its parent up before the clock; a channel that has not
  read the parent looks for it conversation by conversation (docs/browser.md, "Known
  limits"), which this bench does not time.
- **baseline**: the same page actions written directly with Playwright, with the same
  locators (``MailPage``, ``Composer``), waiting for the same conditions and nothing more,
  on the parent item the bench looked up before the clock started: open the parent item,
  Reply, replace the recipient chips, set the subject, insert the same HTML as the adapter
  (the rendered reply in a block whose class is the send's token) with the editor's
  ``insertHTML``, press Send and wait for the ``_api/send`` answer; then open Sent Items,
  open the conversation's row (its newest item, our copy, is shown), "View message source",
  read it.

After one warm-up round of each side (the adapter's first send also sets the mailbox's
"Mark as read" option), ``rounds`` rounds run, alternating which side goes first. Each
side's page loads (navigation requests of its context) and requests are counted per round.
``duplicates`` and ``lost`` are counted from the mock's Sent Items: copies beyond one per
send, and sends without a copy or whose copy was not read back as ours.
"""

from __future__ import annotations

import base64
import os
import re
import secrets
import statistics
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import quote, unquote, urlsplit

import anyio
from playwright.async_api import BrowserContext, Locator, Page, Request, Response

from agent.domain.envelope import Address
from agent.domain.mail import OutgoingMessage
from agent.domain.secrets import Secret
from agent.ports import MailProvider
from agent.providers import mime, rfc822
from agent.rendering.render import render_message
from bench.intake_common import CLIENT, MAILBOX, BenchError, message_id, raw_message

TARGET_RATIO = 1.5
"""The adapter's median round at most this many times the baseline's."""
WARMUP = 1
APP = "/web/outlook/mail/"
COLLEAGUE = "noa.bar@fabrikam.test"
DRAFT = """Hello Dana,

The delivery of order {n} is booked for **30/11/2026 at 10:30**. The invoice \
(INV-2026-{n:04d}) is attached to the order at https://portal.contoso.test/orders/{n}.

- Questions: support@fabrikam.test or 03-555-1234.

"""
INSERT_HTML = "(el, markup) => { el.focus(); document.execCommand('insertHTML', false, markup); }"


# -- what the CLI hands in ----------------------------------------------------------------


class MockAdmin(Protocol):
    """What the bench uses of ``fixtures.admin.MockAdmin``."""

    @property
    def base_url(self) -> str: ...
    def account(self, address: str, provider: str = ..., **extra: Any) -> dict[str, Any]: ...
    def deliver(self, to: str, raw: bytes) -> dict[str, Any]: ...
    def stored(self, address: str, folder: str | None = None) -> list[dict[str, Any]]: ...
    def faults(self, **switches: Any) -> dict[str, Any]: ...
    def web_clock(self) -> WebClock: ...


class WebClock(Protocol):
    """``fixtures.admin.WebClock``: the mock's TOTP clock, moved instead of waited for."""

    def __call__(self) -> float: ...
    async def sleep(self, seconds: float) -> None: ...


class MockServer(Protocol):
    """``fixtures.admin.MockServer``: the mock providers as a child process."""

    def start(self) -> MockAdmin: ...
    def stop(self) -> None: ...


class MailPageObjects(Protocol):
    """``browser_adapters.outlook_pages.MailPage``: the locators the baseline uses."""

    @property
    def message_list(self) -> Locator: ...
    @property
    def rows(self) -> Locator: ...
    @property
    def shown_item(self) -> Locator: ...
    @property
    def more_actions(self) -> Locator: ...
    @property
    def view_source(self) -> Locator: ...
    @property
    def source(self) -> Locator: ...
    @property
    def reply(self) -> Locator: ...


class ComposerObjects(Protocol):
    """``browser_adapters.outlook_pages.Composer``."""

    @property
    def subject(self) -> Locator: ...
    @property
    def body(self) -> Locator: ...
    @property
    def send(self) -> Locator: ...
    def chips(self, field: str) -> Locator: ...
    def field(self, name: str) -> Locator: ...
    def remove(self, address: str) -> Locator: ...


class WebChannel(MailProvider, Protocol):
    """``browser_adapters.outlook.OutlookWeb``."""

    async def login(self) -> object: ...


@dataclass(frozen=True)
class Worker:
    """The mailbox's worker account as the vault would hold it, and the clock its codes
    read (the mock's ``web_clock``)."""

    address: str
    password: Secret
    totp_secret: Secret
    clock: Callable[[], float]
    sleep: Callable[[float], Awaitable[None]]


@dataclass(frozen=True)
class Outlook:
    """Outlook on the web as the station drives it, built by the CLI."""

    channel: WebChannel
    working_context: Callable[[], Awaitable[BrowserContext]]
    """The channel's own working context (its page loads are counted there)."""
    baseline_context: Callable[[], Awaitable[BrowserContext]]
    """A new context of the same browser, made from the kept session as the channel's is."""
    mail_page: Callable[[Page], MailPageObjects]
    composer: Callable[[Page], ComposerObjects]
    aclose: Callable[[], Awaitable[None]]


OutlookFactory = Callable[[str, Worker, Path], Outlook]
"""Outlook on the web at the app's URL for the worker, its session kept in the directory."""
MockServerFactory = Callable[[Path], MockServer]


# -- the mailbox --------------------------------------------------------------------------


@dataclass(frozen=True)
class Parent:
    """A client message delivered for one side of one round."""

    number: int
    message_id: str
    thread_id: str
    subject: str


def _deliver(admin: MockAdmin, number: int) -> Parent:
    answer = admin.deliver(MAILBOX, raw_message(number, 1))
    return Parent(
        number,
        message_id(number, 1),
        str(answer["thread_id"]),
        f"Order {number}: delivery date",
    )


def reply_to(parent: Parent, run: str) -> OutgoingMessage:
    """Our reply to ``parent`` (to the client, a colleague in Cc), rendered as the core
    renders a reply (the channel marks it with the send's token)."""
    mid = f"<bench-browser-{run}-{parent.number}@fabrikam.test>"
    subject = f"RE: {parent.subject}"
    rendered = render_message(
        DRAFT.format(n=parent.number), subject=subject, language="en",
        signature="Noa Bar\nFabrikam Support",
    )  # fmt: skip
    return OutgoingMessage(
        provider_thread_id=parent.thread_id,
        in_reply_to=parent.message_id,
        references=(parent.message_id,),
        sender=Address(address=MAILBOX),
        to=(Address(address=CLIENT.split("<")[1].rstrip(">")),),
        cc=(Address(address=COLLEAGUE),),
        subject=subject,
        text=rendered.text,
        html=rendered.html,
        internet_message_id=mid,
    )


# -- counting what a side's context loads ---------------------------------------------------


@dataclass
class Loads:
    """Navigation requests (page loads) and all requests of one context."""

    pages: int = 0
    requests: int = 0

    def watch(self, context: BrowserContext) -> None:
        context.on("request", self._seen)

    def _seen(self, request: Request) -> None:
        self.requests += 1
        if request.is_navigation_request():
            self.pages += 1

    def now(self) -> tuple[int, int]:
        return self.pages, self.requests


# -- one round of each side ---------------------------------------------------------------


@dataclass
class Side:
    """One side's rounds: seconds by phase, page loads, requests, and what was read back."""

    phases: dict[str, list[float]] = field(default_factory=dict[str, list[float]])
    totals: list[float] = field(default_factory=list[float])
    pages: list[int] = field(default_factory=list[int])
    requests: list[int] = field(default_factory=list[int])
    tokens: list[str] = field(default_factory=list[str])
    read_back: int = 0

    def add(self, phases: dict[str, float], loads: tuple[int, int]) -> None:
        for name, seconds in phases.items():
            self.phases.setdefault(name, []).append(seconds)
        self.totals.append(sum(phases.values()))
        self.pages.append(loads[0])
        self.requests.append(loads[1])


async def adapter_round(
    channel: WebChannel, message: OutgoingMessage
) -> tuple[dict[str, float], bool]:
    """``prepare`` + ``send`` + ``find_sent`` of the reply; seconds of each, and whether the
    copy read back carries the token."""
    started = time.perf_counter()
    handover = await channel.prepare(message)
    prepared = time.perf_counter()
    await channel.send(handover)
    sent = time.perf_counter()
    assert handover.marker is not None
    copy = await channel.find_sent(handover.marker)
    found = time.perf_counter()
    ok = copy is not None and _marked(copy.html or "", message)
    phases = {
        "prepare_s": prepared - started,
        "send_s": sent - prepared,
        "find_sent_s": found - sent,
    }
    return phases, ok


@dataclass(frozen=True)
class Script:
    """The baseline: the same page actions written directly with Playwright."""

    page: Page
    app: str
    mail_page: Callable[[Page], MailPageObjects]
    composer: Callable[[Page], ComposerObjects]

    async def parent_item(self, thread_id: str) -> str:
        """The parent's item id, from the inbox's rows (before the clock starts)."""
        await self.page.goto(self.app + "inbox")
        shown = self.mail_page(self.page)
        await shown.message_list.wait_for()
        rows: list[list[str]] = await shown.rows.evaluate_all(
            "rows => rows.map(r => [r.dataset.convid || '', r.dataset.href || ''])"
        )
        for conversation, href in rows:
            if conversation == thread_id:
                return unquote(href.rsplit("/id/", 1)[-1])
        raise BenchError(f"the inbox shows no conversation {thread_id}")

    async def round(self, item: str, message: OutgoingMessage) -> tuple[dict[str, float], bool]:
        started = time.perf_counter()
        await self.reply(item, message)
        sent = time.perf_counter()
        source = await self.read_back(message.provider_thread_id)
        found = time.perf_counter()
        phases = {"reply_s": sent - started, "read_back_s": found - sent}
        return phases, carries(source.encode("utf-8", "surrogateescape"), message)

    async def reply(self, item: str, message: OutgoingMessage) -> None:
        """Open the parent item, Reply, replace the chips, set the subject, insert the
        HTML, press Send and wait for the app's answer."""
        page = self.page
        await page.goto(self.app + "id/" + quote(item, safe=""))
        shown = self.mail_page(page)
        await shown.shown_item.wait_for()
        await shown.reply.click()
        composer = self.composer(page)
        await composer.body.wait_for()
        plan = {"to": [a.address for a in message.to], "cc": [a.address for a in message.cc]}
        for name, wanted in plan.items():
            chips: list[str] = await composer.chips(name).evaluate_all(
                "els => els.map(e => e.dataset.address)"
            )
            for address in chips:
                await composer.remove(address).click()
            for address in wanted:
                await composer.field(name).fill(address)
                await composer.field(name).press("Enter")
        await composer.subject.fill(message.subject)
        await composer.body.click()
        await composer.body.evaluate(INSERT_HTML, inserted(message))
        async with page.expect_response(_is_send) as answered:
            await composer.send.click()
        response = await answered.value
        if response.status != 200:
            raise BenchError(f"the app answered the baseline's Send with HTTP {response.status}")

    async def read_back(self, thread_id: str) -> str:
        """Open Sent Items, open the conversation's row (its newest item, our copy, shown),
        read its message source."""
        page = self.page
        await page.goto(self.app + "sentitems")
        shown = self.mail_page(page)
        await shown.message_list.wait_for()
        rows: list[list[str]] = await shown.rows.evaluate_all(
            "rows => rows.map(r => [r.dataset.convid || '', r.dataset.href || ''])"
        )
        for conversation, href in rows:
            if conversation != thread_id:
                continue
            await page.goto(urlsplit(page.url)._replace(path=href, query="").geturl())
            await shown.shown_item.wait_for()
            await shown.more_actions.click()
            await shown.view_source.click()
            await shown.source.wait_for()
            return await shown.source.inner_text()
        return ""


def inserted(message: OutgoingMessage) -> str:
    """What the adapter inserts into the editor: the rendered HTML in a block whose class
    is the send's token (its marker), as ``browser_adapters.webmail.wrapped`` writes it."""
    return f'<div class="{mime.send_token(message.internet_message_id)}">{message.html}</div>'


def _marked(markup: str, message: OutgoingMessage) -> bool:
    """Whether stored HTML holds the block of ours (Exchange prefixes shown classes ``x_``)."""
    token = re.escape(mime.send_token(message.internet_message_id))
    return re.search(rf'class="(?:x_)?{token}"', markup) is not None


def carries(source: bytes, message: OutgoingMessage) -> bool:
    """Whether a message source read back is our copy of ``message``."""
    return _marked(
        rfc822.body(source.replace(b"\r\n", b"\n").replace(b"\n", b"\r\n")).html or "", message
    )


async def _read_new(channel: WebChannel, cursor: str | None) -> str:
    """Read what arrived since ``cursor`` through the channel (untimed); the cursor after."""
    while True:
        page = await channel.changes(cursor)
        cursor = page.cursor
        if not page.more:
            return cursor


def _is_send(response: Response) -> bool:
    return response.request.method == "POST" and response.url.endswith("/_api/send")


# -- the run ------------------------------------------------------------------------------


@dataclass
class Run:
    admin: MockAdmin
    outlook: Outlook
    script: Script
    loads: dict[str, Loads]
    progress: Callable[[str], None]
    tag: str = field(default_factory=lambda: secrets.token_hex(4))
    delivered: int = 0
    cursor: str | None = None
    sides: dict[str, Side] = field(default_factory=lambda: {"adapter": Side(), "baseline": Side()})

    def parent(self) -> Parent:
        self.delivered += 1
        return _deliver(self.admin, self.delivered)

    async def one(self, side: str, parent: Parent, *, timed: bool) -> float:
        message = reply_to(parent, f"{self.tag}-{side}")
        token = mime.send_token(message.internet_message_id)
        if side == "adapter":
            # The parent is read first, as the intake that took it in read it (the baseline
            # too looks its parent up before the clock).
            self.cursor = await _read_new(self.outlook.channel, self.cursor)
            before = self.loads[side].now()
            phases, ok = await adapter_round(self.outlook.channel, message)
        else:
            item = await self.script.parent_item(parent.thread_id)
            before = self.loads[side].now()
            phases, ok = await self.script.round(item, message)
        after = self.loads[side].now()
        if not timed:
            return sum(phases.values())
        record = self.sides[side]
        record.add(phases, (after[0] - before[0], after[1] - before[1]))
        record.tokens.append(token)
        record.read_back += ok
        return sum(phases.values())

    async def round(self, number: int, rounds: int) -> None:
        # The adapter's parent is delivered last: the newest conversation of the inbox, the
        # best case of its lookup (each newer conversation would be opened before it).
        parents = {side: self.parent() for side in ("baseline", "adapter")}
        order = ("adapter", "baseline") if number % 2 == 0 else ("baseline", "adapter")
        took = {side: await self.one(side, parents[side], timed=True) for side in order}
        self.progress(
            f"round {number + 1}/{rounds}: adapter {took['adapter']:.3f} s, "
            f"baseline {took['baseline']:.3f} s"
        )


async def _measure(
    admin: MockAdmin, outlook_for: OutlookFactory, scratch: Path, rounds: int,
    progress: Callable[[str], None],
) -> dict[str, Any]:  # fmt: skip
    clock = admin.web_clock()
    password = Secret("pw-" + secrets.token_urlsafe(12))
    totp = Secret(base64.b32encode(secrets.token_bytes(20)).decode())
    admin.account(MAILBOX, "microsoft", password=password.reveal(), totp_secret=totp.reveal())
    worker = Worker(MAILBOX, password, totp, clock, clock.sleep)
    outlook = outlook_for(admin.base_url + APP, worker, scratch / "browser-state")
    try:
        progress("signing the adapter's browser in (managed login, once)")
        started = time.perf_counter()
        await outlook.channel.login()
        sign_in_s = time.perf_counter() - started
        working = await outlook.working_context()
        baseline = await outlook.baseline_context()
        loads = {"adapter": Loads(), "baseline": Loads()}
        loads["adapter"].watch(working)
        loads["baseline"].watch(baseline)
        page = await baseline.new_page()
        script = Script(page, admin.base_url + APP, outlook.mail_page, outlook.composer)
        run = Run(admin, outlook, script, loads, progress)
        progress(f"warm-up: {WARMUP} round of each side")
        for _ in range(WARMUP):
            parents = {side: run.parent() for side in ("baseline", "adapter")}
            for side in ("adapter", "baseline"):
                await run.one(side, parents[side], timed=False)
        for number in range(rounds):
            await run.round(number, rounds)
        version = working.browser.version if working.browser is not None else None
    finally:
        await outlook.aclose()
    duplicates, lost = _counted(admin, run.sides)
    return _result(run.sides, rounds, sign_in_s, version, (duplicates, lost))


def _counted(admin: MockAdmin, sides: dict[str, Side]) -> tuple[int, int]:
    """Copies in Sent Items beyond one per timed send, and timed sends without a copy or
    whose copy was not read back."""
    stored = [
        base64.b64decode(m["raw_base64"]).decode("utf-8", "replace") + str(m.get("html") or "")
        for m in admin.stored(MAILBOX, "sent")
    ]
    duplicates = lost = 0
    for side in sides.values():
        for token in side.tokens:
            copies = sum(1 for text in stored if token in text)
            duplicates += max(0, copies - 1)
            lost += copies == 0
        lost += len(side.tokens) - side.read_back
    return duplicates, lost


def _median(values: list[float]) -> float:
    return statistics.median(values)


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _breakdown(side: Side) -> dict[str, Any]:
    return {
        **{name: round(_median(values), 4) for name, values in side.phases.items()},
        "page_loads_per_round": round(statistics.mean(side.pages), 2),
        "requests_per_round": round(statistics.mean(side.requests), 2),
    }


def _result(
    sides: dict[str, Side], rounds: int, sign_in_s: float, version: str | None,
    counted: tuple[int, int],
) -> dict[str, Any]:  # fmt: skip
    adapter, baseline = sides["adapter"], sides["baseline"]
    adapter_s, baseline_s = _median(adapter.totals), _median(baseline.totals)
    ratio = adapter_s / baseline_s
    duplicates, lost = counted
    return {
        "bench": "browser",
        "channel": "Outlook on the web (mock web app, headless Chromium)",
        "rounds": rounds,
        "warmup_rounds": WARMUP,
        "rate_per_s": round(1 / adapter_s, 3),
        "baseline_per_s": round(1 / baseline_s, 3),
        "ratio": round(ratio, 3),
        "ratio_is": "adapter median seconds / baseline median seconds (lower is better)",
        "target_ratio": TARGET_RATIO,
        "within_target": ratio <= TARGET_RATIO,
        "adapter_median_s": round(adapter_s, 4),
        "baseline_median_s": round(baseline_s, 4),
        "p50_ms": round(adapter_s * 1000, 1),
        "p99_ms": round(_percentile(adapter.totals, 0.99) * 1000, 1),
        "baseline_p50_ms": round(baseline_s * 1000, 1),
        "baseline_p99_ms": round(_percentile(baseline.totals, 0.99) * 1000, 1),
        "adapter_breakdown": _breakdown(adapter),
        "baseline_breakdown": _breakdown(baseline),
        "sign_in_s": round(sign_in_s, 3),
        "read_back": adapter.read_back + baseline.read_back,
        "duplicates": duplicates,
        "lost": lost,
        "includes": _INCLUDES,
        "chromium": version,
        "cpus": os.cpu_count(),
    }


_INCLUDES = {
    "adapter": "OutlookWeb.prepare (the parent found: the inbox's rows, its conversation, its "
    "unread items' message source) + send (the parent item opened, Reply, the chips replaced "
    "and read back, subject, insertHTML, Send and its _api/send answer, then the sent item's "
    "message source for the Message-ID Exchange gave it) + find_sent (Sent Items' rows, the "
    "conversation, its sent items' message source until ours - each sent item's read once "
    "per channel instance - parsed); a warm browser signed in once, one channel instance "
    "for every round",
    "baseline": "the same page actions scripted directly with Playwright and the same "
    "locators, on the parent item looked up before the clock: the parent opened, Reply, the "
    "chips replaced, subject, insertHTML, Send and its _api/send answer; Sent Items opened, "
    "the conversation's row opened, View message source, read",
}


def run(
    scratch: Path,
    mock: MockServerFactory,
    outlook: OutlookFactory,
    *,
    rounds: int = 10,
    progress: Callable[[str], None] = lambda _line: None,
) -> dict[str, Any]:
    """Measure ``rounds`` rounds of each side in ``scratch`` (a fresh directory), on a
    throwaway mock server ``mock(scratch / "mock-providers.log")`` started, and stopped,
    here."""
    if rounds < 1:
        raise ValueError("at least one round")
    scratch.mkdir(parents=True, exist_ok=True)
    server = mock(scratch / "mock-providers.log")
    try:
        progress("starting throwaway mock providers on 127.0.0.1")
        admin = server.start()
        return anyio.run(_measure, admin, outlook, scratch, rounds, progress)
    finally:
        server.stop()
