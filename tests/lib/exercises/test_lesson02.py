"""The checkers of lesson 02 (dpcourse.exercises.lesson02): right answers pass, each planted mistake is named."""

import jax
import numpy as np

from dpcourse import costs, model
from dpcourse.config import make_config
from dpcourse.exercises import lesson02
from dpcourse.exercises.base import BAD_INPUT, CORRECT, NOT_ATTEMPTED, WRONG

CFG = make_config("smoke")


def expect(feedback, status, phrase=""):
    assert feedback.status == status, feedback
    assert phrase in feedback.message, feedback


def _sgd(sign=-1.0, use_lr=True, return_grads=False, summed=False):
    def step(params, x, y, learning_rate):
        grads = jax.grad(lambda p: model.loss_and_metrics(p, x, y, CFG)[0] * (len(x) if summed else 1))(params)
        if return_grads:
            return grads
        lr = learning_rate if use_lr else 1.0
        return jax.tree.map(lambda p, g: p + sign * lr * g, params, grads)

    return step


def test_02_1_flops():
    w, r = CFG.width, 2 * CFG.block_repeats
    expect(lesson02.flops_doubled(6 * (784 * w + r * w * w + 10 * w), CFG), CORRECT)
    expect(lesson02.flops_doubled(2 * model.train_flops_per_example(CFG), CFG), WRONG, "only the hidden block")
    expect(lesson02.flops_doubled(2 * (784 * w + r * w * w + 10 * w), CFG), WRONG, "forward pass only")
    expect(lesson02.flops_doubled(784 * w + r * w * w + 10 * w, CFG), WRONG, "a MAC is 2 FLOPs")
    expect(lesson02.flops_doubled(model.train_flops_per_example(CFG), CFG), WRONG, "current BLOCK_REPEATS")
    expect(lesson02.flops_doubled(6 * (784 * w + r * w * w + 10 * w) / 1e9, CFG), WRONG, "in GFLOP")
    expect(lesson02.flops_doubled(..., CFG), NOT_ATTEMPTED)
    expect(lesson02.flops_doubled("lots", CFG), BAD_INPUT, "got str")


def test_02_2_sgd_step():
    expect(lesson02.sgd_step(_sgd(), CFG), CORRECT)
    expect(lesson02.sgd_step(_sgd(sign=1.0), CFG), WRONG, "sign is flipped")
    expect(lesson02.sgd_step(_sgd(use_lr=False), CFG), WRONG, "ignores the learning rate")
    expect(lesson02.sgd_step(_sgd(return_grads=True), CFG), WRONG, "gradient itself")
    expect(lesson02.sgd_step(_sgd(summed=True), CFG), WRONG, "gradient of the summed loss")
    expect(lesson02.sgd_step(lambda p, x, y, lr: p, CFG), WRONG, "did not change")
    # Right shapes, wrong values: random parameters of the same shapes.
    rng = np.random.default_rng(0)
    expect(
        lesson02.sgd_step(lambda p, x, y, lr: jax.tree.map(lambda a: rng.random(a.shape, np.float32), p), CFG),
        WRONG,
        "differ from params",
    )
    expect(lesson02.sgd_step(lambda p, x, y, lr: p["w_in"], CFG), BAD_INPUT, "structure")
    expect(lesson02.sgd_step(3, CFG), BAD_INPUT, "a function")
    expect(lesson02.sgd_step(None, CFG), NOT_ATTEMPTED)


def test_02_3_step_time_for_mfu():
    full = make_config("full")
    ref = costs.train_flops_per_step(full, 1024) / (0.40 * 495e12) * 1e3
    assert 3.5 < ref < 5  # a realistic step time for one H200 (about 4.2 ms)
    expect(lesson02.step_time_for_mfu(ref), CORRECT)
    expect(lesson02.step_time_for_mfu(ref / 1e3), WRONG, "in seconds")
    expect(lesson02.step_time_for_mfu(ref * 0.4), WRONG, "100 % MFU")
    expect(lesson02.step_time_for_mfu(ref * 0.4 * 0.4), WRONG, "multiplied by the MFU")
    expect(lesson02.step_time_for_mfu(ref / 2), WRONG, "BF16 peak")
    expect(lesson02.step_time_for_mfu(ref / 1024), WRONG, "time per example")
    expect(lesson02.step_time_for_mfu(ref * 3), WRONG, "too large")
    expect(lesson02.step_time_for_mfu(...), NOT_ATTEMPTED)
    expect(lesson02.step_time_for_mfu("4 ms"), BAD_INPUT, "got str")
    # Lifted from the lesson: the same formula with the notebook's own profile and batch.
    for profile in ("smoke", "cpu"):
        cfg = make_config(profile)
        for batch in (cfg.per_device_batch, 8 * cfg.per_device_batch):
            lifted = costs.train_flops_per_step(cfg, batch) / (0.40 * 495e12) * 1e3
            expect(lesson02.step_time_for_mfu(lifted), WRONG, f"'{profile}' profile")


def test_02_1_lifted_answer_is_the_current_count():
    """The lesson prints the FLOPs per example of today's BLOCK_REPEATS; that is not the answer."""
    expect(lesson02.flops_doubled(model.train_flops_per_example(CFG), CFG), WRONG, "current BLOCK_REPEATS")
    expect(lesson02.flops_doubled(3 * model.macs_per_example(CFG) * 2, CFG), WRONG, "current BLOCK_REPEATS")
