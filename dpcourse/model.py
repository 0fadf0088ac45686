"""The shared-block MLP, its loss, parameter count and analytic FLOPs.

Taught in notebook 02. One hidden block (a WIDTH x WIDTH dense layer and
GELU) is applied ``block_repeats`` times with ``jax.lax.scan`` and mixed in
residually (notebook 09 compiles the repeats unrolled and in bfloat16
through the config's ``block_unroll`` and ``compute_dtype``; its own cell
writes :func:`forward` out and is checked against it). Re-using one block raises the compute per example without
raising the number of gradient values that data parallelism must
all-reduce: the point of the design.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax

from dpcourse.config import FULL_UNROLL, Config, check_block_backward, check_block_unroll, check_compute_dtype
from dpcourse.data import N_CLASSES, N_FEATURES
from dpcourse.perf import backward

Params = dict[str, jax.Array]


def init_params(cfg: Config, seed: int | None = None) -> dict[str, np.ndarray]:
    """He-normal weights (std ``sqrt(2 / fan_in)``) and zero biases, on the host.

    Drawn from ``numpy.random.default_rng(seed)`` so the values do not depend
    on the JAX backend or device count; place them with ``jax.device_put``.

    Returns:
        float32 arrays: ``w_in [784, W]``, ``b_in [W]``, ``w_block [W, W]``,
        ``b_block [W]``, ``w_out [W, 10]``, ``b_out [10]`` with ``W = cfg.width``.
    """
    rng = np.random.default_rng(cfg.seed if seed is None else seed)
    width = cfg.width

    def he(fan_in: int, fan_out: int) -> np.ndarray:
        return (rng.standard_normal((fan_in, fan_out)) * np.sqrt(2.0 / fan_in)).astype(np.float32)

    return {
        "w_in": he(N_FEATURES, width),
        "b_in": np.zeros(width, np.float32),
        "w_block": he(width, width),
        "b_block": np.zeros(width, np.float32),
        "w_out": he(width, N_CLASSES),
        "b_out": np.zeros(N_CLASSES, np.float32),
    }


def forward(
    params: Params,
    x: jax.Array,
    block_repeats: int,
    block_mix: float,
    block_unroll: int | str = 1,
    compute_dtype: str = "float32",
    block_backward: str = "autodiff",
) -> jax.Array:
    """Logits of the shared-block MLP.

    Args:
        params: see :func:`init_params` (float32 master weights).
        x: float32 ``[batch, 784]`` (any batch: global under ``jit``,
            per-device inside ``shard_map``/``pmap``).
        block_unroll: 1 (the default ``lax.scan``), an int ``k > 1`` for
            ``lax.scan(..., unroll=k)`` (k copies of the block per loop
            iteration), or ``"full"`` for a Python loop (no loop left in the
            compiled program). All compute the same values.
        compute_dtype: ``"float32"``, or ``"bfloat16"`` for mixed precision:
            the weights and the input are cast to bfloat16 here, so matmuls
            and activations (the residual stream ``h`` included) run in
            bfloat16 while the parameters and the optimizer stay float32.
            The gradients are float32 arrays, but not float32 arithmetic:
            they come from bfloat16 matmuls, and the shared block's weight
            gradient is summed over the repeats in a bfloat16 carry of the
            backward ``scan`` (a chain of bfloat16 adds when unrolled), cast to float32
            only at the end. Notebook 09 measures the resulting logit error
            (``dpcourse.perf.ladder.bf16_logit_tolerance``).
        block_backward: ``"autodiff"`` (JAX differentiates the block) or
            ``"saved_slope"`` (:func:`dpcourse.perf.backward.block_saving_slope`)
            or ``"pallas"`` (:func:`dpcourse.perf.backward.block_with_kernel`,
            bfloat16 only). The logits are the same; only the backward pass
            differs.

    Returns:
        float32 logits ``[batch, 10]`` whatever ``compute_dtype`` is.

    Raises:
        ValueError: an unknown ``block_unroll``, ``compute_dtype`` or ``block_backward``.
    """
    check_block_unroll(block_unroll)
    written = {"saved_slope": backward.block_saving_slope, "pallas": backward.block_with_kernel}
    how = written.get(check_block_backward(block_backward))
    custom = None if how is None else how(block_mix)  # built once, applied at every repeat
    dtype = jnp.dtype(check_compute_dtype(compute_dtype))
    p = jax.tree.map(lambda a: a.astype(dtype), params)
    h = jax.nn.gelu(x.astype(dtype) @ p["w_in"] + p["b_in"])

    def block(h, _):
        if custom is not None:
            return custom(h, p["w_block"], p["b_block"]), None
        out = jax.nn.gelu(h @ p["w_block"] + p["b_block"])
        return (1.0 - block_mix) * h + block_mix * out, None

    if block_unroll == FULL_UNROLL:
        for _ in range(block_repeats):
            h, _ = block(h, None)
    else:
        h, _ = jax.lax.scan(block, h, None, length=block_repeats, unroll=block_unroll)
    return (h @ p["w_out"] + p["b_out"]).astype(jnp.float32)


def loss_and_metrics(params: Params, x: jax.Array, y: jax.Array, cfg: Config) -> tuple[jax.Array, dict[str, jax.Array]]:
    """Mean softmax cross-entropy over the batch, and metrics.

    Args:
        x: float32 ``[batch, 784]``; y: int32 labels ``[batch]``.

    Returns:
        ``(loss, {"loss": loss, "accuracy": accuracy})``, scalars (means over
        the batch the function sees).
    """
    logits = forward(
        params, x, cfg.block_repeats, cfg.block_mix, cfg.block_unroll, cfg.compute_dtype, cfg.block_backward
    )
    loss = optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()
    accuracy = (jnp.argmax(logits, axis=-1) == y).mean()
    return loss, {"loss": loss, "accuracy": accuracy}


def param_count(cfg: Config) -> int:
    """Number of trainable parameters (full size: 1,863,690)."""
    w = cfg.width
    return (N_FEATURES * w + w) + (w * w + w) + (w * N_CLASSES + N_CLASSES)


def macs_per_example(cfg: Config) -> int:
    """Multiply-accumulates of the forward matmuls for one example."""
    w = cfg.width
    return N_FEATURES * w + cfg.block_repeats * w * w + w * N_CLASSES


def train_flops_per_example(cfg: Config) -> int:
    """Analytic training FLOPs per example: 6 x forward matmul multiply-accumulates.

    2 FLOPs per multiply-accumulate, and the backward pass costs about twice
    the forward (gradients for activations and for weights): 2 x 3 = 6.
    Element-wise work (GELU, bias, optimizer) is left out. Full size: about
    0.81 GFLOP (outline of the course).

    ``compiled.cost_analysis()`` is not used: it counts the body of a
    ``lax.scan`` once, not ``block_repeats`` times.
    """
    return 6 * macs_per_example(cfg)
