"""dpcourse.gpu_compile.compile, gpu_targets and placement_report: compiling for GPUs this machine does not have.

The first tests read optimised HLO captured from both JAX versions
(tests/data/hlo_*_jax<version>.txt, written by tools/capture_placement_hlo.py)
and need nothing installed. The compile tests need the gpu-compile extra
(`make gpu-compile`); without it they skip with the reason, except in CI
(CI=true), where a missing extra is a failure.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from coursetools import collective_report as placement_report
from dpcourse.compiled import collectives
from dpcourse.config import make_config
from dpcourse.costs import gradient_bytes
from dpcourse.gpu_compile import compile as deviceless
from dpcourse.gpu_compile import targets as gpu_targets

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


def test_targets_and_the_approximate_l4():
    assert set(gpu_targets.TARGETS) == {"h100_sxm", "h200", "l4"}
    l4 = gpu_targets.target("L4")
    assert l4.approximate and "approximate" in l4.label and "approximate" in l4.devices_label(2)
    text = gpu_targets.config_text("l4")
    assert "core_count: 58" in text and "memory_bandwidth: 300000000000" in text and "minor: 9" in text
    assert not gpu_targets.target("h200").approximate
    with pytest.raises(ValueError, match="h100_sxm, h200, l4"):
        gpu_targets.target("a100")


def test_jaxlib_010_gets_the_text_without_the_newer_field():
    assert "collective_memory_granularity" in gpu_targets.config_text("h200", "0.12.0.1")
    old = gpu_targets.config_text("h200", "0.10.2")
    assert "collective_memory_granularity" not in old and "core_count: 132" in old


def test_vendored_files_keep_their_attribution():
    folder = Path(gpu_targets.__file__).parent / "configs"
    notice = (folder / "NOTICE.md").read_text()
    assert "Apache License, Version" in notice and "openxla/xla" in notice
    for name in ("h200.txtpb", "h100_sxm.txtpb"):
        assert (folder / name).read_text().startswith("# From openxla/xla")


def test_missing_libdevice_is_named_before_anything_compiles(monkeypatch):
    monkeypatch.setattr(gpu_targets, "libdevice_path", lambda: None)
    reason = gpu_targets.extra_missing()
    assert reason and "nvidia-cuda-nvcc-cu12" in reason and "libdevice" in reason and "make gpu-compile" in reason
    monkeypatch.setattr(subprocess, "Popen", lambda *a, **k: pytest.fail("no worker may start"))
    (res,) = deviceless.compile_jobs([deviceless.Job("gpu", "h200", 2, "smoke")])
    assert res.steps == {} and "libdevice" in res.error and res.label == "compiled for 2 x H200 without a GPU"


def test_a_plugin_of_another_version_is_refused(monkeypatch, tmp_path):
    monkeypatch.setattr(gpu_targets, "_installed", lambda d: "0.10.2" if d == "jaxlib" else "0.10.1")
    assert "jax-cuda12-plugin is 0.10.1, not jaxlib's 0.10.2" in gpu_targets.extra_missing()


def test_worker_env_is_cpu_only_with_the_extra_on_its_path_and_passes_off(monkeypatch, tmp_path):
    monkeypatch.setenv(gpu_targets.EXTRA_PATH_ENV, str(tmp_path))
    jobs = [deviceless.Job("cpu", "cpu", 8, "smoke")]
    env = deviceless.worker_env(jobs, (PASS,), base={"XLA_FLAGS": "--xla_force_host_platform_device_count=2"})
    assert env["JAX_PLATFORMS"] == "cpu" and env["JAX_SKIP_CUDA_CONSTRAINTS_CHECK"] == "1"
    assert env["XLA_FLAGS"] == f"--xla_force_host_platform_device_count=8 --xla_disable_hlo_passes={PASS}"
    assert env["PYTHONPATH"].split(os.pathsep)[0] == str(tmp_path)


@pytest.mark.parametrize(
    "text, match",
    [("gpu:h200:8", "backend:target"), ("gpu:a100:8:smoke", "Unknown GPU target"), ("tpu:x:2:smoke", "backend")],
)
def test_bad_jobs_are_refused(text, match):
    with pytest.raises(ValueError, match=match):
        deviceless.Job.from_arg(text)


def test_bad_builder_names_are_refused():
    with pytest.raises(ValueError, match="module:function"):
        deviceless.load_builder("dpcourse.gpu_compile.steps.jit_step")
    with pytest.raises(ValueError, match="no function"):
        deviceless.load_builder("dpcourse.gpu_compile.compile:nope")


@pytest.mark.slow
def test_own_builders_compile_and_a_bad_one_is_reported_per_step():
    steps = {"fast": "dpcourse.gpu_compile.steps:fast_jit_step", "bad": "dpcourse.gpu_compile.compile:nope"}
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


@pytest.fixture
def extra():
    missing = gpu_targets.extra_missing()
    if missing:
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI: the gpu-compile extra must be installed (make gpu-compile): {missing}")
        pytest.skip(f"the gpu-compile extra is not installed: {missing}")


@pytest.mark.slow
def test_make_placement_records_gpu_and_cpu_placement(extra, tmp_path):
    out = tmp_path / "placement.json"
    # H200 (XLA's file) and the approximate L4; `make placement` compiles every target at 2, 4, 8.
    argv = ["--profile", "smoke", "--devices", "2", "--out", str(out), "--target", "h200", "--target", "l4"]
    proc = subprocess.run(
        [sys.executable, "-m", "coursetools.collective_report", *argv], capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "L4 (approximate)" in proc.stdout
    recs = json.loads(out.read_text())
    keys = {(r["backend"], r["target"], r["n_devices"], r["profile"], r["step"]) for r in recs}
    assert len(keys) == len(recs) == (2 + 1) * 3
    for r in recs:
        assert r["error"] is None and r["jax_version"] and isinstance(r["deviceless"], bool)
        if r["backend"] == "gpu" or r["step"] != "jit":
            # One all-reduce per step, after the loop: the gradient and the two metrics.
            assert (r["all_reduces"], r["in_loop"], r["runs_per_step"]) == (1, 0, 1), r
            assert r["bytes_per_step"] == gradient_bytes(SMOKE) + METRIC_BYTES, r
        else:
            # The CPU compiler keeps the block gradient's all-reduce inside the backward loop.
            assert r["in_loop"] == 1 and r["runs_per_step"] == SMOKE.block_repeats + 1, r
        assert r["deviceless"] == (r["backend"] == "gpu")
        assert r["approximate"] == (r["target"] == "l4")
    gpu = [r for r in recs if r["backend"] == "gpu"]
    assert all(r["flops"] and r["bytes_accessed"] for r in gpu)


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


def test_table_and_records_say_what_failed():
    failed = deviceless._failed(deviceless.Job("gpu", "l4", 4, "smoke"), "not compiled: no extra")
    (rec,) = placement_report.records([failed])
    assert rec["error"] == "not compiled: no extra" and rec["approximate"] and rec["step"] is None
    (row,) = placement_report.table_rows([rec])
    assert row["compiled for"] == "4 x L4 (approximate)" and row["step"] == "(not compiled)"
    assert "L4 (approximate)" in placement_report.format_table([row])


def test_check_names_a_moved_all_reduce():
    good = {"error": None, "disabled_passes": [], "all_reduces": 1, "collectives": 1, "in_loop": 0}
    good |= {"runs_per_step": 1, "bytes_per_step": gradient_bytes(SMOKE) + METRIC_BYTES, "profile": "smoke"}
    gpu = {**good, "backend": "gpu", "target": "h200", "n_devices": 8, "step": "jit"}
    cpu = {**good, "backend": "cpu", "target": "cpu", "n_devices": 8, "step": "jit", "in_loop": 1}
    assert placement_report.check([gpu, cpu]) == []
    moved = placement_report.check([{**gpu, "in_loop": 1}, {**cpu, "in_loop": 0}])
    assert len(moved) == 2 and "1 in a loop" in moved[0] and "no longer reduces inside" in moved[1]
    experiment = {**gpu, "in_loop": 1, "disabled_passes": [PASS]}
    assert placement_report.check([experiment]) == []


def test_jobs_of_make_placement():
    jobs = placement_report.jobs_for(["smoke", "full"], ["h200", "l4"], (2, 4, 8))
    smoke = [j for j in jobs if j.profile == "smoke"]
    assert len(smoke) == 2 * 3 + 1
    assert {(j.backend, j.target, j.n_devices) for j in jobs if j.profile == "full"} == set(placement_report.FULL_JOBS)


def test_compiles_in_parallel_keep_the_job_order(monkeypatch):
    """Jobs dealt over two subprocesses come back in the order asked for, each compiled once."""
    calls = []

    def fake_compile_jobs(jobs, steps=None):
        calls.append([j.n_devices for j in jobs])
        return [f"result {j.n_devices}" for j in jobs]

    monkeypatch.setattr(deviceless, "compile_jobs", fake_compile_jobs)
    jobs = [deviceless.Job("gpu", "h200", n, "smoke") for n in (1, 2, 3, 4, 5)]
    assert placement_report.compile_in_parallel(jobs, None, 2) == [f"result {n}" for n in (1, 2, 3, 4, 5)]
    assert sorted(calls) == [[1, 3, 5], [2, 4]]
    calls.clear()
    assert placement_report.compile_in_parallel(jobs[:1], None, 4) == ["result 1"]
    assert calls == [[1]]


def test_workers_below_one_are_refused(capsys):
    with pytest.raises(SystemExit):
        placement_report.main(["--workers", "0"])
    assert "--workers must be at least 1" in capsys.readouterr().err
