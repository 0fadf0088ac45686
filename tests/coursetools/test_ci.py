"""The CI entry points: both environments run, and a missing second interpreter is said in one line."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

needs_make = pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")


# What a dry run must not touch: GNU make runs a recipe line that holds $(MAKE) even under -n, and
# `make test`'s lines write build/*.log and build/*.rc, the files a real `make test` around this
# test is reading.
WRITTEN = {"build", "results", "workspace", ".venv", ".venv-newest", ".venv-site"}


def dry_run_checkout(tmp_path: Path) -> Path:
    """A folder that links every top-level entry of the checkout except what a run writes."""
    for entry in ROOT.iterdir():
        if entry.name not in WRITTEN:
            (tmp_path / entry.name).symlink_to(entry)
    (tmp_path / "build").mkdir()  # the recipe's own `mkdir -p build` is not run under -n
    return tmp_path


def make(*args: str, ci: str | None, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("CI", "MAKEFLAGS", "MAKELEVEL")}
    if ci is not None:
        env["CI"] = ci
    return subprocess.run(
        ["make", "--no-print-directory", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=120
    )


@needs_make
def test_without_python_3_12_ci_fails_in_one_line():
    out = make("test-newest", "NEWEST_PYTHON=", ci="true")
    assert out.returncode != 0
    lines = [line for line in out.stderr.splitlines() if line.startswith("test-newest:")]
    assert len(lines) == 1 and "FAILED: no Python 3.12" in lines[0] and "NEWEST_PYTHON" in lines[0]


@needs_make
def test_without_python_3_12_elsewhere_the_target_skips_in_one_line():
    out = make("test-newest", "NEWEST_PYTHON=", ci=None)
    assert out.returncode == 0
    lines = out.stdout.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("test-newest: SKIPPED: no Python 3.12")


@needs_make
def test_make_test_runs_both_environments(tmp_path):
    checkout = dry_run_checkout(tmp_path)
    plan = make("-n", "test", "NEWEST_PYTHON=/nonexistent/python3.12", ci=None, cwd=checkout).stdout
    assert "requirements-newest.txt" in plan and "--nbmake" in plan
    assert "VENV=.venv-newest" in plan
    # the global-mesh runs shared between the environments (tests/lessons/variants.py)
    assert "DPCOURSE_TEST_MESH_KINDS=alternating-from-Auto" in plan
    assert "DPCOURSE_TEST_MESH_KINDS=alternating-from-Explicit" in plan
    # the device count, a test dimension (docs/testing.md): 2 for notebook-test, 4 for solutions-test and 8 for
    # the whole-lesson runs in the pinned environment, 3 for all of them in the newest
    count = "--xla_force_host_platform_device_count="
    for marker, devices in (("DPCOURSE_RESULTS=", ["2", "3"]), ("DPCOURSE_EXERCISES_STRICT=1", ["3", "4"])):
        found = sorted(m.group(1) for m in re.finditer(re.escape(count) + r"(\d+)\" .*" + re.escape(marker), plan))
        assert found == devices, (marker, found)
    assert sorted(re.findall(r"DPCOURSE_TEST_DEVICES=(\d+) ", plan)) == ["3", "8"]
    assert (checkout / "build" / "newest-install.rc").is_file() and not (checkout / "build").is_symlink()


def test_ci_runs_make_test_as_ci():
    script = (ROOT / ".ci" / "run").read_text()
    assert 'export CI="${CI:-true}"' in script and "\nmake test\n" in script


@needs_make
def test_make_sync_goes_through_the_conflict_check():
    plan = make("-n", "sync", ci=None).stdout
    assert "-m coursetools sync" in plan and "jupytext --sync" not in plan
