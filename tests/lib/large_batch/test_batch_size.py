"""Tests of dpcourse.batch_size: the noise-scale estimator, the noise step, the steps loop, the fit.

The closed-form test: least squares on a fixed finite data set. At a fixed
``w`` each example's gradient is ``g_i = x_i (x_i . w - y_i)``; the true
gradient ``G`` is their mean and ``Sigma`` their covariance (population),
both computed from the data. Batches drawn with replacement then have
``E |G_b|^2 = |G|^2 + tr(Sigma) / b`` exactly, so the estimator's averages
must approach ``tr(Sigma)`` and ``|G|^2``; the tolerance is the sampling
error of the number of steps averaged (measured, see the test).
"""

from __future__ import annotations

import math

import jax
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from dpcourse import model, train
from dpcourse.config import make_config
from dpcourse.large_batch import batch_size

CFG = make_config("smoke").with_overrides(width=16, block_repeats=1)


def least_squares(n_examples=4096, d=20, noise=0.5, seed=0):
    """x [n, d], y [n], and a w away from the solution; per-example gradients g [n, d]."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n_examples, d))
    w_true = rng.normal(size=d)
    y = x @ w_true + noise * rng.normal(size=n_examples)
    w = w_true + 0.3 * rng.normal(size=d)
    g = x * (x @ w - y)[:, None]
    return g


def test_noise_scale_of_least_squares_matches_the_closed_form():
    g = least_squares()
    big_g = g.mean(axis=0)
    trace = float(np.sum(g.var(axis=0)))  # tr(Sigma), population covariance of the data set
    g2 = float(big_g @ big_g)
    expected = trace / g2
    rng = np.random.default_rng(1)
    b, n_dev, steps = 8, 8, 4000
    noise = batch_size.NoiseScale(b, b * n_dev)
    for _ in range(steps):
        idx = rng.integers(0, len(g), size=(n_dev, b))  # with replacement: the formula is exact
        per_device = g[idx].mean(axis=1)  # [n_dev, d], each device's gradient
        local_sq = float(np.mean(np.sum(per_device**2, axis=1)))
        averaged = per_device.mean(axis=0)
        noise.update(local_sq, float(averaged @ averaged))
    # 4000 steps, measured over 20 seeds: relative errors with standard deviations 0.4% (trace),
    # 1.0% (|G|^2) and 0.6% (B_simple), at most 1.3%, 2.6% and 1.5%. 5% leaves room for other
    # seeds and is far from a wrong estimator (b and B swapped makes the trace negative).
    assert noise.trace_sum / steps == pytest.approx(trace, rel=0.05)
    assert noise.g2_sum / steps == pytest.approx(g2, rel=0.05)
    assert noise.b_simple == pytest.approx(expected, rel=0.05)


def test_noise_terms_are_exact_for_expected_norms():
    # With E|G_b|^2 = |G|^2 + tr/b put in exactly, the estimates give |G|^2 and tr back.
    g2, trace, b, big_b = 0.7, 50.0, 16, 128
    got = batch_size.noise_terms(g2 + trace / b, g2 + trace / big_b, b, big_b)
    assert got == pytest.approx((g2, trace), rel=1e-12)


@pytest.mark.parametrize("b, big_b", [(8, 8), (0, 8), (16, 8)])
def test_noise_terms_refuse_batches_that_are_not_two_sizes(b, big_b):
    with pytest.raises(ValueError, match="b < B"):
        batch_size.noise_terms(1.0, 0.5, b, big_b)


def test_noise_scale_is_nan_before_any_step():
    assert math.isnan(batch_size.NoiseScale(4, 32).b_simple)


def _placed(n_devices, global_batch=32, seed=0):
    mesh = Mesh(np.array(jax.devices()[:n_devices]), ("data",))
    optimizer = batch_size.make_optimizer(1e-3, CFG.weight_decay)
    params = jax.device_put(model.init_params(CFG), NamedSharding(mesh, P()))
    rng = np.random.default_rng(seed)
    x = rng.uniform(size=(64, 784)).astype(np.float32)
    y = rng.integers(0, 10, size=64).astype(np.int32)
    xs, ys = batch_size.batch_stream(x, y, global_batch, 0, mesh)(0, 3)
    return mesh, optimizer, params, optimizer.init(params), xs, ys


@pytest.mark.parametrize("n_devices", [8])  # the lesson checks it at its own count
def test_the_extra_pmean_leaves_the_step_bitwise_unchanged(n_devices):
    mesh, optimizer, params, opt_state, xs, ys = _placed(n_devices)
    noise_step = jax.jit(batch_size.make_noise_step(CFG, optimizer, mesh))
    plain_step = jax.jit(train.make_shard_map_step(CFG, optimizer, mesh))
    a = b = (params, opt_state)
    for k in range(3):  # parameters, AdamW state and metrics after each of 3 steps
        out_a, out_b = noise_step(*a, xs[k], ys[k]), plain_step(*b, xs[k], ys[k])
        assert train.max_abs_diff(out_a[:3], out_b) == 0.0, f"step {k + 1}"
        a, b = out_a[:2], out_b[:2]


def test_the_norms_are_the_per_device_and_the_averaged_gradient():
    mesh, optimizer, params, opt_state, xs, ys = _placed(8)
    _, _, _, norms = jax.jit(batch_size.make_noise_step(CFG, optimizer, mesh))(params, opt_state, xs[0], ys[0])
    host = jax.tree.map(np.asarray, params)
    x, y = np.asarray(xs[0]), np.asarray(ys[0])

    @jax.jit
    def sq_grad_jit(xb, yb):  # one device, the whole batch or one device's rows
        grads = jax.grad(lambda p: model.loss_and_metrics(p, xb, yb, CFG)[0])(host)
        return sum(jax.numpy.sum(jax.numpy.square(g)) for g in jax.tree.leaves(grads))

    def sq_grad(xb, yb):
        return float(sq_grad_jit(xb, yb))

    b = len(y) // 8
    local = np.mean([sq_grad(x[i * b : (i + 1) * b], y[i * b : (i + 1) * b]) for i in range(8)])
    # float32 gradients summed in another order: relative differences of a few 1e-7.
    assert float(norms["local_sq"]) == pytest.approx(local, rel=1e-4)
    assert float(norms["global_sq"]) == pytest.approx(sq_grad(x, y), rel=1e-4)


def test_batch_stream_gives_each_step_the_same_batch_however_grouped():
    mesh = Mesh(np.array(jax.devices()[:2]), ("data",))
    x = np.arange(10 * 3, dtype=np.float32).reshape(10, 3)
    y = np.arange(10, dtype=np.int32)
    stream = batch_size.batch_stream(x, y, 4, 3, mesh)
    four = np.asarray(stream(0, 4)[1])
    assert np.array_equal(np.concatenate([np.asarray(stream(0, 1)[1]), np.asarray(stream(1, 3)[1])]), four)
    assert sorted(four.ravel()[:10].tolist()) == list(range(10))  # one epoch: every example once


def test_fit_recovers_an_exact_trade_off():
    s_min, e_min = 40.0, 12_000.0
    batches = [64, 256, 1024, 4096]
    fit = batch_size.fit_trade_off(batches, [s_min + e_min / b for b in batches])
    assert fit.s_min == pytest.approx(s_min) and fit.e_min == pytest.approx(e_min)
    assert fit.b_crit == pytest.approx(300.0) and fit.worst_error < 1e-9
    for b in batches:  # (S/S_min - 1)(E/E_min - 1) = 1 with E = B S
        s = fit.steps_at(b)
        assert (s / fit.s_min - 1) * (b * s / fit.e_min - 1) == pytest.approx(1.0)


def test_fit_refuses_too_few_batches_and_steps_that_do_not_fall():
    with pytest.raises(ValueError, match="2 or more"):
        batch_size.fit_trade_off([64, 64], [10, 12])
    with pytest.raises(ValueError, match="must be > 0"):
        batch_size.fit_trade_off([64, 256, 1024], [10, 20, 40])


def test_learning_rate_rules():
    assert batch_size.scaled_learning_rate(1e-3, 64, 256, "same") == 1e-3
    assert batch_size.scaled_learning_rate(1e-3, 64, 256, "sqrt") == pytest.approx(2e-3)
    assert batch_size.scaled_learning_rate(1e-3, 64, 256, "linear") == pytest.approx(4e-3)
    with pytest.raises(ValueError, match="sqrt"):
        batch_size.scaled_learning_rate(1e-3, 64, 256, "cubic")


def _fake_run_steps(losses):
    """A run_steps whose held-out losses follow ``losses`` (step i -> losses[i]); norms constant."""

    def run_steps(params, opt_state, xs, ys, *held):
        k = len(xs)
        out = np.array([losses[min(params + j, len(losses) - 1)] for j in range(k)])
        return params + k, opt_state, out, np.full(k, 2.0), np.full(k, 1.0)

    return run_steps


@pytest.mark.parametrize("chunk", [1, 3, 7])
def test_steps_to_target_counts_exactly_whatever_the_chunk(chunk):
    losses = [2.0, 1.5, 1.2, 0.9, 0.5, 0.4]
    noise = batch_size.NoiseScale(4, 32)
    run = batch_size.steps_to_target(
        _fake_run_steps(losses), 0, None, lambda s, k: (np.zeros(k), None), (), 0.9, 100, chunk, noise
    )
    assert run.steps == 4 and run.held_out == losses[:4] and noise.count == 4


def test_steps_to_target_gives_up_on_a_stalled_run():
    losses = [2.0, 1.0] + [1.5] * 50
    run = batch_size.steps_to_target(
        _fake_run_steps(losses), 0, None, lambda s, k: (np.zeros(k), None), (), 0.5, 1000, 4, patience=10
    )
    assert run.steps is None and len(run.held_out) == 12


def test_every_profile_has_a_plan():
    from dpcourse.config import profile_names

    for name in profile_names():
        plan = batch_size.plan_for(name)
        assert list(plan.global_batches) == sorted(plan.global_batches) and len(plan.global_batches) >= 3
    with pytest.raises(ValueError, match="smoke"):
        batch_size.plan_for("huge")


def one_sentence(err: pytest.ExceptionInfo) -> str:
    said = str(err.value)
    assert said.endswith(".") and "\n" not in said and len(said) < 400, said
    return said


@pytest.mark.parametrize("bad", [None, math.nan, math.inf, -math.inf, "30", 0, -5])
def test_fit_refuses_a_step_count_that_is_not_a_finite_number_above_zero(bad):
    with pytest.raises(ValueError) as err:
        batch_size.fit_trade_off([64, 256, 1024], [100, bad, 30])
    said = one_sentence(err)
    assert said.startswith("The steps at global batch 256 ")
    if bad is None:
        assert "(its run did not reach the target): leave that batch out of the fit" in said
    else:
        assert f"must be a finite number > 0, got {bad!r}." in said


@pytest.mark.parametrize("bad", [0, math.nan, None, -64, 64.5, math.inf, True])
def test_fit_refuses_a_batch_that_is_not_a_whole_number_of_examples(bad):
    with pytest.raises(ValueError, match=r"^Each global batch must be a whole number >= 1, got ") as err:
        batch_size.fit_trade_off([64, bad, 1024], [100, 50, 30])
    one_sentence(err)


@pytest.mark.parametrize(("batches", "steps"), [([], []), ([256], [40]), ([256, 256], [40, 41])])
def test_fit_with_fewer_than_two_batches_says_what_to_do(batches, steps):
    with pytest.raises(ValueError) as err:
        batch_size.fit_trade_off(batches, steps)
    said = one_sentence(err)
    assert said.startswith(
        f"The fit needs steps to the target at 2 or more distinct global batches, got {len(set(batches))} "
    )
    assert "max_steps" in said and "target_loss" in said
    with pytest.raises(ValueError, match="one step count per global batch, got 2 and 1"):
        batch_size.fit_trade_off([64, 256], [10])


def test_a_global_batch_the_devices_do_not_divide_is_refused_with_the_courses_check():
    mesh = Mesh(np.array(jax.devices()[:4]), ("data",))
    x, y = np.zeros((40, 3), np.float32), np.zeros(40, np.int32)
    with pytest.raises(ValueError) as err:
        batch_size.batch_stream(x, y, 30, 0, mesh)
    with pytest.raises(ValueError) as course:
        train.check_global_batch(30, 4)
    assert (
        str(err.value)
        == str(course.value)
        == (
            "Global batch 30 does not divide evenly over 4 devices. Nearest valid global batches: 28 or 32 "
            "(a multiple of 4)."
        )
    )
    for bad in (0, math.nan, None, 2.5):
        with pytest.raises(ValueError, match="The global batch must be a whole number >= 1"):
            batch_size.batch_stream(x, y, bad, 0, mesh)
    with pytest.raises(ValueError, match=r"The mesh has the axes \('data',\), not 'batch'"):
        batch_size.batch_stream(x, y, 8, 0, mesh, axis="batch")
    with pytest.raises(ValueError, match="same number of examples, at least 1, got 40 and 39"):
        batch_size.batch_stream(x, y[:39], 8, 0, mesh)
    with pytest.raises(ValueError, match="not 'batch'"):
        batch_size.make_noise_step(CFG, batch_size.make_optimizer(1e-3, 0.0), mesh, axis="batch")


@pytest.mark.parametrize("bad", [None, math.nan, math.inf, 0, 2.5])
def test_steps_to_target_refuses_a_step_limit_or_chunk_that_is_not_a_whole_number(bad):
    run = _fake_run_steps([2.0, 1.0, 0.5])
    args = (run, 0, None, lambda s, k: (np.zeros(k), None), ())
    with pytest.raises(ValueError, match=f"^max_steps must be a whole number >= 1, got {bad!r}.$"):
        batch_size.steps_to_target(*args, 0.9, bad, 4)
    with pytest.raises(ValueError, match=r"^chunk \(steps per call\) must be a whole number >= 1"):
        batch_size.steps_to_target(*args, 0.9, 100, bad)  # 0 steps per call looped for ever
    if bad is not None:  # None: no patience, a run stops at max_steps
        with pytest.raises(ValueError, match="^patience must be"):
            batch_size.steps_to_target(*args, 0.9, 100, 4, patience=bad)
    if bad is not None and bad != 0 and bad != 2.5:
        with pytest.raises(ValueError, match=f"^The target held-out loss must be a finite number, got {bad!r}.$"):
            batch_size.steps_to_target(*args, bad, 100, 4)


def test_the_other_public_functions_check_their_numbers_in_one_sentence():
    fit = batch_size.TradeOff(s_min=100.0, e_min=102_400.0, worst_error=0.0)
    cases = [
        (lambda: batch_size.scaled_learning_rate(1e-3, 64, math.nan, "sqrt"), "The global batch must be a whole"),
        (lambda: batch_size.scaled_learning_rate(math.nan, 64, 256, "sqrt"), "The base learning rate must be"),
        (lambda: batch_size.scaled_learning_rate(1e-3, 0, 256, "sqrt"), "The base batch must be a whole number"),
        (lambda: batch_size.make_optimizer(math.nan, 0.0), "The learning rate must be a finite number > 0"),
        (lambda: batch_size.make_optimizer(1e-3, -0.1), "The weight decay must be >= 0"),
        (lambda: batch_size.NoiseScale(0, 64), "The per-device batch b must be a whole number >= 1, got 0."),
        (lambda: batch_size.NoiseScale(64, 64), "Need two batch sizes 1 <= b < B"),
        (lambda: batch_size.NoiseScale(None, 64), "The per-device batch b must be a whole number"),
        (lambda: fit.steps_at(0), "The global batch must be a finite number > 0, got 0."),
        (lambda: batch_size.TradeOff(math.nan, 1e5, 0.0), "S_min must be a finite number > 0, got nan."),
        (lambda: batch_size.TradeOff(100.0, -1.0, 0.0), "E_min must be a finite number > 0, got -1.0."),
    ]
    for call, start in cases:
        with pytest.raises(ValueError) as err:
            call()
        assert one_sentence(err).startswith(start), (start, str(err.value))
