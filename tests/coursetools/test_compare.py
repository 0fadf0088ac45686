"""Tests of coursetools.compare: ``python -m coursetools compare OLD NEW`` on hand-written results files."""

from __future__ import annotations

import copy
import json
import re
import subprocess

import pytest

from coursetools import compare

CONTEXT = dict(
    profile="smoke",
    data_source="synthetic",
    backend="gpu",
    device_kind="NVIDIA L4",
    device_count=8,
    jax_version="0.10.2",
)


def rec(notebook, metric, value, unit, **overrides):
    return {"notebook": notebook, "metric": metric, "value": value, "unit": unit, **{**CONTEXT, **overrides}}


def nb(name, status="passed", error_cell=None, error=None):
    return {
        "notebook": name,
        "status": status,
        "wall_s": 1.5,
        "error_cell": error_cell,
        "error": error,
        "output": f"{name}.ipynb",
    }


def baseline() -> dict:
    """A passing run of three notebooks."""
    return {
        "schema": 1,
        "created": "2025-01-01T00:00:00+00:00",
        "profile": "smoke",
        "notebooks": [nb("02_baseline"), nb("04_sharding"), nb("06_pmap")],
        "records": [
            rec("02_baseline", "throughput", 1000.0, "examples/s", device_count=1),
            rec("02_baseline", "ms_per_step", 64.0, "ms", device_count=1),
            rec("02_baseline", "final_loss", 2.1, "loss", device_count=1),
            rec("04_sharding", "throughput", 900.0, "examples/s"),
            rec("04_sharding", "max_abs_param_diff_vs_1_device", 2e-7, "abs"),
            rec("04_sharding", "max_abs_param_diff_vs_1_device_tolerance", 1e-5, "abs"),
            rec("04_sharding", "collectives_per_step_jit", 3, "count"),
            rec("04_sharding", "mfu", None, "fraction"),
            rec("06_pmap", "max_abs_param_diff_vs_shard_map", 0.0, "abs"),
            rec("06_pmap", "max_abs_param_diff_vs_shard_map_tolerance", 1e-5, "abs"),
        ],
    }


def set_value(payload, notebook, metric, value):
    for r in payload["records"]:
        if r["notebook"] == notebook and r["metric"] == metric:
            r["value"] = value
            return payload
    raise KeyError(metric)


@pytest.fixture()
def write(tmp_path):
    def _write(name, payload):
        path = tmp_path / name
        path.write_text(json.dumps(payload) if not isinstance(payload, str) else payload)
        return path

    return _write


def run_main(write, old, new, capsys, **kwargs):
    code = compare.main(write("old.json", old), write("new.json", new), **kwargs)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_identical_runs_pass_and_show_every_metric(write, capsys):
    code, out, _ = run_main(write, baseline(), baseline(), capsys)
    assert code == 0
    for metric in (
        "throughput",
        "ms_per_step",
        "final_loss",
        "collectives_per_step_jit",
        "max_abs_param_diff_vs_1_device_tolerance",
        "max_abs_param_diff_vs_shard_map",
    ):
        assert metric in out
    assert "+0.0%" in out and "No regressions" in out
    assert "warning" not in out


def test_small_changes_within_threshold_pass(write, capsys):
    new = set_value(baseline(), "04_sharding", "throughput", 820.0)  # -8.9 %
    set_value(new, "02_baseline", "ms_per_step", 80.0)  # slower steps alone are not checked
    code, out, _ = run_main(write, baseline(), new, capsys)
    assert code == 0
    assert "-8.9%" in out


def test_throughput_drop_beyond_threshold_fails(write, capsys):
    new = set_value(baseline(), "04_sharding", "throughput", 800.0)  # -11.1 %
    code, out, _ = run_main(write, baseline(), new, capsys)
    assert code == 1
    assert "REGRESSION" in out and "04_sharding: throughput fell 11.1%" in out


def test_threshold_option_changes_the_verdict(write, capsys):
    new = set_value(baseline(), "04_sharding", "throughput", 800.0)
    assert run_main(write, baseline(), new, capsys, threshold=0.15)[0] == 0
    assert (
        run_main(write, baseline(), set_value(baseline(), "04_sharding", "throughput", 880.0), capsys, threshold=0.01)[
            0
        ]
        == 1
    )


