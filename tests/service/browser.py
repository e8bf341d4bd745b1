"""Headless Chromium for the dashboard tests: the `browser` fixture (skips, saying why, where
chromium or its driver is missing) and full-page screenshots under tmp/artifacts/<page>/
(or $DRAFTYARD_TEST_ARTIFACTS), which the notes list and a person looks at."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from tests.conftest import REPO

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
DRIVER = shutil.which("chromedriver")
ARTIFACTS = Path(os.environ.get("DRAFTYARD_TEST_ARTIFACTS") or REPO / "tmp" / "artifacts")


@pytest.fixture
def browser():
    if not (CHROMIUM and DRIVER):
        pytest.skip("chromium and chromedriver are needed (apt-get install chromium chromium-driver)")
    webdriver = pytest.importorskip("selenium.webdriver")
    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for a in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
              "--window-size=1280,1000", "--hide-scrollbars"):
        opts.add_argument(a)
    d = webdriver.Chrome(options=opts, service=webdriver.ChromeService(executable_path=DRIVER))
    d.set_page_load_timeout(60)
    try:
        yield d
    finally:
        d.quit()


def shoot(d, folder: str, name: str, max_height: int = 6000, min_bytes: int = 5_000) -> Path:
    """A full-page screenshot (the window grown to the page's height, measured afresh: a
    shorter page gets a shorter shot) at ARTIFACTS/folder/name.png."""
    out = ARTIFACTS / folder
    out.mkdir(parents=True, exist_ok=True)
    d.set_window_size(1280, 800)
    h = d.execute_script("window.scrollTo(0, 0); return document.documentElement.scrollHeight")
    d.set_window_size(1280, min(max(h, 800), max_height))
    p = out / f"{name}.png"
    assert d.save_screenshot(str(p)) and p.stat().st_size > min_bytes, p
    print(f"screenshot: {p}")
    return p
