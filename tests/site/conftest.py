"""Fixtures for the site's browser test: the built site, one Chromium, one local HTTP server.

Run with ``make site-test`` (it builds the site first) or, on a site built by
``make site``, ``DPCOURSE_SITE_DIR=build/site .venv/bin/python -m pytest
tests/site --confcutdir=tests/site``. The browser is the system Chromium
(tests/browser/chromium.py); without one the tests skip loudly, except with
CI=true, where that fails.
"""

from __future__ import annotations

import functools
import http.server
import os
import sys
import threading
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "browser"))
from chromium import find_chromium, in_ci, missing_message  # noqa: E402

SITE_ENV = "DPCOURSE_SITE_DIR"


def _no_browser(message: str) -> None:
    if in_ci():
        pytest.fail(f"{message} CI=true: a missing browser fails the site's browser test.", pytrace=False)
    pytest.skip(message)


@pytest.fixture(scope="session")
def site_dir() -> Path:
    """The built site: ``$DPCOURSE_SITE_DIR``, else build/site."""
    folder = Path(os.environ.get(SITE_ENV) or ROOT / "build" / "site").resolve()
    if not (folder / "index.html").is_file():
        pytest.fail(f"No built site in {folder} (no index.html): run `make site` or set {SITE_ENV}.", pytrace=False)
    return folder


@pytest.fixture(scope="session")
def browser():
    """Headless system Chromium driven by Playwright."""
    path = find_chromium()
    if path is None:
        _no_browser(missing_message())
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        _no_browser("Playwright for Python is not installed: pip install -r requirements-dev.txt.")
    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=str(path), headless=True)
        try:
            yield chromium
        finally:
            chromium.close()


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format, *args):  # noqa: A002 - the base class's name
        pass


@pytest.fixture(scope="session")
def http_root(site_dir: Path):
    """The site served on http://127.0.0.1 at a port the OS picks, for the session, stopped at the end."""
    handler = functools.partial(_QuietHandler, directory=str(site_dir))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)  # the OS picks a free port
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


@pytest.fixture()
def page(browser):
    """A fresh context and page, 1280 x 900, that notes console errors, page errors and every request."""
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    context.set_default_timeout(30_000)
    new_page = context.new_page()
    new_page.problems = []
    new_page.requests = []
    new_page.on("console", lambda m: m.type == "error" and new_page.problems.append(f"console error: {m.text[:300]}"))
    new_page.on("pageerror", lambda err: new_page.problems.append(f"page error: {str(err)[:300]}"))
    new_page.on("request", lambda r: new_page.requests.append(r.url))
    new_page.on("response", lambda r: r.status >= 400 and new_page.problems.append(f"HTTP {r.status}: {r.url}"))
    # ERR_ABORTED: a request cut short by the next navigation (the favicon), not a missing file.
    new_page.on(
        "requestfailed",
        lambda r: (
            "ERR_ABORTED" not in str(r.failure) and new_page.problems.append(f"request failed: {r.url} ({r.failure})")
        ),
    )
    try:
        yield new_page
    finally:
        context.close()