def test_throughput_gain_passes(write, capsys):
    code, out, _ = run_main(write, baseline(), set_value(baseline(), "02_baseline", "throughput", 2000.0), capsys)
    assert code == 0 and "+100.0%" in out


def test_notebook_that_passed_and_now_fails_is_a_regression(write, capsys):
    new = baseline()
    new["notebooks"][2] = nb("06_pmap", "failed", error_cell=7, error="ValueError: pmap input has shape (64, 784)")
    new["records"] = [r for r in new["records"] if r["notebook"] != "06_pmap"]
    code, out, _ = run_main(write, baseline(), new, capsys)
    assert code == 1
    assert "06_pmap: passed in OLD, failed in NEW at cell 7: ValueError: pmap input" in out


def test_notebook_missing_from_new_is_a_regression(write, capsys):
    new = baseline()
    new["notebooks"] = new["notebooks"][:2]
    code, out, _ = run_main(write, baseline(), new, capsys)
    assert code == 1 and "06_pmap: passed in OLD, missing from NEW" in out


def test_notebook_failing_in_both_runs_only_warns(write, capsys):
    old, new = baseline(), baseline()
    old["notebooks"][2] = nb("06_pmap", "failed", 3, "boom")
    new["notebooks"][2] = nb("06_pmap", "failed", 3, "boom")
    code, out, _ = run_main(write, old, new, capsys)
    assert code == 0 and "06_pmap: failed in both runs" in out


def test_new_notebook_that_fails_is_a_regression(write, capsys):
    new = baseline()
    new["notebooks"].append(nb("07_sweep", "failed", 2, "KeyError"))
    code, out, _ = run_main(write, baseline(), new, capsys)
    assert code == 1 and "07_sweep: new in NEW and failed" in out


def test_equivalence_over_tolerance_fails(write, capsys):
    new = set_value(baseline(), "04_sharding", "max_abs_param_diff_vs_1_device", 3e-4)
    code, out, _ = run_main(write, baseline(), new, capsys)
    assert code == 1
    assert "04_sharding: max_abs_param_diff_vs_1_device = 0.0003 exceeds its tolerance 1e-05" in out


def test_equivalence_nan_fails(write, capsys):
    new = set_value(baseline(), "06_pmap", "max_abs_param_diff_vs_shard_map", "nan")
    code, out, _ = run_main(write, baseline(), new, capsys)
    assert code == 1 and "max_abs_param_diff_vs_shard_map = 'nan' is not a number" in out


def test_a_run_that_loosens_its_own_tolerance_is_held_to_old_s_on_the_same_hardware(write, capsys):
    new = set_value(baseline(), "04_sharding", "max_abs_param_diff_vs_1_device", 3e-4)
    set_value(new, "04_sharding", "max_abs_param_diff_vs_1_device_tolerance", 1.0)
    code, out, _ = run_main(write, baseline(), new, capsys)
    assert code == 1 and "exceeds its tolerance 1e-05" in out and "held to OLD's" in " ".join(out.split())
    for r in new["records"]:  # on other hardware, NEW's own bound
        r.update(device_kind="NVIDIA H100 80GB HBM3")
    assert run_main(write, baseline(), new, capsys)[0] == 0


def test_equivalence_without_tolerance_warns(write, capsys):
    old, new = baseline(), baseline()
    for payload in (old, new):
        payload["records"] = [r for r in payload["records"] if not r["metric"].endswith("_tolerance")]
    code, out, _ = run_main(write, old, new, capsys)
    assert code == 0
    assert "no numeric 'max_abs_param_diff_vs_1_device_tolerance' record" in out


def test_different_hardware_warns_but_passes(write, capsys):
    new = baseline()
    for r in new["records"]:
        r.update(backend="gpu", device_kind="NVIDIA H100 80GB HBM3", device_count=1 if r["device_count"] == 1 else 2)
        r["jax_version"] = "0.11.0"
    set_value(new, "04_sharding", "throughput", 300.0)  # -67 %, but on other hardware
    code, out, _ = run_main(write, baseline(), new, capsys)
    assert code == 0
    assert "Different hardware" in out and "NVIDIA H100" in out
    assert "not comparable" in out and "REGRESSION" not in out
    assert "JAX version: OLD 0.10.2; NEW 0.11.0" in out  # information only


