"""How a managed login types a secret: never where Playwright's debug logs would print it
(they print the DevTools traffic, the typed value included), only into the field that holds
the focus, and whole or not at all."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from playwright.async_api import Page, async_playwright

from agent.domain.errors import SignInFailed
from agent.domain.secrets import Secret
from managed_login.entry import enter_secret, recording_settings
from tests.browser import LAUNCH_ARGS, chromium_executable


@pytest.mark.parametrize(
    ("debug", "refused"),
    [
        ("pw:api", True),
        ("pw:protocol", True),
        ("pw*", True),
        ("p*", True),
        ("*", True),
        ("*,-express:*", True),
        ("app:*, pw:*", True),
        ("pw:*,-pw:api,-pw:protocol,-pw:channel", False),
        ("express:*", False),
        ("", False),
    ],
)
def test_a_login_refuses_any_debug_setting_that_turns_playwright_s_logs_on(
    debug: str, refused: bool
) -> None:
    assert ("DEBUG" in recording_settings({"DEBUG": debug})) is refused
    assert recording_settings({"DEBUGP": "1", "PWDEBUG": "1"}) == ["DEBUGP", "PWDEBUG"]


PAGE = """<form><input id="user" aria-label="Email"><input id="pass" type="password"
aria-label="Password"></form><script>{script}</script>"""


@pytest.fixture
async def page(anyio_backend: str) -> AsyncIterator[Page]:
    del anyio_backend
    async with async_playwright() as playwright:
        browser = await playwright.chromium.launch(
            executable_path=chromium_executable(), headless=True, args=LAUNCH_ARGS
        )
        try:
            yield await browser.new_page()
        finally:
            await browser.close()


@pytest.mark.anyio
async def test_a_secret_is_typed_whole_into_the_field_it_is_for(page: Page) -> None:
    await page.set_content(PAGE.format(script=""))
    await enter_secret(page.get_by_label("Password"), Secret("pässword-😀"))
    assert await page.evaluate("document.getElementById('pass').value") == "pässword-😀"
    assert await page.evaluate("document.getElementById('user').value") == ""


@pytest.mark.anyio
@pytest.mark.parametrize(
    "script",
    [
        "document.getElementById('pass').addEventListener('focus', () =>"
        " document.getElementById('user').focus());",
        "document.getElementById('pass').maxLength = 4;",
        "document.getElementById('pass').addEventListener('input', () =>"
        " document.getElementById('user').focus(), {once: true});",
    ],
    ids=["focus_moved_first", "field_cut_short", "focus_moved_after"],
)
async def test_a_page_that_moves_the_focus_or_cuts_the_secret_short_keeps_none_of_it(
    page: Page, script: str
) -> None:
    await page.set_content(PAGE.format(script=script))
    with pytest.raises(SignInFailed) as refused:
        await enter_secret(page.get_by_label("Password"), Secret("hunter2-secret"))
    assert "hunter2" not in str(refused.value)
    assert await page.evaluate("document.getElementById('pass').value") == ""
    assert "hunter2" not in await page.evaluate("document.getElementById('user').value")
