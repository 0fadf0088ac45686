"""dpcourse.backend.peaks: the TPU figures, their sources, the kinds JAX reports and the wraparound rule."""

import pytest

from dpcourse.backend.peaks import GB, TFLOP, TPU_V5E, TPU_V5P, TPU_V6E, find_peak


@pytest.mark.parametrize(
    "kind, peak",
    [
        # JAX's device_kind per chip (chip_version_from_device_kind in JAX's Pallas TPU info): v5e "TPU v5 lite",
        # v5p "TPU v5", v6e "TPU v6 lite"; the marketing names too.
        ("TPU v5 lite", TPU_V5E),
        ("TPU v5e", TPU_V5E),
        ("TPU v5", TPU_V5P),
        ("TPU v5p", TPU_V5P),
        ("TPU v6 lite", TPU_V6E),
        ("TPU v6e", TPU_V6E),
    ],
)
def test_find_peak_knows_the_tpu_kinds_jax_reports(kind, peak):
    assert find_peak(kind) is peak


@pytest.mark.parametrize(
    "peak, bf16_tflops, hbm, hbm_gb_s, link_gb_s, links, url",
    [
        # Google's "bidirectional ICI bandwidth per chip" / ports / 2 directions = one link one way.
        (TPU_V5E, 197, 16 * GB, 819, 400 / 4 / 2, 4, "cloud.google.com/tpu/docs/v5e"),
        (TPU_V5P, 459, 95 * 2**30, 2765, 1200 / 6 / 2, 6, "cloud.google.com/tpu/docs/v5p"),
        (TPU_V6E, 918, 32 * GB, 1638, 800 / 4 / 2, 4, "cloud.google.com/tpu/docs/v6e"),
    ],
)
def test_tpu_figures_match_googles_pages(peak, bf16_tflops, hbm, hbm_gb_s, link_gb_s, links, url):
    assert peak.bf16_flops_per_s == bf16_tflops * TFLOP
    assert peak.hbm_bytes == hbm and peak.hbm_bytes_per_s == hbm_gb_s * GB
    assert peak.link_bytes_per_s == link_gb_s * GB
    assert peak.ici.links_per_chip == links
    assert url in peak.source and f"{bf16_tflops} TFLOPs" in peak.source
    assert peak.link == "ICI" and "PCIe" not in peak.source + peak.link


def test_a_tpu_float32_matmul_is_one_bf16_pass_so_mfu_divides_by_the_bf16_peak():
    assert TPU_V5E.float32_matmul == "bf16"
    assert TPU_V5E.peak() == 197 * TFLOP
    assert "one bf16 pass" in TPU_V5E.mfu_note() and "six" in TPU_V5E.mfu_note()
    with pytest.raises(ValueError, match="no published tf32 peak"):
        TPU_V5E.peak("tf32")
    with pytest.raises(ValueError, match="no published fp32 peak"):
        TPU_V6E.peak("fp32")


def test_gpus_keep_tf32_as_their_float32_peak_and_carry_nccl_latencies():
    h200, l4 = find_peak("NVIDIA H200"), find_peak("NVIDIA L4")
    assert h200.float32_matmul == "tf32" and h200.peak() == 495 * TFLOP and not h200.is_tpu
    assert "TF32" in h200.mfu_note()
    # NCCL's tuning model, Ring/Simple: 3.4 us per step over NVLink, 5.7 over PCIe, 8.4 per call.
    assert (h200.hop_latency_s, l4.hop_latency_s) == (3.4e-6, 5.7e-6)
    assert h200.collective_latency_s == l4.collective_latency_s == 8.4e-6


@pytest.mark.parametrize(
    "peak, shape, rings",
    [
        (TPU_V5E, (2, 4), (False, False)),  # a v5e-8: a mesh, not a torus
        (TPU_V5E, (1, 1), (False, False)),
        (TPU_V5E, (8, 16), (False, True)),  # the 16-chip axis closes
        (TPU_V5E, (16, 16), (True, True)),
        (TPU_V6E, (4, 4), (False, False)),
        (TPU_V5P, (2, 2, 2), (False, False, False)),
        (TPU_V5P, (2, 4, 4), (False, False, False)),  # not a whole cube
        (TPU_V5P, (4, 4, 4), (True, True, True)),
        (TPU_V5P, (4, 4, 8), (True, True, True)),
    ],
)
def test_which_axes_wrap_around(peak, shape, rings):
    assert peak.ici.wraparound(shape) == rings


@pytest.mark.parametrize("shape", [(2, 2, 2), (0, 4), ()])
def test_a_shape_the_torus_cannot_have_is_refused(shape):
    with pytest.raises(ValueError, match="topology"):
        TPU_V5E.ici.wraparound(shape)
