"""Checkers for the exercises of notebook 02 (baseline: FLOPs, the training step, MFU)."""

from __future__ import annotations

import jax
import numpy as np

from dpcourse import costs, model
from dpcourse.config import Config, make_config
from dpcourse.exercises.base import as_callable, as_number, check_tree_like, checker, close, how_far, tree_close, wrong

H200_TF32_FLOPS_PER_S = costs.find_peak("NVIDIA H200").peak("tf32")  # datasheet, see dpcourse.costs.PEAKS
TARGET_MFU = 0.40


@checker("ex02_1", "your predicted training FLOPs per example (a number)")
def flops_doubled(answer, cfg: Config) -> str:
    """Exercise 02.1: training FLOPs per example when BLOCK_REPEATS doubles.

    Reference: ``model.train_flops_per_example`` of ``cfg`` with
    ``block_repeats`` doubled (6 x the forward multiply-accumulates).
    Accepted within 1 %.
    """
    value = as_number(answer, "the training FLOPs per example", positive=True)
    doubled = cfg.with_overrides(block_repeats=2 * cfg.block_repeats)
    ref = model.train_flops_per_example(doubled)
    macs = model.macs_per_example(doubled)
    if close(value, ref):
        return f"Right: {ref:,} FLOPs per example. Only the shared block repeats, so input and output layers add the same as before."
    if close(value, 2 * model.train_flops_per_example(cfg)):
        raise wrong(
            "That doubles the whole model, input and output layers too; only the hidden block is applied BLOCK_REPEATS times."
        )
    if close(value, model.train_flops_per_example(cfg)):
        raise wrong("That is the count for the current BLOCK_REPEATS; the block's term grows with the repeats.")
    if close(value, 2 * macs):
        raise wrong(
            "That counts the forward pass only; the backward pass costs about twice the forward (factor 6, not 2)."
        )
    if close(value, macs):
        raise wrong(
            "That is the forward multiply-accumulates: a MAC is 2 FLOPs, and training is 3 forward passes' worth."
        )
    if close(value, 3 * macs):
        raise wrong("Forward plus backward is 3 passes, but each multiply-accumulate is 2 FLOPs: the factor is 6.")
    if close(value * 1e9, ref):
        raise wrong("That is the count in GFLOP (as the workload table prints it); give it in FLOPs (x 1e9).")
    raise wrong(f"Not within 1 % of the reference (your answer is {how_far(value, ref)}); count 6 x the forward MACs.")


@checker("ex02_2", "a function sgd_step(params, x, y, learning_rate) -> new params")
def sgd_step(answer, cfg: Config) -> str:
    """Exercise 02.2: a plain SGD step, ``params - learning_rate * grad`` of the mean loss.

    The checker calls the learner's function on its own parameters (``cfg``'s
    model) and a batch of 16 random examples, and compares with the update
    it computes with ``jax.grad``. Tolerance: 1e-4 of the largest value
    (float32; TF32 matmuls on a GPU round at about 5e-4 relative, scaled
    down by the learning rate).
    """
    fn = as_callable(answer, "sgd_step(params, x, y, learning_rate)")
    rng = np.random.default_rng(7)
    params = jax.tree.map(np.asarray, model.init_params(cfg, seed=7))
    x = rng.random((16, 784), dtype=np.float32)
    y = rng.integers(0, 10, 16).astype(np.int32)
    lr = 0.05
    grads = jax.jit(jax.grad(lambda p: model.loss_and_metrics(p, x, y, cfg)[0]))(params)
    ref = jax.tree.map(lambda p, g: p - lr * g, params, grads)
    got = fn(params, x, y, lr)
    check_tree_like(got, ref, "the new params")
    got = jax.device_get(got)
    if tree_close(got, ref, 1e-4):
        return "Right: every parameter moved by -learning_rate x its gradient of the mean loss."
    if tree_close(got, params, 1e-7):
        raise wrong("The parameters did not change: return params - learning_rate * grad for every leaf.")
    if tree_close(got, jax.tree.map(lambda p, g: p + lr * g, params, grads), 1e-4):
        raise wrong("The sign is flipped: adding the gradient climbs the loss; subtract learning_rate * grad.")
    if tree_close(got, jax.tree.map(lambda p, g: p - g, params, grads), 1e-4):
        raise wrong("The step ignores the learning rate: scale the gradient by learning_rate before subtracting.")
    if tree_close(got, jax.tree.map(lambda p, g: p - len(x) * lr * g, params, grads), 1e-4):
        raise wrong(
            f"Each parameter moved {len(x)} times too far, once per example of the check's batch of {len(x)}: "
            "that is the gradient of the summed loss; differentiate the mean loss, loss_and_metrics(...)[0]."
        )
    if tree_close(got, grads, 1e-4):
        raise wrong("That is the gradient itself, not the updated parameters: return params - learning_rate * grad.")
    raise wrong(
        "The new parameters differ from params - learning_rate * grad of model.loss_and_metrics(...)[0]; "
        "did you differentiate the mean loss with respect to params?"
    )


