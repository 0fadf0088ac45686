"""Checkers of lessons 02 to 05: the solution passes, each known wrong answer gets its message, untouched is not
attempted, and an answer lifted from earlier in the lesson is not accepted."""

import jax
import numpy as np
import optax
import pytest
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from dpcourse import costs, model, train
from dpcourse.compiled import collectives
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
    expect(lesson02.flops_doubled(6 * (784 * w + r * w * w + 10 * w) / 1e9, CFG), WRONG, "in GFLOP")
    expect(lesson02.flops_doubled(..., CFG), NOT_ATTEMPTED)
    expect(lesson02.flops_doubled("lots", CFG), BAD_INPUT, "got str")


def _sgd(sign=-1.0, use_lr=True, return_grads=False, summed=False):
    def step(params, x, y, learning_rate):
        grads = jax.grad(lambda p: model.loss_and_metrics(p, x, y, CFG)[0] * (len(x) if summed else 1))(params)
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


def test_03_2_label_sharding():
    mesh = mesh_of(4)
    expect(lesson03.label_sharding(NamedSharding(mesh, P("data")), mesh), CORRECT)
    expect(lesson03.label_sharding(NamedSharding(mesh, P()), mesh), WRONG, "replicates the labels")
    expect(lesson03.label_sharding(NamedSharding(mesh, P(None)), mesh), WRONG, "replicates the labels")
    expect(lesson03.label_sharding(NamedSharding(mesh, P(None, "data")), mesh), WRONG, "the labels have one")
    expect(lesson03.label_sharding(NamedSharding(mesh_of(2), P("data")), mesh), WRONG, "uses 2 devices")
    expect(lesson03.label_sharding(P("data"), mesh), BAD_INPUT, "NamedSharding")
    expect(lesson03.label_sharding(None, mesh), NOT_ATTEMPTED)
    # Lifted from section 2 of the lesson (the images' sharding): not the labels'.
    expect(lesson03.label_sharding(NamedSharding(mesh, P("data", None)), mesh), WRONG, "images' spec")


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
    right = report.runs_per_step + in_loop
    if in_loop:  # JAX 0.10 on CPU: the all-reduce sits inside the backward scan
        # The lifted answer: today's count, printed in section 3.
        expect(lesson04.collectives_doubled(report.runs_per_step, CFG, mesh), WRONG, "today's count")
        if report.runs_per_step > in_loop:
            expect(lesson04.collectives_doubled(2 * report.runs_per_step, CFG, mesh), WRONG, "Only the collectives")
        far = lesson04.collectives_doubled(right + 1000, CFG, mesh)
        expect(far, WRONG, "too large")
    for value in (report.runs_per_step, right + 1000):
        assert str(right) not in lesson04.collectives_doubled(value, CFG, mesh).message  # no answer given away
    expect(lesson04.collectives_doubled(..., CFG, mesh), NOT_ATTEMPTED)
    expect(lesson04.collectives_doubled("7", CFG, mesh), BAD_INPUT)
    expect(lesson04.collectives_doubled(right + 0.5, CFG, mesh), WRONG, "whole number")


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
    # Lifted from the lesson: its own first batch (64 rows in smoke on 8 devices), not about 100.
    lifted = jax.device_put(dataset.images[:64], NamedSharding(mesh, P("data", None)))
    expect(lesson04.placed_batch(lifted, dataset, mesh), WRONG, "not about 100")


# 05 ---------------------------------------------------------------------------


def _masked_fn(mesh, kind="right", check_vma=True):
    """masked_grads(params, x, y, m) in the right form and in each known wrong one."""

    def local(p, x, y, m):
        if kind != "no cast":
            p = jax.lax.pcast(p, "data", to="varying")

        def per_example(q):
            logits = model.forward(q, x, CFG.block_repeats, CFG.block_mix)
            return optax.softmax_cross_entropy_with_integer_labels(logits, y)

        if kind == "mean of means":
            return jax.lax.pmean(jax.grad(lambda q: (m * per_example(q)).sum() / m.sum())(p), "data")
        if kind == "unmasked":
            return jax.lax.pmean(jax.grad(lambda q: per_example(q).mean())(p), "data")
        g = jax.grad(lambda q: (m * per_example(q)).sum())(p)
        if kind == "no reduction":
            return g
        if kind == "sum":
            return jax.lax.psum(g, "data")
        if kind == "all rows":
            return jax.tree.map(lambda a: jax.lax.psum(a, "data") / (x.shape[0] * mesh.shape["data"]), g)
        count = jax.lax.psum(m.sum(), "data")
        if kind == "no cast":
            return jax.tree.map(lambda a: a / count, g)  # grad already summed over 'data' ...
        return jax.tree.map(lambda a: jax.lax.psum(a, "data") / count, g)

    specs = dict(in_specs=(P(), P("data", None), P("data"), P("data")), out_specs=P())
    return jax.shard_map(local, mesh=mesh, check_vma=check_vma, **specs)


@pytest.mark.parametrize("k", [1, 3, 8])
def test_05_1_solution_on_any_device_count(k):
    mesh = mesh_of(k)
    expect(lesson05.masked_gradients(_masked_fn(mesh), CFG, mesh), CORRECT)


