"""Headless Chromium for the browser tests: the system one (``./scripts/setup`` installs it),
or ``OUTLOOP_CHROMIUM``; a failure (never a skip) when there is none."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from browser_adapters import session

LAUNCH_ARGS = list(session.LAUNCH_ARGS)
"""The product's own flags for headless Chromium on a server."""


def chromium_executable() -> str:
    """``OUTLOOP_CHROMIUM``, else the system ``chromium``; a failure (never a skip) without."""
    configured = os.environ.get("OUTLOOP_CHROMIUM")
    if configured:
        if not (Path(configured).is_file() and os.access(configured, os.X_OK)):
            pytest.fail(
                f"OUTLOOP_CHROMIUM={configured!r} is not an executable file; unset it and run "
                "./scripts/setup to install Chromium",
                pytrace=False,
            )
        return configured
    found = shutil.which("chromium")
    if found is None:
        pytest.fail(
            "Chromium is not installed (no `chromium` on PATH): run ./scripts/setup, which "
            "installs it with the fonts these tests need, or set OUTLOOP_CHROMIUM to a Chromium "
            "executable",
            pytrace=False,
        )
    return found
