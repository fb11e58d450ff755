"""The operator console in headless Chromium: sign in, the queue, a Hebrew task whose draft
preview is right to left with its isolates holding, approval by the approver, keyboard
reach, and an automated accessibility check (axe-core) of every page."""

from __future__ import annotations

import threading
from collections.abc import AsyncIterator, Callable, Iterator

import pytest
import uvicorn
from axe_playwright_python.async_playwright import Axe
from playwright.async_api import Page, async_playwright

from agent.domain.errors import AuthChallengeUnresolved
from agent.domain.secrets import Secret
from agent.domain.states import TaskState
from agent.rendering.render import render_message
from agent.services import approvals, challenges, drafts, learning, workspaces
from agent.storage.sqlite import SqliteStore
from agent.testing import FrozenClock
from managed_login import console as credentials
from managed_login.vault import open_vault
from mcp_server import http
from mcp_server.console.app import Console, build_app
from tests.browser import LAUNCH_ARGS, chromium_executable
from tests.conftest import context_yaml
from tests.fixtures.web.conftest import artifacts
from tests.mcp.test_console import OPERATOR, PASSWORD, BoxBodies, with_operator
from tests.services.gates_world import APPROVER, CLIENT, World
from tests.services.test_console_actions import with_person

pytestmark = pytest.mark.anyio
HEBREW_BODY = "שלום דנה,\n\nהמחיר הוא **$1,200** למזהה A-17, פרטים ב-https://example.com/q/17."


class Served:
    """The console app on a loopback port, served from a thread."""

    def __init__(self, console: Console) -> None:
        sock = http.listening_socket("127.0.0.1", 0)
        self.url = f"http://127.0.0.1:{sock.getsockname()[1]}"
        self.server = uvicorn.Server(uvicorn.Config(build_app(console), log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [sock]})
        self.thread.start()

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)


@pytest.fixture
def served(
    station_store: SqliteStore,
    data_dir: workspaces.DataDir,
    clock: FrozenClock,
    register: Callable[[str], str],
) -> Iterator[tuple[Served, World]]:
    ws = register(with_operator(context_yaml()))
    world = World(station_store, data_dir, ws, clock)
    vault = open_vault(data_dir.root / "vault", "plain")
    for who in (APPROVER, OPERATOR):
        credentials.set_password(station_store, vault, who, Secret(PASSWORD))
    own = SqliteStore(data_dir.database)  # the console's own connection, as its process has
    server = Served(
        Console(own, data_dir.root, vault, clock, secure=False, bodies=BoxBodies(world))
    )
    try:
        yield server, world
    finally:
        server.stop()
        own.close()


async def hebrew_task(world: World) -> str:
    world.deliver(sender=CLIENT, thread=1, text="אשמח להצעת מחיר")
    await world.intake()
    task = world.to_draft_ready(world.only_task().task_id)
    context = workspaces.load_context(world.store, world.workspace_id)
    rendered = render_message(
        HEBREW_BODY, subject="Re: " + task.original_subject, context=context, language="he"
    )
    drafts.keep_draft(world.store, task, "d-he", rendered, world.clock)
    await approvals.request_approval(
        world.store, world.box, task.task_id, "d-he", rendered, (CLIENT,), world.clock
    )
    return task.task_id


@pytest.fixture
async def page() -> AsyncIterator[Page]:
    async with async_playwright() as playwright:
        browser = await playwright.chromium.launch(
            executable_path=chromium_executable(), headless=True, args=LAUNCH_ARGS
        )
        context = await browser.new_context(viewport={"width": 1100, "height": 900})
        try:
            yield await context.new_page()
        finally:
            await browser.close()


async def sign_in(page: Page, url: str, who: str) -> None:
    await page.goto(url + "/signin")
    await page.get_by_label("Address").fill(who)
    await page.get_by_label("Password").fill(PASSWORD)
    await page.get_by_role("button", name="Sign in").click()
    await page.get_by_role("heading", name="Your workspaces").wait_for()


async def no_violations(page: Page) -> None:
    found = await Axe().run(page)
    assert found.violations_count == 0, found.generate_report()


