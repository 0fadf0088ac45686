"""coursetools.tpucheck (make tpu-check): refusals, the plan, the budget and the results file, on the CPU."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from coursetools import compare, timings, tpucheck
from coursetools.gpucheck import Step
from coursetools.paths import ROOT

V5E = {"platform": "tpu", "device_kind": "TPU v5 lite", "count": 1, "memory_bytes": 16_911_433_728}


def test_without_a_tpu_it_refuses_in_one_sentence_and_runs_nothing(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(tpucheck, "probe_tpu", lambda: {**V5E, "platform": "cpu", "device_kind": "cpu"})
    monkeypatch.setattr(tpucheck.subprocess, "Popen", lambda *a, **k: pytest.fail("a step was run"))
    assert tpucheck.main(["--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: tpu-check needs a TPU") and err.count("\n") == 1
    assert not (tmp_path / "out").exists()


def test_a_chip_held_by_another_process_is_named_with_what_to_do():
    held = {"error": "RuntimeError: Internal error when accessing libtpu multi-process lockfile"}
    text = tpucheck.refusal(held)
    assert text.startswith("another process holds the TPU") and "then run make tpu-check again" in text
    assert tpucheck.refusal(V5E) is None


def test_the_probe_of_this_machine_names_its_backend():
    probe = tpucheck.probe_tpu()  # the CPU here: the check would refuse
    assert probe["platform"] == "cpu" and tpucheck.refusal(probe).startswith("tpu-check needs a TPU")


def test_the_dry_run_lists_the_command_and_starts_no_jax(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(tpucheck, "probe_tpu", lambda: pytest.fail("JAX was started"))
    assert tpucheck.main(["--dry-run", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "coursetools run --profile full --kernel shell" in out and not list(tmp_path.iterdir())


def test_the_results_file_is_named_as_the_baselines_are():
    assert tpucheck.results_name("TPU v5 lite", "0.10.2") == "tpu-v5-lite-full-jax0.10.2.json"
    assert tpucheck.results_name("TPU v6e", "0.12.0") == "tpu-v6e-full-jax0.12.0.json"


def _fake_plan(out: Path, wall_s: float = 0.0) -> list[Step]:
    runner = json.loads((ROOT / "baselines" / "cpu-jax0.10.2.json").read_text())
    for nb in runner["notebooks"]:
        nb["peak_device_bytes"] = 3 * 2**30
    target = out / "lessons" / "results.json"
    write = (
        f"import pathlib, time; time.sleep({wall_s}); p = pathlib.Path({str(target)!r}); "
        f"p.parent.mkdir(parents=True, exist_ok=True); p.write_text({json.dumps(runner)!r})"
    )
    return [Step("lessons", [sys.executable, "-c", write], "lessons")]


def test_a_check_writes_a_results_file_that_compare_and_timings_read(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(tpucheck, "probe_tpu", lambda: V5E)
    monkeypatch.setattr(tpucheck, "plan", lambda out: _fake_plan(out))
    assert tpucheck.main(["--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    (path,) = tmp_path.glob("tpu-v5-lite-full-jax*.json")
    payload = json.loads(path.read_text())
    check = payload["tpu_check"]
    assert check["passed"] and check["tpus"] == ["TPU v5 lite"] and payload["machine"]["tpus"] == ["TPU v5 lite"]
    assert check["steps"][0]["exit_status"] == 0 and "peak chip MiB" in out and "3,072" in out
    assert compare.compare(payload, payload, threshold=0.1).exit_code == 0
    lessons = [nb["notebook"] for nb in payload["notebooks"]]
    entry = timings._run_entry(path, lessons)  # the record and the lessons' Time lines read it
    assert timings._machine_words(entry["machine"]) == "1 x TPU v5 lite"


def test_the_budget_stops_the_lessons_and_the_check_fails(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(tpucheck, "probe_tpu", lambda: V5E)
    monkeypatch.setattr(tpucheck, "plan", lambda out: _fake_plan(out, wall_s=30))
    assert tpucheck.main(["--out", str(tmp_path), "--budget-s", "1"]) == 1
    assert "stopped at the time budget" in capsys.readouterr().out
