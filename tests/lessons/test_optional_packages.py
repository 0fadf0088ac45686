"""Every optional display or progress package (pyproject's ``display`` extra) is optional in every lesson.

A static scan keeps every import of them where its absence is handled; the
matrix runs each lesson that reaches one of them with the package made
uninstalled in the kernel (``blocker/sitecustomize.py`` on ``PYTHONPATH``),
and checks the lesson passes and says what the package would add. Every pair
rides on a whole run of its lesson (test_global_mesh.py, marker ``lesson``).
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys

import pytest
from variants import BLOCKER, DISPLAY, KINDS_CHOICES, MATRIX, MESH_KINDS, ROOT, SOLVED_ONLY, plan


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


@pytest.mark.parametrize("setting", KINDS_CHOICES)
def test_every_pair_of_the_matrix_rides_on_one_run_and_a_run_carries_one_where_it_can(setting):
    mesh_runs, solved = plan(setting, plain=False)
    carried = [(package, v.lesson) for v in [*mesh_runs, *solved] for package in v.missing]
    assert sorted(carried) == sorted(MATRIX) and len(set(carried)) == len(carried)
    for v in [*mesh_runs, *solved]:  # two packages on one run only where the lesson has no run left bare
        runs = [w for w in [*mesh_runs, *solved] if w.lesson == v.lesson]
        assert len(v.missing) <= 1 or all(w.missing for w in runs), v.id
    assert {v.mesh for v in mesh_runs} == set(MESH_KINDS) and all(v.mesh is None for v in solved)
    assert [v.lesson for v in solved] == SOLVED_ONLY and "13_elastic" in SOLVED_ONLY
    assert {"rich", "tqdm", "ipywidgets"} <= {package for package, _ in MATRIX}
    if setting != "both":  # 07 reaches two packages and has one run in each environment
        (sweep,) = [v for v in mesh_runs if v.lesson == "07_sweep"]
        assert sweep.missing == ("ipywidgets", "tqdm") and "no-ipywidgets-no-tqdm" in sweep.id


@pytest.mark.parametrize("setting", KINDS_CHOICES)
def test_a_run_with_the_plain_lesson_first_has_every_package_and_the_others_carry_the_matrix(setting):
    """The plain pass is what a learner sees (browser-test and site-test show it): nothing is missing there."""
    mesh_runs, solved = plan(setting, plain=True)
    runs = [*mesh_runs, *solved]
    plain = [v for v in runs if v.plain]
    assert sorted(v.lesson for v in plain) == sorted({v.lesson for v in runs})  # one a lesson
    assert not any(v.missing or v.stand_in for v in plain)
    carried = [(package, v.lesson) for v in runs for package in v.missing]
    free = {v.lesson for v in runs if not v.plain}
    assert sorted(carried) == sorted(pair for pair in MATRIX if pair[1] in free)


def test_make_test_runs_the_whole_matrix_and_the_stand_in_for_every_lesson_from_04():
    """make test: the pinned lane's runs start with the plain lesson, the newest lane's carry the rest."""
    pinned, newest = plan("alternating-from-Auto", plain=True), plan("alternating-from-Explicit", plain=False)
    assert all(v.plain for v in [*pinned[0], *pinned[1]]) and not any(v.plain for v in [*newest[0], *newest[1]])
    carried = [(package, v.lesson) for v in [*newest[0], *newest[1]] for package in v.missing]
    assert sorted(carried) == sorted(MATRIX)
    assert all(v.stand_in for v in newest[0]) and not any(v.stand_in for v in newest[1])
