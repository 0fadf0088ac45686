"""Checkers of lessons 02 to 05: the solution passes, known wrong answers get their message, untouched is not attempted."""

import jax
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from dpcourse import collectives, costs, model, train
from dpcourse.config import make_config
from dpcourse.data import Dataset, prepare, synthetic_images
from dpcourse.exercises import lesson02, lesson03, lesson04, lesson05
from dpcourse.exercises.base import BAD_INPUT, CORRECT, NOT_ATTEMPTED, WRONG

CFG = make_config("smoke")


def expect(feedback, status, phrase=""):
    assert feedback.status == status, feedback
    assert phrase in feedback.message, feedback


def mesh_of(k):
    return Mesh(np.array(jax.devices()[:k]), ("data",))


# 02 ---------------------------------------------------------------------------


def test_02_1_flops():
    w, r = CFG.width, 2 * CFG.block_repeats
    expect(lesson02.flops_doubled(6 * (784 * w + r * w * w + 10 * w), CFG), CORRECT)
    expect(lesson02.flops_doubled(2 * model.train_flops_per_example(CFG), CFG), WRONG, "only the hidden block")
    expect(lesson02.flops_doubled(2 * (784 * w + r * w * w + 10 * w), CFG), WRONG, "forward pass only")
    expect(lesson02.flops_doubled(784 * w + r * w * w + 10 * w, CFG), WRONG, "a MAC is 2 FLOPs")
    expect(lesson02.flops_doubled(model.train_flops_per_example(CFG), CFG), WRONG, "current BLOCK_REPEATS")
    expect(lesson02.flops_doubled(..., CFG), NOT_ATTEMPTED)
    expect(lesson02.flops_doubled("lots", CFG), BAD_INPUT, "got str")


def _sgd(sign=-1.0, use_lr=True, return_grads=False):
    def step(params, x, y, learning_rate):
        grads = jax.grad(lambda p: model.loss_and_metrics(p, x, y, CFG)[0])(params)
        if return_grads:
            return grads
        lr = learning_rate if use_lr else 1.0
        return jax.tree.map(lambda p, g: p + sign * lr * g, params, grads)

    return step


def test_02_2_sgd_step():
    expect(lesson02.sgd_step(_sgd(), CFG), CORRECT)
    expect(lesson02.sgd_step(_sgd(sign=1.0), CFG), WRONG, "sign is flipped")
    expect(lesson02.sgd_step(_sgd(use_lr=False), CFG), WRONG, "ignores the learning rate")
    expect(lesson02.sgd_step(_sgd(return_grads=True), CFG), WRONG, "gradient itself")
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
    gb = 64
    ref = costs.train_flops_per_step(CFG, gb) / (0.40 * 495e12) * 1e3
    expect(lesson02.step_time_for_mfu(ref, CFG, gb), CORRECT)
    expect(lesson02.step_time_for_mfu(ref / 1e3, CFG, gb), WRONG, "in seconds")
    expect(lesson02.step_time_for_mfu(ref * 0.4, CFG, gb), WRONG, "100 % MFU")
    expect(lesson02.step_time_for_mfu(ref / 2, CFG, gb), WRONG, "BF16 peak")
    expect(lesson02.step_time_for_mfu(ref / gb, CFG, gb), WRONG, "time per example")
    expect(lesson02.step_time_for_mfu(..., CFG, gb), NOT_ATTEMPTED)


# 03 ---------------------------------------------------------------------------


