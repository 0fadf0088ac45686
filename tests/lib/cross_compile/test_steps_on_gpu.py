"""Lesson 10's steps compiled for 8 x H200 without a GPU: the collective pattern the lesson teaches.

Needs the gpu-compile extra (``make gpu-compile``); skipped without it,
failed without it in CI, like tests/lib/cross_compile/test_compile.py.
"""

import os

import jax
import pytest
from jax.sharding import PartitionSpec as P

from coursetools import compile_report as collective_report
from dpcourse import costs, model
from dpcourse.compiled import census
from dpcourse.config import make_config
from dpcourse.cross_compile import compile as deviceless
from dpcourse.cross_compile import steps
from dpcourse.cross_compile import targets as gpu_targets
from dpcourse.sharded import forms as sharded

SMOKE = make_config("smoke")
N = 8


@pytest.fixture(scope="module")
def gpu_steps():
    missing = gpu_targets.extra_missing()
    if missing:
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI: the gpu-compile extra must be installed (make gpu-compile): {missing}")
        pytest.skip(f"the gpu-compile extra is not installed: {missing}")
    (res,) = deviceless.compile_jobs([deviceless.Job("gpu", "h200", N, "smoke")], steps.SHARDED_STEPS)
    assert res.error is None, res.error
    for name, step in res.steps.items():
        assert step.error is None, (name, step.error)
    return {name: census.report_from_rows(s.collectives) for name, s in res.steps.items()}


@pytest.fixture(scope="module")
def gpu_census(gpu_steps):
    return {name: census.census(report, N) for name, report in gpu_steps.items()}


@pytest.mark.slow
def test_gpu_collectives_of_each_form(gpu_census):
    r = SMOKE.block_repeats
    k = steps.ACCUM_K
    # Replicated DP and accumulation with reduced/unreduced: one all-reduce per step, after the loops.
    for name in ("dp_replicated", "accum_reduced"):
        c = gpu_census[name]
        assert (c["all-reduce"].count, c["all-reduce"].in_loop, c["all-reduce"].runs_per_step) == (1, 0, 1), name
        assert c["all-gather"].count == c["reduce-scatter"].count == 0, name
    # FSDP gathered once: one all-gather and one reduce-scatter, outside loops (+ the metrics' all-reduce).
    g = gpu_census["fsdp_gathered"]
    assert (g["all-gather"].runs_per_step, g["all-gather"].in_loop) == (1, 0)
    assert (g["reduce-scatter"].runs_per_step, g["reduce-scatter"].in_loop) == (1, 0)
    # FSDP naive: the shared block gathered in every forward and backward iteration, 2R + 1 per step.
    f = gpu_census["fsdp_naive"]
    assert f["all-gather"].in_loop >= 1 and f["all-gather"].runs_per_step == 2 * r + 1
    # ZeRO-1: the shared block's gradient reduce-scattered inside the backward loop.
    z = gpu_census["zero1"]
    assert z["reduce-scatter"].in_loop == 1 and z["reduce-scatter"].runs_per_step == r + 1
    assert z["all-gather"].runs_per_step == 1
    # Accumulation with a scan: the gradient all-reduced in every microbatch (+ the metrics once).
    a = gpu_census["accum_scan"]
    assert a["all-reduce"].in_loop == 1 and a["all-reduce"].runs_per_step == k + 1


@pytest.mark.slow
def test_gpu_zero1_with_the_all_reduce_first_reduces_once_and_gathers_once_outside_the_loops(gpu_census):
    z = gpu_census["zero1_allreduce_first"]
    assert (z["all-reduce"].count, z["all-reduce"].in_loop, z["all-reduce"].runs_per_step) == (1, 0, 1)
    assert (z["all-gather"].count, z["all-gather"].in_loop, z["all-gather"].runs_per_step) == (1, 0, 1)
    assert z["reduce-scatter"].count == 0
    # The all-reduce carries the whole gradient and the two metrics (float32 loss and accuracy).
    assert z["all-reduce"].bytes_per_step == costs.gradient_bytes(SMOKE) + 8


