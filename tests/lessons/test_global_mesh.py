"""Every lesson from 04 on runs top to bottom with ``jax.set_mesh(mesh)`` called globally right after its mesh.

Notebook 03 teaches that form (section 4). The variant inserts, after the
lesson's first ``mesh = ...`` line, either ``jax.set_mesh(mesh)`` on the
lesson's own (Auto) mesh or the same mesh rebuilt with Explicit axes and
then set; the lesson must pass as it stands (marker ``lesson``: whole
lessons, smoke profile). Where the missing-package matrix has a pair for the
lesson, the run also has that package missing (tests/lessons/variants.py).
"""

from __future__ import annotations

import pytest
from variants import MESH_LESSONS, MESH_LINE, ROOT, plan, run, with_global_mesh


def test_the_variant_sets_the_mesh_right_after_it_is_built():
    text = with_global_mesh("import jax\nmesh = Mesh(devs, ('data',))\nprint(mesh)\n", "Explicit")
    assert text.splitlines()[2].startswith("mesh = jax.sharding.Mesh(") and text.splitlines()[3].startswith(
        "jax.set_mesh(mesh)"
    )
    assert all(MESH_LINE.search((ROOT / "notebooks" / f"{name}.py").read_text()) for name in MESH_LESSONS)


RUNS = plan()[0]


@pytest.mark.slow
@pytest.mark.lesson
@pytest.mark.timeout(900)
@pytest.mark.parametrize("variant", RUNS, ids=[v.id for v in RUNS])
def test_the_lesson_runs_with_a_global_mesh(variant, tmp_path, monkeypatch):
    run(variant, tmp_path, monkeypatch)
