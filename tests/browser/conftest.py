"""A real gateway (tests/stack.py) and Debian's Chromium driven by Playwright, one of each per
module. No browser is downloaded: Playwright drives /usr/bin/chromium, which scripts/test
installs. ``UI_SCREENSHOTS=DIR`` keeps a PNG of each step there (``bench/ui_screenshots``
writes bench/results/ui/)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import Browser, sync_playwright

from tests.browser.pages import CHROMIUM, Screens
from tests.stack import Stack


@pytest.fixture(scope="module")
def ui_stack() -> Iterator[Stack]:
    # Two gateway workers, as scripts/demo runs them: both serve the static files.
    running = Stack(
        database_url=os.environ["DATABASE_URL"],
        redis_url=os.environ["REDIS_URL"],
        latency_scale=0.05,
        gateway_workers=2,
    )
    try:
        yield running.start()
    finally:
        running.stop()


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    if not Path(CHROMIUM).exists():
        pytest.fail(f"{CHROMIUM} is missing: scripts/test installs Debian's chromium package")
    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=CHROMIUM)
        try:
            yield launched
        finally:
            launched.close()


@pytest.fixture(scope="module")
def admin_password(ui_stack: Stack) -> str:
    return ui_stack.manage("demo_admin").strip()


@pytest.fixture(scope="session")
def screens() -> Screens:
    return Screens(os.environ.get("UI_SCREENSHOTS", ""))
