"""Tests of coursetools.overlap_report: the overlap table of make placement and the check that fails when a fraction moves."""

from __future__ import annotations

from coursetools import overlap_report
from dpcourse.cross_compile import compile as gpu_compile
from dpcourse.cross_compile import result


def rec(step, target="h200", fraction=0.0, version="0.10.2", **extra):
    return {
        "backend": "gpu",
        "target": target,
        "target_label": {"h200": "H200", "l4": "L4 (approximate)"}.get(target, target),
        "n_devices": 8,
        "profile": "smoke",
        "step": step,
        "overlapped_fraction": fraction,
        "windows_with_compute": 0 if not fraction else 3,
        "collectives": 1 if step == "jit" else 4,
        "scheduler_ran": target != "l4",
        "jax_version": version,
        "error": None,
        **extra,
    }


def test_records_carry_the_schedule_of_gpu_compiles_only():
    summary = {"overlapped_fraction": 0.5, "windows_with_compute": 2, "sync_collectives": 1}
    step = gpu_compile.StepResult("jit", "b", schedule=summary, scheduler_ran=True)
    gpu = gpu_compile.CompileResult("gpu", "h200", 8, "smoke", target_label="H200", steps={"jit": step})
    cpu = gpu_compile.CompileResult("cpu", "cpu", 8, "smoke", target_label="CPU", steps={"jit": step})
    (g,) = result.records([gpu])
    (c,) = result.records([cpu])
    assert (g["overlapped_fraction"], g["windows_with_compute"], g["scheduler_ran"]) == (0.5, 2, True)
    assert c["overlapped_fraction"] is None  # the CPU program is not scheduled: no windows to read


def test_the_table_has_one_row_per_form_and_a_column_per_gpu():
    recs = [rec("jit"), rec("jit", "l4"), rec("small_threshold", fraction=0.9492), rec("jit", "h200", n_devices=2)]
    rows = overlap_report.table_rows(recs)
    assert [r["form"] for r in rows] == ["plain", "small_threshold"]
    assert rows[0]["H200"] == "0.00 (0/1, LHS yes)"
    assert rows[0]["L4 (approximate)"] == "0.00 (0/1, LHS no)"
    assert rows[1]["H200"] == "0.95 (3/4, LHS yes)"


def test_check_passes_as_taught_and_names_a_fraction_that_moved():
    taught = [
        rec("jit"),
        rec("small_threshold", fraction=0.9492),
        rec("small_threshold", fraction=0.0536, version="0.12.0.1"),
    ]
    assert overlap_report.check(taught) == []
    moved = overlap_report.check([rec("jit", fraction=0.4)])
    assert len(moved) == 1 and "plain" in moved[0] and "from 0.0 to 0.4" in moved[0]
    assert overlap_report.check([rec("jit", fraction=None)])  # a schedule that could not be read is a change too


def test_forms_without_an_expectation_other_profiles_and_failed_compiles_are_not_judged():
    assert overlap_report.check([rec("jit", version="0.13.0", fraction=0.7)]) == []
    assert overlap_report.check([rec("jit", fraction=0.7, profile="full")]) == []
    assert overlap_report.check([rec("jit", fraction=None, error="no devices")]) == []
    assert overlap_report.check([{**rec("jit", fraction=0.7), "backend": "cpu"}]) == []


def test_overlap_jobs_compile_the_two_extra_steps_on_8_gpus_of_each_target():
    jobs = overlap_report.jobs(["smoke", "full"], ["h200", "l4"])
    assert [(j.target, j.n_devices, j.profile) for j in jobs] == [("h200", 8, "smoke"), ("l4", 8, "smoke")]
    assert overlap_report.jobs(["full"], ["h200"]) == []
    assert set(overlap_report.EXTRA_STEPS) == {"small_threshold", "o1"}


def test_docs_gpu_md_shows_the_fractions_the_check_expects():
    """docs/gpu.md's overlap table is prose beside make placement's check: the two must not drift apart."""
    import re
    from pathlib import Path

    text = (Path(__file__).resolve().parents[2] / "docs" / "gpu.md").read_text()
    labels = {
        "plain `jit` step": "plain",
        "combine threshold 4,096 bytes": "small_threshold",
        '`optimization_level="O1"`': "o1",
        "FSDP, gathered once": "fsdp_gathered",
        "accumulation, reduced": "accum_reduced",
    }
    seen = set()
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip("|").split("|")]
        if cells[0] not in labels:
            continue
        form = labels[cells[0]]
        for target, cell in zip(("h100_sxm", "h200", "l4"), cells[1:], strict=True):
            first = float(re.match(r"([\d.]+)", cell).group(1))
            later = re.search(r"0\.12: ([\d.]+)", cell)
            assert first == round(overlap_report.EXPECTED[(form, target, "0.10")], 2), (form, target, cell)
            newer = float(later.group(1)) if later else first
            assert newer == round(overlap_report.EXPECTED[(form, target, "0.12")], 2), (form, target, cell)
            seen.add(form)
    assert seen == set(labels.values()), "docs/gpu.md lost a row of the overlap table"


def test_the_stored_overlap_compiles_read_as_taught_and_hold_every_form_the_lesson_reads():
    """What notebook 09 shows without the extra: the stored schedules give the fractions EXPECTED holds."""
    from dpcourse.compiled import schedule
    from dpcourse.cross_compile import notebook

    results, texts = notebook.stored_overlap("smoke")
    assert (
        {(r.target, name) for r in results for name in r.steps}
        == {(t, f) for t, forms in overlap_report.LESSON_FORMS.items() for f in forms}
        == set(texts)
    )
    for (target, form), text in texts.items():
        version = overlap_report._minor(results[0].jax_version)
        got = schedule.read_schedule(text, overlap_report.DEVICES).overlapped_fraction or 0.0
        assert abs(got - overlap_report.EXPECTED[form, target, version]) <= overlap_report.TOLERANCE, (target, form)
        assert "metadata=" not in text


def test_strip_metadata_removes_only_the_metadata():
    line = '  %a = f32[4]{0} add(f32[4]{0} %x, f32[4]{0} %y), metadata={op_name="jit(f)/add" source_file="/x.py"}'
    assert overlap_report.strip_metadata(line) == "  %a = f32[4]{0} add(f32[4]{0} %x, f32[4]{0} %y)"
