"""dpcourse.cross_compile.result: the one result type of every compile backend, its records and table rows."""

from __future__ import annotations

import json
from dataclasses import asdict

import pytest

from dpcourse.cross_compile.result import RESULT_PREFIX, CompileResult, StepResult, records, table_rows


def result(backend: str, target: str, n: int, **kw) -> CompileResult:
    step = StepResult("jit", "dpcourse.cross_compile.steps:jit_step", count=1, runs_per_step=1, bytes_per_step=64)
    label = {"gpu": "H200", "tpu": "TPU v5e 2x4", "cpu": "CPU", "mocked": f"mocked GPU ({target})"}[backend]
    return CompileResult(backend, target, n, "smoke", label, steps={"jit": step}, jax_version="0.10.2", **kw)


@pytest.mark.parametrize(
    "res, label, platform",
    [
        (result("gpu", "h200", 8, deviceless=True), "compiled for 8 x H200 without a GPU", "gpu"),
        (result("cpu", "cpu", 8), "compiled for 8 simulated CPU devices", "cpu"),
        (result("tpu", "v5e_2x4", 8, deviceless=True), "compiled for 8 x TPU v5e (2x4 slice) without a TPU", "tpu"),
        (
            result("tpu", "v5e_2x4", 8, deviceless=True, stored="make placement, 2026-12-06"),
            "compiled for 8 x TPU v5e (2x4 slice) without a TPU, stored (make placement, 2026-12-06, JAX 0.10.2)",
            "tpu",
        ),
        (
            result("mocked", "1x2x1", 2, device_kind="NVIDIA L4"),
            "compiled for 2 mocked GPUs (topology 1x2x1, NVIDIA L4) on a GPU",
            "gpu",
        ),
        (
            result("gpu", "h200", 8, deviceless=True, stored="make placement, 2026-12-03"),
            "compiled for 8 x H200 without a GPU, stored (make placement, 2026-12-03, JAX 0.10.2)",
            "gpu",
        ),
    ],
)
def test_every_backend_says_where_it_was_compiled_for(res, label, platform):
    assert res.label == label and res.platform == platform


def test_a_result_round_trips_through_its_line_and_a_broken_one_is_refused():
    res = result("gpu", "h200", 8, deviceless=True, stored="make placement, 2026-12-03")
    line = res.to_line()
    assert line.startswith(RESULT_PREFIX)
    assert CompileResult.from_dict(json.loads(line[len(RESULT_PREFIX) :])) == res
    with pytest.raises(ValueError, match="Not a compile result"):
        CompileResult.from_dict({**asdict(res), "colour": "blue"})


def test_records_and_rows_name_each_backend_and_say_what_failed():
    failed = CompileResult("mocked", "1x8x1", 8, "smoke", "mocked GPU (1x8x1)", error="no GPU")
    recs = records([result("cpu", "cpu", 8), failed])
    assert [(r["backend"], r["step"], r["error"]) for r in recs] == [("cpu", "jit", None), ("mocked", None, "no GPU")]
    assert "stored" not in recs[0]  # placement.json keeps its fields
    rows = table_rows(recs)
    assert rows[0]["compiled for"] == "8 x CPU (simulated)" and rows[0]["bytes per step"] == "64"
    assert rows[1] == {
        "backend": "mocked",
        "compiled for": "8 x mocked GPU (1x8x1)",
        "profile": "smoke",
        "step": "(not compiled)",
        "collectives": "no GPU",
    }