def test_different_profile_and_data_source_warn(write, capsys):
    new = baseline()
    new["profile"] = "cpu"
    for r in new["records"]:
        r.update(profile="cpu", data_source="real")
    code, out, _ = run_main(write, baseline(), new, capsys)
    assert code == 0
    assert "Different profiles: OLD smoke; NEW cpu" in out
    assert "Different data sources: OLD synthetic; NEW real" in out


def test_profile_comes_from_the_records_and_else_from_the_run(write, capsys):
    old, new = baseline(), baseline()
    new["profile"] = "auto"  # the records say which profile the notebooks used
    assert "Different profiles" not in run_main(write, old, new, capsys)[1]
    old["records"], new["records"] = [], []
    old["profile"], new["profile"] = "smoke", "cpu"
    code, out, _ = run_main(write, old, new, capsys)
    assert code == 0 and "Different profiles: OLD smoke; NEW cpu" in out


def test_jax_upgrade_on_the_same_hardware_still_fails_on_a_drop(write, capsys):
    new = set_value(baseline(), "04_sharding", "throughput", 500.0)
    for r in new["records"]:
        r["jax_version"] = "0.11.0"
    code, out, _ = run_main(write, baseline(), new, capsys)
    assert code == 1 and "JAX version" in out


def test_metric_missing_from_a_passing_notebook_warns(write, capsys):
    new = baseline()
    new["records"] = [r for r in new["records"] if r["metric"] != "final_loss"]
    code, out, _ = run_main(write, baseline(), new, capsys)
    assert code == 0 and "02_baseline: final_loss recorded in OLD, not in NEW" in out
    assert "—" in out  # absent, unlike a recorded None (n/a)


def test_repeated_metrics_are_matched_in_order():
    old, new = baseline(), baseline()
    for payload, values in ((old, (100.0, 200.0)), (new, (100.0, 100.0))):
        payload["records"] += [rec("07_sweep", "throughput", v, "examples/s") for v in values]
        payload["notebooks"].append(nb("07_sweep"))
    result = compare.compare(old, new)
    rows = {(r.notebook, r.metric): r for r in result.rows}
    assert rows[("07_sweep", "throughput")].change == 0.0
    assert rows[("07_sweep", "throughput #2")].change == -0.5
    assert result.exit_code == 1


def test_non_numeric_values_are_shown_without_a_change():
    old, new = baseline(), baseline()
    set_value(new, "02_baseline", "final_loss", "nan")
    result = compare.compare(old, new)
    row = next(r for r in result.rows if r.metric == "final_loss")
    assert (row.old, row.new, row.change) == (2.1, "nan", None)
    assert next(r for r in result.rows if r.metric == "mfu").change is None  # None in both


@pytest.mark.parametrize(
    "content, match",
    [
        (None, "no such file"),
        ("{not json", "not valid JSON"),
        ("[]", "expected a JSON object"),
        (json.dumps({"schema": 2, "notebooks": [], "records": []}), "schema 2"),
        (json.dumps({"schema": 1, "notebooks": {}, "records": []}), r"notebooks: \{\} is not of type 'array'"),
        (json.dumps({"schema": 1, "notebooks": [{"notebook": "x"}], "records": []}), r"notebooks\[0\]: 'status' is"),
        (json.dumps({"schema": 1, "notebooks": [], "records": [{"metric": "m"}]}), r"records\[0\]: 'notebook' is"),
        # Fields of the wrong type: one sentence each, never a traceback.
        (
            json.dumps({"schema": 1, "notebooks": [], "records": [rec(1, 2, 3, 4)]}),
            r"records\[0\]\.\w+: \d is not of type 'string'",
        ),
        (
            json.dumps({"schema": 1, "notebooks": [nb(["x"])], "records": []}),
            r"notebooks\[0\]\.notebook: \['x'\] is not",
        ),
        (
            json.dumps({"schema": 1, "notebooks": [nb("a", "failed", "x")], "records": []}),
            r"notebooks\[0\]\.error_cell",
        ),
        (json.dumps({**baseline(), "records": [rec("a", "m", 1, "s", device_count=[1])]}), r"device_count: \[1\]"),
    ],
)
def test_bad_file_exits_2_naming_it(write, tmp_path, capsys, content, match):
    good = write("good.json", baseline())
    bad = tmp_path / "bad.json" if content is None else write("bad.json", content)
    for old, new in ((bad, good), (good, bad)):
        code = compare.main(old, new)
        err = capsys.readouterr().err
        assert code == 2
        assert str(bad) in err and "Traceback" not in err and err.count("\n") == 1
        assert re.search(match, err), err


