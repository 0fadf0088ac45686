"""dpcourse.gpu_compile.mocked: compile the steps per backend and device count, in fresh processes.

On a CPU-only machine the GPU path cannot compile; these tests run the CPU
path in real subprocesses (simulated CPU devices stand in), read a
recorded worker report, and check the GPU path's environment, its refusal
and its error reporting with stand-ins for ``nvidia-smi`` and the plugin.
"""

from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest

from dpcourse import record as results
from dpcourse.config import make_config
from dpcourse.costs import gradient_bytes
from dpcourse.gpu_compile import mocked as gp

RECORDED = Path(__file__).resolve().parents[2] / "data" / "placement_report_cpu_smoke_4.txt"
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


def test_gpu_worker_env_mocks_the_topology_on_one_visible_gpu_without_preallocation():
    base = {"XLA_FLAGS": "--xla_force_host_platform_device_count=8 --foo", "CUDA_VISIBLE_DEVICES": "3,5"}
    env = gp.worker_env("gpu", topology="1x4x1", base=base)
    assert env["JAX_PLATFORMS"] == "cuda" and env[gp.MOCK_TOPOLOGY_ENV] == "1x4x1"
    assert env["CUDA_VISIBLE_DEVICES"] == "3"
    assert env["XLA_PYTHON_CLIENT_PREALLOCATE"] == "false"
    assert env["XLA_FLAGS"] == "--foo"


def test_cpu_worker_env_sets_its_own_device_count_and_drops_a_mocked_topology():
    base = {"XLA_FLAGS": "--xla_force_host_platform_device_count=8", gp.MOCK_TOPOLOGY_ENV: "1x2x1"}
    env = gp.worker_env("cpu", n_devices=2, base=base)
    assert env["JAX_PLATFORMS"] == "cpu" and gp.MOCK_TOPOLOGY_ENV not in env
    assert env["XLA_FLAGS"] == "--xla_force_host_platform_device_count=2"


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(platform="gpu"), "topology"),
        (dict(platform="gpu", topology="4"), "1x4x1"),
        (dict(platform="cpu"), "n_devices"),
        (dict(platform="tpu", n_devices=2), "gpu"),
    ],
)
def test_worker_env_refuses_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        gp.worker_env(base={}, **kwargs)


def check_cpu_placement(rep: gp.PlacementReport, n: int) -> None:
    """What the CPU compiler does with the smoke workload (JAX 0.10.2 and 0.12.0.1)."""
    assert rep.error is None, rep.error
    assert (rep.platform, rep.topology, rep.n_devices, rep.profile) == ("cpu", None, n, "smoke")
    ideal = gradient_bytes(SMOKE)
    jit = rep.steps["jit"]
    # The shared block's gradient is all-reduced inside the backward scan, once per repeat.
    assert jit.in_loop == 1
    loop_rows = [r for r in jit.rows if r["inside loop"] == "yes"]
    assert loop_rows[0]["bytes"] == BLOCK_GRAD_BYTES and loop_rows[0]["runs per step"] == SMOKE.block_repeats
    for name in ("device_axis", "shard_map"):
        s = rep.steps[name]
        assert (s.collectives, s.in_loop, s.runs_per_step) == (1, 0, 1), name
        assert ideal <= s.bytes_per_step <= ideal + 16, name  # the gradient and two float32 metrics


@pytest.mark.parametrize("n", [2, 4])
def test_cpu_worker_compiles_each_step_in_a_fresh_process(n):
    rep = gp.run_worker("cpu", "smoke", n_devices=n, timeout_s=300)
    check_cpu_placement(rep, n)
    assert rep.jax_version and rep.jaxlib_version and rep.device_kind


def test_a_recorded_worker_report_is_read_back():
    rep = gp.PlacementReport.from_output(RECORDED.read_text())
    check_cpu_placement(rep, 4)
    assert rep.where == "cpu, 4 devices"


def test_report_round_trips_through_its_line():
    rep = gp.PlacementReport.from_output(RECORDED.read_text())
    gpu = gp.PlacementReport(**{**rep.__dict__, "platform": "gpu", "topology": "1x4x1"})
    again = gp.PlacementReport.from_output("noise\n" + gpu.to_line() + "\n")
    assert again == gpu and again.where == "gpu, mocked topology 1x4x1 (4 devices)"


@pytest.mark.parametrize(
    "text, match",
    [
        ("nothing here", "No placement report"),
        (gp.REPORT_PREFIX + "{not json", "not JSON"),
        (gp.REPORT_PREFIX + json.dumps({"platform": "cpu"}), "Not a placement report"),
        (
            gp.REPORT_PREFIX
            + json.dumps(
                {
                    "platform": "cpu",
                    "topology": None,
                    "n_devices": 2,
                    "steps": {"x": dict(step="x", collectives=0, in_loop=0, runs_per_step=0, bytes_per_step=0)},
                }
            ),
            "unknown steps",
        ),
    ],
)
def test_broken_reports_are_refused(text, match):
    with pytest.raises(ValueError, match=match):
        gp.PlacementReport.from_output(text)


def test_a_failing_worker_gives_a_report_with_the_reason(monkeypatch):
    # The GPU path on this machine (no GPU, or no CUDA plugin): the backend cannot start.
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    rep = gp.run_worker("gpu", "smoke", topology="1x2x1", timeout_s=300)
    if rep.error is None:
        pytest.skip("this machine can compile for mocked GPUs")
    assert rep.steps == {} and rep.n_devices == 2 and rep.topology == "1x2x1"
    assert "gpu backend" in rep.error
    row = gp.rows([rep])[0]
    assert row["step"] == "(not compiled)" and row["collectives"] == rep.error


