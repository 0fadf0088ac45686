"""dpcourse.cross_compile.mocked: mocked GPU topologies, one backend of dpcourse.cross_compile.compile with the same result type.

This machine has no GPU, so the mocked path is checked with stand-ins for
``nvidia-smi`` and the CUDA plugin, its environment is checked as built, and
a mocked job's worker is run for real to show that it fails with its reason
instead of making anything up. The CPU devices of the same interface run in
real subprocesses.
"""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from dpcourse import record as results
from dpcourse.config import make_config
from dpcourse.costs import gradient_bytes
from dpcourse.cross_compile import compile as deviceless
from dpcourse.cross_compile import mocked as gp
from dpcourse.cross_compile import notebook as gpu_notebook
from dpcourse.cross_compile.result import CompileResult, StepResult, records, table_rows

SMOKE = make_config("smoke")
BLOCK_GRAD_BYTES = (SMOKE.width * SMOKE.width + SMOKE.width) * 4  # w_block + b_block, float32


@pytest.mark.parametrize("text, expected", [("1x4x1", (1, 4, 1)), ("2x2x2", (2, 2, 2)), (" 1X8X1 ", (1, 8, 1))])
def test_topology_is_parsed(text, expected):
    assert gp.parse_topology(text) == expected
    assert gp.topology_device_count(text) == expected[0] * expected[1] * expected[2]


@pytest.mark.parametrize("bad", ["4", "1x4", "1x0x1", "1x-2x1", "axbxc", ""])
def test_bad_topology_is_refused_with_an_example(bad):
    with pytest.raises(ValueError, match="1x4x1"):
        gp.parse_topology(bad)


def test_a_mocked_job_names_its_topology_and_must_match_its_device_count():
    job = deviceless.Job("mocked", "1x4x1", 4, "smoke")
    assert job.to_arg() == "mocked:1x4x1:4:smoke" and deviceless.Job.from_arg(job.to_arg()) == job
    with pytest.raises(ValueError, match="has 4 GPUs, not n_devices=8"):
        deviceless.Job("mocked", "1x4x1", 8, "smoke")
    with pytest.raises(ValueError, match="1x4x1"):
        deviceless.Job("mocked", "four", 4, "smoke")
    with pytest.raises(ValueError, match="'gpu', 'tpu', 'mocked', 'cpu'"):
        deviceless.Job("xpu", "v5e", 4, "smoke")


def test_mocked_worker_mocks_the_topology_on_one_visible_gpu_without_preallocation():
    base = {"XLA_FLAGS": "--xla_force_host_platform_device_count=8 --foo", "CUDA_VISIBLE_DEVICES": "3,5"}
    env = deviceless.worker_env([deviceless.Job("mocked", "1x4x1", 4, "smoke")], (gpu_notebook.PASS_NAME,), base=base)
    assert env["JAX_PLATFORMS"] == "cuda" and env[gp.MOCK_TOPOLOGY_ENV] == "1x4x1"
    assert env["CUDA_VISIBLE_DEVICES"] == "3"
    assert env["XLA_PYTHON_CLIENT_PREALLOCATE"] == "false"
    assert env["XLA_FLAGS"] == f"--foo --xla_disable_hlo_passes={gpu_notebook.PASS_NAME}"
    assert "PYTHONPATH" not in env  # the real CUDA plugin, not the extra's folder


def test_other_workers_drop_a_mocked_topology_they_inherit():
    base = {"XLA_FLAGS": "--xla_force_host_platform_device_count=8", gp.MOCK_TOPOLOGY_ENV: "1x2x1"}
    env = deviceless.worker_env([deviceless.Job("cpu", "cpu", 2, "smoke")], base=base)
    assert env["JAX_PLATFORMS"] == "cpu" and gp.MOCK_TOPOLOGY_ENV not in env
    assert env["XLA_FLAGS"] == "--xla_force_host_platform_device_count=2"


def test_a_mocked_job_gets_a_process_of_its_own():
    jobs = [deviceless.Job("mocked", "1x2x1", 2, "smoke"), deviceless.Job("cpu", "cpu", 2, "smoke")]
    with pytest.raises(ValueError, match="each mocked job on its own"):
        deviceless.start_jobs(jobs)


def fake_nvidia_smi(tmp_path: Path, listing: str) -> None:
    exe = tmp_path / "nvidia-smi"
    exe.write_text(f"#!/bin/sh\nprintf '{listing}'\n")
    exe.chmod(exe.stat().st_mode | stat.S_IEXEC)