def test_folder_instead_of_a_file_exits_2(write, tmp_path, capsys):
    assert compare.main(tmp_path, write("r.json", baseline())) == 2
    err = capsys.readouterr().err
    assert str(tmp_path) in err and "cannot read" in err


def test_negative_threshold_exits_2(write, capsys):
    path = write("r.json", baseline())
    assert compare.main(path, path, threshold=-0.1) == 2
    assert "--threshold" in capsys.readouterr().err
    with pytest.raises(ValueError):
        compare.compare(baseline(), baseline(), threshold=-1)


def test_inputs_are_not_modified():
    old, new = baseline(), set_value(baseline(), "04_sharding", "throughput", 1.0)
    old_copy, new_copy = copy.deepcopy(old), copy.deepcopy(new)
    compare.compare(old, new)
    assert (old, new) == (old_copy, new_copy)


@pytest.mark.slow
def test_command_line(write, python_exe):
    old = write("old.json", baseline())
    new = write("new.json", set_value(baseline(), "04_sharding", "throughput", 100.0))
    ok = subprocess.run(
        [python_exe, "-m", "coursetools", "compare", str(old), str(old)], capture_output=True, text=True
    )
    assert ok.returncode == 0, ok.stderr
    bad = subprocess.run(
        [python_exe, "-m", "coursetools", "compare", str(old), str(new), "--threshold", "0.5"],
        capture_output=True,
        text=True,
    )
    assert bad.returncode == 1 and "throughput fell 88.9%" in bad.stdout


def test_a_throughput_drop_on_cpu_devices_warns_but_does_not_fail(write, capsys):
    # Simulated CPU devices share busy cores: runs of one commit differ by tens of percent.
    old = baseline()
    for r in old["records"]:
        r.update(backend="cpu", device_kind="cpu")
    new = copy.deepcopy(old)
    set_value(new, "04_sharding", "throughput", 500.0)  # -44 %
    code, out, _ = run_main(write, old, new, capsys)
    assert code == 0
    assert "too noisy to count as a regression" in out


def test_metrics_only_in_new_are_reported(write, capsys):
    new = baseline()
    new["records"].append(rec("04_sharding", "max_abs_grad_diff_vs_1_device", 1e-9, "abs"))
    new["records"].append(rec("04_sharding", "max_abs_grad_diff_vs_1_device_tolerance", 1e-6, "abs"))
    code, out, _ = run_main(write, baseline(), new, capsys)
    assert code == 0
    assert "04_sharding: 2 metrics are new in NEW" in out and "max_abs_grad_diff_vs_1_device," in out


def test_many_new_metrics_give_one_note_per_notebook(write, capsys):
    new = baseline()
    for i in range(30):
        new["records"].append(rec("09_performance", f"rung_{i}_compile_time", 1.0, "s"))
    code, out, _ = run_main(write, baseline(), new, capsys)
    assert code == 0
    flat = " ".join(out.split())  # rich may fold a long note
    assert flat.count("new in NEW") == 1 and "30 metrics are new in NEW" in flat and "26 more, see the table" in flat


def test_any_metric_with_a_tolerance_sibling_is_checked(write, capsys):
    new = baseline()
    new["records"].append(rec("08_multihost", "rel_grad_diff_vs_single_process", 0.5, "ratio"))
    new["records"].append(rec("08_multihost", "rel_grad_diff_vs_single_process_tolerance", 1e-4, "ratio"))
    code, out, _ = run_main(write, baseline(), new, capsys)
    assert code == 1 and "rel_grad_diff_vs_single_process = 0.5 exceeds" in out


