"""Checkers for the exercises of notebook 05 (shard_map: a pmean gradient, what psum does)."""

from __future__ import annotations

import functools

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
    check_tree_like,
    checker,
    close,
    tree_close,
    wrong,
)

PER_DEVICE = 4  # examples per device in the checkers' batches


def _batch(cfg: Config, n: int, seed: int = 5) -> tuple[np.ndarray, np.ndarray, dict]:
    rng = np.random.default_rng(seed)
    x = rng.random((PER_DEVICE * n, 784), dtype=np.float32)
    y = rng.integers(0, 10, PER_DEVICE * n).astype(np.int32)
    return x, y, model.init_params(cfg, seed=seed)


def _loss(cfg: Config):
    return lambda p, x, y: model.loss_and_metrics(p, x, y, cfg)[0]


@functools.lru_cache(maxsize=8)
def _reference_grads(cfg: Config, n: int) -> tuple[dict, dict]:
    """Gradients of the global mean loss and of device 0's shard, on one device (cached per config and N)."""
    x, y, host_params = _batch(cfg, n)
    grad = jax.jit(jax.grad(_loss(cfg)))
    return jax.device_get(grad(host_params, x, y)), jax.device_get(grad(host_params, x[:PER_DEVICE], y[:PER_DEVICE]))


def _rel_tol(mesh: Mesh) -> float:
    """Gradient tolerance relative to its largest element (see train.equivalence_tolerances)."""
    device = mesh.devices.flat[0]
    return train.equivalence_tolerances(device.platform, 3e-4, 1)[1]


def _norm(tree) -> float:
    return float(np.sqrt(sum(np.sum(np.square(np.asarray(a, np.float64))) for a in jax.tree.leaves(tree))))


@checker("ex05_1", "a function grads_fn(params, x, y) -> gradients, built with jax.shard_map and lax.pmean")
def pmean_gradients(answer, cfg: Config, mesh: Mesh) -> str:
    """Exercise 05.1: the data-parallel gradient written with ``shard_map`` and ``pmean``.

    The checker calls ``answer(params, x, y)`` with replicated parameters and
    a batch ``[4 x N, 784]`` sharded ``P('data', None)`` on ``mesh``, and
    compares with ``jax.grad`` of the global mean loss on one device
    (tolerance: :func:`dpcourse.train.equivalence_tolerances`).
    """
    fn = as_callable(answer, "grads_fn(params, x, y)")
    n = mesh.shape["data"]
    x, y, host_params = _batch(cfg, n)
    ref, shard0 = _reference_grads(cfg, n)
    params = jax.device_put(host_params, NamedSharding(mesh, P()))
    xs = jax.device_put(x, NamedSharding(mesh, P("data", None)))
    ys = jax.device_put(y, NamedSharding(mesh, P("data")))
    got = fn(params, xs, ys)
    check_tree_like(got, ref, "the gradients")
    got = jax.device_get(got)
    tol = _rel_tol(mesh)
    if tree_close(got, ref, tol):
        return f"Right: the mean of the {n} shards' mean gradients equals the gradient of the global mean loss."
    ratio = _norm(got) / _norm(ref)
    if n > 1 and close(ratio, n, 1e-3):
        raise wrong(
            f"The gradient is {n} times too large: a psum (or a missing pcast before grad) sums the shards' "
            "gradients; average them with lax.pmean."
        )
    if n > 1 and tree_close(got, shard0, tol):
        raise wrong("That is device 0's local gradient only: reduce it over 'data' with lax.pmean before returning it.")
    if n > 1 and close(ratio, 1.0 / n, 1e-3):
        raise wrong(f"The gradient is {n} times too small: it was divided by the device count once too often.")
    raise wrong(f"The gradients differ from the single-device reference (norm ratio {ratio:.3g}).")


