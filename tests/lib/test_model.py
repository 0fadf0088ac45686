"""Tests of dpcourse.model: the shared-block MLP's size, cost, initialisation and loss."""

import math

import jax
import numpy as np
import pytest

from dpcourse import model
from dpcourse.config import make_config

FULL = make_config("full")
SMOKE = make_config("smoke")


def test_full_size_parameter_count_matches_the_outline():
    # 784*1024+1024 + 1024*1024+1024 + 1024*10+10 (outline: 1,863,690).
    assert model.param_count(FULL) == 1_863_690


def test_parameter_count_does_not_grow_with_block_repeats():
    # The design's point: more compute per example, same gradient to all-reduce.
    assert model.param_count(FULL.with_overrides(block_repeats=1)) == model.param_count(FULL)


def test_parameter_count_matches_the_initialised_arrays():
    for cfg in (SMOKE, make_config("cpu")):
        params = model.init_params(cfg)
        assert sum(p.size for p in params.values()) == model.param_count(cfg)


def test_full_size_training_flops_per_example():
    # 6 x (784*1024 + 128*1024*1024 + 1024*10) = 810,184,704, about 0.81 GFLOP.
    assert model.macs_per_example(FULL) == 135_030_784
    assert model.train_flops_per_example(FULL) == 810_184_704


def test_training_flops_grow_linearly_with_block_repeats():
    one = model.train_flops_per_example(FULL.with_overrides(block_repeats=1))
    two = model.train_flops_per_example(FULL.with_overrides(block_repeats=2))
    assert two - one == 6 * 1024 * 1024


def test_full_size_gradient_bytes():
    from dpcourse.costs import gradient_bytes

    assert gradient_bytes(FULL) == 7_454_760  # 1,863,690 float32 values


def test_init_shapes_dtypes_and_zero_biases():
    params = model.init_params(SMOKE)
    w = SMOKE.width
    shapes = {k: v.shape for k, v in params.items()}
    assert shapes == {
        "w_in": (784, w),
        "b_in": (w,),
        "w_block": (w, w),
        "b_block": (w,),
        "w_out": (w, 10),
        "b_out": (10,),
    }
    assert all(v.dtype == np.float32 for v in params.values())
    for name in ("b_in", "b_block", "b_out"):
        assert not params[name].any()


def test_init_is_he_normal_at_full_size():
    params = model.init_params(FULL)
    # He-normal: std sqrt(2 / fan_in), mean 0. The sample std of n normal
    # draws has relative standard error 1/sqrt(2n): 0.08% for w_in (802,816
    # values), 0.07% for w_block (1,048,576) and 0.7% for w_out (10,240).
    # Tolerances of 1%, 1% and 4% are over 5 standard errors: a wrong scale
    # (e.g. 1/fan_in, or fan_out instead of fan_in) misses them by far.
    for name, fan_in, rtol in (("w_in", 784, 0.01), ("w_block", 1024, 0.01), ("w_out", 1024, 0.04)):
        w = params[name]
        expected = math.sqrt(2.0 / fan_in)
        assert w.std() == pytest.approx(expected, rel=rtol), name
        assert abs(w.mean()) < 5 * expected / math.sqrt(w.size), name


def test_init_is_deterministic_and_seeded():
    a, b, c = model.init_params(SMOKE), model.init_params(SMOKE), model.init_params(SMOKE, seed=1)
    for name in a:
        np.testing.assert_array_equal(a[name], b[name])
    assert not np.array_equal(a["w_in"], c["w_in"])


def test_forward_output_shape(cpu_devices):
    params = model.init_params(SMOKE)
    x = np.random.default_rng(0).uniform(size=(5, 784)).astype(np.float32)
    logits = jax.jit(model.forward, static_argnums=(2, 3))(params, x, SMOKE.block_repeats, SMOKE.block_mix)
    assert logits.shape == (5, 10) and logits.dtype == np.float32
    assert np.isfinite(np.asarray(logits)).all()


def test_forward_applies_the_block_residually():
    # With block_mix 0 the block is skipped entirely: h stays the input layer's output.
    params = model.init_params(SMOKE)
    x = np.random.default_rng(0).uniform(size=(3, 784)).astype(np.float32)
    # Full float32 matmuls on every platform: a GPU's default is TF32 (10-bit
    # mantissa), whose rounding differs between the two computations.
    with jax.default_matmul_precision("highest"):
        h = jax.nn.gelu(x @ params["w_in"] + params["b_in"])
        expected = h @ params["w_out"] + params["b_out"]
        got = jax.jit(model.forward, static_argnums=(2, 3))(params, x, 5, 0.0)
    # float32 matmuls of the same values, differing only in summation order
    # (784 terms): 1e-5 relative is ample.
    np.testing.assert_allclose(np.asarray(got), np.asarray(expected), rtol=1e-5, atol=1e-5)


def test_loss_at_init_is_near_ln10_at_full_size(cpu_devices):
    # He init keeps the logits small at full size, so the initial
    # cross-entropy is close to uniform guessing over 10 classes, ln(10) =
    # 2.3026 (measured 2.3027 to 2.3048 over three seeds). A broken init or
    # residual mix gives losses far above it (large logits) or NaN.
    params = model.init_params(FULL)
    rng = np.random.default_rng(0)
    x = rng.uniform(size=(16, 784)).astype(np.float32)
    y = rng.integers(0, 10, size=16).astype(np.int32)
    loss, metrics = jax.jit(lambda p, x, y: model.loss_and_metrics(p, x, y, FULL))(params, x, y)
    assert float(loss) == pytest.approx(math.log(10), abs=0.05)
    assert float(metrics["loss"]) == float(loss)
    assert 0.0 <= float(metrics["accuracy"]) <= 1.0