@pytest.mark.slow
@pytest.mark.parametrize("name", ["dp_replicated", "zero1_allreduce_first", "fsdp_gathered", "accum_reduced"])
def test_gpu_bytes_sent_match_the_cost_model_where_placed_as_it_assumes(gpu_steps, name):
    sent = census.sent_bytes_per_step(gpu_steps[name], N)
    # Within 10%: what the prediction leaves out is the metrics' 8 bytes and, for FSDP, the replicated
    # leaves' all-reduce (2 (N - 1) / N of 1.6 kB at this size), a few percent of the gradient.
    assert sent == pytest.approx(collective_report.predicted_sent_bytes(name, "smoke", N), rel=0.10)


@pytest.mark.slow
def test_gpu_small_all_reduce_carries_the_replicated_leaves_and_the_metrics(gpu_steps):
    shapes = jax.eval_shape(lambda: model.init_params(SMOKE))
    plan = sharded.shard_specs(shapes, N)
    replicated = sum(a.size * 4 for k, a in shapes.items() if plan.specs[k] == P())
    for name in ("zero1", "fsdp_gathered"):
        (ar,) = gpu_steps[name].of_kind("all-reduce")
        assert ar.bytes == replicated + 8, name


@pytest.mark.slow
def test_gpu_scan_accumulation_reduces_only_the_shared_block_in_the_microbatch_loop(gpu_steps):
    block_and_bias = (SMOKE.width * SMOKE.width + SMOKE.width) * 4
    inside = [c for c in gpu_steps["accum_scan"].of_kind("all-reduce") if c.in_loop]
    outside = [c for c in gpu_steps["accum_scan"].of_kind("all-reduce") if not c.in_loop]
    assert [(c.bytes, c.runs_per_step) for c in inside] == [(block_and_bias, steps.ACCUM_K)]
    assert sum(c.bytes for c in outside) == costs.gradient_bytes(SMOKE) - block_and_bias + 8


def test_lesson10_check_names_a_zero1_that_moved_or_sends_too_much():
    good = {"error": None, "disabled_passes": [], "backend": "gpu", "target": "h200", "n_devices": 8}
    good |= {"profile": "smoke", "step": "zero1_allreduce_first", "all_reduces": 1, "collectives": 2}
    good |= {"in_loop": 0, "runs_per_step": 2}
    want = collective_report.predicted_sent_bytes("zero1_allreduce_first", "smoke", 8)
    assert collective_report.check_lesson10([{**good, "sent_bytes_per_step": want * 1.02}]) == []
    (moved,) = collective_report.check_lesson10([{**good, "in_loop": 1, "sent_bytes_per_step": want}])
    assert "1 in a loop" in moved and "outside any loop" in moved
    (heavy,) = collective_report.check_lesson10([{**good, "sent_bytes_per_step": want * 1.5}])
    assert "more than 10% apart" in heavy
    cpu = {**good, "backend": "cpu", "in_loop": 3, "sent_bytes_per_step": want * 9}
    assert collective_report.check_lesson10([cpu, {**good, "step": "zero1", "in_loop": 1}]) == []


def test_lesson10_records_carry_the_efficient_zero1_and_bytes_sent():
    assert "zero1_allreduce_first" in steps.SHARDED_STEPS
    assert steps.FORM_LABELS["zero1_allreduce_first"] == "ZeRO-1, all-reduce first"
    rows = [
        {"kind": "all-reduce", "name": "ar", "bytes": 800, "in_loop": False, "runs_per_step": 1},
        {"kind": "all-gather", "name": "ag", "bytes": 800, "in_loop": False, "runs_per_step": 1},
    ]
    step = deviceless.StepResult("zero1_allreduce_first", "b", rows, 2, 0, 2, 1600)
    res = deviceless.CompileResult("gpu", "h200", 8, "smoke", steps={"zero1_allreduce_first": step})
    (rec,) = collective_report.records([res])
    assert rec["sent_bytes_per_step"] == pytest.approx(2 * 7 / 8 * 800 + 7 / 8 * 800)
