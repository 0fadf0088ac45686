"""dpcourse.large_batch.time_to_target: the modelled step with its latencies, the rows' marks and the sentence read from them."""

import math

import pytest

from dpcourse import costs
from dpcourse.config import make_config
from dpcourse.large_batch import time_to_target as ttt
from dpcourse.large_batch.batch_size import TradeOff

CFG = make_config("smoke")
GRAD = costs.gradient_bytes(CFG)


def test_a_gpu_step_adds_nccls_latencies_to_the_ring():
    """8 H200s: compute = FLOPs(64 examples) / 495e12; ring = 2 x 7/8 x bytes / 450e9
    + 14 steps x 3.4 us + 8.4 us per call."""
    h200 = costs.find_peak("NVIDIA H200")
    compute, comm = ttt.step_terms(CFG, 64, h200, (8,))
    assert compute == pytest.approx(costs.train_flops_per_step(CFG, 64) / 495e12, rel=1e-12)
    assert comm == pytest.approx(1.75 * GRAD / 450e9 + 14 * 3.4e-6 + 8.4e-6, rel=1e-12)
    _, bare = ttt.step_terms(CFG, 64, h200, (8,), latency=False)
    assert bare == pytest.approx(1.75 * GRAD / 450e9, rel=1e-12)
    assert ttt.step_terms(CFG, 64, h200, (1,))[1] == 0.0


def test_a_tpu_step_uses_the_bf16_peak_and_the_ici_model():
    v5e = costs.find_peak("TPU v5 lite")
    compute, comm = ttt.step_terms(CFG, 64, v5e, (2, 4))
    assert compute == pytest.approx(costs.train_flops_per_step(CFG, 64) / 197e12, rel=1e-12)
    assert comm == costs.tpu_slice_allreduce_s(GRAD, v5e, (2, 4))


def test_rows_are_marked_trained_interpolated_or_extrapolated():
    fit = TradeOff(s_min=100.0, e_min=100.0 * 1024, worst_error=0.0)
    table = ttt.rows(fit, 64, ttt.gpus("H200", "NVIDIA H200", [1, 2, 4, 16, 64]), CFG, trained=[128, 256, 2048])
    assert [r["batch"] for r in table] == ["extrapolated", "trained", "trained", "interpolated", "extrapolated"]
    assert [r["machine"] for r in table][:2] == ["1 x H200", "2 x H200"]
    r = table[2]
    assert r["steps"] == fit.steps_at(256)
    assert r["time to target ms"] == pytest.approx(r["steps"] * r["ms/step"], rel=1e-12)
    slices = ttt.rows(fit, 64, ttt.tpu_slices("TPU v5e", "TPU v5 lite", [(2, 4), (16, 16)]), CFG, [512])
    assert [r["machine"] for r in slices] == ["v5e-8 (2x4 mesh)", "v5e-256 (16x16 torus)"]


def _table(times_ms, counts=(2, 4, 8, 16)):
    return [
        {"machine": f"{n} x X", "devices": n, "global batch": 8 * n, "batch": "trained", "time to target ms": t}
        for n, t in zip(counts, times_ms)
    ]


def test_the_reading_follows_the_numbers_wherever_the_minimum_is():
    # Planted against the old text, which said time kept falling "past 256" devices:
    # with latency the shortest can be the smallest count, a middle one, or the last.
    first = ttt.reading(_table([1.0, 2.0, 3.0, 4.0]), "X")
    assert "shortest at 2 devices" in first and "smallest count" in first and "4 ms at 16" in first
    # Not monotonic after the minimum (a v5e-16 beat a v5e-8 in one run): only "at least as long" is claimed.
    bumpy = ttt.reading(_table([1.0, 3.0, 2.0, 4.0]), "X")
    assert "shortest at 2 devices" in bumpy and "every larger count in the table takes at least as long" in bumpy
    middle = ttt.reading(_table([3.0, 1.5, 2.0, 2.5]), "X")
    assert "shortest at 4 devices" in middle and "every larger count" in middle
    last = ttt.reading(_table([4.0, 3.0, 2.0, 1.0]), "X")
    assert "shortest at 16 devices" in last and "50.0% below the 2 ms at 8: it still falls there" in last
    # A 0.2% gap in a column that rose on the way (a v5e-256 against a v5e-128 at `full`) is no fall.
    level = ttt.reading(_table([4.0, 3.1, 3.5, 3.006, 3.0], (2, 4, 8, 16, 32)), "X")
    assert "only 0.2% below the 3.006 ms at 16" in level and "rises from 3.1 ms at 4 to 3.5 ms at 8)" in level
    assert "levelled off" in level and "still falls" not in level
    assert "lower bound" not in first + middle + last


