"""Which Python the learners' users can run: `make hub` as root builds the course's environment from one they can reach.

A virtual environment's interpreter is a link to (or, with ``--copies``, a
copy of) its base Python, and it reads the standard library, and with a
shared build ``libpython``, from the base install: a learner's server can
start only when every folder above all of these may be entered by other
users. pyenv installs under the instructor's home (``/root``, 0700 on most
cloud images), so a course environment built from it cannot run as a
learner, however open the course's own folder is.

    python hub/pythons.py --pick   another Python to build the hub's environment from, or nothing (hub.mk)

Standard library only: it runs before the environment exists.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

# What a Python says of itself: where it lies, its version, and whether it can make a virtual environment.
ASK = (
    "import json, os, sys, sysconfig, importlib.util as u; print(json.dumps({'executable': os.path.realpath(sys.executable),"
    " 'base_prefix': sys.base_prefix, 'libdir': sysconfig.get_config_var('LIBDIR') or sys.base_prefix,"
    " 'version': list(sys.version_info[:2]), 'venv': bool(u.find_spec('venv') and u.find_spec('ensurepip'))}))"
)
LEAST = (3, 11)
NAMES = ("python3.13", "python3.12", "python3.11", "python3")
PLACES = ("/usr/local/bin", "/usr/bin", "/opt/python/bin")


def closed_folders(paths: list[Path]) -> list[Path]:
    """The folders among ``paths`` and above them that other users may not enter (no o+x)."""
    closed: set[Path] = set()
    for path in paths:
        for folder in (path, *path.parents):
            try:
                mode = os.stat(folder).st_mode
            except OSError:
                continue
            if stat.S_ISDIR(mode) and not mode & stat.S_IXOTH:
                closed.add(folder)
    return sorted(closed)


def describe(python: str) -> dict | None:
    """What the Python at ``python`` says of itself (``ASK``), or None when it does not run."""
    try:
        said = subprocess.run([python, "-c", ASK], capture_output=True, text=True, timeout=30)
        return json.loads(said.stdout) if said.returncode == 0 else None
    except (OSError, ValueError, subprocess.TimeoutExpired):
        return None


def folders_of(facts: dict) -> list[Path]:
    """The paths a learner's process must reach to run this Python."""
    return [Path(facts["executable"]), Path(facts["base_prefix"]), Path(facts["libdir"])]


def closed_for(python: str) -> list[Path]:
    """The folders closed to other users that the Python ``python`` needs; [] when it is open (or does not run)."""
    facts = describe(python)
    return closed_folders([Path(python), *folders_of(facts)]) if facts else []


def candidates(path: str | None = None) -> list[str]:
    """Pythons on PATH and in the system's usual places, newest name first, each file once."""
    found, seen = [], set()
    for folder in [*(path or os.environ.get("PATH", "")).split(os.pathsep), *PLACES]:
        for name in NAMES:
            full = shutil.which(name, path=folder) if folder else None
            if full and os.path.realpath(full) not in seen:
                seen.add(os.path.realpath(full))
                found.append(full)
    return found


def open_python(pythons: list[str]) -> str | None:
    """The first of ``pythons`` that is 3.11 or newer, can make a virtual environment, and lies where others may enter."""
    for python in pythons:
        facts = describe(python)
        if facts and tuple(facts["version"]) >= LEAST and facts["venv"]:
            if not closed_folders([Path(python), *folders_of(facts)]):
                return python
    return None


def pick(python: str, pythons: list[str] | None = None, as_root: bool | None = None) -> str:
    """``python`` where the learners can run it (or without root, where they are the hub's user), else an open one, else ``python``."""
    as_root = os.geteuid() == 0 if as_root is None else as_root
    if not as_root or not closed_for(python):
        return python
    return open_python(candidates() if pythons is None else pythons) or python


def advice(closed: list[Path], pythons: list[str] | None = None) -> str:
    """One sentence: the closed folders the course's Python lies below, and the ``make hub`` that works without opening them."""
    names = " ".join(str(p) for p in closed)
    other = open_python(candidates() if pythons is None else pythons)
    build = (
        f"build the hub's environment from a Python they can run: `make hub VENV=.venv-hub PYTHON={other}` "
        "(a second environment beside .venv, used by `make hub VENV=.venv-hub` from then on)"
        if other
        else "install Python 3.11 or newer where every user may enter (e.g. `apt-get install python3 python3-venv`, "
        "/usr/bin), then `make hub VENV=.venv-hub PYTHON=/usr/bin/python3`"
    )
    return (
        f"each learner's server runs as a user of their own, who cannot enter {names}, where the course's Python "
        f"lies ({sys.base_prefix}): {build}. Opening {names} to others (chmod o+x) would also work, but lets every "
        "learner open any file there whose name they know."
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pick", action="store_true", help="print the Python to build the hub's environment from")
    args = parser.parse_args(argv)
    if args.pick:  # nothing printed when this Python will do
        chosen = pick(sys.executable)
        print("" if chosen == sys.executable else chosen)
    return 0


if __name__ == "__main__":
    sys.exit(main())
