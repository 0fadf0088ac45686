"""dpcourse.cross_compile.notebook: the GPU and TPU cells of 04, 05, 09 and 10 show a compile, a mocked one or the stored one.

The stored results (dpcourse/cross_compile/stored/lessons.json and
lessons_tpu.json, written by `make placement-store`) are held to what the code compiles: they cover every job
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
NO_TPU_EXTRA = "libtpu is not installed. Install the TPU-compile extra: make tpu-compile"


def missing(gpu: str | None, tpu: str | None):
    """A stand-in for ``targets.extra_missing``: each platform's reason."""
    return lambda platform="gpu": {"gpu": gpu, "tpu": tpu}[platform]


@pytest.fixture
def no_extra_no_gpu(monkeypatch):
    monkeypatch.setattr(gpu_targets, "extra_missing", missing(NO_EXTRA, NO_TPU_EXTRA))
    monkeypatch.setattr(gpu_placement, "gpu_unavailable_reason", lambda: "no NVIDIA GPU here (stand-in)")
    monkeypatch.setattr(deviceless, "compile_jobs", lambda *a, **k: pytest.fail("nothing may compile"))
    monkeypatch.setattr(deviceless, "compile_mocked", lambda *a, **k: pytest.fail("nothing may compile"))


def key(res: CompileResult) -> tuple:
    return (res.backend, res.target, res.n_devices, res.profile, tuple(res.disabled_passes), tuple(res.steps))


def test_without_the_extra_or_a_gpu_the_cell_shows_the_stored_result_labelled_as_stored(no_extra_no_gpu, capsys):
    shown = gpu_notebook.show_gpu_placement("smoke", "cpu", tpu_targets=())
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
    (res,) = gpu_notebook.show_gpu_placement("cpu", "cpu", tpu_targets=())
    assert res.profile == "smoke" and "smoke profile" in capsys.readouterr().out


def test_the_experiment_without_the_pass_is_stored_too(no_extra_no_gpu):
    steps = {"jit": deviceless.COURSE_STEPS["jit"]}
    shown = gpu_notebook.show_gpu_placement("smoke", "cpu", steps=steps, disable_passes=(gpu_notebook.PASS_NAME,))
    (res,) = [r for r in shown if r.backend == "gpu"]
    assert res.disabled_passes == [gpu_notebook.PASS_NAME] and res.steps["jit"].in_loop == 1


def test_a_compile_nobody_stored_says_so_in_one_short_line(no_extra_no_gpu, capsys):
    assert gpu_notebook.show_gpu_placement("smoke", "cpu", steps={"unstored": deviceless.COURSE_STEPS["jit"]}) == []
    gpu_line, tpu_line = capsys.readouterr().out.strip().splitlines()
    assert gpu_line.startswith("Not shown: no stored result of this compile") and "make gpu-compile" in gpu_line
    assert tpu_line.startswith("Not shown: no stored result of this compile") and "make tpu-compile" in tpu_line
    assert len(gpu_line) < 200 and len(tpu_line) < 200


def test_with_the_extra_it_compiles_for_h200_and_on_a_gpu_machine_for_the_cpu_too(monkeypatch):
    asked = []
    monkeypatch.setattr(gpu_targets, "extra_missing", missing(None, NO_TPU_EXTRA))
    monkeypatch.setattr(deviceless, "compile_jobs", lambda jobs, steps, disable_passes: asked.append(jobs) or [])
    gpu_notebook.show_gpu_placement("smoke", "cpu", tpu_targets=())
    gpu_notebook.show_gpu_placement("smoke", "gpu", tpu_targets=())
    assert asked[0] == [deviceless.Job("gpu", "h200", 8, "smoke")]
    assert asked[1] == asked[0] + [deviceless.Job("cpu", "cpu", 8, "smoke")]


def test_with_both_extras_the_gpu_and_the_tpu_slices_compile_in_one_worker_on_two_cores(monkeypatch):
    asked = []
    monkeypatch.setattr(gpu_notebook, "_cores", lambda: 2)
    monkeypatch.setattr(gpu_targets, "extra_missing", missing(None, None))
    monkeypatch.setattr(deviceless, "compile_jobs", lambda jobs, steps, disable_passes: asked.append(jobs) or [])
    gpu_notebook.show_gpu_placement("smoke", "cpu")
    assert asked == [
        [
            deviceless.Job("gpu", "h200", 8, "smoke"),
            deviceless.Job("tpu", "v5e_2x4", 8, "smoke"),
            deviceless.Job("tpu", "v6e_16x16", 256, "smoke"),
        ]
    ]


