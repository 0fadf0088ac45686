"""dpcourse.cross_compile.notebook: the GPU cells of 04, 05, 09 and 10 show a compile, a mocked one or the stored one.

The stored results (dpcourse/gpu_stored/lessons.json, written by `make
placement-store`) are held to what the code compiles: they cover every job
and step the lessons ask for, and, where this test run's `make placement`
wrote results/placement/lessons.json with the same jaxlib, every collective
matches it (make test runs `placement` before the unit tests).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from coursetools import compile_report as placement_report
from dpcourse.cross_compile import compile as deviceless
from dpcourse.cross_compile import mocked as gpu_placement
from dpcourse.cross_compile import notebook as gpu_notebook
from dpcourse.cross_compile import steps
from dpcourse.cross_compile import targets as gpu_targets
from dpcourse.cross_compile.result import CompileResult

ROOT = Path(__file__).resolve().parents[3]
THIS_RUN = ROOT / placement_report.DEFAULT_JSON.parent / placement_report.STORED_NAME
NO_EXTRA = "jax-cuda12-plugin is not installed. Install the GPU-compile extra: make gpu-compile"


@pytest.fixture
def no_extra_no_gpu(monkeypatch):
    monkeypatch.setattr(gpu_targets, "extra_missing", lambda: NO_EXTRA)
    monkeypatch.setattr(gpu_placement, "gpu_unavailable_reason", lambda: "no NVIDIA GPU here (stand-in)")
    monkeypatch.setattr(deviceless, "compile_jobs", lambda *a, **k: pytest.fail("nothing may compile"))
    monkeypatch.setattr(gpu_placement, "compile_mocked", lambda *a, **k: pytest.fail("nothing may compile"))


def key(res: CompileResult) -> tuple:
    return (res.backend, res.target, res.n_devices, res.profile, tuple(res.disabled_passes), tuple(res.steps))


def test_without_the_extra_or_a_gpu_the_cell_shows_the_stored_result_labelled_as_stored(no_extra_no_gpu, capsys):
    shown = gpu_notebook.show_gpu_placement("smoke", "cpu")
    payload = gpu_notebook.stored_payload()
    (res,) = shown
    assert (res.backend, res.target, res.n_devices, res.profile) == ("gpu", "h200", 8, "smoke")
    assert set(res.steps) == set(deviceless.COURSE_STEPS) and res.stored.startswith("make placement, 20")
    assert res.label.endswith(f"stored (make placement, {payload['date']}, JAX {payload['jax_version']})")
    out = capsys.readouterr().out
    lines = [line for line in out.splitlines() if line.strip() and not line.startswith("<")]
    assert lines[0] == (
        f"Stored result (made by make placement, {payload['date']}, JAX {payload['jax_version']}, smoke profile): "
        "the GPU-compile extra (make gpu-compile, about 510 MB) compiles it on this machine."
    )
    # The placement the lessons teach: one all-reduce per step, after the loop.
    assert all((s.in_loop, s.runs_per_step) == (0, 1) for s in res.steps.values())


def test_a_profile_that_was_not_stored_shows_the_smoke_one_and_says_so(no_extra_no_gpu, capsys):
    (res,) = gpu_notebook.show_gpu_placement("cpu", "cpu")
    assert res.profile == "smoke" and "smoke profile" in capsys.readouterr().out


def test_the_experiment_without_the_pass_is_stored_too(no_extra_no_gpu):
    steps = {"jit": deviceless.COURSE_STEPS["jit"]}
    (res,) = gpu_notebook.show_gpu_placement("smoke", "cpu", steps=steps, disable_passes=(gpu_notebook.PASS_NAME,))
    assert res.disabled_passes == [gpu_notebook.PASS_NAME] and res.steps["jit"].in_loop == 1


def test_a_compile_nobody_stored_says_so_in_one_short_line(no_extra_no_gpu, capsys):
    assert (
        gpu_notebook.show_gpu_placement("smoke", "cpu", steps={"fast": deviceless.FAST_STEPS["jit_unrolled_bf16"]})
        == []
    )
    (line,) = capsys.readouterr().out.strip().splitlines()
    assert line.startswith("Not shown: no stored result of this compile") and "make gpu-compile" in line
    assert len(line) < 200


def test_with_the_extra_it_compiles_for_h200_and_on_a_gpu_machine_for_the_cpu_too(monkeypatch):
    asked = []
    monkeypatch.setattr(gpu_targets, "extra_missing", lambda: None)
    monkeypatch.setattr(deviceless, "compile_jobs", lambda jobs, steps, disable_passes: asked.append(jobs) or [])
    gpu_notebook.show_gpu_placement("smoke", "cpu")
    gpu_notebook.show_gpu_placement("smoke", "gpu")
    assert asked[0] == [deviceless.Job("gpu", "h200", 8, "smoke")]
    assert asked[1] == asked[0] + [deviceless.Job("cpu", "cpu", 8, "smoke")]


def test_on_a_gpu_machine_without_the_extra_it_compiles_mocked_topologies_and_records_them(monkeypatch):
    asked, recorded = [], []
    monkeypatch.setattr(gpu_targets, "extra_missing", lambda: NO_EXTRA)
    monkeypatch.setattr(gpu_placement, "gpu_unavailable_reason", lambda: None)
    monkeypatch.setattr(gpu_placement, "compile_mocked", lambda *a: asked.append(a) or [])
    monkeypatch.setattr(gpu_placement, "record", recorded.append)
    steps = {"jit": deviceless.COURSE_STEPS["jit"]}
    gpu_notebook.show_gpu_placement("full", "gpu", steps=steps, counts=(2, 8), disable_passes=("p",))
    assert asked == [("full", ("1x2x1", "1x8x1"), steps, ("p",))] and recorded == [[]]


def test_lesson_10s_background_compile_falls_back_to_the_stored_results(no_extra_no_gpu, monkeypatch, capsys):
    monkeypatch.setattr(deviceless, "start_jobs", lambda *a, **k: pytest.fail("nothing may start"))
    pending = gpu_notebook.start_gpu_compile(steps.SHARDED_STEPS, ("h200", "l4"), 8, "smoke")
    found = pending.results()
    assert [r.target for r in found] == ["h200", "l4"]
    assert all(list(r.steps) == list(steps.SHARDED_STEPS) and r.stored for r in found)
    assert "Stored result" in capsys.readouterr().out
    assert gpu_notebook.start_gpu_compile(steps.SHARDED_STEPS, (), 8, "smoke").results() == []


def expected_keys() -> set[tuple]:
    """What the lessons ask for at 8 GPUs, for the profiles `make placement` compiles (smoke and full)."""
    profiles, targets = ["smoke", "full"], list(gpu_targets.TARGETS)
    n = placement_report.LESSON10_DEVICES
    course = [j for j in placement_report.jobs_for(profiles, targets, (n,)) if j.backend == "gpu"]
    lesson10 = [j for j in placement_report.lesson10_jobs(profiles, targets) if j.backend == "gpu"]
    keys = {(j.backend, j.target, j.n_devices, j.profile, (), tuple(deviceless.COURSE_STEPS)) for j in course}
    keys |= {(j.backend, j.target, j.n_devices, j.profile, (), tuple(steps.SHARDED_STEPS)) for j in lesson10}
    keys |= {
        ("gpu", "h200", n, p, (gpu_notebook.PASS_NAME,), tuple(placement_report.NO_MOTION_STEPS)) for p in profiles
    }
    return keys


def test_the_stored_results_are_every_compile_the_lessons_ask_for():
    stored = gpu_notebook.stored_results()
    assert {key(r) for r in stored} == expected_keys(), "run `make placement-store` and commit the stored file"
    assert all(r.error is None and all(s.error is None for s in r.steps.values()) for r in stored)
    payload = gpu_notebook.stored_payload()
    assert {r.jax_version for r in stored} == {payload["jax_version"]} and payload["date"][:2] == "20"


def comparable(res: CompileResult) -> dict:
    """Everything the lessons show of a result, without the compile's time."""
    return {
        name: (s.count, s.in_loop, s.runs_per_step, s.bytes_per_step, s.collectives) for name, s in res.steps.items()
    }


