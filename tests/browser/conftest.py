"""Fixtures for the browser tests: one JupyterLab server and one Chromium per session.

Run with ``make browser-test`` (``--confcutdir=tests/browser`` keeps the
course's ``tests/conftest.py`` out). Without a Chromium the browser tests are
skipped with a loud message, except in CI (``CI=true``), where that is a
failure. The server is stopped in the fixture's teardown, which pytest also
runs after a failure or Ctrl-C; SIGTERM (a timeout killing the run) is turned
into the same interrupt, and on Linux the server also gets SIGTERM if the
test process dies outright.
"""

from __future__ import annotations

import signal
from pathlib import Path

import pytest
from chromium import find_chromium, in_ci, missing_message
from labserver import ROOT, LabServer

SCREENSHOTS = ROOT / "results" / "browser"
_SKIP_NOTE = pytest.StashKey[str]()


def _interrupt_on_sigterm(signum, frame):  # pragma: no cover (signal handler)
    raise KeyboardInterrupt(f"signal {signum}")


def pytest_configure(config: pytest.Config) -> None:
    signal.signal(signal.SIGTERM, _interrupt_on_sigterm)


def pytest_terminal_summary(terminalreporter, exitstatus, config: pytest.Config) -> None:
    note = config.stash.get(_SKIP_NOTE, None)
    if note:
        terminalreporter.write_sep("!", "BROWSER TESTS SKIPPED", red=True, bold=True)
        terminalreporter.write_line(note, red=True, bold=True)


def _no_browser(config: pytest.Config, message: str) -> None:
    if in_ci():
        pytest.fail(f"{message} CI=true: a missing browser fails the browser tests.", pytrace=False)
    config.stash[_SKIP_NOTE] = message
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        reporter.write_line("")
        reporter.write_sep("!", "BROWSER TESTS SKIPPED", red=True, bold=True)
        reporter.write_line(message, red=True, bold=True)
    pytest.skip(message)


@pytest.fixture(scope="session")
def chromium_path(request: pytest.FixtureRequest) -> Path:
    """The system Chromium, or a loud skip (a failure in CI)."""
    path = find_chromium()
    if path is None:
        _no_browser(request.config, missing_message())
    return path


@pytest.fixture(scope="session")
def browser(request: pytest.FixtureRequest, chromium_path: Path):
    """Headless Chromium driven by Playwright."""
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        _no_browser(request.config, "Playwright for Python is not installed: pip install -r requirements-dev.txt.")
    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=str(chromium_path), headless=True)
        try:
            yield chromium
        finally:
            chromium.close()


@pytest.fixture(scope="session")
def lab():
    """JupyterLab with the course's settings and the smoke profile, stopped at the end."""
    server = LabServer(profile="smoke")
    try:
        server.start()
        yield server
    finally:
        server.cleanup()


def _new_page(browser):
    """A fresh browser context (no cookies) and its page, 1280 x 900; JavaScript errors collect in ``page.js_errors``."""
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    context.set_default_timeout(60_000)
    new_page = context.new_page()
    # JavaScript errors in the lab: reported with each lesson's notes.
    new_page.js_errors = []
    new_page.on("pageerror", lambda err: new_page.js_errors.append(str(err)[:300]))
    return context, new_page


@pytest.fixture()
def page(browser):
    """A fresh browser context (no cookies) and page, 1280 x 900."""
    context, new_page = _new_page(browser)
    try:
        yield new_page
    finally:
        context.close()


@pytest.fixture(scope="module")
def lab_page(browser):
    """One page for a module's lessons in turn: a learner's lab, loaded once, each lesson opened and closed in it.

    Yields a dict: ``page``, and ``open`` (whether the page shows the lab with nothing open; after a
    lesson with a problem it is loaded again, so one lesson's failure never reaches the next).
    """
    context, new_page = _new_page(browser)
    try:
        yield {"page": new_page, "open": False}
    finally:
        context.close()


@pytest.fixture(scope="session")
def screenshots() -> Path:
    """results/browser/, where each lesson's screenshot is saved."""
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    return SCREENSHOTS
