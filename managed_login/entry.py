"""How a secret reaches a sign-in page without Playwright recording it anywhere.

Playwright records what its own input calls are given: ``fill`` and ``type`` put the value
into the trace's action parameters, the ``pw:api`` log and the call log of a timeout's
exception; ``keyboard.*`` and ``evaluate`` arguments go into the trace; DOM snapshots copy
every input's value. A value sent as Chrome DevTools ``Input.insertText`` on a CDP session
of its own is in none of them (only in ``DEBUG=pw:protocol``, which a login refuses to run
under). So a secret is typed here, into the focused field, through a session opened for it
and closed at once - only once the field is checked to hold the focus, and the field checked
to hold the whole secret afterwards; the caller clears the field if the page stays on it.

Sign-in pages run in a browser context of their own that never traces, records HAR or
video, and is closed before any traced work begins (``browser_adapters.session``).
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from typing import Any, cast

from playwright.async_api import Locator

from agent.domain.errors import SignInFailed
from agent.domain.secrets import Secret

RECORDING_SETTINGS = ("DEBUG", "DEBUGP", "PWDEBUG")
"""Environment variables under which Playwright prints what it sends to the browser."""


def recording_settings(environ: Mapping[str, str] | None = None) -> list[str]:
    """The set variables that would make Playwright print a typed value (``DEBUG`` only
    when it names Playwright's own logs)."""
    env = os.environ if environ is None else environ
    found: list[str] = []
    for name in RECORDING_SETTINGS:
        value = env.get(name, "")
        if value and (name != "DEBUG" or any(_enables(value, log) for log in PLAYWRIGHT_LOGS)):
            found.append(name)
    return found


PLAYWRIGHT_LOGS = ("pw:api", "pw:protocol", "pw:channel")
"""The namespaces of Playwright's debug logs that print what a page is given."""


def _enables(debug: str, namespace: str) -> bool:
    """Whether a ``DEBUG`` value turns ``namespace`` on, read as the ``debug`` package
    reads it: names split by commas or spaces, ``*`` any run of characters, a leading ``-``
    turning a name off again."""
    on = False
    for name in re.split(r"[\s,]+", debug.strip()):
        if not name:
            continue
        skip = name.startswith("-")
        pattern = re.escape(name.removeprefix("-")).replace(r"\*", ".*")
        if re.fullmatch(pattern, namespace):
            if skip:
                return False
            on = True
    return on


def refuse_recording(environ: Mapping[str, str] | None = None) -> None:
    """Refuse to sign in where Playwright would print what the page is given."""
    found = recording_settings(environ)
    if found:
        raise SignInFailed(
            f"managed login will not type a secret while {', '.join(found)} is set "
            "(Playwright would print it)",
            f"unset {' and '.join(found)} and run again",
        )


ARRIVED_WHOLE = """(el, n) => {
    const focused = document.activeElement;
    if (focused === el && el.value.length === n) return true;
    el.value = '';
    if (focused && focused !== el && 'value' in focused) focused.value = '';
    return false;
}"""
"""Whether the field holding the focus is the one typed into and holds the whole value;
else both it and the field typed into are emptied."""


async def enter_secret(field: Locator, secret: Secret) -> None:
    """Type ``secret`` into ``field`` (emptied first) through a DevTools session of its
    own; nothing Playwright records is given the value."""
    refuse_recording()
    await field.focus()
    focused = await field.evaluate("el => { el.value = ''; return el === document.activeElement; }")
    if not focused:  # the text would go wherever the focus went instead
        raise SignInFailed(
            "the sign-in page moved the focus away from the field a secret was for; nothing "
            "was typed",
            "run `outloop login` again; if it happens again, the page is not one managed "
            "login knows",
        )
    page = field.page
    session = await page.context.new_cdp_session(page)
    try:
        send = cast("Any", session).send  # its params are typed Dict[Unknown, Unknown]
        await send("Input.insertText", {"text": secret.reveal()})
    finally:
        await session.detach()
    units = len(secret.reveal().encode("utf-16-le")) // 2  # a page counts UTF-16 units
    if not await field.evaluate(ARRIVED_WHOLE, units):
        raise SignInFailed(
            "the secret did not arrive whole in the sign-in field (the page moved the focus "
            "or cut it short); the field, and any field the focus went to, were emptied",
            "run `outloop login` again",
        )


async def clear_field(field: Locator) -> None:
    """Empty a credential field the page still shows (a refused value stays typed in)."""
    if await field.count():
        await field.evaluate("el => { el.value = ''; }")
