"""Notebook 09 with failing rungs and a failing ceiling: it goes on, records each failure with its reason, says why a check could not run."""

from __future__ import annotations

import json
from pathlib import Path

import jupytext
import nbformat
import pytest

from coursetools import runner

ROOT = Path(__file__).resolve().parents[2]
ANCHOR = "single = measurement_device(PROFILE)\n"
# Injected right after the notebook picks its device: the default rung (the
# reference of the correctness checks), a bfloat16 rung and the large-batch
# rung fail as an out-of-memory would, and the bfloat16 ceiling fails as on
# a backend without bfloat16 matmuls.
INJECTED = """
SCHEDULES = False  # section 8's GPU schedules have tests of their own
_real_run_rung = ladder.run_rung
def _failing_run_rung(rung, *args, **kwargs):
    if rung.name == "scan_f32" or rung.name == "scan_bf16" or rung.name.startswith("unrolled_bf16_batch"):
        return ladder.RungResult(rung, "failed", "XlaRuntimeError: RESOURCE_EXHAUSTED: injected by the test")
    return _real_run_rung(rung, *args, **kwargs)
ladder.run_rung = _failing_run_rung
_real_measure_all = ceilings.measure_all
def _measure_all(*args, **kwargs):
    out = _real_measure_all(*args, **kwargs)
    out["bfloat16"] = ceilings.Ceiling("bfloat16", "failed", reason="NotImplementedError: injected by the test")
    return out
ceilings.measure_all = _measure_all
"""


@pytest.mark.slow
@pytest.mark.lesson
@pytest.mark.timeout(600)
def test_failed_rungs_and_ceilings_are_recorded_with_reasons_and_the_lesson_goes_on(tmp_path):
    source = (ROOT / "notebooks" / "09_performance.py").read_text()
    assert source.count(ANCHOR) == 1
    nb = jupytext.reads(source.replace(ANCHOR, ANCHOR + INJECTED), fmt="py:percent")
    path = tmp_path / "09_performance.ipynb"
    nbformat.write(nb, path)
    out = tmp_path / "out"
    out.mkdir()
    records_file = out / "records.jsonl"

    run = runner.run_notebook(path, out, records_file, profile="smoke", cell_timeout_s=300)

    assert run.status == "passed", run.error
    records = {r["metric"]: r["value"] for r in map(json.loads, records_file.read_text().splitlines())}
    for name in ("scan_f32", "scan_bf16"):
        assert records[f"rung_{name}_status"] == "failed: XlaRuntimeError: RESOURCE_EXHAUSTED: injected by the test"
    assert records["rung_unrolled_f32_status"] == "ok"
    assert records["ceiling_bfloat16_status"] == "failed: NotImplementedError: injected by the test"
    assert records["ceiling_float32_default_status"] == "ok"
    executed = nbformat.read(out / path.name, as_version=4)
    text = "".join(
        "".join(o.get("text", "")) for c in executed.cells if c.cell_type == "code" for o in c.get("outputs", [])
    )
    assert "scan_f32, the reference of these checks, failed" in text