async def test_an_approver_signs_in_opens_a_hebrew_task_sees_it_right_to_left_and_approves(
    served: tuple[Served, World], page: Page
) -> None:
    server, world = served
    task_id = await hebrew_task(world)
    await page.goto(server.url + f"/tasks/{task_id}")
    assert page.url.startswith(server.url + "/signin")  # signed out: sent to sign in
    await no_violations(page)
    await sign_in(page, server.url, APPROVER)
    await no_violations(page)
    await page.get_by_role("link", name=world.workspace_id).click()
    await page.get_by_role("table", name="Open tasks").wait_for()
    await no_violations(page)
    await page.screenshot(path=artifacts("console") / "queue.png", full_page=True)
    await page.locator(f"a[href='/tasks/{task_id}']").click()
    preview = page.frame_locator("iframe[title^='Draft d-he']")
    wrapper = preview.locator("[dir=rtl]").first
    assert await wrapper.evaluate("e => getComputedStyle(e).direction") == "rtl"
    isolates = preview.locator("bdi, [dir=ltr]")
    texts = [await isolates.nth(i).inner_text() for i in range(await isolates.count())]
    assert any("$1,200" in t for t in texts) and any("A-17" in t for t in texts)
    for i in range(await isolates.count()):
        bidi = await isolates.nth(i).evaluate("e => getComputedStyle(e).unicodeBidi")
        assert bidi in ("isolate", "isolate-override", "plaintext"), bidi
    await page.locator("iframe").scroll_into_view_if_needed()  # painted before the capture
    await page.screenshot(path=artifacts("console") / "task-hebrew.png", full_page=True)
    await page.get_by_role("button", name="Approve").scroll_into_view_if_needed()
    async with page.expect_navigation():
        await page.get_by_role("button", name="Approve").click()
    await page.get_by_role("status").wait_for()
    assert (
        "Recorded: approved: the send is possible." in await page.get_by_role("status").inner_text()
    )
    assert world.task(task_id).state is TaskState.APPROVED_TO_SEND


async def test_the_sign_in_form_and_the_decision_are_reachable_by_keyboard(
    served: tuple[Served, World], page: Page
) -> None:
    server, world = served
    task_id = await hebrew_task(world)
    await page.goto(server.url + "/signin")
    focused: list[str] = []
    for _ in range(5):
        await page.keyboard.press("Tab")
        focused.append(
            await page.evaluate("document.activeElement.id || document.activeElement.textContent")
        )
    assert focused == ["Skip to content", "Outloop console", "address", "password", "Sign in"]
    await page.keyboard.press("Shift+Tab")
    await page.keyboard.press("Shift+Tab")
    await page.keyboard.type(APPROVER)
    await page.keyboard.press("Tab")
    await page.keyboard.type(PASSWORD)
    await page.keyboard.press("Enter")
    await page.get_by_role("heading", name="Your workspaces").wait_for()
    await page.goto(server.url + f"/tasks/{task_id}")
    await page.get_by_label("Note (needed to request changes)").focus()
    await page.keyboard.type("Quote in shekels, please.")
    await page.keyboard.press("Tab")
    await page.keyboard.press("Tab")  # past Approve, to Request changes
    await page.keyboard.press("Enter")
    await page.get_by_role("status").wait_for()
    assert world.task(task_id).state is TaskState.CHANGES_REQUESTED


async def test_an_operator_works_the_runs_and_proposals_pages_by_role_and_name(
    served: tuple[Served, World], page: Page
) -> None:
    server, world = served
    world.deliver(sender=CLIENT, thread=1, text="שלום,\nאשמח להצעת מחיר\u200f למזהה A-17.")
    await world.intake()
    task_id = world.only_task().task_id
    with_person(world)
    challenges.keep(
        world.store, world.workspace_id, "support@fabrikam.test", "browser",
        AuthChallengeUnresolved("asks to approve a push", "approve it on the worker phone",
                                challenge="push_approval"),
        world.clock.now(),
    )  # fmt: skip
    pid = learning.submit(
        world.store, world.workspace_id, kind="rule", summary="Quote in shekels",
        detail="Dana asked twice", evidence=(), clock=world.clock,
    ).proposal_id  # fmt: skip
    await sign_in(page, server.url, OPERATOR)
    await page.goto(server.url + f"/tasks/{task_id}")
    body = page.locator(".message .body")
    assert await body.evaluate("e => getComputedStyle(e).direction") == "rtl"
    assert await body.locator("mark").inner_text() == "[U+200F]"
    await no_violations(page)
    await page.screenshot(path=artifacts("console") / "task-thread.png", full_page=True)
    await page.goto(server.url + f"/workspaces/{world.workspace_id}")
    await page.get_by_role("link", name="Runs").click()
    await page.get_by_role("heading", name="Reconciliation of the latest runs").wait_for()
    await no_violations(page)
    await page.screenshot(path=artifacts("console") / "runs.png", full_page=True)
    await page.get_by_label("What you did to resolve it").fill("approved the push")
    async with page.expect_navigation():
        await page.get_by_role("button", name="Acknowledge resolved").click()
    assert "acknowledged resolved" in await page.get_by_role("status").inner_text()
    await page.get_by_role("link", name="Learning proposals").click()
    await no_violations(page)
    await page.get_by_role("link", name="Quote in shekels").click()
    await no_violations(page)
    area = page.get_by_label("Workspace context (YAML)", exact=False)
    text = await area.input_value()
    await area.fill(text.replace("language: he", "language: en"))
    await page.get_by_role("button", name="Show the change").click()
    await page.get_by_role("heading", name="The change, checked").wait_for()
    await no_violations(page)
    await page.screenshot(path=artifacts("console") / "proposal-diff.png", full_page=True)
    async with page.expect_navigation():
        await page.get_by_role("button", name="Accept and write this change").click()
    assert f"{pid} accepted" in await page.get_by_role("status").inner_text()
    assert workspaces.load_context(world.store, world.workspace_id).language == "en"
