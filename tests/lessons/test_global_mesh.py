"""Every lesson from 04 on runs top to bottom with ``jax.set_mesh(mesh)`` called globally right after its mesh.

Notebook 03 teaches that form (section 4). The variant inserts, after the
lesson's first ``mesh = ...`` line, either ``jax.set_mesh(mesh)`` on the
lesson's own (Auto) mesh or the same mesh rebuilt with Explicit axes and
then set; the lesson must pass as it stands (marker ``lesson``: whole
lessons, smoke profile).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LESSONS = [p.stem for p in sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.py")) if int(p.stem[:2]) >= 4]
MESH_LINE = re.compile(r"^(?P<indent> *)mesh = .*$", re.M)
SET = {
    "Auto": "{i}jax.set_mesh(mesh)  # global, as notebook 03 allows\n",
    "Explicit": (
        "{i}mesh = jax.sharding.Mesh(mesh.devices, mesh.axis_names, "
        "axis_types=(jax.sharding.AxisType.Explicit,) * len(mesh.axis_names))\n"
        "{i}jax.set_mesh(mesh)  # global, as notebook 03 allows\n"
    ),
}


def with_global_mesh(source: str, kind: str) -> str:
    """``source`` (a lesson's py:percent text) with the mesh set globally after its first ``mesh = ...`` line."""
    match = MESH_LINE.search(source)
    assert match, "the lesson builds no `mesh = ...`"
    inserted = SET[kind].format(i=match.group("indent"))
    return source[: match.end() + 1] + inserted + source[match.end() + 1 :]


def test_the_variant_sets_the_mesh_right_after_it_is_built():
    text = with_global_mesh("import jax\nmesh = Mesh(devs, ('data',))\nprint(mesh)\n", "Explicit")
    assert text.splitlines()[2].startswith("mesh = jax.sharding.Mesh(") and text.splitlines()[3].startswith(
        "jax.set_mesh(mesh)"
    )
    assert all(MESH_LINE.search((ROOT / "notebooks" / f"{name}.py").read_text()) for name in LESSONS)


# Lesson 10 teaches the Auto-mesh forms (with_sharding_constraint), which JAX turns into asserts on an
# Explicit mesh ("acts as an assert when all axes of mesh are of type Explicit", code cell 11): not
# yet rewritten for a learner who rebuilt its mesh with Explicit axes. strict: it fails when fixed.
OPEN = {
    ("10_sharded", "Explicit"): "10's Auto-mesh forms fail on an Explicit global mesh (code cell 11)",
    # Code cell 16 builds its Explicit mesh's arrays while the global Auto mesh is set: "context mesh
    # ... Explicit ... should match the aval mesh ... Auto" for a scalar made under the global mesh.
    # Its shard_map cell passes the lesson's own Auto mesh while the global mesh is Explicit.
    ("06_pmap", "Explicit"): "06's shard_map cell meets an Explicit global mesh (code cell 17)",
    # 11 trains lesson 10's FSDP form (with_sharding_constraint inside) in code cell 9, which an
    # Explicit global mesh turns into an assert, as in 10: "P('data', None) did not match ... P(None, None)".
    ("11_checkpoint", "Explicit"): "11's FSDP training fails on an Explicit global mesh (code cell 9)",
    ("10_sharded", "Auto"): "10's Explicit-mesh cell meets arrays made under the global Auto mesh (code cell 16)",
}
CASES = [
    pytest.param(lesson, kind, marks=[pytest.mark.xfail(strict=True, reason=OPEN[lesson, kind])])
    if (lesson, kind) in OPEN
    else pytest.param(lesson, kind)
    for lesson in LESSONS
    for kind in ("Auto", "Explicit")
]


@pytest.mark.slow
@pytest.mark.lesson
@pytest.mark.timeout(900)
@pytest.mark.parametrize("lesson, kind", CASES, ids=[f"{c.values[0]}-{c.values[1]}" for c in CASES])
def test_the_lesson_runs_with_a_global_mesh(lesson, kind, tmp_path):
    import jupytext
    import nbformat

    from coursetools import runner

    nb = jupytext.reads(with_global_mesh((ROOT / "notebooks" / f"{lesson}.py").read_text(), kind), fmt="py:percent")
    path = tmp_path / f"{lesson}.ipynb"
    nbformat.write(nb, path)
    out = tmp_path / "out"
    out.mkdir()
    run = runner.run_notebook(path, out, out / "records.jsonl", profile="smoke", cell_timeout_s=600)
    assert run.status == "passed", f"code cell {run.error_code_cell}: {run.error}"
