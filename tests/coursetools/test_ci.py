"""The CI entry points: both environments run, and a missing second interpreter is said in one line."""

from __future__ import annotations

import importlib.util
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


def makefile_variables() -> set[str]:
    """The variables the Makefile and its included files set."""
    text = "\n".join(p.read_text() for p in [ROOT / "Makefile", *ROOT.glob("*.mk")])
    return set(re.findall(r"^([A-Z][A-Z0-9_]*)\s*[?:+]?=", text, re.M))


def make(*args: str, ci: str | None, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    # Under `make test` this process's environment holds what the Makefile passed down (a variable
    # set on a make command line is exported): the plan must be the Makefile's own.
    dropped = {"CI", "MAKEFLAGS", "MAKELEVEL", "MAKEOVERRIDES", "MFLAGS"} | makefile_variables()
    env = {k: v for k, v in os.environ.items() if k not in dropped}
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
    # the pinned lane's notebook-test is its unit layer's plain passes: they leave the executed lessons there
    assert "PLAIN_PASS_DIR=build/notebook-test lint workflow-lint placement unit-test;" in plan
    assert plan.count("--nbmake-timeout") == 1 and "build/notebook-test-newest" in plan  # the newest lane's 01 alone
    assert "VENV=.venv-newest" in plan
    # the global-mesh runs shared between the environments (tests/lessons/variants.py)
    assert "DPCOURSE_TEST_MESH_KINDS=alternating-from-Auto" in plan
    assert "DPCOURSE_TEST_MESH_KINDS=alternating-from-Explicit" in plan
    # the lesson runs: pinned, each lesson its own count of 4, 2, 8 (the Makefile's default), every cell
    # again; newest: 3 devices, no second pass, no `processes` tests; both as a learner without the compile extras
    pinned = [
        line for line in plan.splitlines() if "alternating-from-Auto" in line or "unit-test notebook-test" in line
    ]
    assert any('LESSON_ENV="DPCOURSE_GPU_COMPILE_PATH=' in line for line in plan.splitlines()), plan
    newest = [line for line in plan.splitlines() if "LESSON_DEVICES=" in line]
    assert len(newest) == 1 and 'UNIT_MARKS="not processes" LESSON_DEVICES=3 RUN_AGAIN=0' in newest[0], pinned
    assert 'LESSON_ENV="DPCOURSE_GPU_COMPILE_PATH=' in newest[0], newest[0]
    # there: every lesson's run and the package's tests of what a JAX release can change, not the checkers'
    assert "tests/lessons " in newest[0] and "tests/lib/compiled" in newest[0] and "exercises" not in newest[0]
    # those runs are solved and strict (tests/lessons/variants.py): make test runs no solutions-test of its own
    assert "coursetools.solutions" not in plan and "DPCOURSE_EXERCISES_STRICT=1" not in plan
    assert (checkout / "build" / "newest-install.rc").is_file() and not (checkout / "build").is_symlink()
    # what the side layers need installs in the background lane, before they run
    assert (checkout / "build" / "side-install.rc").is_file()


@needs_make
def test_the_lesson_settings_reach_pytest_through_the_environment_as_typed(tmp_path):
    (tmp_path / "checkout").mkdir()
    checkout = dry_run_checkout(tmp_path / "checkout")
    venv = tmp_path / "venv"
    venv.mkdir()
    for marker in (".installed", ".dev-installed", ".gpu-compile-installed", ".tpu-compile-installed"):
        (venv / marker).touch()
    seen = tmp_path / "seen"
    python = tmp_path / "python"
    python.write_text(f"#!/bin/sh\nenv -0 > '{seen}'\n")
    python.chmod(0o755)
    devices, lesson_env = "2,$(touch made),`touch made`", "A=1 B='two words;touch made'"
    settings = [f"VENV={venv}", f"PY={python}", f"LESSON_DEVICES={devices}", f"LESSON_ENV={lesson_env}", "RUN_AGAIN=0"]
    for target in ("unit-test", "notebook-test"):  # notebook-test's kernels get LESSON_ENV too (nbmake_guard)
        extra = [f"NOTEBOOK_TEST_DIR={tmp_path / 'executed'}"] if target == "notebook-test" else []
        out = make(target, *settings, *extra, ci=None, cwd=checkout)
        assert out.returncode == 0, out.stderr
        env = dict(item.split("=", 1) for item in seen.read_text().split("\0") if "=" in item)
        assert env["DPCOURSE_TEST_DEVICES"] == devices and env["DPCOURSE_TEST_LESSON_ENV"] == lesson_env, target
        assert env["XLA_FLAGS"].split()[0] == "--xla_backend_optimization_level=0", target  # TEST_XLA_FLAGS
        assert not (checkout / "made").exists(), target
        if target == "unit-test":
            assert env["DPCOURSE_TEST_RUN_AGAIN"] == "0" and env["DPCOURSE_TEST_PLAIN_PASS"] == ""


@needs_make
def test_side_install_installs_what_the_side_layers_need(tmp_path):
    # -B: every install planned, whatever this checkout already has
    plan = make("-n", "-B", "side-install", ci=None, cwd=dry_run_checkout(tmp_path)).stdout
    for needed in ("infra", "checkov", "site", "hub"):
        assert f"-r requirements-{needed}.txt" in plan, needed
    assert "cd tools/site && npm ci" in plan and "cd tools/hub && npm ci" in plan


def pins(name: str) -> dict[str, str]:
    """``{distribution: version}`` of the ``name==version`` lines of a requirements file (its -r files too)."""
    found = {}
    for line in (ROOT / name).read_text().splitlines():
        line = line.split("#")[0].split(";")[0].strip()
        if line.startswith("-r "):
            found |= pins(line[3:].strip())
        elif "==" in line:
            dist, version = line.split("==")
            found[re.sub(r"[-_.]+", "-", dist).lower()] = version.strip()
    return found


@pytest.mark.parametrize("extra", ["requirements-hub.txt", "requirements-infra.txt"])
def test_the_background_installs_into_the_test_environment_replace_no_package(extra):
    # make test installs these into .venv while the unit layer runs there: a package they share with
    # the test environment must be at the same version, or pip would swap it under the running tests.
    from importlib import metadata

    test_pins = pins("requirements-dev.txt")
    for dist, version in pins(extra).items():
        if dist in test_pins:
            assert test_pins[dist] == version, f"{extra} pins {dist}=={version}, requirements-dev.txt {test_pins[dist]}"
        else:
            try:
                installed = metadata.version(dist)
            except metadata.PackageNotFoundError:
                continue  # added by the install, replacing nothing
            assert installed == version, (
                f"{extra} pins {dist}=={version}; the test environment has {installed} from its own "
                f"requirements: pin {dist}=={version} in requirements-dev.txt"
            )


def test_ci_runs_make_test_as_ci():
    script = (ROOT / ".ci" / "run").read_text()
    assert 'export CI="${CI:-true}"' in script and "\nmake test\n" in script


@needs_make
def test_make_sync_goes_through_the_conflict_check():
    plan = make("-n", "sync", ci=None).stdout
    assert "-m coursetools sync" in plan and "jupytext --sync" not in plan


def test_the_unit_layers_scopes_keep_a_file_together_and_each_whole_lesson_run_alone():
    spec = importlib.util.spec_from_file_location("tests_conftest", ROOT / "tests" / "conftest.py")
    conftest = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(conftest)
    run = "tests/lessons/test_global_mesh.py::test_the_lesson_runs_with_a_global_mesh"
    assert run in conftest.WHOLE_LESSON_TESTS
    assert conftest.xdist_scope(f"{run}[05_shard_map-Explicit]") == f"{run}[05_shard_map-Explicit]"
    assert conftest.xdist_scope("tests/lessons/test_global_mesh.py::test_an_unknown_setting_names_the_choices") == (
        "tests/lessons/test_global_mesh.py"
    )
    assert conftest.xdist_scope("tests/lib/test_show.py::test_number_formatting[1.5-1.5]") == "tests/lib/test_show.py"


def test_make_unit_tests_xdist_option_gets_the_scopes_of_conftest():
    # pytest-xdist's own grouping (loadgroup) stopped working under pytest 9.2 without a word: the
    # unit-test recipe's --dist must be the mode tests/conftest.py builds its scheduler for.
    import types

    options = re.search(r"\$\(XDIST\) --dist (\S+) --no-loadscope-reorder ", (ROOT / "Makefile").read_text())
    assert options, "the unit-test recipe's xdist options moved: update this test"
    spec = importlib.util.spec_from_file_location("tests_conftest", ROOT / "tests" / "conftest.py")
    conftest = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(conftest)
    settings = {"dist": options.group(1), "tx": ["2*popen"], "numprocesses": 2}
    config = types.SimpleNamespace(getvalue=settings.get, option=types.SimpleNamespace(numprocesses=2))
    scheduler = conftest.pytest_xdist_make_scheduler(config, None)
    assert scheduler is not None, f"tests/conftest.py gives no scheduler for --dist {options.group(1)}"
    run = "tests/lessons/test_global_mesh.py::test_the_lesson_runs_with_a_global_mesh[05_shard_map-Explicit]"
    assert scheduler._split_scope(run) == run
    assert scheduler._split_scope("tests/lib/test_show.py::test_number_formatting[1.5-1.5]") == "tests/lib/test_show.py"
