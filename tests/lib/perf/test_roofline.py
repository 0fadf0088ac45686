"""Tests of dpcourse.perf.roofline: the byte model, intensities and bounds of notebook 09."""

import pytest

from dpcourse.config import make_config
from dpcourse.perf import roofline

FULL = make_config("full")


def test_fifteen_passes_per_repeat():
    assert roofline.passes_per_repeat() == 15  # 5 forward + 10 backward, listed in the module


def test_elementwise_bytes_follow_the_stated_model():
    # 128 repeats x 15 passes x 4096 x 1024 values x 4 bytes = 32.2 GB per step at full size.
    assert roofline.elementwise_bytes_per_step(FULL, 4096) == 128 * 15 * 4096 * 1024 * 4
    bf16 = FULL.with_overrides(compute_dtype="bfloat16")
    assert roofline.elementwise_bytes_per_step(bf16, 4096) == roofline.elementwise_bytes_per_step(FULL, 4096) / 2


def test_block_matmul_intensity_at_full_size():
    # 2 B W^2 / ((2 B W + W^2) x 4) with B = 4096, W = 1024: 8.59e9 / 3.77e7
    assert roofline.block_matmul_intensity(FULL, 4096) == pytest.approx(227.6, abs=0.1)
    # grows with the batch, and doubles (almost) in bfloat16
    assert roofline.block_matmul_intensity(FULL, 8192) > roofline.block_matmul_intensity(FULL, 4096)
    bf16 = FULL.with_overrides(compute_dtype="bfloat16")
    assert roofline.block_matmul_intensity(bf16, 4096) == pytest.approx(2 * 227.6, abs=0.2)


def test_step_bound_takes_the_least_bytes_and_estimates_with_separate_kernels():
    flops = 6 * 135_030_784 * 4096
    b = roofline.step_bound(FULL, 4096, matmul_flops_per_s=1e15, bytes_per_s=4e12)
    assert b.compute_s == pytest.approx(flops / 1e15)
    assert b.memory_s == pytest.approx(2 * 128 * 4096 * 1024 * 4 / 4e12)  # one [B, W] per repeat, out and back
    assert b.unfused_s == pytest.approx(128 * 15 * 4096 * 1024 * 4 / 4e12)
    assert b.serial_s == pytest.approx(b.compute_s + b.unfused_s)
    assert b.overlap_s == max(b.compute_s, b.memory_s)
    with pytest.raises(ValueError, match="Rates must be > 0"):
        roofline.step_bound(FULL, 4096, 0.0, 1.0)


def test_step_intensity_and_io_fraction():
    assert roofline.step_intensity(FULL, 4096) == pytest.approx(
        6 * 135_030_784 * 4096 / roofline.elementwise_bytes_per_step(FULL, 4096)
    )
    assert 0 < roofline.input_output_fraction(FULL) < 0.01  # the block dominates at full size


def test_unknown_dtype_is_refused():
    with pytest.raises(ValueError, match="float32, bfloat16"):
        roofline.dtype_bytes("int8")


def test_chart_draws_the_roof_and_every_point():
    fig = roofline.roofline_chart(1e12, 1e11, [("a", 1.0, 1e10), ("b", 100.0, 5e11)], "t", note="n")
    ax = fig.axes[0]
    assert len(ax.lines) == 4  # roof, ridge, two points
    import matplotlib.pyplot as plt

    plt.close(fig)
