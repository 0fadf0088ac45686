"""Checkers for the exercises of notebook 05 (shard_map: a masked gradient over unequal shards, what psum does to AdamW)."""

from __future__ import annotations

import functools
import inspect

import jax
import numpy as np
import optax
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from dpcourse import model, train
from dpcourse.config import Config
from dpcourse.exercises.base import (
    as_callable,
    as_number,
    as_tuple,
    bad_input,
    check_tree_like,
    checker,
    close,
    tree_close,
    wrong,
)
from dpcourse.exercises.cells import compiled_call

PER_DEVICE = 4  # examples per device in the checkers' batches


def _batch(cfg: Config, n: int, seed: int = 5) -> tuple[np.ndarray, np.ndarray, dict]:
    rng = np.random.default_rng(seed)
    x = rng.random((PER_DEVICE * n, 784), dtype=np.float32)
    y = rng.integers(0, 10, PER_DEVICE * n).astype(np.int32)
    return x, y, model.init_params(cfg, seed=seed)


def _loss(cfg: Config):
    return lambda p, x, y: model.loss_and_metrics(p, x, y, cfg)[0]


def _rel_tol(mesh: Mesh) -> float:
    """Gradient tolerance relative to its largest element (see train.equivalence_tolerances)."""
    device = mesh.devices.flat[0]
    return train.equivalence_tolerances(device.platform, 3e-4, 1)[1]


def _norm(tree) -> float:
    return float(np.sqrt(sum(np.sum(np.square(np.asarray(a, np.float64))) for a in jax.tree.leaves(tree))))