def test_mocked_topologies_need_a_gpu_and_the_cuda_plugin(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    assert "no NVIDIA GPU" in gp.gpu_unavailable_reason()  # no nvidia-smi at all
    fake_nvidia_smi(tmp_path, "")
    assert "no NVIDIA GPU" in gp.gpu_unavailable_reason()  # nvidia-smi lists nothing
    fake_nvidia_smi(tmp_path, "GPU 0: NVIDIA H200 (UUID: GPU-0)\\n")
    assert gp.nvidia_gpus() == ["GPU 0: NVIDIA H200 (UUID: GPU-0)"]  # what gpu-check reads too
    monkeypatch.setattr(gp, "_cuda_plugin_names", lambda: [])
    assert "CUDA plugin" in gp.gpu_unavailable_reason()
    monkeypatch.setattr(gp, "_cuda_plugin_names", lambda: ["jax_plugins.xla_cuda12"])
    assert gp.gpu_unavailable_reason() is None


def test_without_a_gpu_a_mocked_compile_starts_nothing_and_says_why(monkeypatch):
    monkeypatch.setattr(gp, "gpu_unavailable_reason", lambda: "no NVIDIA GPU here (stand-in)")
    (res,) = deviceless.compile_mocked("smoke", ("1x2x1",))
    assert isinstance(res, CompileResult) and res.steps == {}
    assert (res.backend, res.target, res.n_devices, res.platform) == ("mocked", "1x2x1", 2, "gpu")
    assert res.error == "not compiled: no NVIDIA GPU here (stand-in)"
    (row,) = table_rows(records([res]))
    assert row["compiled for"] == "2 x mocked GPU (1x2x1)" and row["step"] == "(not compiled)"


@pytest.mark.slow
def test_a_mocked_worker_without_a_gpu_fails_with_its_reason(monkeypatch):
    # Past the check (as if a GPU were here): the worker's CUDA backend cannot start on this machine.
    monkeypatch.setattr(gp, "gpu_unavailable_reason", lambda: None)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    (res,) = deviceless.compile_mocked("smoke", ("1x2x1",), {"jit": deviceless.COURSE_STEPS["jit"]}, timeout_s=300)
    if res.error is None:
        pytest.skip("this machine can compile for mocked GPUs")
    assert res.steps == {} and res.n_devices == 2
    assert res.error.startswith("no mocked devices: RuntimeError: JAX could not start the CUDA backend (")


def mocked_result(topology: str) -> CompileResult:
    """A mocked result as the worker writes it (figures of the smoke profile's plain jit step on a GPU)."""
    n = gp.topology_device_count(topology)
    step = StepResult("jit", deviceless.COURSE_STEPS["jit"], count=1, in_loop=0, runs_per_step=1, bytes_per_step=99)
    return CompileResult(
        "mocked", topology, n, "smoke", f"mocked GPU ({topology})", device_kind="NVIDIA H200", steps={"jit": step}
    )


def test_a_mocked_result_is_labelled_and_round_trips_through_its_line():
    res = mocked_result("1x4x1")
    assert res.label == "compiled for 4 mocked GPUs (topology 1x4x1, NVIDIA H200) on a GPU"
    line = res.to_line()
    assert CompileResult.from_dict(__import__("json").loads(line[len(deviceless.RESULT_PREFIX) :])) == res


def test_records_carry_backend_and_topology(tmp_path):
    (cpu,) = deviceless.compile_jobs(
        [deviceless.Job("cpu", "cpu", 4, "smoke")], {"jit": deviceless.COURSE_STEPS["jit"]}
    )
    failed = deviceless._failed(deviceless.Job("mocked", "1x8x1", 8, "smoke"), "no GPU")
    results.enable(tmp_path / "r.jsonl")
    results.set_context("04_sharding", "smoke", "synthetic", "cpu", "cpu", 8, jax_version="0.10.2")
    try:
        gpu_notebook.record([cpu, mocked_result("1x4x1"), failed])
    finally:
        results.disable()
    recs = {r["metric"]: r for r in results.read_records(tmp_path / "r.jsonl")}
    assert len(recs) == 2 * 3  # two results x one step x three figures; the failed one records nothing
    cpu_rec = recs["collectives_in_loop_jit_cpu_4"]
    assert (cpu_rec["value"], cpu_rec["backend"], cpu_rec["device_count"]) == (1, "cpu", 4)
    gpu_rec = recs["collectives_per_step_jit_gpu_1x4x1"]
    assert (gpu_rec["value"], gpu_rec["backend"], gpu_rec["device_count"]) == (1, "gpu", 4)
    assert gpu_rec["device_kind"] == "NVIDIA H200 (mocked topology 1x4x1)"


def test_report_command_prints_the_cpu_placement_and_why_mocked_gpus_are_missing(monkeypatch, capsys):
    monkeypatch.setattr(gp, "gpu_unavailable_reason", lambda: "no NVIDIA GPU here (stand-in)")
    assert gpu_notebook.main(["--report", "--profile", "smoke"]) == 0
    out = capsys.readouterr().out
    assert "Mocked GPU topologies cannot be compiled here: no NVIDIA GPU here (stand-in)." in out
    jit = next(line for line in out.splitlines() if "step=jit " in line)
    assert "compiled for=8 x CPU (simulated)" in jit and "inside loop=1" in jit
    smap = next(line for line in out.splitlines() if "step=shard_map " in line)
    assert "inside loop=0" in smap and f"bytes per step={gradient_bytes(SMOKE) + 8:,}" in smap


def test_report_command_needs_report():
    with pytest.raises(SystemExit):
        gpu_notebook.main(["--profile", "smoke"])


def test_the_topologies_module_imports_no_compile():
    # The compile uses mocked topologies; mocked imports nothing of the package (no import circle).
    import ast

    tree = ast.parse(Path(gp.__file__).read_text())
    imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    imported |= {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    assert not any(name and name.startswith("dpcourse") for name in imported), imported


def test_the_report_refuses_an_unknown_profile_before_any_compile(monkeypatch, capsys):
    monkeypatch.setattr(gpu_notebook, "report", lambda *a, **k: pytest.fail("compiled before checking"))
    with pytest.raises(SystemExit) as exit_:
        gpu_notebook.main(["--report", "--profile", "nosuch"])
    assert exit_.value.code == 2 and "--profile 'nosuch' is not a profile" in capsys.readouterr().err