def fake_nvidia_smi(tmp_path: Path, listing: str) -> None:
    exe = tmp_path / "nvidia-smi"
    exe.write_text(f"#!/bin/sh\nprintf '{listing}'\n")
    exe.chmod(exe.stat().st_mode | stat.S_IEXEC)


def test_gpu_support_needs_a_gpu_and_the_cuda_plugin(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    assert "no NVIDIA GPU" in gp.gpu_unavailable_reason()  # no nvidia-smi at all
    fake_nvidia_smi(tmp_path, "")
    assert "no NVIDIA GPU" in gp.gpu_unavailable_reason()  # nvidia-smi lists nothing
    fake_nvidia_smi(tmp_path, "GPU 0: NVIDIA H200 (UUID: GPU-0)\\n")
    monkeypatch.setattr(gp, "_cuda_plugin_names", lambda: [])
    assert "CUDA plugin" in gp.gpu_unavailable_reason()
    monkeypatch.setattr(gp, "_cuda_plugin_names", lambda: ["jax_plugins.xla_cuda12"])
    assert gp.gpu_unavailable_reason() is None


def test_records_carry_backend_and_topology(tmp_path):
    rep = gp.PlacementReport.from_output(RECORDED.read_text())
    gpu = gp.PlacementReport(**{**rep.__dict__, "platform": "gpu", "topology": "1x4x1", "device_kind": "NVIDIA H200"})
    failed = gp.PlacementReport("gpu", "1x8x1", 8, error="no GPU")
    results.enable(tmp_path / "r.jsonl")
    results.set_context("04_sharding", "smoke", "synthetic", "cpu", "cpu", 8, jax_version="0.10.2")
    gp.record([rep, gpu, failed])
    recs = {r["metric"]: r for r in results.read_records(tmp_path / "r.jsonl")}
    assert len(recs) == 2 * 3 * 3  # two reports x three steps x three figures; the failed one records nothing
    cpu_rec = recs["collectives_in_loop_jit_cpu_4"]
    assert (cpu_rec["value"], cpu_rec["backend"], cpu_rec["device_count"]) == (1, "cpu", 4)
    gpu_rec = recs["collectives_per_step_shard_map_gpu_1x4x1"]
    assert (gpu_rec["value"], gpu_rec["backend"], gpu_rec["device_count"]) == (1, "gpu", 4)
    assert gpu_rec["device_kind"] == "NVIDIA H200 (mocked topology 1x4x1)"


def test_no_gpu_caveat_names_the_pass():
    assert "while-loop-all-reduce-code-motion" in gp.CPU_ONLY_CAVEAT


def test_report_command_prints_the_cpu_placement_and_why_gpu_is_missing(monkeypatch, capsys):
    monkeypatch.setattr(gp, "gpu_unavailable_reason", lambda: "no NVIDIA GPU here (stand-in)")
    assert gp.main(["--report", "--profile", "smoke"]) == 0
    out = capsys.readouterr().out
    assert "GPU placement cannot be compiled here: no NVIDIA GPU here (stand-in)." in out
    rep = gp.PlacementReport.from_output(out)
    assert (rep.platform, rep.n_devices, rep.error) == ("cpu", 8, None)
    assert "step=jit(train_step)" in out and "inside loop=1" in out


@pytest.mark.parametrize("argv", [["--profile", "smoke"], ["--platform", "gpu", "--profile", "smoke"]])
def test_worker_command_needs_its_arguments(argv):
    with pytest.raises(SystemExit):
        gp.main(argv)


def test_notebook_helper_says_why_there_is_no_gpu_table(monkeypatch, capsys):
    monkeypatch.setattr(gp, "gpu_unavailable_reason", lambda: "no NVIDIA GPU (nvidia-smi not found)")
    assert gp.show_mocked_gpu_placement("smoke", "cpu") == []
    out = capsys.readouterr().out
    assert "no NVIDIA GPU (nvidia-smi not found)" in out and "the CPU compiler's" in out


def test_notebook_helper_compiles_every_mocked_topology_and_records_them(monkeypatch, tmp_path, capsys):
    recorded = gp.PlacementReport.from_output(RECORDED.read_text())
    asked = []

    def fake_worker(platform, profile, topology=None, **_):
        asked.append((platform, profile, topology))
        return gp.PlacementReport(**{**recorded.__dict__, "platform": "gpu", "topology": topology})

    monkeypatch.setattr(gp, "gpu_unavailable_reason", lambda: None)
    monkeypatch.setattr(gp, "run_worker", fake_worker)
    results.enable(tmp_path / "records.jsonl")
    results.set_context("04_sharding", "smoke", "synthetic", "gpu", "NVIDIA H200", 1, jax_version="0.11.2")
    try:
        reports = gp.show_mocked_gpu_placement("smoke", "gpu")
    finally:
        results.disable()
    assert asked == [("gpu", "smoke", t) for t in gp.GPU_TOPOLOGIES]
    assert [r.topology for r in reports] == list(gp.GPU_TOPOLOGIES)
    topologies = {r["device_kind"].split()[-1].rstrip(")") for r in results.read_records(tmp_path / "records.jsonl")}
    assert topologies == set(gp.GPU_TOPOLOGIES)
    assert "Compiled for mocked GPU topologies" in capsys.readouterr().out