def test_the_stored_results_match_what_make_placement_compiled_in_this_run():
    if not THIS_RUN.is_file():
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI: {THIS_RUN} is missing; make test runs `make placement` before the unit tests.")
        pytest.skip(f"no {THIS_RUN} (run `make placement` first)")
    payload = json.loads(THIS_RUN.read_text())
    fresh = [CompileResult.from_dict(r) for r in payload["results"]]
    stored = {key(r): r for r in gpu_notebook.stored_results()}
    assert {key(r) for r in fresh} <= set(stored), "run `make placement-store` and commit the stored file"
    if payload["jaxlib_version"] != gpu_notebook.stored_payload()["jaxlib_version"]:
        return  # another JAX: the jobs and steps above are what can be held to the stored ones
    differ = [key(r) for r in fresh if comparable(r) != comparable(stored[key(r)])]
    assert not differ, f"stored results differ from this run's compile: {differ}; run `make placement-store`"


def test_the_stored_overlap_compiles_are_labelled_stored_with_their_jax_and_date():
    results, texts = gpu_notebook.stored_overlap("smoke")
    assert results and all(r.stored.startswith("make placement, 20") and r.jax_version for r in results)
    assert all(", stored (make placement, " in r.label for r in results)
    assert all(text.lstrip().startswith("HloModule") for text in texts.values())
    line = gpu_notebook.stored_overlap_line(results, "the extra is missing")
    assert line.startswith(f"Stored result (made by {results[0].stored}, JAX {results[0].jax_version}, smoke profile)")
    assert gpu_notebook.stored_overlap("full") == ([], {})


def test_the_stored_overlap_compiles_list_the_forms_in_the_lessons_order():
    from dpcourse.cross_compile import overlap_steps

    results, _ = gpu_notebook.stored_overlap("smoke")
    for res in results:
        assert list(res.steps) == [k for k in overlap_steps.STEPS if k in res.steps], res.target