def test_on_a_host_with_cores_to_spare_each_slice_compiles_in_a_worker_of_its_own(monkeypatch):
    started, collected, events = [], [], []

    class Pending:
        def __init__(self, jobs):
            self.jobs = jobs

        def results(self):
            collected.append(self.jobs)
            events.append("wait")
            return [
                CompileResult(j.backend, j.target, j.n_devices, j.profile, target_label=j.target) for j in self.jobs
            ]

    def start_jobs(jobs, steps, disable_passes):
        started.append(jobs)
        events.append("start")
        return Pending(jobs)

    monkeypatch.setattr(gpu_notebook, "_cores", lambda: 13)
    monkeypatch.setattr(gpu_targets, "extra_missing", missing(None, None))
    monkeypatch.setattr(deviceless, "compile_jobs", lambda *a, **k: pytest.fail("one worker for all"))
    monkeypatch.setattr(deviceless, "start_jobs", start_jobs)
    shown = gpu_notebook.show_gpu_placement("smoke", "tpu")
    h200, cpu = deviceless.Job("gpu", "h200", 8, "smoke"), deviceless.Job("cpu", "cpu", 8, "smoke")
    v5e, v6e = deviceless.Job("tpu", "v5e_2x4", 8, "smoke"), deviceless.Job("tpu", "v6e_16x16", 256, "smoke")
    assert started == collected == [[h200, cpu], [v5e], [v6e]]
    assert events == ["start"] * 3 + ["wait"] * 3  # every worker started before any is waited for
    assert [r.target for r in shown] == ["h200", "cpu", "v5e_2x4", "v6e_16x16"]


def test_with_the_tpu_extra_only_the_slices_compile_and_the_gpu_is_stored(monkeypatch, capsys):
    asked = []

    def compile_jobs(jobs, steps, disable_passes):
        asked.append(jobs)
        return [CompileResult(j.backend, j.target, j.n_devices, j.profile, target_label="t") for j in jobs]

    monkeypatch.setattr(gpu_targets, "extra_missing", missing(NO_EXTRA, None))
    monkeypatch.setattr(gpu_placement, "gpu_unavailable_reason", lambda: "no NVIDIA GPU here (stand-in)")
    monkeypatch.setattr(deviceless, "compile_jobs", compile_jobs)
    shown = gpu_notebook.show_gpu_placement("smoke", "cpu", tpu_targets=("v5e_2x4",))
    assert asked == [[deviceless.Job("tpu", "v5e_2x4", 8, "smoke")]]
    assert [(r.backend, bool(r.stored)) for r in shown] == [("gpu", True), ("tpu", False)]
    assert "the GPU-compile extra" in capsys.readouterr().out


def test_without_the_tpu_extra_the_slices_are_stored_and_say_so(no_extra_no_gpu, capsys):
    shown = gpu_notebook.show_gpu_placement("smoke", "cpu")
    payload = gpu_notebook.stored_payload("tpu")
    tpu = [r for r in shown if r.backend == "tpu"]
    assert [r.target for r in tpu] == list(gpu_notebook.LESSON_TPU_TARGETS)
    assert all(r.stored.startswith("make placement, 20") and r.jax_version == payload["jax_version"] for r in tpu)
    assert tpu[0].label == (
        f"compiled for 8 x TPU v5e (2x4 slice) without a TPU, stored (make placement, {payload['date']}, "
        f"JAX {payload['jax_version']})"
    )
    out = capsys.readouterr().out
    assert (
        f"Stored result for TPUs (made by make placement, {payload['date']}, JAX {payload['jax_version']}, "
        "smoke profile): the TPU-compile extra (make tpu-compile, libtpu: a 209 MB wheel) compiles it"
    ) in out
    # What the TPU compiler did with the course's steps: one all-reduce per step, after the loop.
    for res in tpu:
        assert all((s.count, s.in_loop, s.runs_per_step) == (1, 0, 1) for s in res.steps.values()), res.label


def test_on_a_gpu_machine_without_the_extra_it_compiles_mocked_topologies_and_records_them(monkeypatch):
    asked, recorded = [], []
    monkeypatch.setattr(gpu_targets, "extra_missing", missing(NO_EXTRA, NO_TPU_EXTRA))
    monkeypatch.setattr(gpu_placement, "gpu_unavailable_reason", lambda: None)
    monkeypatch.setattr(deviceless, "compile_mocked", lambda *a: asked.append(a) or [])
    monkeypatch.setattr(gpu_notebook, "record", recorded.append)
    steps = {"jit": deviceless.COURSE_STEPS["jit"]}
    gpu_notebook.show_gpu_placement("full", "gpu", steps=steps, counts=(2, 8), disable_passes=("p",), tpu_targets=())
    assert asked == [("full", ("1x2x1", "1x8x1"), steps, ("p",))] and recorded == [[]]


