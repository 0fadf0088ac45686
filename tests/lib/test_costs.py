"""Tests of dpcourse.costs: the cost model's formulas on hand-computed cases."""

import pytest

from dpcourse import costs
from dpcourse.config import make_config
from dpcourse.costs import TFLOP, find_peak, fit_overhead_and_per_example, mfu, predict_step, ring_allreduce_s

FULL = make_config("full")
GRAD_BYTES = 7_454_760  # 1,863,690 float32 gradients (outline)


def test_gradient_bytes_and_flops_per_step_at_full_size():
    assert costs.gradient_bytes(FULL) == GRAD_BYTES
    assert costs.gradient_bytes(FULL, bytes_per_value=2) == GRAD_BYTES // 2  # bf16
    assert costs.train_flops_per_step(FULL, 1024) == 810_184_704 * 1024


def test_ring_allreduce_two_l4_over_pcie():
    # 2 (N-1)/N x bytes / bandwidth = 2 * 1/2 * 7,454,760 / 32e9 = 0.000232961 s.
    assert ring_allreduce_s(GRAD_BYTES, 2, 32e9) == pytest.approx(0.000233, abs=5e-7)
    assert ring_allreduce_s(GRAD_BYTES, 2, 32e9) == pytest.approx(GRAD_BYTES / 32e9, rel=1e-12)


def test_ring_allreduce_hand_cases():
    assert ring_allreduce_s(GRAD_BYTES, 1, 32e9) == 0.0  # one device: nothing to exchange
    # 4 devices: 2 * 3/4 = 1.5 buffers each way; 8 devices: 1.75.
    assert ring_allreduce_s(1e9, 4, 1e9) == pytest.approx(1.5, rel=1e-12)
    assert ring_allreduce_s(1e9, 8, 450e9) == pytest.approx(1.75 / 450, rel=1e-12)


@pytest.mark.parametrize("n_devices, bandwidth", [(0, 32e9), (2, 0.0), (2, -1.0)])
def test_ring_allreduce_rejects_bad_arguments(n_devices, bandwidth):
    with pytest.raises(ValueError):
        ring_allreduce_s(GRAD_BYTES, n_devices, bandwidth)


@pytest.mark.parametrize(
    "kind, name, tf32_tflops, link_gb_s",
    [
        ("NVIDIA L4", "NVIDIA L4", 60, 32),
        ("NVIDIA H100 80GB HBM3", "NVIDIA H100 SXM", 495, 450),
        ("NVIDIA H100 PCIe", "NVIDIA H100 PCIe", 378, 64),
        ("NVIDIA H200", "NVIDIA H200 SXM", 495, 450),
        ("NVIDIA A100-SXM4-80GB", "NVIDIA A100 SXM", 156, 300),
        ("NVIDIA A100-SXM4-40GB", "NVIDIA A100 SXM", 156, 300),
        # PCIe A100s once matched the NVLink entry: an all-reduce 300/32 = 9.4x too fast.
        ("NVIDIA A100-PCIE-40GB", "NVIDIA A100 PCIe", 156, 32),
        ("NVIDIA A100 80GB PCIe", "NVIDIA A100 PCIe", 156, 32),
    ],
)
def test_find_peak_known_devices(kind, name, tf32_tflops, link_gb_s):
    peak = find_peak(kind)
    assert peak is not None and peak.name == name
    assert peak.peak("tf32") == tf32_tflops * TFLOP
    assert peak.peak() == peak.tf32_flops_per_s  # TF32 is the default on GPUs (JAX float32 matmuls)
    assert peak.link_bytes_per_s == link_gb_s * costs.GB
    assert peak.source  # every figure says where it comes from


def test_outline_peaks_for_l4_and_h100():
    l4, h100 = find_peak("NVIDIA L4"), find_peak("NVIDIA H100 80GB HBM3")
    assert (l4.peak("fp32"), l4.peak("bf16")) == (30.3 * TFLOP, 121 * TFLOP)
    assert (h100.peak("fp32"), h100.peak("bf16")) == (67 * TFLOP, 989 * TFLOP)


