"""Tests of dpcourse.perf.report: its tables record every figure, failures with reasons (sentences: stored-runs test)."""

from types import SimpleNamespace

import pytest

from dpcourse import bench, record
from dpcourse.config import make_config
from dpcourse.perf import ceilings, ladder, report

CFG = make_config("smoke")
RUNGS = ladder.default_rungs(CFG)
MEASURED = {
    "float32 highest": ceilings.Ceiling("float32 highest", "ok", 1e10, size=128),
    "float32 default": ceilings.Ceiling("float32 default", "ok", 2e10, size=128),
    "bfloat16": ceilings.Ceiling("bfloat16", "failed", reason="NotImplementedError: no bf16 here"),
    "memory bandwidth": ceilings.Ceiling("memory bandwidth", "ok", 5e9),
}


def _ok(rung, ms):
    result = bench.BenchResult(rung.label, 1, rung.global_batch, 1.0, ms, rung.global_batch / ms * 1e3, 2.3, 0.1)
    return ladder.RungResult(rung, "ok", result=result)


def test_failures_are_recorded_with_their_reasons_and_the_checks_say_why_they_could_not_run(tmp_path):
    record.enable(tmp_path / "records.jsonl")
    record.set_context(
        "09_performance", profile="smoke", data_source="synthetic", backend="cpu", device_kind="cpu", device_count=1
    )
    try:
        runs = [ladder.RungResult(RUNGS[0], "failed", "XlaRuntimeError: RESOURCE_EXHAUSTED: injected")]
        runs += [_ok(RUNGS[2], 0.5)]
        report.ceiling_table(MEASURED, None, "cpu", "cpu").show()
        part = report.ladder_table(runs, CFG, MEASURED, "cpu", "the ladder").show()
        checks = report.float32_checks(runs, CFG, SimpleNamespace(platform="cpu"), {}, [])
    finally:
        record.disable()
    got = {r["metric"]: r["value"] for r in record.read_records(tmp_path / "records.jsonl")}
    assert got["rung_scan_f32_status"] == "failed: XlaRuntimeError: RESOURCE_EXHAUSTED: injected"
    assert got["rung_unrolled_f32_status"] == "ok" and got["best_rung"] == "unrolled_f32"
    assert got["ceiling_bfloat16_status"] == "failed: NotImplementedError: no bf16 here"
    assert "rung_scan_f32_throughput" not in got and "ceiling_bfloat16" not in got
    assert part.lines[0].startswith("scan_f32: ")
    assert checks.lines[0].startswith("scan_f32, the reference of these checks, failed (XlaRuntimeError")


def test_a_step_below_its_roofline_bound_stops_the_lesson_on_an_accelerator_only():
    fast = [_ok(RUNGS[2], 1e-6)]
    part = report.budget_table(fast, CFG, MEASURED, "cpu")
    assert "best measured 0.00 ms >= roofline bound" in part.lines[0] and part.lines[0].endswith("False")
    with pytest.raises(AssertionError, match="below its roofline bound"):
        report.budget_table(fast, CFG, MEASURED, "gpu")
