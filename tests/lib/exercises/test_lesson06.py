"""The checkers of lesson 06 (dpcourse.exercises.lesson06): right answers pass, each planted mistake is named."""

import jax
import numpy as np
import pytest

from dpcourse import model
from dpcourse.config import make_config
from dpcourse.exercises import lesson06
from dpcourse.exercises.base import BAD_INPUT, CORRECT, NOT_ATTEMPTED, WRONG

CFG = make_config("smoke")


def expect(feedback, status, phrase=""):
    assert feedback.status == status, feedback
    assert phrase in feedback.message, feedback


def _step_keys(n):
    return lambda seed, step: jax.random.split(jax.random.fold_in(jax.random.key(seed), step), n)


def _lesson_cell(stem, tag):
    import jupytext

    from coursetools.solutions import NOTEBOOK_DIR

    nb = jupytext.read(NOTEBOOK_DIR / f"{stem}.py")
    cells = [c.source for c in nb.cells if tag in c.get("metadata", {}).get("tags", [])]
    assert len(cells) == 1, f"{stem} must have one cell tagged {tag}"
    return cells[0]


@pytest.mark.parametrize("n", [1, 2, 3, 8])
def test_06_1_step_keys_pass_on_any_device_count(n):
    expect(lesson06.per_device_keys(_step_keys(n), n), CORRECT)
    raw = lambda seed, step: jax.random.split(jax.random.fold_in(jax.random.PRNGKey(seed), step), n)  # noqa: E731
    expect(lesson06.per_device_keys(raw, n), CORRECT)


def test_06_1_wrong_answers():
    n = 4
    # Lifted from section 3 of the lesson: one split per seed, the same masks at every step.
    lifted = lambda seed, step: jax.random.split(jax.random.key(seed), n)  # noqa: E731
    expect(lesson06.per_device_keys(lifted, n), WRONG, "Steps 0 and 1 draw the same masks")
    copied = lambda seed, step: jax.numpy.stack([jax.random.key(seed + 10 * step)] * n)  # noqa: E731
    expect(lesson06.per_device_keys(copied, n), WRONG, "same key")
    half = lambda seed, step: jax.numpy.concatenate([jax.random.split(jax.random.key(seed), 2)] * 2)  # noqa: E731
    expect(lesson06.per_device_keys(half, n), WRONG, "Only 2 of 4")
    counter = iter(range(1000))
    fresh = lambda seed, step: jax.random.split(jax.random.key(next(counter)), n)  # noqa: E731
    expect(lesson06.per_device_keys(fresh, n), WRONG, "same seed and step gave different masks")
    fixed = lambda seed, step: jax.random.split(jax.random.fold_in(jax.random.key(0), step), n)  # noqa: E731
    expect(lesson06.per_device_keys(fixed, n), WRONG, "must come from the seed")
    added = lambda seed, step: jax.random.split(jax.random.key(seed + step), n)  # noqa: E731
    expect(lesson06.per_device_keys(added, n), WRONG, "fold_in")
    expect(lesson06.per_device_keys(lambda seed, step: jax.random.key(seed), n), BAD_INPUT, "shape (4,)")
    expect(lesson06.per_device_keys(lambda seed, step: np.arange(4.0), n), BAD_INPUT, "PRNG keys")
    expect(lesson06.per_device_keys(lambda seed: jax.random.split(jax.random.key(seed), n), n), BAD_INPUT)
    expect(lesson06.per_device_keys(..., n), NOT_ATTEMPTED)


def test_06_2_bytes_per_device():
    ref = 3 * 4 * model.param_count(CFG) + 4
    expect(lesson06.bytes_per_device(ref, CFG, 8), CORRECT)
    expect(lesson06.bytes_per_device(4 * model.param_count(CFG), CFG, 8), WRONG, "parameters only")
    expect(lesson06.bytes_per_device(ref / 8, CFG, 8), WRONG, "full copy on every device")
    expect(lesson06.bytes_per_device(ref * 8, CFG, 8), WRONG, "total over all 8")
    expect(lesson06.bytes_per_device(ref / 4, CFG, 8), WRONG, "values, not bytes")
    expect(lesson06.bytes_per_device(None, CFG, 8), NOT_ATTEMPTED)


def test_06_lesson_cells_equal_the_package(cpu_devices):
    import optax
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    from dpcourse import data, train

    devs = cpu_devices[:4]
    optimizer = train.make_optimizer(CFG)
    init_host = model.init_params(CFG)
    ns = dict(jax=jax, np=np, optax=optax, Mesh=Mesh, NamedSharding=NamedSharding, P=P, model=model, train=train)
    ns.update(cfg=CFG, optimizer=optimizer, init_host=init_host, devs=devs, print=lambda *a: None)
    exec(_lesson_cell("06_pmap", "lesson_replicate"), ns)
    exec(_lesson_cell("06_pmap", "lesson_pmap_step"), ns)
    assert train.max_abs_diff(ns["params_r"], train.replicate(init_host, devs)) == 0.0
    x, y = data.stacked_batches(data.load_fashion_mnist(source="synthetic", limit=256, seed=0), 1, 4 * 8)
    xb, yb = train.split_for_pmap(x[0], 4), train.split_for_pmap(y[0], 4)
    params_r, state_r = ns["params_r"], ns["state_r"]
    mine = ns["p_step"](params_r, state_r, xb, yb)
    package = train.make_pmap_step(CFG, optimizer, devs)(params_r, state_r, xb, yb)
    assert train.max_abs_diff(mine[0], package[0]) == 0.0
    assert train.max_abs_diff(mine[2], package[2]) == 0.0
