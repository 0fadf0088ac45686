"""Tests of dpcourse.perf.backward: the block's hand-written backward passes compute JAX's gradient."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dpcourse.perf import backward

MIX = 0.1


def _operands(dtype, batch=48, width=16, seed=0):
    rng = np.random.default_rng(seed)
    h = jnp.asarray(rng.standard_normal((batch, width)), dtype)
    w = jnp.asarray(rng.standard_normal((width, width)) / np.sqrt(width), dtype)
    b = jnp.asarray(0.1 * rng.standard_normal(width), dtype)
    return h, w, b


def _gradient(block, h, w, b, repeats=3):
    def loss(h, w, b):
        for _ in range(repeats):
            h = block(h, w, b)
        return jnp.sum(h.astype(jnp.float32) ** 2)

    return jax.jit(jax.grad(loss, argnums=(0, 1, 2)))(h, w, b)


def _jax_block(h, w, b):
    return (1.0 - MIX) * h + MIX * jax.nn.gelu(h @ w + b)


def _rel(a, ref):
    a, ref = np.asarray(a, np.float64), np.asarray(ref, np.float64)
    return float(np.linalg.norm(a - ref) / np.linalg.norm(ref))


def test_keeping_the_slope_gives_jaxs_gradient_in_float32():
    ops = _operands(jnp.float32)
    mine, jaxs = _gradient(backward.block_saving_slope(MIX), *ops), _gradient(_jax_block, *ops)
    for a, ref in zip(mine, jaxs):
        assert _rel(a, ref) < 1e-6
    np.testing.assert_array_equal(backward.block_saving_slope(MIX)(*ops), _jax_block(*ops))  # the same forward


def test_the_kernel_in_bfloat16_is_as_close_to_float32_as_jaxs_own_bfloat16_gradient():
    exact = _gradient(_jax_block, *_operands(jnp.float32))
    low = _operands(jnp.bfloat16)
    kernel = _gradient(backward.block_with_kernel(MIX, interpret=True, rows=16), *low)  # 3 tiles of 16 rows
    jaxs = _gradient(_jax_block, *low)
    for k, j, ref in zip(kernel, jaxs, exact):
        assert k.dtype == jnp.bfloat16
        assert _rel(k, ref) <= 2 * _rel(j, ref) + 2**-8


def test_a_wrong_mix_in_the_kernel_is_caught_by_that_comparison():
    exact = _gradient(_jax_block, *_operands(jnp.float32))
    low = _operands(jnp.bfloat16)
    wrong = backward._custom_block(MIX, lambda kept, g: (g, kept[0].T @ g, g.sum(0)))  # forgets the slope
    dw = _gradient(wrong, *low)[1]
    assert _rel(dw, exact[1]) > 0.5


def test_the_kernel_takes_bfloat16_only_and_says_so():
    with pytest.raises(TypeError, match="compute_dtype='bfloat16'"):
        _gradient(backward.block_with_kernel(MIX, interpret=True), *_operands(jnp.float32))


def test_tile_rows_takes_the_whole_batch_or_tiles_that_divide_it():
    assert backward.tile_rows(48) == 48 and backward.tile_rows(8192) == backward.TILE_ROWS
    assert backward.tile_rows(96, rows=32) == 32
    with pytest.raises(ValueError, match="is 1100 rows: .* \\(3 in all\\) .*\\(for example 3072 or 4608\\)"):
        backward.tile_rows(1100, devices=3)
