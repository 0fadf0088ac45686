"""The lessons' own code cells (02 to 05) hold the same numbers as the package's reusable versions.

Each lesson writes the code it teaches in editable cells and checks them
with ``check_against``; these tests take the cell source out of the lesson
``.py`` as committed, run it, and hold it to the package function, so the
two cannot drift apart. A changed cell must be reported with what differs.
"""

from __future__ import annotations

import functools
import re
from pathlib import Path

import jax
import jax.numpy as jnp
import jupytext
import numpy as np
import optax
import pytest
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from dpcourse import model, train
from dpcourse.config import make_config
from dpcourse.exercises.base import CORRECT, WRONG
from dpcourse.exercises.cells import check_against, compare_trees

ROOT = Path(__file__).resolve().parents[3]
CFG = make_config("smoke")


def lesson_cells(stem: str, *names: str) -> str:
    """The source of the lesson's code cells that define ``names`` (``def name(``), in lesson order."""
    nb = jupytext.read(ROOT / "notebooks" / f"{stem}.py")
    cells = [
        c.source
        for c in nb.cells
        if c.cell_type == "code" and any(re.search(rf"^def {n}\(", c.source, flags=re.M) for n in names)
    ]
    found = {n for n in names for src in cells if re.search(rf"^def {n}\(", src, flags=re.M)}
    assert found == set(names), f"{stem}: no cell defines {set(names) - found}"
    return "\n\n".join(cells)


def run_cells(source: str, **names) -> dict:
    namespace = dict(jax=jax, jnp=jnp, optax=optax, functools=functools, model=model, P=P, cfg=CFG, **names)
    exec(compile(source, "<lesson cell>", "exec"), namespace)
    return namespace


def host_batch(rows: int, seed: int = 3):
    rng = np.random.default_rng(seed)
    return rng.random((rows, 784), dtype=np.float32), rng.integers(0, 10, rows).astype(np.int32)


def mesh_of(k):
    return Mesh(np.array(jax.devices()[:k]), ("data",))


def test_02_forward_loss_and_step_cells_match_the_package():
    ns = run_cells(lesson_cells("02_baseline", "forward", "loss_and_metrics", "make_train_step"))
    params = model.init_params(CFG)
    x, y = host_batch(8)
    fb = check_against(model.forward, ns["forward"], params, x, CFG.block_repeats, CFG.block_mix)
    assert fb.status == CORRECT, fb
    reference_loss = functools.partial(model.loss_and_metrics, cfg=CFG)
    assert check_against(reference_loss, ns["loss_and_metrics"], params, x, y).status == CORRECT
    opt = train.make_optimizer(CFG)
    step = ns["make_train_step"](opt)
    fb = check_against(train.make_train_step(CFG, opt), step, params, opt.init(params), x, y)
    assert fb.status == CORRECT, fb


def test_02_a_changed_forward_cell_is_told_what_differs():
    source = lesson_cells("02_baseline", "forward", "loss_and_metrics")
    assert "(1.0 - block_mix) * h" in source
    ns = run_cells(source.replace("(1.0 - block_mix) * h", "h"))
    params = model.init_params(CFG)
    x, y = host_batch(8)
    fb = check_against(model.forward, ns["forward"], params, x, CFG.block_repeats, CFG.block_mix)
    assert fb.status == WRONG and "the output differs from the reference's by" in fb.message, fb
    # the size of the difference reads as a sentence: "... by 0.22 of its own size (...; at most 0.0001 ...)"
    assert "of its own size" in fb.message and "tolerated" in fb.message, fb


def test_04_device_axis_step_cell_matches_the_package():
    mesh = mesh_of(4)
    ns = run_cells(lesson_cells("04_sharding", "make_device_axis_step"))
    opt = train.make_optimizer(CFG)
    params = jax.device_put(model.init_params(CFG), NamedSharding(mesh, P()))
    x, y = host_batch(4 * CFG.per_device_batch)
    xs = jax.device_put(x, NamedSharding(mesh, P("data", None)))
    ys = jax.device_put(y, NamedSharding(mesh, P("data")))
    args = (params, opt.init(params), xs, ys)
    fb = check_against(train.make_device_axis_step(CFG, opt, 4), ns["make_device_axis_step"](opt, 4), *args)
    assert fb.status == CORRECT, fb
    bad = run_cells(lesson_cells("04_sharding", "make_device_axis_step").replace("g.mean(axis=0)", "g.sum(axis=0)"))
    fb = check_against(train.make_device_axis_step(CFG, opt, 4), bad["make_device_axis_step"](opt, 4), *args)
    assert fb.status == WRONG and "your gradients are 4x the reference's (N = 4 devices)" in fb.message, fb


def test_05_shard_map_step_cell_matches_the_package_and_a_psum_is_caught():
    mesh = mesh_of(4)
    source = lesson_cells("05_shard_map", "local_grads", "make_shard_map_step")
    opt = train.make_optimizer(CFG)
    params = jax.device_put(model.init_params(CFG), NamedSharding(mesh, P()))
    x, y = host_batch(4 * CFG.per_device_batch)
    xs = jax.device_put(x, NamedSharding(mesh, P("data", None)))
    ys = jax.device_put(y, NamedSharding(mesh, P("data")))
    args = (params, opt.init(params), xs, ys)
    reference = train.make_shard_map_step(CFG, opt, mesh)
    ns = run_cells(source)
    assert check_against(reference, ns["make_shard_map_step"](opt, mesh), *args).status == CORRECT
    assert 'jax.lax.pmean(grads, "data")' in source
    bad = run_cells(source.replace('jax.lax.pmean(grads, "data")', 'jax.lax.psum(grads, "data")'))
    fb = check_against(reference, bad["make_shard_map_step"](opt, mesh), *args)
    assert fb.status == WRONG, fb  # AdamW hides most of it in params, not in the optimizer state
    assert "your gradients are 4x the reference's (N = 4 devices)" in fb.message, fb


