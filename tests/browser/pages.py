"""Helpers of the browser tests: a browser context on a stack, signing in, screenshots."""

from __future__ import annotations

from pathlib import Path

from playwright.sync_api import Browser, BrowserContext, Page

from tests.stack import Stack

CHROMIUM = "/usr/bin/chromium"  # Debian's package (scripts/test installs it)
VIEWPORT = {"width": 1280, "height": 900}


class Screens:
    """Numbered screenshots of the steps, kept only when UI_SCREENSHOTS names a directory."""

    def __init__(self, directory: str) -> None:
        self.directory = Path(directory) if directory else None

    def shot(self, page: Page, name: str) -> None:
        if self.directory is None:
            return
        self.directory.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=self.directory / f"{name}.png", full_page=True)


def context_new(browser: Browser, stack: Stack, *, color_scheme: str = "light") -> BrowserContext:
    context = browser.new_context(
        base_url=stack.base_url, viewport=VIEWPORT, color_scheme=color_scheme
    )
    context.set_default_timeout(15_000)
    return context


def sign_in(page: Page, username: str, password: str) -> None:
    page.goto("/admin/login/?next=/admin/")
    page.fill("#id_username", username)
    page.fill("#id_password", password)
    page.click("input[type=submit]")
    page.wait_for_url("**/admin/")