def masked_batch(cfg: Config, n: int, seed: int = 5) -> tuple[np.ndarray, np.ndarray, np.ndarray, dict]:
    """The padded batch of exercise 05.1: ``x [4 N, 784]``, ``y [4 N]``, mask ``m [4 N]``, parameters.

    Device ``i`` holds rows ``4 i`` to ``4 i + 3``, of which the first
    ``1 + i % 4`` are real (mask 1.0) and the rest padding (0.0): the
    shards hold different numbers of real examples.
    """
    x, y, params = _batch(cfg, n, seed)
    mask = np.array([float(j % PER_DEVICE < 1 + (j // PER_DEVICE) % PER_DEVICE) for j in range(PER_DEVICE * n)])
    return x, y, mask.astype(np.float32), params


def per_example_loss(cfg: Config, params, x, y):
    """Softmax cross-entropy of each example, ``[batch]``."""
    logits = model.forward(params, x, cfg.block_repeats, cfg.block_mix, cfg.block_unroll, cfg.compute_dtype)
    return optax.softmax_cross_entropy_with_integer_labels(logits, y)


@functools.lru_cache(maxsize=8)
def _masked_references(cfg: Config, n: int) -> dict[str, dict]:
    """Gradients on one device: the right one and those of the known mistakes of exercise 05.1."""
    x, y, m, params = masked_batch(cfg, n)

    def grad_of(fn):
        return jax.device_get(jax.jit(jax.grad(fn))(params))

    def shard(a, i):
        return a[i * PER_DEVICE : (i + 1) * PER_DEVICE]

    def local_masked_mean(p, i):
        return (shard(m, i) * per_example_loss(cfg, p, shard(x, i), shard(y, i))).sum() / shard(m, i).sum()

    refs = {
        "right": grad_of(lambda p: (m * per_example_loss(cfg, p, x, y)).sum() / m.sum()),
        "mean of means": grad_of(lambda p: sum(local_masked_mean(p, i) for i in range(n)) / n),
        "unmasked": grad_of(lambda p: per_example_loss(cfg, p, x, y).mean()),
        "sum": grad_of(lambda p: (m * per_example_loss(cfg, p, x, y)).sum()),
        "all rows": grad_of(lambda p: (m * per_example_loss(cfg, p, x, y)).sum() / len(m)),
        "device 0": grad_of(lambda p: local_masked_mean(p, 0)),
    }
    return refs


def _is_vma_error(err: Exception) -> bool:
    text = str(err)
    return isinstance(err, ValueError) and "out_specs" in text and "replicat" in text


@checker("ex05_1", "a function masked_grads(params, x, y, m) -> gradients, built with jax.shard_map")
def masked_gradients(answer, cfg: Config, mesh: Mesh) -> str:
    """Exercise 05.1: the gradient of a masked (padded) global mean, with shards of unequal size.

    The checker calls ``jax.jit(answer)(params, x, y, m)`` (``answer(...)``
    where it cannot be traced: :func:`dpcourse.exercises.cells.compiled_call`) with replicated
    parameters and the batch of :func:`masked_batch` sharded over ``data``
    (``x`` ``P('data', None)``, ``y`` and ``m`` ``P('data')``), and compares
    with ``jax.grad`` of ``sum(m * loss) / sum(m)`` on one device
    (tolerance: :func:`dpcourse.train.equivalence_tolerances`). Each known
    mistake (the mean of the shards' means, the mask ignored, no division,
    division by all rows, one device's gradient) gets its own message.
    """
    fn = as_callable(answer, "masked_grads(params, x, y, m)")
    try:
        inspect.signature(fn).bind(None, None, None, None)
    except TypeError as err:
        raise bad_input(
            "masked_grads takes four arguments, (params, x, y, m): the mask m of real examples is what this "
            f"exercise is about ({err})."
        ) from None
    except ValueError:  # a builtin or a jitted function without a signature: just call it
        pass
    n = mesh.shape["data"]
    x, y, m, host_params = masked_batch(cfg, n)
    refs = _masked_references(cfg, n)
    params = jax.device_put(host_params, NamedSharding(mesh, P()))
    xs = jax.device_put(x, NamedSharding(mesh, P("data", None)))
    ys, ms = (jax.device_put(a, NamedSharding(mesh, P("data"))) for a in (y, m))
    try:
        # Compiled (run op by op outside jit, a shard_map gradient takes seconds per try);
        # run as it is where it cannot be traced (numpy or Python control flow on values).
        got = compiled_call(fn, (params, xs, ys, ms))
    except ValueError as err:
        if _is_vma_error(err):
            raise wrong(
                "Your function returns each device's gradient of its own shard, which differs from device to "
                "device, as if it were the same everywhere (out_specs=P()); JAX refuses. Combine the devices' "
                "contributions over 'data' inside shard_map before returning."
            ) from None
        raise
    check_tree_like(got, refs["right"], "the gradients")
    got = jax.device_get(got)
    tol = _rel_tol(mesh)
    if tree_close(got, refs["right"], tol):
        return (
            "Right: summing the masked losses' gradients over the devices and dividing by the global count of "
            "real examples gives every real example the same weight, whatever shard it is on."
        )
    if n > 1 and tree_close(got, refs["mean of means"], tol):
        raise wrong(
            "That is the mean of the shards' masked means: a shard with 1 real example weighs as much as one "
            "with 4. Sum the masked losses' gradients over 'data' and divide by the total number of real "
            "examples on all devices."
        )
    if tree_close(got, refs["unmasked"], tol):
        raise wrong("That averages every row, padding included: multiply each example's loss by its mask.")
    if tree_close(got, refs["sum"], tol):
        raise wrong("That is the gradient of the masked sum, not the mean: divide by the number of real examples.")
    if tree_close(got, refs["all rows"], tol):
        raise wrong(
            "That divides by every row of the global batch, padding included; divide by the number of real "
            "examples, the sum of the mask over all devices."
        )
    if n > 1 and tree_close(got, refs["device 0"], tol):
        raise wrong(
            "That is one device's gradient of its own shard: combine the devices' contributions over 'data' "
            "before returning it."
        )
    ratio = _norm(got) / _norm(refs["right"])
    if n > 1 and close(ratio, n, 1e-3):
        raise wrong(
            f"The gradient is {n} times too large: with a replicated input, grad inside shard_map already sums "
            "over the devices; cast the parameters to a per-device copy (lax.pcast) first."
        )
    direction = "larger" if ratio > 1 else "smaller"
    raise wrong(
        f"The gradients differ from the single-device reference of sum(m * loss) / sum(m); their norm is "
        f"{direction}. Check which rows count and what you divide by."
    )


def _shard_map_grads(reduce, cfg: Config, mesh: Mesh, params, xs, ys):
    def local(p, x, y):
        p = jax.lax.pcast(p, "data", to="varying")
        return reduce(jax.grad(_loss(cfg))(p, x, y), "data")

    return jax.jit(jax.shard_map(local, mesh=mesh, in_specs=(P(), P("data", None), P("data")), out_specs=P()))(
        params, xs, ys
    )


@functools.lru_cache(maxsize=16)
def measured_adamw_factors(cfg: Config, mesh: Mesh, learning_rate: float = 0.1) -> tuple[float, float]:
    """AdamW's first update and second moment with ``psum`` gradients, over those with ``pmean``.

    Norm ratios ``(update, nu)`` after one step from a fresh state, with
    optax's defaults and ``cfg``'s weight decay, on the same parameters and
    batch. About (1, N**2): the update divides the first moment by the
    square root of the second, so the gradient's scale cancels (up to the
    epsilon and the weight decay), while ``nu`` averages squared gradients.
    Kept per (cfg, mesh, learning_rate): each try of 05.2 reuses it.
    """
    x, y, host_params = _batch(cfg, mesh.shape["data"], seed=6)
    params = jax.device_put(host_params, NamedSharding(mesh, P()))
    xs = jax.device_put(x, NamedSharding(mesh, P("data", None)))
    ys = jax.device_put(y, NamedSharding(mesh, P("data")))
    g_mean = _shard_map_grads(jax.lax.pmean, cfg, mesh, params, xs, ys)
    g_sum = _shard_map_grads(jax.lax.psum, cfg, mesh, params, xs, ys)
    opt = optax.adamw(learning_rate, weight_decay=cfg.weight_decay)
    state = opt.init(params)
    up_sum, state_sum = opt.update(g_sum, state, params)
    up_mean, state_mean = opt.update(g_mean, state, params)

    def nu(st):
        return [leaf.nu for leaf in jax.tree.leaves(st, is_leaf=lambda a: hasattr(a, "nu")) if hasattr(leaf, "nu")]

    update_ratio = _norm(jax.device_get(up_sum)) / _norm(jax.device_get(up_mean))
    nu_ratio = _norm(jax.device_get(nu(state_sum))) / _norm(jax.device_get(nu(state_mean)))
    return update_ratio, nu_ratio


def _part_message(which: str, value: float, ref: float, n: int) -> str:
    """Why one of the two factors of 05.2 is off, without giving the measured value."""
    if which == "update":
        if close(value, n, 0.05):
            return (
                "The update is not N times larger: AdamW's first update is learning_rate x m / (sqrt(v) + eps) "
                "(plus weight decay), and a common scale of the gradient appears above and below the line."
            )
        if close(value, 1.0 / n, 0.05):
            return "The update does not shrink: a larger gradient does not make AdamW step less."
        return f"Your update factor is too {'large' if value > ref else 'small'}."
    if close(value, n, 0.05):
        return "nu is not scaled like the gradient: it is a running mean of the gradient's squares."
    if close(value, 1.0, 0.05):
        return "nu does change: unlike the update, it is not normalised; it holds the squared gradients."
    return f"Your nu factor is too {'large' if value > ref else 'small'}."


@checker("ex05_2", "a tuple (update_factor, nu_factor) of two numbers")
def adamw_psum_factors(answer, cfg: Config, mesh: Mesh) -> str:
    """Exercise 05.2: what ``psum`` for ``pmean`` does to AdamW's first update and to its ``nu``.

    Both as norm ratios (psum / pmean), measured by
    :func:`measured_adamw_factors` on the lesson's mesh; each prediction must
    be within 5 % of its measurement. A wrong answer is told which part is
    off and why, never the measured value of either part.
    """
    update_ans, nu_ans = as_tuple(answer, 2, "(update_factor, nu_factor)")
    update_ans = as_number(update_ans, "the update factor", positive=True)
    nu_ans = as_number(nu_ans, "the nu factor", positive=True)
    n = mesh.shape["data"]
    update_ref, nu_ref = measured_adamw_factors(cfg, mesh)
    update_ok, nu_ok = close(update_ans, update_ref, 0.05), close(nu_ans, nu_ref, 0.05)
    if update_ok and nu_ok:
        return (
            f"Right: measured {update_ref:.3g} and {nu_ref:.4g} on {n} devices. AdamW's update hides the mistake "
            "(hence the course's gradient checks in 04-06), while its second moment shows it squared."
        )
    if not update_ok:
        other = "Your nu factor is right." if nu_ok else "The nu factor is not right either."
        raise wrong(f"{_part_message('update', update_ans, update_ref, n)} {other}")
    raise wrong(f"Your update factor is right. {_part_message('nu', nu_ans, nu_ref, n)}")