def test_find_peak_is_case_insensitive():
    assert find_peak("nvidia l4").name == "NVIDIA L4"


@pytest.mark.parametrize(
    "kind",
    [
        "NVIDIA H100 NVL",
        "NVIDIA H200 NVL",
        "cpu",
        "TPU v4",
        "TPU7x",
        "NVIDIA GeForce RTX 4090",
        "",
        # Names that contain a listed one as a substring, not as a token:
        "NVIDIA L40S",
        "NVIDIA L40",
        "NVIDIA RTX A1000",
        "NVIDIA GH200 480GB",
    ],
)
def test_find_peak_unknown_devices_are_none(kind):
    assert find_peak(kind) is None


def test_peak_rejects_an_unknown_precision():
    with pytest.raises(ValueError, match="fp32"):
        find_peak("NVIDIA L4").peak("fp8")


def test_mfu_is_none_on_cpu():
    assert mfu(FULL, 1024, 100.0, 1, "cpu") is None


def test_mfu_hand_computed():
    # One L4, batch 1024, 20 ms/step: 810,184,704 * 1024 / 0.02 s
    # = 4.148e13 FLOP/s achieved, over the 60e12 TF32 peak = 0.691358.
    expected = 810_184_704 * 1024 / 0.020 / 60e12
    assert mfu(FULL, 1024, 20.0, 1, "NVIDIA L4") == pytest.approx(expected, rel=1e-12)
    assert expected == pytest.approx(0.691358, abs=1e-6)
    # Two L4s each with their own 1024 examples in the same time: same MFU.
    assert mfu(FULL, 2048, 20.0, 2, "NVIDIA L4") == pytest.approx(expected, rel=1e-12)
    # Against the lower FP32 peak the same run shows 60/30.3 times the utilisation.
    assert mfu(FULL, 1024, 20.0, 1, "NVIDIA L4", precision="fp32") == pytest.approx(expected * 60 / 30.3, rel=1e-12)


def test_achieved_flops_per_s():
    assert costs.achieved_flops_per_s(FULL, 1024, 1000.0) == pytest.approx(810_184_704 * 1024, rel=1e-12)


def test_fit_recovers_exact_linear_data():
    overhead, per_example = 0.004, 2.5e-5
    batches = [256, 512, 1024, 2048, 4096]
    times = [overhead + per_example * b for b in batches]
    fit_overhead, fit_per_example = fit_overhead_and_per_example(batches, times)
    # Exact data: only float64 rounding (1e-16 relative) separates the fit.
    assert fit_overhead == pytest.approx(overhead, rel=1e-9)
    assert fit_per_example == pytest.approx(per_example, rel=1e-9)


def test_fit_with_a_negative_overhead_goes_through_the_origin():
    # The free line is t = -1 + 0.01 b (a negative overhead is not physical);
    # through the origin, per_example = sum(b t) / sum(b^2) = 200 / 50,000.
    overhead, per_example = fit_overhead_and_per_example([100, 200], [0.0, 1.0])
    assert overhead == 0.0
    assert per_example == pytest.approx(0.004, rel=1e-12)


@pytest.mark.parametrize("batches, times", [([256], [0.1]), ([256, 256], [0.1, 0.2]), ([1, 2], [0.1])])
def test_fit_needs_two_distinct_batches(batches, times):
    with pytest.raises(ValueError, match="two measurements"):
        fit_overhead_and_per_example(batches, times)


def test_predict_step_one_device():
    pred = predict_step(
        FULL, per_device_batch=1024, n_devices=1, overhead_s=0.002, per_example_s=1e-5, link_bytes_per_s=32e9
    )
    compute = 0.002 + 1e-5 * 1024
    assert pred.global_batch == 1024
    assert pred.compute_s == pytest.approx(compute)
    assert pred.allreduce_s == 0.0  # nothing to reduce on one device
    assert pred.step_s == pytest.approx(compute)
    assert pred.examples_per_s == pytest.approx(1024 / compute)
    assert pred.efficiency == pytest.approx(1.0)


