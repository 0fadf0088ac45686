"""hub/pythons.py and the refusal in hub/launch.py: a course Python under a home closed to others, as pyenv's in /root."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "hub"))
import launch as launcher  # noqa: E402 - hub/launch.py
import pythons  # noqa: E402 - hub/pythons.py


@pytest.fixture()
def closed_python(tmp_path) -> Path:
    """This test's Python as ``python3`` in a folder only its owner may enter (0700), as a pyenv home is."""
    home = tmp_path / "home"
    home.mkdir()
    os.chmod(home, 0o700)
    (home / "python3").symlink_to(sys.executable)
    return home / "python3"


@pytest.fixture(scope="module")
def open_python() -> str:
    found = pythons.open_python(pythons.candidates())
    if found is None:
        pytest.skip("no Python 3.11+ with venv lies where every user may enter (e.g. /usr/bin/python3)")
    return found


def test_a_python_below_a_closed_folder_is_found_closed(closed_python, open_python):
    assert closed_python.parent in pythons.closed_for(str(closed_python))
    assert pythons.closed_for(open_python) == []


def test_make_hub_builds_from_a_python_the_learners_can_run(closed_python, open_python):
    assert pythons.pick(str(closed_python), [str(closed_python), open_python], as_root=True) == open_python
    assert pythons.pick(str(closed_python), [str(closed_python)], as_root=True) == str(closed_python)  # refused later
    assert pythons.pick(str(closed_python), [open_python], as_root=False) == str(closed_python)  # one user: no need


def test_a_clone_whose_python_is_closed_makes_its_environment_from_an_open_one(tmp_path, closed_python, open_python):
    """`make hub` on a fresh clone, `python3` on PATH being the closed one: the environment is made from the open one."""
    clone = tmp_path / "clone"
    (clone / "hub").mkdir(parents=True)
    for name in ("Makefile", "hub.mk", "infra.mk", "hub/pythons.py"):
        shutil.copy(ROOT / name, clone / name)
    for name in ("requirements.txt", "requirements-hub.txt", "requirements-dev.txt", "pyproject.toml"):
        (clone / name).write_text("")
    # A make of its own (run from make hub-test, the parent's MAKEFLAGS would add its directory lines).
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL")}
    path = f"{closed_python.parent}{os.pathsep}{env['PATH']}"
    make = ["make", "--no-print-directory", "-n", "hub"]
    planned = subprocess.run(make, cwd=clone, env={**env, "PATH": path}, capture_output=True, text=True, timeout=60)
    first = planned.stdout.splitlines()[0]
    if os.geteuid() == 0:
        assert first == f"{open_python} -m venv .venv", planned.stdout + planned.stderr
    else:  # without root every server runs as the hub's user: the Python on PATH is used
        assert first == "python3 -m venv .venv", planned.stdout + planned.stderr
    given = subprocess.run([*make, "PYTHON=python3"], cwd=clone, env=env, capture_output=True, text=True)
    assert given.stdout.splitlines()[0] == "python3 -m venv .venv"


def test_an_environment_built_from_a_closed_python_is_refused_naming_the_folder_and_the_make_hub_that_works(
    tmp_path, monkeypatch, closed_python, open_python
):
    monkeypatch.setattr(sys, "base_prefix", str(closed_python.parent))
    (tmp_path / "hubdir").mkdir()
    with pytest.raises(launcher.LaunchError) as refused:
        launcher._separate_users(tmp_path / "hubdir")
    said = str(refused.value)
    assert f"cannot enter {closed_python.parent.parent.parent}" in said or str(closed_python.parent) in said
    assert f"`make hub VENV=.venv-hub PYTHON={open_python}`" in said
    assert "chmod o+x" in said and "any file there" in said  # the other way, and what it costs
