"""The checkers of lesson 05 (dpcourse.exercises.lesson05): right answers pass, each planted mistake is named."""

import jax
import numpy as np
import optax
import pytest
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

from dpcourse import model
from dpcourse.config import make_config
from dpcourse.exercises import lesson05
from dpcourse.exercises.base import BAD_INPUT, CORRECT, NOT_ATTEMPTED, WRONG

CFG = make_config("smoke")


def expect(feedback, status, phrase=""):
    assert feedback.status == status, feedback
    assert phrase in feedback.message, feedback


def mesh_of(k):
    return Mesh(np.array(jax.devices()[:k]), ("data",))


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
    right = jax.jit(_masked_fn(mesh))  # compiled inside: op by op, a shard_map gradient takes seconds

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