def test_predict_step_two_l4s_adds_the_ring_allreduce():
    pred = predict_step(FULL, 1024, 2, overhead_s=0.002, per_example_s=1e-5, link_bytes_per_s=32e9)
    compute = 0.002 + 1e-5 * 1024
    allreduce = GRAD_BYTES / 32e9  # 2 * 1/2 * bytes / bandwidth
    assert pred.global_batch == 2048
    assert pred.compute_s == pytest.approx(compute)  # devices work side by side
    assert pred.allreduce_s == pytest.approx(allreduce)
    assert pred.step_s == pytest.approx(compute + allreduce)
    assert pred.examples_per_s == pytest.approx(2048 / (compute + allreduce))
    assert pred.efficiency == pytest.approx(compute / (compute + allreduce))


def test_predict_step_on_simulated_devices_never_speeds_up():
    # Shared cores: 8 shards of 128 take as long as 1024 examples on one device.
    pred = predict_step(FULL, 128, 8, overhead_s=0.001, per_example_s=1e-4, link_bytes_per_s=None, shared_cores=True)
    assert pred.allreduce_s == 0.0  # unknown link: left out
    assert pred.compute_s == pytest.approx(0.001 + 1e-4 * 1024)
    single = predict_step(FULL, 1024, 1, overhead_s=0.001, per_example_s=1e-4, link_bytes_per_s=None)
    assert pred.examples_per_s <= single.examples_per_s * (1 + 1e-12)


def test_fit_step_time_says_when_it_went_through_the_origin():
    from dpcourse.costs import fit_step_time

    assert fit_step_time([100, 200], [0.0, 1.0]).through_origin
    fit = fit_step_time([100, 200], [1.0, 2.0])
    assert not fit.through_origin and fit.examples_per_s(100) == pytest.approx(100.0)


def test_a_step_time_that_falls_with_the_batch_cannot_be_fitted():
    from dpcourse.costs import fit_step_time

    with pytest.raises(ValueError, match="does not grow with the batch"):
        fit_step_time([16, 32, 64], [0.010, 0.009, 0.008])


@pytest.mark.parametrize(
    "kind, link",
    [
        ("NVIDIA A100-SXM4-80GB", "NVLink3 (SXM)"),
        ("NVIDIA A100-PCIE-40GB", "PCIe Gen4 x16"),
        ("NVIDIA A100 80GB PCIe", "PCIe Gen4 x16"),
        ("NVIDIA H100 80GB HBM3", "NVLink4"),
        ("NVIDIA H100 PCIe", "PCIe Gen5 x16"),
        ("NVIDIA H200", "NVLink4"),
        ("NVIDIA L4", "PCIe Gen4 x16"),
    ],
)
def test_every_peak_names_its_link_and_the_source_of_its_figures(kind, link):
    peak = find_peak(kind)
    assert peak.link == link
    assert "datasheet" in peak.source
    # The link figure itself is sourced, not only the FLOP/s.
    assert f"{peak.link_bytes_per_s / costs.GB:.0f} GB/s each way" in peak.source


def test_pcie_a100_allreduce_is_predicted_at_pcie_speed():
    sxm, pcie = find_peak("NVIDIA A100-SXM4-80GB"), find_peak("NVIDIA A100-PCIE-40GB")
    t_sxm = ring_allreduce_s(GRAD_BYTES, 4, sxm.link_bytes_per_s)
    t_pcie = ring_allreduce_s(GRAD_BYTES, 4, pcie.link_bytes_per_s)
    assert t_pcie / t_sxm == pytest.approx(300 / 32, rel=1e-12)


def test_ring_allreduce_latency_term():
    # 8 devices: 14 ring steps; at 2 us each 28 us, beside 1.75 x 7,454,760 / 450e9 = 28.99 us.
    bandwidth_only = ring_allreduce_s(GRAD_BYTES, 8, 450e9)
    assert bandwidth_only == pytest.approx(28.99e-6, abs=0.01e-6)
    assert ring_allreduce_s(GRAD_BYTES, 8, 450e9, latency_s=2e-6) == pytest.approx(bandwidth_only + 28e-6)
    assert ring_allreduce_s(GRAD_BYTES, 1, 450e9, latency_s=2e-6) == 0.0  # one device: no steps
    with pytest.raises(ValueError, match="latency"):
        ring_allreduce_s(GRAD_BYTES, 8, 450e9, latency_s=-1e-6)


