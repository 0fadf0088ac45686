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
from variants import (
    KINDS_SETTING,
    MESH_KINDS,
    MESH_LESSONS,
    MESH_LINE,
    ROOT,
    mesh_kinds_of,
    plan,
    run,
    with_global_mesh,
)


def test_the_variant_sets_the_mesh_right_after_it_is_built():
    text = with_global_mesh("import jax\nmesh = Mesh(devs, ('data',))\nprint(mesh)\n", "Explicit")
    assert text.splitlines()[2].startswith("mesh = jax.sharding.Mesh(") and text.splitlines()[3].startswith(
        "jax.set_mesh(mesh)"
    )
    assert all(MESH_LINE.search((ROOT / "notebooks" / f"{name}.py").read_text()) for name in MESH_LESSONS)


def test_the_two_alternations_share_every_lesson_and_kind_between_them():
    """make test gives one alternation to each JAX environment: each runs every lesson, together every kind."""
    shares = [{(v.lesson, v.mesh) for v in plan(f"alternating-from-{kind}")[0]} for kind in MESH_KINDS]
    for share in shares:
        assert sorted(lesson for lesson, _ in share) == MESH_LESSONS
        assert {kind for _, kind in share} == set(MESH_KINDS)
    assert set.union(*shares) == {(v.lesson, v.mesh) for v in plan("both")[0]} and not set.intersection(*shares)
    assert mesh_kinds_of("04_sharding", "alternating-from-Auto") == ("Auto",)
    assert mesh_kinds_of("05_shard_map", "alternating-from-Auto") == ("Explicit",)


def test_an_unknown_setting_names_the_choices(monkeypatch):
    monkeypatch.setenv(KINDS_SETTING, "Explicit")
    with pytest.raises(
        ValueError, match=r"DPCOURSE_TEST_MESH_KINDS='Explicit' is not one of both, alternating-from-Auto"
    ):
        mesh_kinds_of("04_sharding")


RUNS = plan()[0]


@pytest.mark.slow
@pytest.mark.lesson
@pytest.mark.timeout(900)
@pytest.mark.parametrize("variant", RUNS, ids=[v.id for v in RUNS])
def test_the_lesson_runs_with_a_global_mesh(variant, tmp_path, monkeypatch):
    run(variant, tmp_path, monkeypatch)
