"""The learner's library as a wheel: it installs into a fresh environment and runs lesson 05 outside the repository.

The fresh environment has the wheel and its install requirements only (no
nbclient, jupytext or the course's toolkit, no path to this repository), so
the lesson proves that the library needs nothing else: 05 trains (the model,
the data, the steps), places arrays on a mesh, and shows the compile results
stored in the package (the fresh environment has no GPU-compile extra). It
runs from a temporary folder, executed by this environment's nbclient with
the fresh environment's Python as its kernel. Skipped, with the reason, where the
package registry cannot be reached.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import venv
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LESSONS = ("05_shard_map",)
CACHE_VARIABLES = ("JAX_COMPILATION_CACHE", "JAX_PERSISTENT_CACHE")


def _pins(names: set[str]) -> list[str]:
    """The requirements.txt pins of ``names`` (the wheel's own requirements), so the install is the tested one."""
    out = []
    for line in (ROOT / "requirements.txt").read_text().splitlines():
        name = line.split("==")[0].strip().lower().replace("_", "-")
        if "==" in line and name in names:
            out.append(line.strip())
    return out


def test_the_wheel_installs_fresh_and_runs_lesson_05_outside_the_repository(tmp_path):
    wheels = tmp_path / "wheels"
    built = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--quiet",
            "--no-deps",
            "-w",
            str(wheels),
            str(ROOT),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert built.returncode == 0, built.stderr[-3000:]
    (wheel,) = wheels.glob("dpcourse-*.whl")
    env_dir = tmp_path / "fresh"
    venv.create(env_dir, with_pip=True)
    python = env_dir / "bin" / "python"
    meta = subprocess.run(
        [sys.executable, "-c", "import importlib.metadata as m, re; print('\\n'.join(m.requires('dpcourse') or []))"],
        capture_output=True,
        text=True,
    ).stdout
    names = {
        re.split(r"[<>=!\[; ]", r, maxsplit=1)[0].lower().replace("_", "-")
        for r in meta.split("\n")
        if r and "extra" not in r
    }
    # --no-compile: byte-compiling every installed file takes more CPU than the few modules the lesson imports.
    install = subprocess.run(
        [str(python), "-m", "pip", "install", "--quiet", "--no-compile", str(wheel), *_pins(names)],
        capture_output=True,
        text=True,
        timeout=1800,
    )
    if install.returncode != 0 and ("Could not find" in install.stderr or "connection" in install.stderr.lower()):
        pytest.skip(f"the package registry cannot be reached: {install.stderr.strip()[-300:]}")
    assert install.returncode == 0, install.stderr[-3000:]
    installed = subprocess.run([str(python), "-m", "pip", "list", "--format=json"], capture_output=True, text=True)
    present = {d["name"].lower() for d in json.loads(installed.stdout)}
    assert not present & {"nbclient", "jupytext", "nbformat"}, "the wheel pulled in notebook tooling"

    kernels = tmp_path / "jupyter" / "kernels" / "fresh"
    kernels.mkdir(parents=True)
    argv = [str(python), "-m", "ipykernel_launcher", "-f", "{connection_file}"]
    (kernels / "kernel.json").write_text(json.dumps({"argv": argv, "display_name": "fresh", "language": "python"}))
    folder = tmp_path / "learner"
    folder.mkdir()
    for lesson in LESSONS:
        shutil.copy(ROOT / "notebooks" / f"{lesson}.ipynb", folder)
    # make test's shared compilation cache needs filelock, which the wheel does not (Makefile, test_cache_env).
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("PYTHONPATH", "XLA_FLAGS", "VIRTUAL_ENV") and not k.startswith(CACHE_VARIABLES)
    }
    env |= {"JUPYTER_PATH": str(tmp_path / "jupyter"), "DPCOURSE_PROFILE": "smoke"}
    script = f"""
import sys, nbformat
from nbclient import NotebookClient
for name in {list(LESSONS)!r}:
    nb = nbformat.read("{folder}/" + name + ".ipynb", as_version=4)
    NotebookClient(nb, timeout=600, kernel_name="fresh", resources={{"metadata": {{"path": "{folder}"}}}}).execute()
    printed = "".join(o.get("text", "") for c in nb.cells for o in c.get("outputs", []))
    assert "DeprecationWarning" not in printed, name
    print(name, "ran")
"""
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=env, cwd=folder, timeout=1500
    )
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    assert done.stdout.split() == ["05_shard_map", "ran"]
    where = subprocess.run(
        [str(python), "-c", "import dpcourse; print(dpcourse.__file__)"],
        capture_output=True,
        text=True,
        env=env,
        cwd=folder,
    ).stdout
    assert str(env_dir) in where and str(ROOT) not in where