def test_check_against_compares_gradients_of_a_scalar_output():
    params = {"w": np.ones(3, np.float32)}

    def ref(p, x):
        return (p["w"] * x).sum()

    def cut(p, x):
        return (jax.lax.stop_gradient(p["w"]) * x).sum()

    fb = check_against(ref, cut, params, np.arange(3, dtype=np.float32))
    assert fb.status == WRONG and "the gradient" in fb.message, fb


def test_check_against_reports_a_cell_that_raises_in_a_sentence():
    fb = check_against(lambda a: a * 2, lambda a: a.undefined, np.ones(2, np.float32))
    assert fb.status == WRONG and "raised AttributeError" in fb.message, fb


def test_compare_trees_names_structure_shape_and_dtype():
    ref = {"a": np.zeros(2, np.float32)}
    assert "structure" in compare_trees(ref, [np.zeros(2)], "out", 1e-4)
    extra = compare_trees(ref, {"a": np.zeros(2, np.float32), "b": np.zeros(1)}, "the output", 1e-4)
    assert extra == "the output has another structure than the reference's: extra ['b']."
    assert "shape" in compare_trees(ref, {"a": np.zeros(3, np.float32)}, "out", 1e-4)
    assert "dtype" in compare_trees(ref, {"a": np.zeros(2, np.float64)}, "out", 1e-4)
    assert compare_trees(ref, {"a": np.zeros(2, np.float32)}, "out", 1e-4) is None


def _names_in(node) -> set[str]:
    import ast

    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}


@pytest.mark.parametrize("path", sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.py")), ids=lambda p: p.stem)
def test_a_check_against_cell_still_runs_after_the_lessons_cleanup(path):
    """A learner edits the lesson's cell after Run All and re-runs its check: the check's arguments must
    not be among the names the lesson's last cells free (memory.free), or the check raises NameError.
    A name the check's own cell assigns before the check is made again when the cell is re-run."""
    import ast

    nb = jupytext.read(path)
    freed: set[str] = set()
    checked: dict[str, set[str]] = {}
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        tree = ast.parse(cell.source)
        for call in (n for n in ast.walk(tree) if isinstance(n, ast.Call)):
            name = getattr(call.func, "attr", getattr(call.func, "id", ""))
            if name == "free":
                freed |= {a.value for a in call.args if isinstance(a, ast.Constant) and isinstance(a.value, str)}
            elif name == "check_against":
                made_here = {
                    n.id
                    for n in ast.walk(tree)
                    if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store) and n.lineno < call.lineno
                }
                args = set().union(*(_names_in(a) for a in call.args[2:]))
                checked[cell.source.splitlines()[0]] = args - made_here
    for first_line, names in checked.items():
        assert not names & freed, (
            f"{path.name}: the check_against cell starting {first_line!r} passes {sorted(names & freed)}, "
            "which the lesson's cleanup frees; give the check arguments of its own"
        )


SCALE = 1.0  # a global the cell below reads, changed between two checks


def test_a_global_changed_between_two_checks_is_seen():
    """jax.jit(mine) would reuse the first check's trace, made with the old global, and accept the changed cell."""
    global SCALE

    def reference(p, x):
        return p * x

    def mine(p, x):
        return p * x * SCALE

    p, x = jnp.ones(3), jnp.arange(3.0)
    try:
        assert check_against(reference, mine, p, x).status == CORRECT
        SCALE = 2.0
        fb = check_against(reference, mine, p, x)
        assert fb.status == WRONG and "the output is 2x the reference's" in fb.message, fb
    finally:
        SCALE = 1.0


def test_a_loss_that_numpy_cannot_differentiate_gets_a_sentence():
    """Eager, a loss through numpy runs; its gradient cannot be traced: a sentence, not a traceback."""

    def reference(p, x):
        return (p * x).sum()

    def mine(p, x):
        return jnp.asarray(np.sum(np.asarray(p) * np.asarray(x)))

    fb = check_against(reference, mine, jnp.ones(3), jnp.arange(3.0))
    assert fb.status == WRONG and "taking the gradient of your cell's loss raised" in fb.message, fb
    assert "use jax.numpy" in fb.message, fb


def test_check_against_names_a_foreign_global_mesh_that_stopped_the_cell(cpu_devices):
    foreign = jax.make_mesh((4, 2), ("data", "model"), axis_types=(jax.sharding.AxisType.Explicit,) * 2)
    one_device = jax.device_put(np.ones(2, np.float32), cpu_devices[0])

    def mine(a):  # float() keeps it out of jit: its own jitted step on one device then runs under the mesh
        return float(a[0]) * jax.jit(lambda b: b * 2)(one_device)

    with jax.set_mesh(foreign):
        fb = check_against(lambda a: a * 2, mine, np.ones(2, np.float32))
    assert fb.status == WRONG and "your cell raised ForeignMeshError: A global mesh {'data': 4, 'model': 2}" in (
        fb.message
    ), fb
