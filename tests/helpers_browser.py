"""Headless Chromium (Debian's `/usr/bin/chromium`) driven by Playwright, for the console's
browser tests. `make browser` installs it as root; without it the tests skip, saying how."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

CHROMIUM = os.environ.get("ENS_CHROMIUM", "/usr/bin/chromium")
ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
SHOTS = Path(__file__).resolve().parent.parent / "docs" / "console"


def need_chromium() -> None:
    if not Path(CHROMIUM).exists():
        pytest.skip(
            f"no Chromium at {CHROMIUM}: install it with `sudo apt-get install chromium "
            "chromium-driver` (`make browser` does as root), or set ENS_CHROMIUM"
        )
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        pytest.skip("playwright is not installed: `make install` (the test extra) installs it")


@contextmanager
def chromium() -> Iterator[Any]:
    """One browser for a test module (a new context per login)."""
    need_chromium()
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:  # Playwright gives it a new empty profile directory
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS, headless=True)
        try:
            yield browser
        finally:
            browser.close()


def screenshot(page: Any, name: str) -> None:
    """docs/console/NAME.png, when ENS_SCREENSHOTS=1 (docs/console.md embeds them)."""
    if os.environ.get("ENS_SCREENSHOTS") == "1":
        SHOTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(SHOTS / f"{name}.png"), full_page=True)