def test_a_throughput_that_disappears_or_is_nan_is_a_regression(write, capsys):
    new = baseline()
    new["records"] = [r for r in new["records"] if not (r["notebook"] == "04_sharding" and r["metric"] == "throughput")]
    code, out, _ = run_main(write, baseline(), new, capsys)
    assert code == 1 and "missing in NEW" in out
    new = set_value(baseline(), "04_sharding", "throughput", "nan")
    code, out, _ = run_main(write, baseline(), new, capsys)
    assert code == 1


def test_a_change_in_the_collectives_warns(write, capsys):
    new = set_value(baseline(), "04_sharding", "collectives_per_step_jit", 17)
    code, out, _ = run_main(write, baseline(), new, capsys)
    assert code == 0 and "collectives moved" in out


# --- notebook 09's records: rung status, throughput, checks and targets ---


def ladder_run(status="ok", fraction=0.55, backend="gpu", loss_diff=0.003, tolerance_name="median"):
    """A run of notebook 09 with one rung, its check and a target; ``tolerance_name="max"``: as recorded before the rename."""
    payload = baseline()
    payload["notebooks"].append(nb("09_performance"))
    ctx = dict(device_count=1, backend=backend)
    payload["records"] += [
        rec("09_performance", "rung_unrolled_bf16_status", status, "status", **ctx),
        rec("09_performance", "max_abs_loss_diff_bf16_vs_f32", 0.3, "loss", **ctx),  # one step, reported only
        rec("09_performance", "median_abs_loss_diff_bf16_vs_f32", loss_diff, "loss", **ctx),
        rec("09_performance", f"{tolerance_name}_abs_loss_diff_bf16_vs_f32_tolerance", 0.04, "loss", **ctx),
        rec("09_performance", "best_bf16_fraction_of_measured_ceiling", fraction, "fraction", **ctx),
        rec("09_performance", "best_bf16_fraction_of_measured_ceiling_target", 0.5, "fraction", **ctx),
    ]
    if status == "ok":
        payload["records"].append(rec("09_performance", "rung_unrolled_bf16_throughput", 4.4e5, "examples/s", **ctx))
    return payload


def test_ladder_records_of_two_good_runs_pass(write, capsys):
    code, out, _ = run_main(write, ladder_run(), ladder_run(), capsys)
    assert code == 0 and "rung_unrolled_bf16_status" in out and "below its target" not in out


def test_a_rung_that_ran_and_now_fails_is_a_regression(write, capsys):
    new = ladder_run(status="failed: RuntimeError: RESOURCE_EXHAUSTED: out of memory")
    code, out, _ = run_main(write, ladder_run(), new, capsys)
    assert code == 1
    assert "rung_unrolled_bf16_status was ok in OLD" in out and "RESOURCE_EXHAUSTED" in out
    assert "rung_unrolled_bf16_throughput was measured in OLD and is missing in NEW" in out


def test_a_rung_failing_on_other_hardware_only_warns(write, capsys):
    new = ladder_run(status="failed: no bfloat16")
    for r in new["records"]:
        r["device_kind"] = "NVIDIA L4"  # same as OLD ...
        r["profile"] = "cpu"  # ... but another profile: not comparable
    code, out, _ = run_main(write, ladder_run(), new, capsys)
    assert code == 0 and "other hardware or profile" in out


def test_a_rung_that_now_runs_passes(write, capsys):
    code, _, _ = run_main(write, ladder_run(status="failed: x"), ladder_run(), capsys)
    assert code == 0


def test_bf16_loss_beyond_its_tolerance_fails(write, capsys):
    code, out, _ = run_main(write, ladder_run(), ladder_run(loss_diff=0.5), capsys)
    assert code == 1 and "median_abs_loss_diff_bf16_vs_f32 = 0.5 exceeds its tolerance 0.04" in out
    assert "REGRESSIONS (1)" in out  # the largest difference (one step) has no tolerance: reported, not failed