def test_unknown_machines_are_refused_with_what_to_use():
    with pytest.raises(ValueError, match="No published peak"):
        ttt.gpus("X", "Imaginary GPU", [2])
    with pytest.raises(ValueError, match="not a TPU"):
        ttt.tpu_slices("L4", "NVIDIA L4", [(2, 4)])
    with pytest.raises(ValueError, match="No rows"):
        ttt.fastest([])


@pytest.mark.parametrize("devices", [0, -1, None, math.nan, 1.5])
def test_a_machine_needs_one_device_or_more(devices):
    with pytest.raises(ValueError, match=f"^The number of devices must be a whole number >= 1, got {devices!r}.$"):
        ttt.gpus("H200", "NVIDIA H200", [2, devices])
    with pytest.raises(ValueError, match=f"^A side of a TPU slice must be a whole number >= 1, got {devices!r}.$"):
        ttt.tpu_slices("TPU v5e", "TPU v5 lite", [(2, devices)])


def test_rows_need_a_per_device_batch_of_one_or_more():
    machine = ttt.gpus("H200", "NVIDIA H200", [2])
    with pytest.raises(ValueError, match="^The per-device batch must be a whole number >= 1, got 0.$"):
        ttt.rows(TradeOff(100.0, 1000.0, 0.1), 0, machine, make_config("smoke"), [64])


def _priced(cfg, per_device_batch, b_crit=404.0):
    fit = TradeOff(50.0, 50.0 * b_crit, 0.1)
    gpus = ttt.gpus("L4", "NVIDIA L4", [2, 4, 8, 16, 32, 64])
    return ttt.rows(fit, per_device_batch, gpus, cfg, [64, 256, 2048])


def test_the_regime_of_a_small_models_step_is_the_all_reduce_and_of_the_full_workloads_compute():
    plan_cfg = make_config("cpu").with_overrides(width=32, block_repeats=1)  # lesson 12's cpu model
    small = _priced(plan_cfg, 8)
    assert all(r["all-reduce µs"] > 100 * r["compute µs"] for r in small)
    assert all(0 < r["of which latency µs"] < r["all-reduce µs"] for r in small)
    text = ttt.regime_sentence(small, 404.0, "L4", "this lesson's model")
    share = small[0]["all-reduce µs"] / (small[0]["all-reduce µs"] + small[0]["compute µs"])
    assert text.startswith(f"L4, this lesson's model: the all-reduce is {share:.0%} of the modelled step at 2")
    assert "B_crit alone does not decide" in text and f"shortest at {ttt.fastest(small)['devices']} devices" in text
    full = make_config("full")
    big = _priced(full, full.per_device_batch)
    assert big[0]["compute µs"] > 10 * big[0]["all-reduce µs"]
    text = ttt.regime_sentence(big, 404.0, "L4", "the full workload")
    assert "compute is 98% of the modelled step at 2 devices" in text
    assert "every row is past B_crit (404)" in text and f"shortest at {ttt.fastest(big)['devices']} devices" in text
    # The time turns up at 32 L4s with compute still most of the step: the all-reduce's growth decides there.
    best, nxt = big[3], big[4]
    assert ttt.fastest(big) is best and nxt["compute µs"] / nxt["ms/step"] / 1e3 > 0.9
    cut = f"fall by only {1 - nxt['steps'] / best['steps']:.1%} while the all-reduce grows from"
    assert cut in text and "decides where the time turns up, not B_crit alone" in text, text
    falling = ttt.regime_sentence(big[:4], 404.0, "L4", "w")
    assert falling.endswith("The time still falls at the largest count: the steps, and with them B_crit, decide here.")


def test_the_regime_says_where_b_crit_lies_against_the_rows():
    full = make_config("full")
    inside = ttt.regime_sentence(_priced(full, 16, b_crit=300.0), 300.0, "L4", "w")
    below = ttt.regime_sentence(_priced(full, 1, b_crit=5000.0), 5000.0, "L4", "w")
    for text, where in ((inside, "lies inside the table"), (below, "every row is below B_crit")):
        assert where in text or "the all-reduce is" in text, text
    with pytest.raises(ValueError, match="> 0"):
        ttt.regime_sentence(_priced(full, 16), 0.0, "L4", "w")
    with pytest.raises(ValueError, match="No rows"):
        ttt.regime_sentence([], 1.0, "L4", "w")