def _shapes(n):
    return ((48 // n, 784) if 48 % n == 0 else None, (48, 784 // n) if 784 % n == 0 else None, (48, 784))


@pytest.mark.parametrize("k", [1, 2, 3, 4, 8])
def test_03_1_solution_on_any_device_count(k):
    expect(lesson03.shard_shapes(_shapes(k), mesh_of(k)), CORRECT)


def test_03_1_wrong_answers():
    mesh = mesh_of(8)
    expect(lesson03.shard_shapes(((48, 784), (48, 98), (48, 784)), mesh), WRONG, "gave the whole array")
    expect(lesson03.shard_shapes(((6, 784), (48, 98), (6, 784)), mesh), WRONG, "P() replicates")
    expect(lesson03.shard_shapes(((48, 98), (48, 98), (48, 784)), mesh), WRONG, "split the other dimension")
    expect(lesson03.shard_shapes(((6, 784), None, (48, 784)), mesh), WRONG, "placement works")
    mesh3 = mesh_of(3)
    expect(lesson03.shard_shapes(((16, 784), (48, 261), (48, 784)), mesh3), WRONG, "answer None")
    expect(lesson03.shard_shapes(((6, 784), (48, 98)), mesh), BAD_INPUT, "tuple of 3")
    expect(lesson03.shard_shapes(("6x784", (48, 98), (48, 784)), mesh), BAD_INPUT, "tuple of ints")
    expect(lesson03.shard_shapes(..., mesh), NOT_ATTEMPTED)


def test_03_2_batch_sharding():
    mesh = mesh_of(4)
    expect(lesson03.batch_sharding(NamedSharding(mesh, P("data", None)), mesh), CORRECT)
    expect(lesson03.batch_sharding(NamedSharding(mesh, P("data")), mesh), CORRECT)
    expect(lesson03.batch_sharding(NamedSharding(mesh, P()), mesh), WRONG, "replicates the batch")
    expect(lesson03.batch_sharding(NamedSharding(mesh, P(None, "data")), mesh), WRONG, "784 features")
    expect(lesson03.batch_sharding(NamedSharding(mesh_of(2), P("data", None)), mesh), WRONG, "uses 2 devices")
    expect(lesson03.batch_sharding(P("data", None), mesh), BAD_INPUT, "NamedSharding")
    expect(lesson03.batch_sharding(None, mesh), NOT_ATTEMPTED)


# 04 ---------------------------------------------------------------------------


def test_04_1_collectives_doubled():
    mesh = mesh_of(4)
    opt = train.make_optimizer(CFG)
    params = jax.device_put(model.init_params(CFG), NamedSharding(mesh, P()))
    x = jax.device_put(np.zeros((4 * CFG.per_device_batch, 784), np.float32), NamedSharding(mesh, P("data", None)))
    y = jax.device_put(np.zeros((4 * CFG.per_device_batch,), np.int32), NamedSharding(mesh, P("data")))
    report = collectives.collective_report(jax.jit(train.make_train_step(CFG, opt)), params, opt.init(params), x, y)
    in_loop = sum(c.runs_per_step for c in report.collectives if c.in_loop)
    expect(lesson04.collectives_doubled(report.runs_per_step + in_loop, CFG, mesh), CORRECT, "measured")
    if in_loop:  # JAX 0.10 on CPU: the all-reduce sits inside the backward scan
        expect(lesson04.collectives_doubled(report.runs_per_step, CFG, mesh), WRONG, "once per block repeat")
        if report.runs_per_step > in_loop:
            expect(lesson04.collectives_doubled(2 * report.runs_per_step, CFG, mesh), WRONG, "Only the collectives")
    expect(lesson04.collectives_doubled(..., CFG, mesh), NOT_ATTEMPTED)
    expect(lesson04.collectives_doubled("7", CFG, mesh), BAD_INPUT)


@pytest.fixture(scope="module")
def dataset():
    return Dataset(*prepare(*synthetic_images(256, seed=1)), source="synthetic", note="test")


@pytest.mark.parametrize("k", [1, 3, 8])
def test_04_2_solution_on_any_device_count(k, dataset):
    mesh = mesh_of(k)
    b = (100 // k) * k
    x = jax.device_put(dataset.images[:b], NamedSharding(mesh, P("data", None)))
    expect(lesson04.placed_batch(x, dataset, mesh), CORRECT)


def test_04_2_wrong_answers(dataset):
    mesh = mesh_of(8)
    expect(
        lesson04.placed_batch(jax.device_put(dataset.images[:96], NamedSharding(mesh, P())), dataset, mesh),
        WRONG,
        "replicated",
    )
    expect(lesson04.placed_batch(dataset.images[:100], dataset, mesh), WRONG, "do not divide by 8")
    expect(lesson04.placed_batch(dataset.images[:96], dataset, mesh), BAD_INPUT, "jax.Array")
    wrong_rows = jax.device_put(dataset.images[8:104], NamedSharding(mesh, P("data", None)))
    expect(lesson04.placed_batch(wrong_rows, dataset, mesh), WRONG, "first 96 images")
    one_device = jax.device_put(dataset.images[:96], jax.devices()[0])
    expect(lesson04.placed_batch(one_device, dataset, mesh), WRONG, "lives on 1 device")
    expect(lesson04.placed_batch(jax.numpy.zeros((96, 28, 28)), dataset, mesh), BAD_INPUT, "[B, 784]")
    expect(lesson04.placed_batch(..., dataset, mesh), NOT_ATTEMPTED)


# 05 ---------------------------------------------------------------------------


def _grads_fn(mesh, reduce=jax.lax.pmean, cast=True, check_vma=True):
    def local(p, x, y):
        if cast:
            p = jax.lax.pcast(p, "data", to="varying")
        g = jax.grad(lambda q: model.loss_and_metrics(q, x, y, CFG)[0])(p)
        return g if reduce is None else reduce(g, "data")

    return jax.shard_map(
        local, mesh=mesh, in_specs=(P(), P("data", None), P("data")), out_specs=P(), check_vma=check_vma
    )


@pytest.mark.parametrize("k", [1, 3, 8])
def test_05_1_solution_on_any_device_count(k):
    mesh = mesh_of(k)
    expect(lesson05.pmean_gradients(_grads_fn(mesh), CFG, mesh), CORRECT)


def test_05_1_wrong_answers():
    mesh = mesh_of(4)
    expect(lesson05.pmean_gradients(_grads_fn(mesh, jax.lax.psum), CFG, mesh), WRONG, "4 times too large")
    expect(lesson05.pmean_gradients(_grads_fn(mesh, cast=False), CFG, mesh), WRONG, "4 times too large")
    no_reduce = _grads_fn(mesh, reduce=None, check_vma=False)
    expect(lesson05.pmean_gradients(no_reduce, CFG, mesh), WRONG, "device 0's local gradient")
    # Varying value under out_specs=P() with check_vma: JAX refuses; the learner reads a sentence.
    expect(lesson05.pmean_gradients(_grads_fn(mesh, reduce=None), CFG, mesh), BAD_INPUT, "raised")
    expect(lesson05.pmean_gradients(..., CFG, mesh), NOT_ATTEMPTED)


def test_05_2_psum_factors():
    mesh = mesh_of(4)
    expect(lesson05.psum_update_factors((4, 1.0), CFG, mesh), CORRECT)
    expect(lesson05.psum_update_factors((4, 4), CFG, mesh), WRONG, "AdamW's first update")
    expect(lesson05.psum_update_factors((1, 1), CFG, mesh), WRONG, "SGD's update")
    expect(lesson05.psum_update_factors((0.25, 1), CFG, mesh), WRONG, "Inverted")
    expect(lesson05.psum_update_factors(4, CFG, mesh), BAD_INPUT, "tuple of 2")
    expect(lesson05.psum_update_factors(None, CFG, mesh), NOT_ATTEMPTED)