@pytest.mark.parametrize("old_name", ["max", "median"])
def test_the_median_s_tolerance_is_read_under_its_old_name_too(write, capsys, old_name):
    """Runs before the rename recorded the median's tolerance under the max's name; it still checks the median."""
    code, out, _ = run_main(write, ladder_run(tolerance_name=old_name), ladder_run(loss_diff=0.5), capsys)
    assert code == 1 and "median_abs_loss_diff_bf16_vs_f32 = 0.5 exceeds its tolerance 0.04" in out
    code, out, _ = run_main(write, ladder_run(tolerance_name=old_name), ladder_run(tolerance_name=old_name), capsys)
    assert code == 0 and "median_abs_loss_diff_bf16_vs_f32_tolerance" in out


def elastic_run(preempted=3.4e-8, survivors=3.4e-8, tolerances=True):
    """A run of lesson 13: its two parameter differences, with their tolerances or (as before they were recorded) without."""
    payload = baseline()
    payload["notebooks"].append(nb("13_elastic"))
    ctx = dict(device_count=3, backend="cpu", device_kind="cpu")
    for name, value in (("preempted_resume", preempted), ("survivors", survivors)):
        payload["records"].append(rec("13_elastic", f"{name}_max_abs_param_diff", value, "abs", **ctx))
        if tolerances:
            payload["records"].append(rec("13_elastic", f"{name}_max_abs_param_diff_tolerance", 1e-5, "abs", **ctx))
    return payload


@pytest.mark.parametrize(
    ("new", "said"),
    [
        (elastic_run(survivors=0.5), "13_elastic: survivors_max_abs_param_diff = 0.5 exceeds its tolerance 1e-05"),
        (elastic_run(preempted="nan"), "13_elastic: preempted_resume_max_abs_param_diff = 'nan' is not a number"),
        (elastic_run(preempted="nan", tolerances=False), "preempted_resume_max_abs_param_diff = 'nan' is not a number"),
    ],
)
def test_lesson_13_s_differences_are_checked_against_their_tolerances(write, capsys, new, said):
    code, out, _ = run_main(write, elastic_run(tolerances=False), new, capsys)
    assert code == 1 and said in out
    code, out, _ = run_main(write, elastic_run(), new, capsys)  # OLD's tolerance serves a NEW run without one
    assert code == 1 and said.split(" = ")[0] in out


def test_a_figure_below_its_target_warns_on_a_gpu_and_informs_on_a_cpu(write, capsys):
    code, out, _ = run_main(write, ladder_run(), ladder_run(fraction=0.47), capsys)
    assert code == 0 and "warning" in out and "below its target 0.5" in out
    code, out, _ = run_main(write, ladder_run(backend="cpu"), ladder_run(fraction=0.47, backend="cpu"), capsys)
    assert code == 0 and "the target is set for GPUs" in out


# ---------------------------------------------------------------------------
# The committed GPU baseline (baselines/h200-full-jax0.11.2.json, a real run on
# one H200; see baselines/README.md). gpu.yml compares every GPU run with it.
# ---------------------------------------------------------------------------

from pathlib import Path  # noqa: E402

H200_BASELINE = Path(__file__).resolve().parents[2] / "baselines" / "h200-full-jax0.11.2.json"


@pytest.fixture()
def h200() -> dict:
    return compare.load_results(H200_BASELINE)


def test_h200_baseline_is_a_full_gpu_run_of_every_notebook(h200):
    assert h200["profile"] == "full"
    lessons = ["01_setup", "02_baseline", "03_mesh", "04_sharding", "05_shard_map", "06_pmap", "07_sweep"]
    assert [n["notebook"] for n in h200["notebooks"]] == lessons + ["08_multihost"]
    assert all(n["status"] == "passed" for n in h200["notebooks"])
    gpu = {(r["notebook"], r["metric"]) for r in h200["records"] if r["backend"] == "gpu"}
    assert ("02_baseline", "throughput") in gpu
    assert next(r for r in h200["records"] if r["metric"] == "throughput")["device_kind"] == "NVIDIA H200"


@pytest.mark.parametrize(
    "path", sorted(p for p in H200_BASELINE.parent.glob("*.json") if p.name != "timings.json"), ids=lambda p: p.name
)
def test_every_committed_baseline_compared_with_itself_passes(path):
    result = compare.compare(compare.load_results(path), compare.load_results(path))
    assert result.exit_code == 0, result.failures
    assert not [r for r in result.rows if r.check == "REGRESSION"]


