"""A real browser for the pages: Debian's Chromium driven by Playwright ($TFORMER_CHROMIUM, or
TFORMER_SKIP_BROWSER=1 to leave those tests out)."""

import os
import shutil
from pathlib import Path

import pytest

CHROMIUM = os.environ.get("TFORMER_CHROMIUM", "/usr/bin/chromium")


def _browser():
    if os.environ.get("TFORMER_SKIP_BROWSER") == "1":
        pytest.skip("TFORMER_SKIP_BROWSER=1")
    if not Path(CHROMIUM).exists() or shutil.which(CHROMIUM) is None:
        pytest.fail(f"no Chromium at {CHROMIUM}: install Debian's chromium (the README's test command does), set "
                    "TFORMER_CHROMIUM to another Chromium, or TFORMER_SKIP_BROWSER=1 to leave this test out")
    from playwright.sync_api import sync_playwright

    return sync_playwright


BROWSER_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                "--disable-background-networking", "--disable-component-update", "--disable-sync"]
