"""coursetools.compile_report (make placement): the records, the table, the check that fails when a collective moves, the jobs."""

from __future__ import annotations

import dataclasses

import pytest

from coursetools import compile_report as placement_report
from dpcourse.config import make_config
from dpcourse.costs import gradient_bytes
from dpcourse.cross_compile import compile as deviceless

SMOKE = make_config("smoke")
METRIC_BYTES = 8  # loss and accuracy, float32, reduced with the gradient
PASS = "while-loop-all-reduce-code-motion"


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


def test_a_slices_all_reduce_is_read_back_over_every_chip_beside_the_ici_models_time():
    from dpcourse.costs import find_peak, tpu_slice_allreduce_s
    from dpcourse.cross_compile.result import CompileResult, StepResult

    v = gradient_bytes(SMOKE) + METRIC_BYTES
    steps = {
        name: StepResult(name, "b", bytes_per_step=v, schedule={"sent_bytes_per_step": 2 * (n - 1) / n * v})
        for name, n in (("jit", 16), ("device_axis", 4))  # the second over a part of the slice
    }
    res = CompileResult("tpu", "v5e_4x4", 16, "smoke", target_label="TPU v5e 4x4", device_kind="TPU v5 lite")
    rows = placement_report.ici_rows([dataclasses.replace(res, steps=steps)])
    assert [r["devices in its group"] for r in rows] == [16, 4]
    predicted = tpu_slice_allreduce_s(v, find_peak("TPU v5 lite"), (4, 4))
    assert rows[0]["ICI model's time, predicted (us)"] == f"{predicted * 1e6:.1f}"
    assert placement_report.slice_problems(rows) == ["16 x TPU v5e 4x4 smoke device_axis: the all-reduce spans 4 chips"]


def test_jobs_of_make_placement():
    jobs = placement_report.jobs_for(["smoke", "full"], ["h200", "l4", "v5e_2x4", "v6e_16x16"], (2, 4, 8))
    smoke = [(j.backend, j.target, j.n_devices) for j in jobs if j.profile == "smoke"]
    # The L4 at each count, the other GPUs at the largest, each TPU slice at its own chip count, and the CPU.
    assert [n for b, t, n in smoke if b == "gpu"] == [8, 2, 4, 8] and ("tpu", "v6e_16x16", 256) in smoke
    assert len(smoke) == 4 + 2 + 1 and ("tpu", "v5e_2x4", 8) in smoke
    alone = placement_report.jobs_for(["smoke"], ["h200"], (2, 4, 8))
    assert [j.n_devices for j in alone if j.backend == "gpu"] == [2, 4, 8]
    assert {(j.backend, j.target, j.n_devices) for j in jobs if j.profile == "full"} == set(placement_report.FULL_JOBS)
    gpus_only = placement_report.jobs_for(["smoke", "full"], ["h200", "l4"], (8,))
    assert not [j for j in gpus_only if j.backend == "tpu"]


def test_lesson_10s_jobs_take_the_8_chip_slice_and_no_tpu_at_the_full_profile():
    jobs = placement_report.lesson10_jobs(["smoke", "full"], ["h200", "v5e_2x4", "v6e_16x16"])
    assert {(j.backend, j.target, j.n_devices, j.profile) for j in jobs} == {
        ("gpu", "h200", 8, "smoke"),
        ("tpu", "v5e_2x4", 8, "smoke"),
        ("cpu", "cpu", 8, "smoke"),
        ("gpu", "h200", 8, "full"),
        ("cpu", "cpu", 8, "full"),
    }


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


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["--profile", "nosuch"], "--profile 'nosuch' is not a profile"),
        (["--target", "nosuch"], "Unknown target 'nosuch'"),
        (["--devices", "2,x"], "--devices takes GPU counts of 1 or more"),
        (["--devices", "0"], "--devices takes GPU counts of 1 or more"),
    ],
)
def test_a_bad_argument_is_refused_before_any_compile_and_nothing_is_written(argv, says, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(placement_report, "compile_in_parallel", lambda *a: pytest.fail("compiled before checking"))
    out = tmp_path / "placement.json"
    with pytest.raises(SystemExit) as exit_:
        placement_report.main([*argv, "--out", str(out)])
    assert exit_.value.code == 2 and says in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("where", ["folder", "under_a_file"])
def test_an_output_path_that_cannot_be_written_is_refused_before_any_compile(where, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(placement_report, "compile_in_parallel", lambda *a: pytest.fail("compiled before checking"))
    (tmp_path / "a_file").write_text("")
    out = tmp_path if where == "folder" else tmp_path / "a_file" / "placement.json"
    with pytest.raises(SystemExit):
        placement_report.main(["--profile", "smoke", "--out", str(out)])
    assert ("is a folder" if where == "folder" else "is a file") in capsys.readouterr().err


@pytest.mark.parametrize(
    ("flags", "says"),
    [
        ("\u2014xla_gpu_all_reduce_combine_threshold_bytes=4096", "an em dash"),
        ("--xla_gpu_all_reduce_combine_threshold_bytes=big", "--xla_gpu_all_reduce_combine_threshold_bytes"),
    ],
)
def test_make_placement_names_a_bad_xla_flags_token_before_any_compile(flags, says, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(placement_report, "compile_in_parallel", lambda *a: pytest.fail("compiled before checking"))
    monkeypatch.setenv("XLA_FLAGS", flags)
    monkeypatch.setenv("DPCOURSE_CACHE_DIR", str(tmp_path / "cache"))
    with pytest.raises(SystemExit) as exit_:
        placement_report.main(["--profile", "smoke", "--out", str(tmp_path / "placement.json")])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and says in err and err.count("\n") == 1, err
    assert not (tmp_path / "placement.json").exists()
