"""Fixtures of the hub tests (make hub-test): Chromium as the browser tests find it, and the course's root.

Run with ``--confcutdir=tests/hub`` so that the course's tests/conftest.py (JAX device set-up) stays out.
"""

from __future__ import annotations

import signal
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "browser"))  # chromium.py, labpage.py
sys.path.insert(0, str(Path(__file__).parent))


def _interrupt_on_sigterm(signum, frame):  # pragma: no cover (signal handler)
    raise KeyboardInterrupt(f"signal {signum}")


def pytest_configure(config: pytest.Config) -> None:
    # A timeout killing the run still stops the hub in the fixtures' teardown.
    signal.signal(signal.SIGTERM, _interrupt_on_sigterm)


@pytest.fixture(scope="session")
def browser():
    """Headless system Chromium driven by Playwright; skipped loudly without one (a failure with CI=true)."""
    from chromium import find_chromium, in_ci, missing_message

    path = find_chromium()
    if path is None:
        if in_ci():
            pytest.fail(f"{missing_message()} CI=true: a missing browser fails the hub test.", pytrace=False)
        pytest.skip(missing_message())
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=str(path), headless=True)
        try:
            yield chromium
        finally:
            chromium.close()