def test_loss_at_init_is_in_the_ln10_region_at_smoke_size(cpu_devices):
    # Narrow models start further from uniform (2.33 to 2.74 measured over
    # seeds 0-2); the region [ln 10 - 0.1, ln 10 + 1] still rules out an
    # exploding init.
    params = model.init_params(SMOKE)
    rng = np.random.default_rng(0)
    x = rng.uniform(size=(64, 784)).astype(np.float32)
    y = rng.integers(0, 10, size=64).astype(np.int32)
    loss, _ = jax.jit(lambda p, x, y: model.loss_and_metrics(p, x, y, SMOKE))(params, x, y)
    assert math.log(10) - 0.1 < float(loss) < math.log(10) + 1.0


def test_accuracy_counts_argmax_hits():
    params = model.init_params(SMOKE)
    x = np.random.default_rng(0).uniform(size=(8, 784)).astype(np.float32)
    logits = np.asarray(jax.jit(model.forward, static_argnums=(2, 3))(params, x, SMOKE.block_repeats, SMOKE.block_mix))
    y = logits.argmax(axis=1).astype(np.int32)
    y[:2] = (y[:2] + 1) % 10  # two wrong labels out of 8
    _, metrics = jax.jit(lambda p, x, y: model.loss_and_metrics(p, x, y, SMOKE))(params, x, y)
    assert float(metrics["accuracy"]) == 6 / 8


# --- the ladder's settings (notebook 09): same function, other programs ---

UNROLLS = (1, 2, "full")


def _loss_and_grads(cfg, params, x, y):
    return jax.jit(jax.value_and_grad(lambda p: model.loss_and_metrics(p, x, y, cfg)[0]))(params)


def _sample(cfg, n=16):
    rng = np.random.default_rng(1)
    return rng.random((n, 784), np.float32), rng.integers(0, 10, n).astype(np.int32)


@pytest.mark.parametrize("unroll", UNROLLS[1:])
def test_unrolled_forward_and_gradients_equal_the_scan(unroll):
    cfg = make_config("smoke").with_overrides(block_repeats=5)  # 5 repeats: unroll=2 leaves a remainder
    params = model.init_params(cfg)
    x, y = _sample(cfg)
    ref_loss, ref_grads = _loss_and_grads(cfg, params, x, y)
    loss, grads = _loss_and_grads(cfg.with_overrides(block_unroll=unroll), params, x, y)
    # Same float32 arithmetic in another program: a few roundings at most.
    assert abs(float(loss) - float(ref_loss)) <= 1e-6
    for name in ref_grads:
        np.testing.assert_allclose(grads[name], ref_grads[name], rtol=1e-5, atol=1e-6)


def test_full_unroll_leaves_no_loop_in_the_program():
    cfg = make_config("smoke").with_overrides(block_repeats=3)
    params = model.init_params(cfg)
    x, _ = _sample(cfg)

    def hlo(c):
        return (
            jax.jit(lambda p, x: model.forward(p, x, c.block_repeats, c.block_mix, c.block_unroll))
            .lower(params, x)
            .compile()
            .as_text()
        )

    assert " while(" in hlo(cfg)
    assert " while(" not in hlo(cfg.with_overrides(block_unroll="full"))


def test_bfloat16_compute_keeps_float32_logits_and_gradients():
    cfg = make_config("smoke").with_overrides(compute_dtype="bfloat16")
    params = model.init_params(cfg)
    x, y = _sample(cfg)
    logits = model.forward(params, x, cfg.block_repeats, cfg.block_mix, compute_dtype="bfloat16")
    assert logits.dtype == np.float32
    _, grads = _loss_and_grads(cfg, params, x, y)
    assert all(g.dtype == np.float32 for g in grads.values())  # master weights: float32 gradients


def test_bfloat16_compute_is_really_bfloat16():
    # A cast that did nothing would give the float32 logits exactly.
    cfg = make_config("smoke")
    params = model.init_params(cfg)
    x, _ = _sample(cfg)
    f32 = model.forward(params, x, cfg.block_repeats, cfg.block_mix)
    bf16 = model.forward(params, x, cfg.block_repeats, cfg.block_mix, compute_dtype="bfloat16")
    assert float(np.max(np.abs(f32 - bf16))) > 0


@pytest.mark.parametrize("name", ["smoke", "cpu"])
def test_bfloat16_loss_is_within_the_ladders_tolerance(name):
    from dpcourse.perf import ladder

    cfg = make_config(name)
    params = model.init_params(cfg)
    x, y = _sample(cfg, 64)
    f32, _ = _loss_and_grads(cfg, params, x, y)
    bf16, _ = _loss_and_grads(cfg.with_overrides(compute_dtype="bfloat16"), params, x, y)
    assert abs(float(bf16) - float(f32)) <= ladder.bf16_loss_tolerance(float(f32))


def test_forward_refuses_unknown_settings():
    cfg = make_config("smoke")
    params = model.init_params(cfg)
    x, _ = _sample(cfg)
    with pytest.raises(ValueError, match="block_unroll"):
        model.forward(params, x, 2, 0.1, block_unroll=0)
    with pytest.raises(ValueError, match="compute_dtype"):
        model.forward(params, x, 2, 0.1, compute_dtype="float16")