def _shard_map_grads(reduce, cfg: Config, mesh: Mesh, params, xs, ys):
    def local(p, x, y):
        p = jax.lax.pcast(p, "data", to="varying")
        return reduce(jax.grad(_loss(cfg))(p, x, y), "data")

    return jax.jit(jax.shard_map(local, mesh=mesh, in_specs=(P(), P("data", None), P("data")), out_specs=P()))(
        params, xs, ys
    )


def measured_update_ratios(cfg: Config, mesh: Mesh, learning_rate: float = 0.1) -> tuple[float, float]:
    """Norm of the first update with ``psum`` gradients over that with ``pmean``: (SGD, AdamW).

    Both from the same parameters and batch; AdamW with optax's defaults and
    ``cfg``'s weight decay.
    """
    n = mesh.shape["data"]
    x, y, host_params = _batch(cfg, n, seed=6)
    params = jax.device_put(host_params, NamedSharding(mesh, P()))
    xs = jax.device_put(x, NamedSharding(mesh, P("data", None)))
    ys = jax.device_put(y, NamedSharding(mesh, P("data")))
    g_mean = _shard_map_grads(jax.lax.pmean, cfg, mesh, params, xs, ys)
    g_sum = _shard_map_grads(jax.lax.psum, cfg, mesh, params, xs, ys)
    ratios = []
    for opt in (optax.sgd(learning_rate), optax.adamw(learning_rate, weight_decay=cfg.weight_decay)):
        state = opt.init(params)
        up_sum, _ = opt.update(g_sum, state, params)
        up_mean, _ = opt.update(g_mean, state, params)
        ratios.append(_norm(jax.device_get(up_sum)) / _norm(jax.device_get(up_mean)))
    return ratios[0], ratios[1]


@checker("ex05_2", "a tuple (sgd_factor, adamw_factor) of two numbers")
def psum_update_factors(answer, cfg: Config, mesh: Mesh) -> str:
    """Exercise 05.2: how much larger is the first update when ``psum`` replaces ``pmean``?

    For plain SGD and for AdamW, as (norm of the psum update) / (norm of the
    pmean update). The checker measures both on the lesson's mesh; each
    prediction must be within 5 % of its measurement (AdamW's epsilon and
    weight decay move the second ratio slightly off 1).
    """
    sgd_ans, adam_ans = as_tuple(answer, 2, "(sgd_factor, adamw_factor)")
    sgd_ans = as_number(sgd_ans, "the SGD factor", positive=True)
    adam_ans = as_number(adam_ans, "the AdamW factor", positive=True)
    n = mesh.shape["data"]
    sgd_ref, adam_ref = measured_update_ratios(cfg, mesh)
    sgd_ok, adam_ok = close(sgd_ans, sgd_ref, 0.05), close(adam_ans, adam_ref, 0.05)
    if sgd_ok and adam_ok:
        return (
            f"Right: measured {sgd_ref:.3g} and {adam_ref:.3g}. SGD's update is the gradient x lr, so it is {n} times too "
            "large; AdamW divides by the gradient's own scale, which hides the mistake (hence the gradient checks in 04-06)."
        )
    if sgd_ok and n > 1 and close(adam_ans, n, 0.05):
        raise wrong(
            f"SGD is right, but AdamW's first update is m / sqrt(v): scaling the gradient by {n} scales both, so the "
            f"update barely changes (measured {adam_ref:.3g})."
        )
    if not sgd_ok and n > 1 and close(sgd_ans, 1.0, 0.05):
        raise wrong(f"SGD's update is learning_rate x gradient, and the psum gradient is {n} times the pmean one.")
    if not sgd_ok and n > 1 and close(sgd_ans, 1.0 / n, 0.05):
        raise wrong(f"Inverted: psum sums the {n} shards' gradients, so the update is {n} times larger, not smaller.")
    raise wrong(f"Measured ({sgd_ref:.3g}, {adam_ref:.3g}) on {n} devices; you predicted ({sgd_ans:g}, {adam_ans:g}).")