def test_bfloat16_gradients_halve_the_allreduce():
    f32 = predict_step(FULL, 1024, 4, overhead_s=0.002, per_example_s=1e-5, link_bytes_per_s=32e9)
    bf16 = predict_step(
        FULL, 1024, 4, overhead_s=0.002, per_example_s=1e-5, link_bytes_per_s=32e9, grad_bytes_per_value=2
    )
    assert bf16.allreduce_s == pytest.approx(f32.allreduce_s / 2, rel=1e-12)
    assert bf16.compute_s == f32.compute_s


def test_prediction_docstring_calls_the_no_overlap_step_an_estimate():
    # The no-overlap sum is not an upper bound: its all-reduce term has no latency (a
    # lower bound on the communication) while the sum assumes nothing overlaps.
    doc = " ".join(costs.Prediction.__doc__.split())
    assert "is an estimate, not a bound" in doc
    assert "lower bound on the communication" in doc


@pytest.mark.parametrize("n_points", [0, 1, 2])
def test_two_points_are_exact_by_construction(n_points):
    text = costs.judge_fit(n_points, 0.0)
    assert "by construction" in text and "well" not in text


def test_three_points_are_judged():
    assert "describes them well" in costs.judge_fit(3, 0.04)
    assert "misses some sizes" in costs.judge_fit(5, -0.2)
    assert "+4.0%" in costs.judge_fit(3, 0.04)


def test_scaling_efficiency_hand_computed():
    s = costs.scaling(1000.0, 3000.0, 4, simulated=False)
    assert (s.per_device_examples_per_s, s.speedup, s.efficiency) == (750.0, 3.0, 0.75)
    assert s.verdict == ""


def test_real_devices_slower_than_one_are_communication_bound():
    assert costs.scaling(1000.0, 900.0, 2, simulated=False).verdict == "communication-bound"


def test_simulated_devices_are_never_judged():
    s = costs.scaling(1000.0, 900.0, 8, simulated=True)
    assert s.verdict == "simulated" and s.efficiency == pytest.approx(900 / 8000)


@pytest.mark.parametrize("args", [(0.0, 1.0, 2), (1.0, 0.0, 2), (1.0, 1.0, 0)])
def test_scaling_rejects_bad_input(args):
    with pytest.raises(ValueError):
        costs.scaling(*args, simulated=False)


def test_the_overlapped_bound_hides_only_the_bytes_inside_windows():
    # 10 ms of compute, 4 ms of communication.
    assert costs.overlapped_step_s(0.010, 0.004, 0.0) == pytest.approx(0.014)  # the no-overlap sum
    assert costs.overlapped_step_s(0.010, 0.004, 1.0) == pytest.approx(0.010)  # all hidden by compute
    assert costs.overlapped_step_s(0.010, 0.004, 0.5) == pytest.approx(0.012)  # half hidden, half added
    # Only 1 ms of compute inside the windows: 2 ms in windows cost max(1, 2), the rest adds.
    assert costs.overlapped_step_s(0.010, 0.004, 0.5, 0.001) == pytest.approx(0.009 + 0.002 + 0.002)
    # Communication longer than compute: the bound is the communication.
    assert costs.overlapped_step_s(0.001, 0.004, 1.0) == pytest.approx(0.004)


def test_the_overlapped_bound_refuses_impossible_inputs():
    with pytest.raises(ValueError, match="fraction in"):
        costs.overlapped_step_s(0.01, 0.004, 1.5)
    with pytest.raises(ValueError, match="window compute <= compute"):
        costs.overlapped_step_s(0.01, 0.004, 0.5, 0.02)
    with pytest.raises(ValueError, match="times >= 0"):
        costs.overlapped_step_s(-0.01, 0.004, 0.5)


def test_a_step_with_compute_in_a_window_earns_the_overlapped_bound():
    assert costs.bound_for(0.0) == "no-overlap sum"
    assert costs.bound_for(None) == "no-overlap sum"
    assert costs.bound_for(0.25) == "overlapped bound"
