"""Tests of coursetools.nbmake_guard: the nbmake layers run this interpreter's kernel and check XLA_FLAGS first."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from coursetools import nbmake_guard

REPO = Path(__file__).resolve().parents[2]


def foreign_python3(folder: Path) -> Path:
    """A ``python3`` kernelspec of "another environment" (its own interpreter path) on a JUPYTER_PATH folder."""
    spec = folder / "kernels" / "python3"
    spec.mkdir(parents=True)
    other = folder / "other-env-python"
    other.write_text(f'#!/bin/sh\nexec {sys.executable} "$@"\n')
    other.chmod(0o755)
    argv = [str(other), "-m", "ipykernel_launcher", "-f", "{connection_file}"]
    spec_json = {"argv": argv, "display_name": "other", "language": "python", "env": {"FOREIGN_KERNEL": "1"}}
    (spec / "kernel.json").write_text(json.dumps(spec_json))
    return other


def test_kernel_name_is_this_interpreters_own():
    assert nbmake_guard.kernel_name() == nbmake_guard.kernel_name(sys.executable)
    assert nbmake_guard.kernel_name() != nbmake_guard.kernel_name("/elsewhere/bin/python")
    assert nbmake_guard.kernel_name() != "python3"


def test_a_foreign_kernelspec_under_the_courses_name_is_refused_naming_it(tmp_path, monkeypatch):
    name = nbmake_guard.kernel_name()
    spec = tmp_path / "kernels" / name
    spec.mkdir(parents=True)
    (spec / "kernel.json").write_text(
        json.dumps(
            {"argv": ["/usr/bin/python3", "-m", "ipykernel_launcher"], "display_name": "x", "language": "python"}
        )
    )
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path))
    with pytest.raises(RuntimeError) as err:
        nbmake_guard.check_kernelspec(name)
    assert str(spec) in str(err.value) and "/usr/bin/python3" in str(err.value)


@pytest.mark.slow
def test_nbmake_runs_this_interpreter_even_with_a_foreign_python3_kernelspec_on_jupyter_path(tmp_path):
    """The issue's example: a python3 kernelspec of another env on JUPYTER_PATH must not run the lesson."""
    jpath = tmp_path / "jupyter"
    foreign_python3(jpath)
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    check = (
        "import os, sys\n"
        "assert 'FOREIGN_KERNEL' not in os.environ, 'ran the foreign kernelspec'\n"
        f"assert os.path.realpath(sys.executable) == {os.path.realpath(sys.executable)!r}, sys.executable"
    )
    nb.cells = [nbformat.v4.new_code_cell(check)]
    nbformat.write(nb, tmp_path / "01_x.ipynb")
    env = dict(os.environ, JUPYTER_PATH=str(jpath))
    env.pop("XLA_FLAGS", None)
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        "-p",
        "coursetools.nbmake_guard",
        "--nbmake",
        "-p",
        "no:cacheprovider",
        "-q",
        str(tmp_path / "01_x.ipynb"),
    ]
    out = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp_path, env=env, timeout=300)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    # Without the guard the same run uses the foreign kernelspec (so the test above can fail).
    cmd.remove("-p")
    cmd.remove("coursetools.nbmake_guard")
    out = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp_path, env=env, timeout=300)
    assert out.returncode != 0 and "ran the foreign kernelspec" in out.stdout


def test_a_bad_xla_flags_token_stops_nbmake_before_any_kernel_naming_it(tmp_path):
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell("1")]
    nbformat.write(nb, tmp_path / "01_x.ipynb")
    env = dict(os.environ, XLA_FLAGS="\u2013xla_force_host_platform_device_count=8")
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        "-p",
        "coursetools.nbmake_guard",
        "--nbmake",
        "-p",
        "no:cacheprovider",
        "-q",
        str(tmp_path / "01_x.ipynb"),
    ]
    out = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp_path, env=env, timeout=120)
    text = out.stdout + out.stderr
    assert out.returncode != 0 and "NBMAKE INTERNAL ERROR" not in text
    assert "XLA_FLAGS" in text and "en dash" in text and "'--xla_force_host_platform_device_count=8'" in text


@pytest.mark.slow
def test_a_known_flag_with_a_bad_value_stops_nbmake_before_any_kernel_naming_it(tmp_path):
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell("1")]
    nbformat.write(nb, tmp_path / "01_x.ipynb")
    env = dict(os.environ, XLA_FLAGS="--xla_cpu_enable_fast_math=maybe", DPCOURSE_CACHE_DIR=str(tmp_path / "cache"))
    cmd = [sys.executable, "-m", "pytest", "-p", "coursetools.nbmake_guard", "--nbmake", "-p", "no:cacheprovider"]
    out = subprocess.run(
        [*cmd, "-q", str(tmp_path / "01_x.ipynb")], capture_output=True, text=True, cwd=tmp_path, env=env, timeout=300
    )
    text = out.stdout + out.stderr
    assert out.returncode != 0 and "NBMAKE INTERNAL ERROR" not in text and "DeadKernelError" not in text
    assert "'maybe'" in text and "--xla_cpu_enable_fast_math=true or" in text


def test_each_lesson_gets_its_count_of_the_rotation_and_a_bad_setting_is_named(monkeypatch):
    from coursetools.nbmake_guard import DEVICES_SETTING, lesson_device_count, with_device_count

    flags = "--xla_cpu_enable_fast_math=false --xla_force_host_platform_device_count=8"
    assert with_device_count(flags, 3) == "--xla_cpu_enable_fast_math=false --xla_force_host_platform_device_count=3"
    assert with_device_count("", 2) == "--xla_force_host_platform_device_count=2"
    assert [lesson_device_count(f"{n:02d}_x", "2,4,8") for n in range(1, 14)] == [4, 8, 2] * 4 + [4]
    assert lesson_device_count("13_elastic", "3") == 3
    monkeypatch.delenv(DEVICES_SETTING, raising=False)
    assert lesson_device_count("04_sharding") is None
    for bad in ("1", "two", "-3", "2,,4", "2,1"):
        with pytest.raises(ValueError, match=f"DPCOURSE_TEST_DEVICES='{bad}' is not a whole number >= 2"):
            lesson_device_count("04_sharding", bad)


def test_the_lessons_own_settings_are_name_value_words_and_a_bad_one_is_named():
    from coursetools.nbmake_guard import lesson_env

    assert lesson_env("A=1 B='two words'") == {"A": "1", "B": "two words"} and lesson_env("") == {}
    for bad in ("A", "=1", "A-B=1"):
        with pytest.raises(ValueError, match=f"DPCOURSE_TEST_LESSON_ENV: '{bad}' is not NAME=value"):
            lesson_env(bad)
