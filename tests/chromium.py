"""Debian's `chromium` (Makefile's APT_PACKAGES) driven by Playwright's Python package (the dev
extra; never its own browser downloads): what the browser tests launch, and how."""

from __future__ import annotations

from pathlib import Path

CHROMIUM = Path("/usr/bin/chromium")
# Root in a container: no sandbox; no GPU; nothing that would call out to the network by itself;
# audio may start without a click (Playwright's clicks are not trusted user gestures for autoplay).
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 "--autoplay-policy=no-user-gesture-required"]


def launch_chromium(playwright, *extra_args: str):
    """A headless Chromium; Playwright gives every launch a fresh temporary profile (user-data-dir)."""
    return playwright.chromium.launch(executable_path=str(CHROMIUM), args=[*CHROMIUM_ARGS, *extra_args],
                                      headless=True)