def test_lesson_10s_background_compile_falls_back_to_the_stored_results(no_extra_no_gpu, monkeypatch, capsys):
    monkeypatch.setattr(deviceless, "start_jobs", lambda *a, **k: pytest.fail("nothing may start"))
    pending = gpu_notebook.start_gpu_compile(steps.SHARDED_STEPS, ("h200", "l4"), 8, "smoke")
    found = pending.results()
    assert [r.target for r in found] == ["h200", "l4"]
    assert all(list(r.steps) == list(steps.SHARDED_STEPS) and r.stored for r in found)
    assert "Stored result" in capsys.readouterr().out
    assert gpu_notebook.start_gpu_compile(steps.SHARDED_STEPS, (), 8, "smoke").results() == []
    with_tpu = gpu_notebook.start_gpu_compile(steps.SHARDED_STEPS, ("h200",), 8, "smoke", ("v5e_2x4",)).results()
    assert [(r.backend, r.target) for r in with_tpu] == [("gpu", "h200"), ("tpu", "v5e_2x4")]
    assert all(list(r.steps) == list(steps.SHARDED_STEPS) and r.stored for r in with_tpu)


def expected_keys(platform: str = "gpu") -> set[tuple]:
    """What the lessons ask for at 8 GPUs, or on each TPU slice, for the profiles `make placement` compiles."""
    profiles, targets = ["smoke", "full"], list(gpu_targets.TARGETS)
    n = placement_report.LESSON10_DEVICES
    course = [j for j in placement_report.jobs_for(profiles, targets, (n,)) if j.backend == platform]
    lesson10 = [j for j in placement_report.lesson10_jobs(profiles, targets) if j.backend == platform]
    keys = {(j.backend, j.target, j.n_devices, j.profile, (), tuple(deviceless.COURSE_STEPS)) for j in course}
    keys |= {(j.backend, j.target, j.n_devices, j.profile, (), tuple(steps.SHARDED_STEPS)) for j in lesson10}
    no_motion = (gpu_notebook.PASS_NAME,), tuple(placement_report.NO_MOTION_STEPS)
    if platform == "gpu":
        keys |= {("gpu", "h200", n, p, *no_motion) for p in profiles}
    else:
        keys |= {("tpu", placement_report.NO_MOTION_TPU, 8, "smoke", *no_motion)}
    fast = tuple(placement_report.FAST_LESSON_STEPS)
    keys |= {
        (j.backend, j.target, j.n_devices, j.profile, (), fast) for j in placement_report.fast_jobs(profiles, targets)
    }
    return {k for k in keys if k[0] == platform}


@pytest.mark.parametrize("platform", ["gpu", "tpu"])
def test_the_stored_results_are_every_compile_the_lessons_ask_for(platform):
    stored = gpu_notebook.stored_results(platform)
    assert {key(r) for r in stored} == expected_keys(platform), "run `make placement-store`, commit the stored file"
    assert all(r.error is None and all(s.error is None for s in r.steps.values()) for r in stored)
    payload = gpu_notebook.stored_payload(platform)
    assert {r.jax_version for r in stored} == {payload["jax_version"]} and payload["date"][:2] == "20"


def comparable(res: CompileResult) -> dict:
    """Everything the lessons show of a result, without the compile's time."""
    return {
        name: (s.count, s.in_loop, s.runs_per_step, s.bytes_per_step, s.collectives) for name, s in res.steps.items()
    }


@pytest.mark.parametrize("platform, name", [("gpu", THIS_RUN.name), ("tpu", placement_report.TPU_STORED_NAME)])
def test_the_stored_results_match_what_make_placement_compiled_in_this_run(platform, name):
    this_run = THIS_RUN.with_name(name)
    if not this_run.is_file():
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI: {this_run} is missing; make test runs `make placement` before the unit tests.")
        pytest.skip(f"no {this_run} (run `make placement` first)")
    payload = json.loads(this_run.read_text())
    fresh = [CompileResult.from_dict(r) for r in payload["results"]]
    stored = {key(r): r for r in gpu_notebook.stored_results(platform)}
    assert {key(r) for r in fresh} <= set(stored), "run `make placement-store` and commit the stored file"
    if payload["jaxlib_version"] != gpu_notebook.stored_payload(platform)["jaxlib_version"]:
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
