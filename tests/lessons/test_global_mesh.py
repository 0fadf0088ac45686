"""Every lesson from 04 on runs top to bottom with ``jax.set_mesh(mesh)`` called globally right after its mesh.

Notebook 03 teaches that form (section 4). The variant inserts, after the
lesson's first ``mesh = ...`` line, either ``jax.set_mesh(mesh)`` on the
lesson's own (Auto) mesh or the same mesh rebuilt with Explicit axes and
then set; the lesson must pass as it stands (marker ``lesson``: whole
lessons, smoke profile). Where the missing-package matrix has pairs for the
lesson, the run also has those packages missing (tests/lessons/variants.py).

A learner's own mesh (2-D Explicit or Auto, a 1-D mesh over half the
devices, the Explicit twin of the lesson's own), set right after the lesson
starts or in a cell of its own after the lesson's first mesh, is tried in
every lesson from 03: the lesson runs under it or stops with one sentence
naming it and how to clear it (``dpcourse.global_mesh``), never with JAX's
own error.
"""

from __future__ import annotations

import re

import pytest
from variants import (
    FIRST_MESH_LINE,
    FOREIGN_KINDS,
    FOREIGN_LESSONS,
    FOREIGN_REFUSAL,
    KINDS_SETTING,
    MESH_KINDS,
    MESH_LESSONS,
    MESH_LINE,
    ROOT,
    START_LINE,
    execute,
    foreign_kind,
    foreign_runs,
    mesh_kinds_of,
    plan,
    refusal,
    run,
    with_foreign_mesh,
    with_global_mesh,
)

from coursetools.nbmake_guard import lesson_device_count


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


RUNS, SOLVED = plan()


@pytest.mark.slow
@pytest.mark.lesson
@pytest.mark.timeout(900)
@pytest.mark.parametrize("variant", RUNS, ids=[v.id for v in RUNS])
def test_the_lesson_runs_with_a_global_mesh(variant, tmp_path, monkeypatch):
    run(variant, tmp_path, monkeypatch)


@pytest.mark.slow
@pytest.mark.lesson
@pytest.mark.timeout(900)
@pytest.mark.parametrize("variant", SOLVED, ids=[v.id for v in SOLVED])
def test_a_lesson_without_a_global_mesh_run_runs_solved_and_again(variant, tmp_path, monkeypatch):
    """01 to 03 and 13: solved, strict and every cell again, with the lesson's own mesh."""
    run(variant, tmp_path, monkeypatch)


def test_the_foreign_mesh_is_set_right_after_the_lesson_starts():
    text = with_foreign_mesh("from x import start_lesson\nlesson = start_lesson('03_mesh')\nmesh = 1\n")
    lines = text.splitlines()
    assert lines[1].startswith("lesson = start_lesson(") and lines[3].startswith("jax.set_mesh(jax.sharding.Mesh(")
    assert lines[4] == "mesh = 1"
    assert all(START_LINE.search((ROOT / "notebooks" / f"{name}.py").read_text()) for name in FOREIGN_LESSONS)
    assert FOREIGN_LESSONS[0].startswith("03_") and set(MESH_LESSONS) < set(FOREIGN_LESSONS)


def test_later_the_foreign_mesh_is_a_cell_of_its_own_after_the_lessons_first_mesh():
    source = (
        "# %%\nlesson = start_lesson('04')\n# Mesh(in a comment)\nn = 2\n\n"
        "# %%\nmesh = Mesh(devs, ('data',))\nx = 1\n\n# %%\nstep(x)\n"
    )
    text = with_foreign_mesh(source, "Explicit twin", "later")
    cells = text.split("# %%\n")
    assert cells[2].startswith("mesh = Mesh(") and cells[3].startswith("import jax, numpy as np")
    assert "AxisType.Explicit" in cells[3] and cells[4] == "step(x)\n"
    for name in FOREIGN_LESSONS:  # each lesson's first mesh comes after its start, so the run tries the guard
        lesson = (ROOT / "notebooks" / f"{name}.py").read_text()
        assert FIRST_MESH_LINE.search(lesson, START_LINE.search(lesson).end()), name


def test_each_kind_builds_the_mesh_the_sentence_names():
    import jax
    import numpy as np

    from dpcourse.backend.mesh_guard import describe

    for kind, (code, named) in FOREIGN_KINDS.items():
        mesh = eval(code, {"jax": jax, "np": np})  # noqa: S307 - the variant's own expression
        assert re.fullmatch(named, describe(mesh)), kind
        assert refusal(kind).match(
            f"ForeignMeshError: A global mesh {describe(mesh)} is set (jax.set_mesh without "
            f"`with`), and this lesson, which needs its own mesh {{'data': 8}} (Auto axes), "
            "stopped under it (ValueError): clear it with jax.set_mesh(None) (or restart the "
            "kernel), then run this cell again."
        ), kind


def test_the_two_alternations_share_the_foreign_mesh_runs_and_each_tries_every_kind():
    shares = [foreign_runs(f"alternating-from-{kind}") for kind in MESH_KINDS]
    lessons = [{v.lesson for v in share} for share in shares]
    assert set.union(*lessons) == set(FOREIGN_LESSONS) and not set.intersection(*lessons)
    for share in shares:
        assert {v.foreign for v in share} == set(FOREIGN_KINDS) and {v.where for v in share} == {"later"}
    both = foreign_runs("both")
    assert {v.lesson for v in both if v.where == "start"} == set(FOREIGN_LESSONS)
    assert {v.lesson for v in both if v.where == "later" and v.foreign == "2-D Explicit"} == set(FOREIGN_LESSONS)
    # the failures named: a 2-D Explicit mesh set after the mesh of 04, 05, 10 and 12 (12 tries it under `both`)
    assert [foreign_kind(name) for name in ("04_sharding", "05_shard_map", "10_sharded")] == ["2-D Explicit"] * 3


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


FOREIGN_RUNS = foreign_runs()


@pytest.mark.slow
@pytest.mark.lesson
@pytest.mark.timeout(900)
@pytest.mark.parametrize("variant", FOREIGN_RUNS, ids=[v.id for v in FOREIGN_RUNS])
def test_a_learners_own_mesh_of_another_shape_is_run_under_or_named(variant, tmp_path, monkeypatch):
    """A 2-D Explicit mesh set a few cells in stopped 04, 05, 10 and 12 with 26 to 80 lines of JAX's own error."""
    import nbformat

    done = execute(variant, tmp_path, monkeypatch)
    count = lesson_device_count(variant.lesson)
    where = f"{variant.id}{f' on {count} devices' if count else ''}"
    assert done.status == "passed" or refusal(variant.foreign).match(done.error or ""), (
        f"{where}: code cell {done.error_code_cell}: {done.error}"
    )
    if done.status != "passed":  # the sentence alone, under IPython's pointer to %tb
        executed = nbformat.read(tmp_path / "out" / f"{variant.lesson}.ipynb", as_version=4)
        shown = [o for c in executed.cells for o in c.get("outputs", []) if o.get("output_type") == "error"]
        assert len(shown) == 1 and len("".join(shown[0]["traceback"]).strip().splitlines()) <= 2, where
