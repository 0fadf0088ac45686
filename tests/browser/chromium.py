"""Finding a Chromium for Playwright: the system's, never a download.

Playwright's own browser download cannot be used on the build machines, and
is not needed: Debian's ``chromium`` package (which ``.ci/run`` installs when
it is missing) works with ``executable_path``.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

CHROMIUM_ENV = "DPCOURSE_CHROMIUM"
CANDIDATES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable", "chrome")


def find_chromium() -> Path | None:
    """The Chromium to drive: ``$DPCOURSE_CHROMIUM``, else the first of ``CANDIDATES`` on PATH.

    Raises:
        FileNotFoundError: ``$DPCOURSE_CHROMIUM`` is set but names no executable
            file (a wrong setting is an error, not a reason to skip).
    """
    chosen = os.environ.get(CHROMIUM_ENV)
    if chosen:
        path = Path(chosen).expanduser()
        if not (path.is_file() and os.access(path, os.X_OK)):
            raise FileNotFoundError(f"{CHROMIUM_ENV}={chosen} is not an executable file; unset it or fix the path.")
        return path
    for name in CANDIDATES:
        found = shutil.which(name)
        if found:
            return Path(found)
    return None


def in_ci() -> bool:
    """Whether this is a CI run (``CI=true``), where a missing browser is a failure."""
    return os.environ.get("CI", "").strip().lower() in ("true", "1", "yes")


def missing_message() -> str:
    """What to say when no browser is found: where it looked and how to get one."""
    return (
        f"No Chromium found for the browser tests (tried ${CHROMIUM_ENV}, then {', '.join(CANDIDATES)} on PATH). "
        f"Install one (Debian/Ubuntu: apt-get install chromium) or set {CHROMIUM_ENV} to its path."
    )
