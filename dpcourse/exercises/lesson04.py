"""Checkers for the exercises of notebook 04 (automatic data parallelism: collectives, placement)."""

from __future__ import annotations

import functools

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from dpcourse import model, train
from dpcourse.compiled import collectives
from dpcourse.config import Config
from dpcourse.data import Dataset
from dpcourse.exercises.base import as_number, bad_input, checker, describe, wrong


@functools.lru_cache(maxsize=16)
def measured_runs_per_step(cfg: Config, mesh: Mesh) -> int | None:
    """Collective executions per step of ``jit(train_step)`` for ``cfg`` on ``mesh`` (compiled, not run).

    Parameters replicated, a batch ``[per_device_batch x N, 784]`` sharded
    ``P('data', None)``, as in notebook 04. Kept per (cfg, mesh), so a second
    try of the exercise does not compile again.
    """
    n = mesh.shape["data"]
    optimizer = train.make_optimizer(cfg)
    params = jax.device_put(model.init_params(cfg), NamedSharding(mesh, P()))
    opt_state = optimizer.init(params)
    batch = cfg.per_device_batch * n
    x = jax.device_put(np.zeros((batch, 784), np.float32), NamedSharding(mesh, P("data", None)))
    y = jax.device_put(np.zeros((batch,), np.int32), NamedSharding(mesh, P("data")))
    step = jax.jit(train.make_train_step(cfg, optimizer))
    return collectives.collective_report(step, params, opt_state, x, y).runs_per_step


@checker("ex04_1", "your predicted collective executions per step (an int)")
def collectives_doubled(answer, cfg: Config, mesh: Mesh) -> str:
    """Exercise 04.1: collective executions per step of ``jit(train_step)`` when BLOCK_REPEATS doubles.

    The checker compiles the step for both configurations on the lesson's
    mesh and reads the counts with :func:`dpcourse.compiled.collectives.collective_report`;
    the prediction must match the measured count exactly.
    """
    value = as_number(answer, "a count of collective executions per step", positive=True)
    now = measured_runs_per_step(cfg, mesh)
    ref = measured_runs_per_step(cfg.with_overrides(block_repeats=2 * cfg.block_repeats), mesh)
    if ref is None or now is None:
        raise bad_input("The compiled program has a loop of unknown length, so the count cannot be measured here.")
    in_loop = ref - now  # executions added by doubling the repeats
    if value == ref:
        how = (
            f"the {in_loop} added executions are the all-reduces inside the backward scan, once per block repeat"
            if in_loop
            else "on this JAX and backend no collective sits inside the loop, so the count does not change"
        )
        return f"Right: {ref} per step (measured); {how}."
    if value == now and in_loop:
        raise wrong(
            "That is today's count: the collectives inside the backward scan run once per block repeat, so "
            "doubling BLOCK_REPEATS adds executions."
        )
    if value == 2 * now and in_loop and 2 * now != ref:
        raise wrong("Only the collectives inside the loop double; those outside still run once per step.")
    if not in_loop:
        raise wrong(
            "On this JAX and backend no collective runs inside the loop, so doubling the repeats adds none: "
            "the count stays what the table shows."
        )
    raise wrong(
        f"Your count is too {'large' if value > ref else 'small'}: add the executions of the collectives inside "
        "the loop (in_loop) once more; those outside it do not change."
    )


ABOUT_04_2 = 100  # exercise 04.2: "a global batch of about 100 examples"


@checker("ex04_2", "x_mine: a jax.Array of the first examples, placed over the mesh")
def placed_batch(answer, dataset: Dataset, mesh: Mesh) -> str:
    """Exercise 04.2: a batch of the first ``B`` images placed ``P('data', None)``.

    Checks the type, the shape ``[B, 784]``, that ``B`` divides by the device
    count and is within one device count of 100 (so the lesson's own
    ``batches[0][0]``, another size, is not taken for the answer), that the array is sharded on its batch dimension over every
    device, and that its values are ``dataset.images[:B]``.
    """
    n = mesh.shape["data"]
    if not isinstance(answer, jax.Array):
        rows = np.shape(answer)[0] if np.ndim(answer) else None
        if rows and rows % n:
            lower = max(n, rows // n * n)
            raise wrong(
                f"{rows} rows do not divide by {n} devices, so they cannot be split evenly; take {lower} or {lower + n}."
            )
        raise bad_input(
            f"Expected a jax.Array placed with jax.device_put(..., NamedSharding(...)); got {describe(answer)}."
        )
    if answer.ndim != 2 or answer.shape[1] != 784 or answer.dtype != np.float32:
        raise bad_input(f"Expected a float32 array of shape [B, 784]; got {describe(answer)}.")
    rows = answer.shape[0]
    if rows % n:
        lower = max(n, rows // n * n)
        raise wrong(f"{rows} does not divide by {n} devices; take {lower} or {lower + n} examples.")
    if abs(rows - ABOUT_04_2) >= n:
        raise wrong(
            f"{rows} examples is not about {ABOUT_04_2}: pick the multiple of {n} devices nearest to "
            f"{ABOUT_04_2} (this lesson's own batches are another size)."
        )
    if not np.array_equal(np.asarray(jax.device_get(answer)), dataset.images[:rows]):
        raise wrong(f"The values are not the first {rows} images of the dataset (dataset.images[:{rows}]).")
    if len(answer.sharding.device_set) != n:
        raise wrong(
            f"The array lives on {len(answer.sharding.device_set)} device(s); place it over all {n} of the mesh."
        )
    shard_shapes = {tuple(s.data.shape) for s in answer.addressable_shards}
    if n > 1 and answer.sharding.is_fully_replicated:
        raise wrong("The batch is replicated: every device holds all of it, so each would compute the same gradient.")
    if shard_shapes != {(rows // n, 784)}:
        raise wrong(
            f"Each device holds {sorted(shard_shapes)}; split the batch dimension: ({rows // n}, 784) per device."
        )
    return f"Right: {rows} examples, {rows // n} rows on each of the {n} devices."
