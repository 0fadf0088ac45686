"""Lesson 10's steps compiled for 8 x H200 without a GPU: the collective pattern the lesson teaches.

Needs the gpu-compile extra (``make gpu-compile``); skipped without it,
failed without it in CI, like tests/lib/gpu_compile/test_compile.py.
"""

import os

import pytest

from dpcourse.compiled import census
from dpcourse.config import make_config
from dpcourse.gpu_compile import compile as deviceless
from dpcourse.gpu_compile import sharded_steps
from dpcourse.gpu_compile import targets as gpu_targets

SMOKE = make_config("smoke")
N = 8


@pytest.fixture(scope="module")
def gpu_census():
    missing = gpu_targets.extra_missing()
    if missing:
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI: the gpu-compile extra must be installed (make gpu-compile): {missing}")
        pytest.skip(f"the gpu-compile extra is not installed: {missing}")
    (res,) = deviceless.compile_jobs([deviceless.Job("gpu", "h200", N, "smoke")], sharded_steps.STEPS)
    assert res.error is None, res.error
    for name, step in res.steps.items():
        assert step.error is None, (name, step.error)
    return {name: census.census(census.report_from_rows(s.collectives)) for name, s in res.steps.items()}


@pytest.mark.slow
def test_gpu_collectives_of_each_form(gpu_census):
    r = SMOKE.block_repeats
    k = sharded_steps.ACCUM_K
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