def test_h200_gpu_throughput_drop_is_a_regression(h200):
    new = set_value(copy.deepcopy(h200), "02_baseline", "throughput", 0.8 * 92411.35741358409)
    result = compare.compare(h200, new)
    assert result.exit_code == 1
    assert any("02_baseline: throughput fell 20.0%" in line for line in result.failures)


def test_h200_cpu_device_throughput_drop_only_warns(h200):
    # 04 ran on 8 simulated CPU devices beside the GPU (one GPU): a drop there is noise, not a verdict.
    new = set_value(copy.deepcopy(h200), "04_sharding", "throughput", 20000.0)
    result = compare.compare(h200, new)
    assert result.exit_code == 0
    assert any("04_sharding" in line for line in result.warnings)


def test_h200_failed_lesson_and_broken_equivalence_are_regressions(h200):
    new = copy.deepcopy(h200)
    (entry,) = [n for n in new["notebooks"] if n["notebook"] == "06_pmap"]
    entry.update(status="failed", error_cell=5, error="ValueError: pmap")
    new["records"] = [r for r in new["records"] if r["notebook"] != "06_pmap"]
    set_value(new, "08_multihost", "max_abs_param_diff_vs_single_process", 1e-3)
    result = compare.compare(h200, new)
    assert result.exit_code == 1
    text = "\n".join(result.failures)
    assert "06_pmap: passed in OLD, failed in NEW" in text
    assert "08_multihost: max_abs_param_diff_vs_single_process = 0.001 exceeds its tolerance 1e-05" in text


@pytest.mark.slow
def test_gpu_workflow_command_on_the_h200_baseline(python_exe, tmp_path):
    """The command .github/workflows/gpu.yml runs, with the baseline as both files and with a slower run."""
    ok = subprocess.run(
        [python_exe, "-m", "coursetools", "compare", str(H200_BASELINE), str(H200_BASELINE)],
        capture_output=True,
        text=True,
    )
    assert ok.returncode == 0, ok.stdout + ok.stderr
    slower = set_value(compare.load_results(H200_BASELINE), "02_baseline", "throughput", 50000.0)
    path = tmp_path / "results.json"
    path.write_text(json.dumps(slower))
    bad = subprocess.run(
        [python_exe, "-m", "coursetools", "compare", str(H200_BASELINE), str(path)], capture_output=True, text=True
    )
    assert bad.returncode == 1 and "02_baseline: throughput fell 45.9%" in bad.stdout


def test_the_comparison_prints_without_rich(write, capsys, monkeypatch):
    """the course's own reporting works with the minimum install."""
    import sys

    for name in ("rich", "rich.console", "rich.markup", "rich.table"):
        monkeypatch.setitem(sys.modules, name, None)
    new = set_value(baseline(), "04_sharding", "throughput", 800.0)  # -11.1 %
    code, out, _ = run_main(write, baseline(), new, capsys)
    assert code == 1 and "REGRESSIONS (1)" in out and "04_sharding: throughput fell 11.1%" in out


def test_every_difference_a_lesson_records_has_its_tolerance_recorded_beside_it():
    """``compare`` checks a difference against its ``_tolerance`` record: a lesson that records none goes unchecked."""
    lessons = sorted((H200_BASELINE.parents[1] / "notebooks").glob("[0-9][0-9]_*.py"))
    unchecked = []
    for path in lessons:
        text = path.read_text(encoding="utf-8")
        recorded = r'(?:record\(\s*f?"({n})"|"({n})":\s*\(|\["({n})"\]\s*=)'.format(
            n=r"[A-Za-z0-9_{}]*max_abs[A-Za-z0-9_{}]*"
        )
        # a name recorded (record.record, a figures dict's key, figs[...] =), not one read from a row
        for name in sorted({m for groups in re.findall(recorded, text) for m in groups if m}):
            reported = (path.stem, name) in compare.REPORTED_ONLY
            if not name.endswith("_tolerance") and f'"{name}_tolerance"' not in text and not reported:
                unchecked.append(f"{path.name}: {name}")
    assert len(lessons) >= 13 and not unchecked
