"""Every lesson from 04 on runs top to bottom with ``jax.set_mesh(mesh)`` called globally right after its mesh.

Notebook 03 teaches that form (section 4). The variant inserts, after the
lesson's first ``mesh = ...`` line, either ``jax.set_mesh(mesh)`` on the
lesson's own (Auto) mesh or the same mesh rebuilt with Explicit axes and
then set; the lesson must pass as it stands (marker ``lesson``: whole
lessons, smoke profile). Where the missing-package matrix has a pair for the
lesson, the run also has that package missing (tests/lessons/variants.py).

A learner's own mesh of another shape, set before the lesson builds its
own, is tried in every lesson from 03: the lesson runs under it or stops
with one sentence naming it and how to clear it.
"""

from __future__ import annotations

import pytest
from variants import (
    DEVICES_SETTING,
    FOREIGN,
    FOREIGN_LESSONS,
    FOREIGN_REFUSAL,
    KINDS_SETTING,
    MESH_KINDS,
    MESH_LESSONS,
    MESH_LINE,
    ROOT,
    START_LINE,
    Variant,
    device_count,
    execute,
    foreign_lessons,
    mesh_kinds_of,
    plan,
    run,
    with_device_count,
    with_foreign_mesh,
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


def test_the_foreign_mesh_is_set_right_after_the_lesson_starts():
    text = with_foreign_mesh("from x import start_lesson\nlesson = start_lesson('03_mesh')\nmesh = 1\n")
    lines = text.splitlines()
    assert lines[1].startswith("lesson = start_lesson(") and lines[4].startswith("jax.set_mesh(jax.make_mesh(")
    assert lines[5] == "mesh = 1"
    assert all(START_LINE.search((ROOT / "notebooks" / f"{name}.py").read_text()) for name in FOREIGN_LESSONS)
    assert FOREIGN_LESSONS[0].startswith("03_") and set(MESH_LESSONS) < set(FOREIGN_LESSONS)


def test_the_two_alternations_share_the_foreign_mesh_runs():
    shares = [set(foreign_lessons(f"alternating-from-{kind}")) for kind in MESH_KINDS]
    assert set.union(*shares) == set(foreign_lessons("both")) == set(FOREIGN_LESSONS)
    assert not set.intersection(*shares)


def test_the_device_count_setting_replaces_any_count_in_xla_flags(monkeypatch):
    flags = "--xla_cpu_enable_fast_math=false --xla_force_host_platform_device_count=8"
    assert with_device_count(flags, 3) == "--xla_cpu_enable_fast_math=false --xla_force_host_platform_device_count=3"
    assert with_device_count("", 2) == "--xla_force_host_platform_device_count=2"
    monkeypatch.delenv(DEVICES_SETTING, raising=False)
    assert device_count() is None and device_count("4") == 4
    for bad in ("1", "two", "-3"):
        with pytest.raises(ValueError, match=f"DPCOURSE_TEST_DEVICES='{bad}' is not a whole number >= 2"):
            device_count(bad)


def test_the_refusal_pattern_is_the_packages_sentence():
    """The runner keeps an error's first line: the package's message must be that one line, and match."""
    import jax
    import numpy as np

    from dpcourse.lesson import ForeignMeshError, check_global_mesh

    own = jax.sharding.Mesh(np.array(jax.devices()), ("data",))
    devs = jax.devices()[: len(jax.devices()) // 2 * 2]
    foreign = jax.make_mesh(
        (len(devs) // 2, 2), ("data", "model"), axis_types=(jax.sharding.AxisType.Explicit,) * 2, devices=devs
    )
    with jax.set_mesh(foreign), pytest.raises(ForeignMeshError) as err:
        check_global_mesh(own)
    assert "\n" not in str(err.value) and FOREIGN_REFUSAL.match(f"ForeignMeshError: {err.value}")


FOREIGN_RUNS = foreign_lessons()


@pytest.mark.slow
@pytest.mark.lesson
@pytest.mark.timeout(900)
@pytest.mark.parametrize("lesson", FOREIGN_RUNS, ids=[f"{name}-{FOREIGN}" for name in FOREIGN_RUNS])
def test_a_learners_own_mesh_of_another_shape_is_run_under_or_named(lesson, tmp_path, monkeypatch):
    done = execute(Variant(lesson, FOREIGN, None), tmp_path, monkeypatch)
    count = device_count()
    where = f"{lesson} with a 2-D Explicit global mesh{f' on {count} devices' if count else ''}"
    assert done.status == "passed" or FOREIGN_REFUSAL.match(done.error or ""), (
        f"{where}: code cell {done.error_code_cell}: {done.error}"
    )
