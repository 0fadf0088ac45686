"""dpcourse.costs on TPUs: MFU against the bf16 peak and the all-reduce over ICI, on hand-worked cases."""

import pytest

from dpcourse import costs
from dpcourse.backend.peaks import TPU_V5E, TPU_V5P
from dpcourse.config import make_config

FULL = make_config("full")
V = 7_454_760  # bytes of the full profile's float32 gradient
W = 50e9  # v5e: one ICI link, one direction (400 GB/s bidirectional per chip / 4 ports / 2)


def test_lesson_02_on_one_v5e_chip_is_31_7_percent_mfu():
    """13.29 ms per step at `full` (global batch 1024 on one chip), measured on one TPU v5e.

    810,184,704 FLOPs per example x 1024 / 0.01329 s = 62.42 TFLOP/s; over
    the bf16 peak of 197 TFLOP/s that is 0.31688, 31.7% (31.6% truncated).
    """
    assert FULL.per_device_batch == 1024
    achieved = costs.achieved_flops_per_s(FULL, 1024, 13.29)
    assert achieved == pytest.approx(62.42e12, rel=1e-4)
    assert costs.mfu(FULL, 1024, 13.29, 1, "TPU v5 lite") == pytest.approx(0.316879, abs=1e-6)
    assert f"{costs.mfu(FULL, 1024, 13.29, 1, 'TPU v5 lite'):.1%}" == "31.7%"


def test_mfu_on_v5p_and_v6e_uses_their_bf16_peaks():
    flops = 810_184_704 * 1024 / 0.010
    assert costs.mfu(FULL, 1024, 10.0, 1, "TPU v5") == pytest.approx(flops / 459e12, rel=1e-12)
    assert costs.mfu(FULL, 1024, 10.0, 1, "TPU v6 lite") == pytest.approx(flops / 918e12, rel=1e-12)


def test_one_axis_allreduce_with_and_without_wraparound():
    """The book's 2 V / W_ici on a ring; a line without wraparound takes 2 (N - 1) / N x V / W.

    W_ici (both directions) = 2 W, so a ring of 16 takes 2 V / 2 W = V / W
    = 7,454,760 / 50e9 = 149.0952 us, plus 2 x ceil(16 / 2) = 16 hops of
    1 us. The same 16 chips as a line: 2 x 15/16 x V / W = 279.5535 us
    (1.875 times the ring's) plus 2 x 15 = 30 hops.
    """
    ring = costs.ici_axis_allreduce_s(V, 16, W, wraparound=True, hop_latency_s=1e-6)
    line = costs.ici_axis_allreduce_s(V, 16, W, wraparound=False, hop_latency_s=1e-6)
    assert ring == pytest.approx(149.0952e-6 + 16e-6, rel=1e-9)
    assert line == pytest.approx(279.5535e-6 + 30e-6, rel=1e-9)
    assert costs.ici_axis_allreduce_s(V, 1, W, wraparound=False, hop_latency_s=1e-6) == 0.0
    # Two chips: one link, a ring or not, the same V / W.
    assert costs.ici_axis_allreduce_s(V, 2, W, True) == costs.ici_axis_allreduce_s(V, 2, W, False) == V / W


def test_v5e_8_is_a_2x4_mesh_hand_worked():
    """A v5e-8: axes of 2 and 4 chips, neither wrapped.

    Bandwidth terms alone: axis 2: 2 x 1/2 x V / W = 149.0952 us; axis 4:
    2 x 3/4 x V / W = 223.6428 us. Both axes at once, their rates add:
    1 / (1/149.0952 + 1/223.6428) = 0.6 x V / W = 89.4571 us. Hops:
    2 x ((2 - 1) + (4 - 1)) = 8, at 1 us: 8 us. Total 97.4571 us.
    """
    t = costs.tpu_slice_allreduce_s(V, TPU_V5E, (2, 4))
    assert t == pytest.approx(89.45712e-6 + 8e-6, rel=1e-9)
    assert costs.tpu_slice_allreduce_s(V, TPU_V5E, (2, 4), latency=False) == pytest.approx(89.45712e-6, rel=1e-9)
    assert costs.slice_name(TPU_V5E, (2, 4)) == "v5e-8 (2x4 mesh)"


def test_v5e_256_is_a_16x16_torus_hand_worked():
    """A v5e-256: two wrapped axes of 16. Each: V / W = 149.0952 us; together
    half that, 74.5476 us (the book's 2 V / (n_axes W_ici)). Hops: 2 x (8 + 8)
    = 32 us. Total 106.5476 us: more than the v5e-8, the latency's doing."""
    assert costs.tpu_slice_allreduce_s(V, TPU_V5E, (16, 16)) == pytest.approx(106.5476e-6, rel=1e-9)
    assert costs.slice_name(TPU_V5E, (16, 16)) == "v5e-256 (16x16 torus)"


def test_a_v5p_cube_is_a_3d_torus():
    # 4x4x4, all wrapped: each axis V / 100e9 = 74.5476 us, three at once a third: 24.8492 us;
    # hops 2 x (2 + 2 + 2) = 12 us.
    assert costs.tpu_slice_allreduce_s(V, TPU_V5P, (4, 4, 4)) == pytest.approx(24.84920e-6 + 12e-6, rel=1e-6)


def test_the_ici_model_refuses_a_gpu_and_mismatched_flags():
    with pytest.raises(ValueError, match="not a TPU"):
        costs.tpu_slice_allreduce_s(V, costs.find_peak("NVIDIA H200"), (2, 4))
    with pytest.raises(ValueError, match="one wraparound flag per axis"):
        costs.ici_allreduce_s(V, (2, 4), W, (False,))


def test_predict_tpu_step_adds_the_ici_allreduce():
    pred = costs.predict_tpu_step(FULL, 1024, TPU_V5E, (2, 4), 0.0, 13.29e-3 / 1024)
    assert pred.n_devices == 8 and pred.global_batch == 8192
    assert pred.allreduce_s == pytest.approx(89.45712e-6, rel=1e-9)  # no hop latency unless asked
    assert pred.step_s == pytest.approx(13.29e-3 + 89.45712e-6, rel=1e-9)


def test_a_reduce_scatter_or_all_gather_over_a_slice_is_half_an_all_reduce():
    full = costs.tpu_slice_allreduce_s(V, TPU_V5E, (2, 4))
    assert costs.tpu_collective_s("all-reduce", V, TPU_V5E, (2, 4)) == full
    assert costs.tpu_collective_s("all-gather", V, TPU_V5E, (2, 4)) == full / 2
    assert costs.tpu_collective_s("reduce-scatter", V, TPU_V5E, (2, 4)) == pytest.approx(48.72856e-6, rel=1e-9)
    with pytest.raises(ValueError, match="kind must be"):
        costs.tpu_collective_s("all-to-all", V, TPU_V5E, (2, 4))


def test_the_slice_shape_is_read_from_the_chips_coordinates():
    v5e_8 = [(x, y, 0) for x in range(2) for y in range(4)]
    assert costs.tpu_slice_shape(v5e_8, TPU_V5E) == (2, 4)
    assert costs.tpu_slice_shape([(0, 0, 0)], TPU_V5E) == (1, 1)
    assert costs.tpu_slice_shape([(x, y, z) for x in range(2) for y in range(2) for z in range(2)], TPU_V5P) == (
        2,
        2,
        2,
    )
    with pytest.raises(ValueError, match="more axes"):
        costs.tpu_slice_shape([(0, 0, 0), (0, 0, 1)], TPU_V5E)
