"""Every optional display or progress package (pyproject's ``display`` extra) is optional in every lesson.

A static scan keeps every import of them where its absence is handled; the
matrix (marker ``lesson``) runs each lesson that reaches one of them with
that one package made uninstalled in the kernel (``blocker/sitecustomize.py``
on ``PYTHONPATH``), and checks the lesson passes and says what the package
would add.
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BLOCKER = Path(__file__).resolve().parent / "blocker"
DISPLAY = sorted(
    dep.split(">")[0].split("=")[0].strip()
    for dep in tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["display"]
)
# What each package adds, as the lesson says it when the package is missing.
SAYS = {"rich": "needs the rich package", "tqdm": "no progress bar", "ipywidgets": "ipywidgets cannot be imported"}
# The course's ways to reach each display package; a lesson that uses none of them, nor the package, never needs it.
REACHES = {
    "rich": ("show.sharding", "visualize_array_sharding"),
    "tqdm": ("show.progress", "bench.sweep"),
    "ipywidgets": ("optional_widgets",),
}


def _handled(tree: ast.AST, node: ast.AST) -> bool:
    """Whether ``node`` (an import) sits in a ``try`` that catches ImportError, or in a function that checks find_spec."""
    for parent in ast.walk(tree):
        if isinstance(parent, ast.Try) and any(node in ast.walk(stmt) for stmt in parent.body):
            caught = {ast.unparse(h.type) for h in parent.handlers if h.type is not None}
            if caught & {"ImportError", "ModuleNotFoundError", "(ImportError, ModuleNotFoundError)"}:
                return True
    return False


def test_every_import_of_a_display_package_handles_its_absence():
    sources = [*sorted((ROOT / "dpcourse").rglob("*.py")), *sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.py"))]
    bare = []
    for path in sources:
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            if any(n.partition(".")[0] in DISPLAY for n in names) and not _handled(tree, node):
                bare.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert not bare, f"an import of a display package that fails without it: {bare}"


def test_the_blocker_makes_a_package_look_uninstalled():
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(BLOCKER), os.environ.get("PYTHONPATH", "")]))
    env["DPCOURSE_BLOCK_IMPORTS"] = "rich"
    code = "import importlib.util as u\nprint(u.find_spec('rich'), u.find_spec('numpy') is not None)\nimport rich"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60)
    assert out.stdout.split() == ["None", "True"] and "No module named 'rich'" in out.stderr


def _code(path: Path) -> str:
    """A lesson's code lines (its markdown and comments may name a package it never uses)."""
    return "\n".join(line for line in path.read_text().splitlines() if not line.lstrip().startswith("#"))


def lessons_reaching(package: str) -> list[str]:
    return [
        p.stem
        for p in sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.py"))
        if any(word in _code(p) for word in (*REACHES[package], f"import {package}", f"from {package}"))
    ]


MATRIX = [(package, lesson) for package in DISPLAY for lesson in lessons_reaching(package)]


@pytest.mark.slow
@pytest.mark.lesson
@pytest.mark.timeout(900)
@pytest.mark.parametrize("package, lesson", MATRIX, ids=[f"{p}-missing-{n}" for p, n in MATRIX])
def test_the_lesson_runs_without_the_package_and_says_what_it_would_add(package, lesson, tmp_path, monkeypatch):
    import nbformat

    from coursetools import runner

    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(BLOCKER), os.environ.get("PYTHONPATH", "")]))
    monkeypatch.setenv("DPCOURSE_BLOCK_IMPORTS", package)
    path = tmp_path / f"{lesson}.ipynb"
    path.write_text((ROOT / "notebooks" / f"{lesson}.ipynb").read_text())
    out = tmp_path / "out"
    out.mkdir()
    run = runner.run_notebook(path, out, out / "records.jsonl", profile="smoke", cell_timeout_s=600)
    assert run.status == "passed", run.error
    executed = nbformat.read(out / path.name, as_version=4)
    text = json.dumps([c.get("outputs", []) for c in executed.cells if c.cell_type == "code"])
    assert SAYS[package] in text, f"{lesson} without {package} does not say what it would add"
