"""coursetools.gpucheck (make gpu-check): refused without a GPU, the plan, the budget and the results file, on the CPU."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from coursetools import compare, gpucheck
from coursetools.paths import ROOT

H100 = "GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-0b1c)"


def test_without_a_gpu_it_refuses_in_one_sentence_and_runs_nothing(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(gpucheck, "nvidia_gpus", lambda: [])
    monkeypatch.setattr(gpucheck.subprocess, "Popen", lambda *a, **k: pytest.fail("a step was run"))
    assert gpucheck.main(["--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: gpu-check needs an NVIDIA GPU") and err.count("\n") == 1
    assert not (tmp_path / "out").exists()


def test_a_gpu_that_jax_cannot_use_is_named_with_the_plugin_to_install(tmp_path, monkeypatch, capsys):
    from dpcourse import devices

    monkeypatch.setattr(gpucheck, "nvidia_gpus", lambda: [H100])
    monkeypatch.setattr(devices, "probe_backend", lambda: "cpu")
    monkeypatch.setattr(gpucheck.subprocess, "Popen", lambda *a, **k: pytest.fail("a step was run"))
    assert gpucheck.main(["--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "NVIDIA H100 80GB HBM3" in err and "jax[cuda12]==" in err and "cpu backend" in err


def test_the_dry_run_lists_each_command_on_any_machine(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(gpucheck, "nvidia_gpus", lambda: [])
    assert gpucheck.main(["--dry-run", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "coursetools check-collectives" in out and "coursetools run --profile full" in out
    assert all(test in out for test in gpucheck.GPU_TESTS)
    assert "gpu-check needs an NVIDIA GPU" in out and not list(tmp_path.iterdir())


def test_every_gpu_test_named_exists():
    assert all((ROOT / path).is_file() for path in gpucheck.GPU_TESTS)


def test_the_results_file_is_named_as_the_baselines_are():
    assert gpucheck.results_name([H100], "0.10.2") == "h100-80gb-hbm3-full-jax0.10.2.json"
    assert gpucheck.results_name(["GPU 0: NVIDIA L4 (UUID: x)"], "0.12.0.1") == "l4-full-jax0.12.0.1.json"


def _fake_steps(out: Path, lessons_wall_s: float = 0.0) -> list:
    """The plan's three steps as quick scripts: the lessons' step writes a results.json of the runner's format."""
    runner = json.loads((ROOT / "baselines" / "cpu-jax0.10.2.json").read_text())
    for nb in runner["notebooks"]:
        nb["peak_gpu_bytes"] = 3 * 2**30
    target = out / "lessons" / "results.json"
    write = (
        f"import pathlib, time; time.sleep({lessons_wall_s}); p = pathlib.Path({str(target)!r}); "
        f"p.parent.mkdir(parents=True, exist_ok=True); p.write_text({json.dumps(runner)!r})"
    )
    return [
        gpucheck.Step("collectives", [sys.executable, "-c", "pass"], "probe"),
        gpucheck.Step("lessons", [sys.executable, "-c", write], "lessons"),
        gpucheck.Step("tests", [sys.executable, "-c", "raise SystemExit(0)"], "tests"),
    ]


def test_a_check_on_one_gpu_writes_a_results_file_compare_reads(tmp_path, monkeypatch, capsys):
    from dpcourse import devices

    monkeypatch.setattr(gpucheck, "nvidia_gpus", lambda: [H100])
    monkeypatch.setattr(devices, "probe_backend", lambda: "gpu")
    monkeypatch.setattr(gpucheck, "plan", lambda out: _fake_steps(out))
    assert gpucheck.main(["--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    (path,) = tmp_path.glob("h100-80gb-hbm3-full-jax*.json")
    payload = compare.load_results(path)  # the format of baselines/
    check = payload["gpu_check"]
    assert check["passed"] and check["gpus"] == ["NVIDIA H100 80GB HBM3"] and check["jax_version"]
    assert [s["name"] for s in check["steps"]] == ["collectives", "lessons", "tests"]
    assert "3,072" in out and "gpu-check passed" in out  # each lesson's peak GPU memory, MiB


def test_a_check_past_its_budget_stops_the_step_and_fails(tmp_path, monkeypatch, capsys):
    from dpcourse import devices

    monkeypatch.setattr(gpucheck, "nvidia_gpus", lambda: [H100])
    monkeypatch.setattr(devices, "probe_backend", lambda: "gpu")
    monkeypatch.setattr(gpucheck, "plan", lambda out: _fake_steps(out, lessons_wall_s=30))
    monkeypatch.setattr(gpucheck, "BUDGET_S", 2)
    assert gpucheck.main(["--out", str(tmp_path)]) == 1
    (path,) = tmp_path.glob("*.json")
    steps = json.loads(path.read_text())["gpu_check"]["steps"]
    assert [s["name"] for s in steps] == ["collectives", "lessons"] and steps[-1]["timed_out"]
    assert "stopped at the time budget" in capsys.readouterr().out


def test_a_bad_xla_flags_token_is_named_before_any_step(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(gpucheck, "nvidia_gpus", lambda: [H100])
    monkeypatch.setenv("XLA_FLAGS", "\u2014xla_gpu_all_reduce_combine_threshold_bytes=4096")
    monkeypatch.setattr(gpucheck.subprocess, "Popen", lambda *a, **k: pytest.fail("a step was run"))
    with pytest.raises(SystemExit) as exit_:
        gpucheck.main(["--out", str(tmp_path / "out")])
    assert exit_.value.code == 2 and "em dash" in capsys.readouterr().err


def test_the_summary_gives_each_lesson_its_peak_and_error_under_either_check():
    notebooks = [
        {"notebook": "01_setup", "status": "passed", "wall_s": 9.6, "peak_gpu_bytes": 3 * 2**30},
        {"notebook": "09_performance", "status": "failed", "wall_s": 37.0, "error": "ValueError: too big"},
    ]
    section = {"steps": [{"name": "lessons", "exit_status": 1, "wall_s": 47.0, "timed_out": False}]}
    payload = {"notebooks": notebooks, "gpu_check": {**section, "passed": False, "wall_s": 48.0, "budget_s": 480}}
    lines = gpucheck.summary(payload).splitlines()
    assert lines[0].split()[-3:] == ["peak", "GPU", "MiB"]
    assert lines[1].split() == ["01_setup", "passed", "9.6", "3,072"]
    assert lines[2].split() == ["09_performance", "failed", "37.0", "-"] and lines[3] == "  ValueError: too big"
    assert lines[-2:] == ["lessons: exit status 1 in 47 s", "gpu-check FAILED: 48 s of a 480 s budget"]
    on_a_chip = {"notebooks": notebooks[1:], "tpu_check": {**section, "passed": False, "wall_s": 48.0, "budget_s": 520}}
    text = gpucheck.check_summary(on_a_chip, "tpu_check", "peak_device_bytes", "peak chip MiB")
    assert "peak chip MiB" in text and text.endswith("tpu-check FAILED: 48 s of a 520 s budget")
