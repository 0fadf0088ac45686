"""dpcourse.cross_compile.compile, targets and placement_report: compiling for GPUs and TPUs this machine does not have.

The first tests read optimised HLO captured from both JAX versions
(tests/data/hlo_*_jax<version>.txt, written by tools/capture_placement_hlo.py)
and need nothing installed. The compile tests need the gpu-compile extra
(`make gpu-compile`), the TPU ones the tpu-compile extra (`make
tpu-compile`, libtpu); without it they skip with the reason, except in CI
(CI=true), where a missing extra is a failure.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from dpcourse.compiled import collectives
from dpcourse.config import make_config
from dpcourse.costs import gradient_bytes
from dpcourse.cross_compile import compile as deviceless

DATA = Path(__file__).resolve().parents[2] / "data"
SMOKE = make_config("smoke")
METRIC_BYTES = 8  # loss and accuracy, float32, reduced with the gradient
BLOCK_GRAD_BYTES = (SMOKE.width * SMOKE.width + SMOKE.width) * 4
VERSIONS = ("0.10.2", "0.12.0.1")
PASS = "while-loop-all-reduce-code-motion"


def captured(backend: str, step: str, version: str) -> str:
    return (DATA / f"hlo_{backend}_{step}_smoke_2_jax{version}.txt").read_text()


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("step", ["jit", "device_axis", "shard_map"])
def test_gpu_program_reduces_once_per_step_outside_the_loop(version, step):
    report = collectives.parse_hlo(captured("gpu", step, version))
    assert [c.kind for c in report.collectives] == ["all-reduce"]
    assert (report.in_loop_count, report.runs_per_step) == (0, 1)
    assert report.bytes_per_step == gradient_bytes(SMOKE) + METRIC_BYTES


@pytest.mark.parametrize("version", VERSIONS)
def test_cpu_program_reduces_the_block_gradient_inside_the_loop(version):
    report = collectives.parse_hlo(captured("cpu", "jit", version))
    inside = [c for c in report.collectives if c.in_loop]
    assert len(inside) == 1 and inside[0].bytes == BLOCK_GRAD_BYTES
    assert inside[0].runs_per_step == SMOKE.block_repeats


def test_jax_012_gpu_all_reduce_is_tuple_typed_and_counted_once():
    line = next(ln for ln in captured("gpu", "jit", "0.12.0.1").splitlines() if "all-reduce-start(" in ln)
    assert line.split("=", 1)[1].strip().startswith("((f32[26508]{0}), f32[26508]{0})")
    assert collectives.parse_hlo(captured("gpu", "jit", "0.12.0.1")).bytes_per_step == 26508 * 4


@pytest.mark.parametrize(
    "opcode, type_text, expected",
    [
        ("all-reduce-start", "((f32[26508]{0}), f32[26508]{0})", 106032),  # jaxlib 0.12, GPU
        ("all-reduce-start", "f32[26508]{0}", 106032),  # jaxlib 0.10.2, GPU
        ("all-reduce-start", "(f32[10]{0}, f32[6]{0})", 64),  # combined, no operand tuple
        ("all-reduce-start", "((f32[10]{0}, f32[6]{0}), (f32[10]{0}, f32[6]{0}))", 64),
        ("all-reduce", "(f32[32,32]{1,0}, f32[32]{0})", 4224),  # synchronous, combined
        ("all-gather-start", "(f32[8]{0}, f32[32]{0})", 128),
        ("collective-permute-start", "(f32[8]{0}, f32[8]{0}, u32[], u32[])", 32),  # not the u32 context
    ],
)
def test_result_bytes_count_each_transfer_once(opcode, type_text, expected):
    assert collectives._result_bytes(opcode, type_text) == expected


def test_type_tree_nests_tuples():
    assert collectives.type_tree("((f32[2]{0}), bf16[4]{0})") == [[[8], 8]]


# ---- targets and the extra ----


@pytest.mark.parametrize(
    "text, match",
    [
        ("gpu:h200:8", "backend:target"),
        ("gpu:a100:8:smoke", "Unknown GPU target"),
        ("tpu:x:2:smoke", "Unknown TPU target"),
        ("gpu:v5e_2x4:8:smoke", "Unknown GPU target"),
        ("tpu:h200:8:smoke", "Unknown TPU target"),
        ("tpu:v5e_2x4:4:smoke", "has 8 chips, not n_devices=4"),
        ("xpu:h200:8:smoke", "Unknown backend"),
    ],
)
def test_bad_jobs_are_refused(text, match):
    with pytest.raises(ValueError, match=match):
        deviceless.Job.from_arg(text)


def test_bad_builder_names_are_refused():
    with pytest.raises(ValueError, match="module:function"):
        deviceless.load_builder("dpcourse.cross_compile.steps.jit_step")
    with pytest.raises(ValueError, match="no function"):
        deviceless.load_builder("dpcourse.cross_compile.compile:nope")


@pytest.mark.slow
def test_own_builders_compile_and_a_bad_one_is_reported_per_step():
    steps = {"fast": "dpcourse.cross_compile.steps:fast_jit_step", "bad": "dpcourse.cross_compile.compile:nope"}
    (res,) = deviceless.compile_jobs([deviceless.Job("cpu", "cpu", 2, "smoke")], steps)
    assert res.error is None and res.label == "compiled for 2 simulated CPU devices"
    fast = res.steps["fast"]
    assert fast.error is None and fast.in_loop == 0 and fast.runs_per_step >= 1  # unrolled: no loop
    assert fast.cost["flops"] > 0 and fast.memory["argument_size_in_bytes"] > 0
    assert "no function 'nope'" in res.steps["bad"].error


def test_a_worker_past_its_time_limit_is_stopped_and_every_job_says_so():
    jobs = [deviceless.Job("cpu", "cpu", 2, "smoke"), deviceless.Job("cpu", "cpu", 4, "smoke")]
    pending = deviceless.start_jobs(jobs, {"jit": deviceless.COURSE_STEPS["jit"]}, timeout_s=0.2)
    results = pending.results()
    assert pending.done() and pending.results() is results
    assert [r.n_devices for r in results] == [2, 4]
    assert all("did not finish within 0 s" in r.error and r.steps == {} for r in results)


def test_a_compile_option_this_jaxlib_does_not_know_is_dropped():
    import jax

    lowered = jax.jit(lambda x: x * 2.0).lower(1.0)
    assert float(deviceless._compile(lowered, {"xla_no_such_option_here": "x"})(3.0)) == 6.0


@pytest.mark.slow
def test_started_jobs_compile_while_the_caller_goes_on():
    pending = deviceless.start_jobs([deviceless.Job("cpu", "cpu", 2, "smoke")], {"jit": deviceless.COURSE_STEPS["jit"]})
    assert not pending.done()  # the worker imports JAX for over a second: start_jobs did not wait
    (res,) = pending.results()
    assert pending.done() and res.error is None and res.steps["jit"].runs_per_step >= 1


# ---- the GPU compile itself (needs the extra) ----


@pytest.mark.slow
def test_without_the_pass_the_gpu_all_reduce_is_back_in_the_loop(extra):
    (res,) = deviceless.compile_jobs(
        [deviceless.Job("gpu", "h200", 2, "smoke")], {"jit": deviceless.COURSE_STEPS["jit"]}, disable_passes=(PASS,)
    )
    assert res.error is None and res.disabled_passes == [PASS]
    jit = res.steps["jit"]
    inside = [c for c in jit.collectives if c["in_loop"]]
    assert len(inside) == 1 and inside[0]["bytes"] == BLOCK_GRAD_BYTES
    assert inside[0]["runs_per_step"] == SMOKE.block_repeats


# ---- the TPU compile itself (needs the tpu-compile extra) ----


def test_a_tpu_job_names_its_slice_and_runs_with_libtpu_quiet_beside_other_processes(monkeypatch, tmp_path):
    monkeypatch.setenv("DPCOURSE_TPU_COMPILE_PATH", str(tmp_path))
    job = deviceless.Job("tpu", "v5e_2x4", 8, "smoke")
    assert deviceless.Job.from_arg(job.to_arg()) == job and job.to_arg() == "tpu:v5e_2x4:8:smoke"
    env = deviceless.worker_env([job], base={"XLA_FLAGS": ""})
    assert env["JAX_PLATFORMS"] == "cpu" and str(tmp_path) in env["PYTHONPATH"].split(":")
    assert {k: env[k] for k in deviceless.TPU_ENV} == deviceless.TPU_ENV
    assert "TPU_WORKER_HOSTNAMES" not in deviceless.worker_env([deviceless.Job("cpu", "cpu", 8, "smoke")], base={})


def test_without_libtpu_a_tpu_job_starts_nothing_and_the_cpu_job_still_compiles(monkeypatch, tmp_path):
    monkeypatch.setenv("DPCOURSE_TPU_COMPILE_PATH", str(tmp_path / "none"))
    started = []
    monkeypatch.setattr(deviceless, "PendingCompile", lambda jobs, runnable, *a: started.append(runnable) or None)
    deviceless.start_jobs([deviceless.Job("tpu", "v5e_2x4", 8, "smoke"), deviceless.Job("cpu", "cpu", 2, "smoke")])
    assert started == [[deviceless.Job("cpu", "cpu", 2, "smoke")]]


@pytest.mark.slow
def test_the_course_step_compiled_for_tpu_slices_reduces_once_after_the_loop(tpu_extra):
    import time

    jobs = [deviceless.Job("tpu", "v5e_2x4", 8, "smoke"), deviceless.Job("tpu", "v6e_16x16", 256, "smoke")]
    t0 = time.perf_counter()
    results = deviceless.compile_jobs(jobs, {"jit": deviceless.COURSE_STEPS["jit"]}, timeout_s=300)
    wall = time.perf_counter() - t0
    for res, kind in zip(results, ("TPU v5 lite", "TPU v6 lite")):
        assert res.error is None, res.error
        assert res.device_kind == kind and res.deviceless and res.platform == "tpu"
        assert res.label.startswith(f"compiled for {res.n_devices} x TPU v")
        jit = res.steps["jit"]
        # As on the GPU compiler: one all-reduce of the gradient and the two metrics, after the loop.
        assert [(c["kind"], c["bytes"], c["in_loop"]) for c in jit.collectives] == [
            ("all-reduce", gradient_bytes(SMOKE) + METRIC_BYTES, False)
        ]
        assert jit.runs_per_step == 1 and jit.memory["argument_size_in_bytes"] > 0 and jit.cost["flops"] > 0
    assert wall < 120, f"two TPU compiles took {wall:.0f} s"