FULL_BATCH_02_3 = 1024  # the full profile's per-device batch: one H200's batch in exercise 02.3


@checker("ex02_3", "the predicted step time in ms (a number)")
def step_time_for_mfu(answer) -> str:
    """Exercise 02.3: the step time (ms) at which the full profile reaches 40 % MFU on one H200.

    The situation is a realistic one: the ``full`` workload (WIDTH 1024,
    BLOCK_REPEATS 128) with a batch of 1024 on one H200. Reference: training
    FLOPs per step / (0.40 x the H200's dense TF32 peak, 495 TFLOP/s from
    NVIDIA's datasheet via :data:`dpcourse.costs.PEAKS`), in milliseconds
    (about 4.2 ms). Accepted within 1 %.
    """
    value = as_number(answer, "a step time in milliseconds", positive=True)
    cfg = make_config("full")
    flops = costs.train_flops_per_step(cfg, FULL_BATCH_02_3)
    ref = flops / (TARGET_MFU * H200_TF32_FLOPS_PER_S) * 1e3
    if close(value, ref):
        return f"Right: {ref:.3g} ms per step; any slower and MFU drops below 40 %."
    if close(value, ref / 1e3):
        raise wrong("That is in seconds; the exercise asks for milliseconds (x 1000).")
    if close(value, ref * TARGET_MFU):
        raise wrong("That is the step time at 100 % MFU; at 40 % of the peak the step takes 1 / 0.4 times longer.")
    if close(value, ref * TARGET_MFU * TARGET_MFU):
        raise wrong(
            "You multiplied by the MFU instead of dividing: 40 % of the peak means a longer step, not a shorter one."
        )
    bf16 = costs.find_peak("NVIDIA H200").peak("bf16")
    if close(value, flops / (TARGET_MFU * bf16) * 1e3):
        raise wrong(
            "That uses the BF16 peak; this float32 step runs its matmuls as TF32, so compare with the TF32 peak."
        )
    if close(value, ref / FULL_BATCH_02_3):
        raise wrong("That is the time per example; the FLOPs of a whole step cover the batch of 1024.")
    for name in ("cpu", "smoke"):
        small = make_config(name)
        if any(
            close(value, costs.train_flops_per_step(small, b) / (TARGET_MFU * H200_TF32_FLOPS_PER_S) * 1e3)
            for b in (small.per_device_batch, small.per_device_batch * 8, FULL_BATCH_02_3)
        ):
            raise wrong(
                f"That is the '{name}' profile's workload; the question is about the full one, cfg_full "
                "(WIDTH 1024, BLOCK_REPEATS 128), with a batch of 1024."
            )
    raise wrong(f"Your answer is {how_far(value, ref)}: step time = FLOPs per step / (0.40 x TF32 peak), in ms.")