def test_05_1_no_cast_with_the_implicit_sum_is_right_too():
    """Without pcast, grad of a replicated input already sums over 'data': dividing by the count is right."""
    mesh = mesh_of(4)
    expect(lesson05.masked_gradients(_masked_fn(mesh, "no cast"), CFG, mesh), CORRECT)


def test_05_1_wrong_answers():
    mesh = mesh_of(4)
    expect(lesson05.masked_gradients(_masked_fn(mesh, "mean of means"), CFG, mesh), WRONG, "mean of the shards'")
    expect(lesson05.masked_gradients(_masked_fn(mesh, "unmasked"), CFG, mesh), WRONG, "padding included")
    expect(lesson05.masked_gradients(_masked_fn(mesh, "sum"), CFG, mesh), WRONG, "masked sum, not the mean")
    expect(lesson05.masked_gradients(_masked_fn(mesh, "all rows"), CFG, mesh), WRONG, "every row")
    # No reduction at all: with check_vma JAX refuses; the learner reads about the concept, not JAX's internals.
    fb = lesson05.masked_gradients(_masked_fn(mesh, "no reduction"), CFG, mesh)
    expect(fb, WRONG, "each device's gradient of its own shard")
    assert "_rem_singleton" not in fb.message and "Cannot check" not in str(fb)
    unchecked = _masked_fn(mesh, "no reduction", check_vma=False)
    # check_vma off: out_specs=P() takes device 0's value, its own shard's gradient (1 real example there).
    expect(lesson05.masked_gradients(unchecked, CFG, mesh), WRONG, "one device's gradient")
    expect(lesson05.masked_gradients(..., CFG, mesh), NOT_ATTEMPTED)
    expect(lesson05.masked_gradients(3, CFG, mesh), BAD_INPUT, "a function")


def test_05_1_an_answer_jit_cannot_trace_is_run_as_it_is():
    """numpy or a Python `if` on values: jax.jit(answer) raised a tracer error, shown as 'Cannot check'."""
    mesh = mesh_of(4)
    right = _masked_fn(mesh)

    def with_numpy(p, x, y, m):
        if float(np.asarray(m).sum()) == 0:  # no real example: nothing to average
            raise ValueError("an empty batch")
        return jax.tree.map(np.asarray, right(p, x, y, m))

    expect(lesson05.masked_gradients(with_numpy, CFG, mesh), CORRECT)


def test_05_1_lifted_answer_is_refused():
    """Section 5(b)'s grads_with(pmean) and section 2's step take (params, x, y): no mask, not the answer."""
    mesh = mesh_of(4)

    def grads_with(reduce):  # as in the lesson, section 5(b)
        def local(p, x, y):
            p = jax.lax.pcast(p, "data", to="varying")
            return reduce(jax.grad(lambda q: model.loss_and_metrics(q, x, y, CFG)[0])(p), "data")

        return jax.shard_map(local, mesh=mesh, in_specs=(P(), P("data", None), P("data")), out_specs=P())

    expect(lesson05.masked_gradients(grads_with(jax.lax.pmean), CFG, mesh), BAD_INPUT, "four arguments")
    ignore_mask = lambda p, x, y, m: grads_with(jax.lax.pmean)(p, x, y)  # noqa: E731
    expect(lesson05.masked_gradients(ignore_mask, CFG, mesh), WRONG, "padding included")


def test_05_2_adamw_factors():
    mesh = mesh_of(4)
    expect(lesson05.adamw_psum_factors((1.0, 16), CFG, mesh), CORRECT)
    expect(lesson05.adamw_psum_factors((4, 16), CFG, mesh), WRONG, "not N times larger")
    expect(lesson05.adamw_psum_factors((0.25, 16), CFG, mesh), WRONG, "does not shrink")
    expect(lesson05.adamw_psum_factors((1, 4), CFG, mesh), WRONG, "squares")
    expect(lesson05.adamw_psum_factors((1, 1), CFG, mesh), WRONG, "nu does change")
    expect(lesson05.adamw_psum_factors((4, 4), CFG, mesh), WRONG, "not right either")
    expect(lesson05.adamw_psum_factors(4, CFG, mesh), BAD_INPUT, "tuple of 2")
    expect(lesson05.adamw_psum_factors(None, CFG, mesh), NOT_ATTEMPTED)


def test_05_2_no_message_gives_a_measured_part_away():
    mesh = mesh_of(4)
    update, nu = lesson05.measured_adamw_factors(CFG, mesh)
    for answer in [(4, 4), (1, 4), (4, 16), (8, 8), (1, 1), (0.25, 2), (2, 32)]:
        fb = lesson05.adamw_psum_factors(answer, CFG, mesh)
        assert fb.status == WRONG, (answer, fb)
        assert "measured" not in fb.message and f"{nu:.4g}" not in fb.message and "16" not in fb.message, fb


def test_05_2_lifted_answer_is_not_accepted():
    """Section 5(b) prints |psum grad| / |pmean grad| = N: as either factor it is wrong."""
    mesh = mesh_of(4)
    expect(lesson05.adamw_psum_factors((4, 4), CFG, mesh), WRONG)
    expect(lesson05.adamw_psum_factors((1.0, 4), CFG, mesh), WRONG, "squares")
