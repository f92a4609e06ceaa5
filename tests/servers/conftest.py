"""The browser fixtures every browser test shares (tests/servers/test_playground.py, test_api_docs.py)."""

from __future__ import annotations

import pytest
from playwright.sync_api import sync_playwright

from chromium import CHROMIUM, launch_chromium  # tests/chromium.py (tests/ is on sys.path)


@pytest.fixture(scope="module")
def playwright():
    assert CHROMIUM.exists(), f"{CHROMIUM} is missing: `make test` installs Debian's chromium"
    with sync_playwright() as playwright:  # one per process at a time: its sync API runs one event loop
        yield playwright


@pytest.fixture(scope="module")
def browser(playwright):
    browser = launch_chromium(playwright)
    yield browser
    browser.close()
