"""A managed login refuses to type a secret where Playwright's debug logs would print it
(they print the DevTools traffic, the typed value included)."""

from __future__ import annotations

import pytest

from managed_login.entry import recording_settings


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
