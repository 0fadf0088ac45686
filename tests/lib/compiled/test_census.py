"""Tests of dpcourse.compiled.census: collectives per kind and the predicted communication."""

import pytest

from dpcourse.compiled import census


def test_predict_communication_same_bytes_when_gathered_once():
    pred = census.predict_communication(1_000, 100, 8, 4, 2)
    wire = pred["replicated DP"]["wire_bytes"]
    assert wire == pytest.approx(2 * 7 / 8 * 1_000)
    for form in ("ZeRO-1", "FSDP, gathered once", "accumulation, reduced"):
        assert pred[form]["wire_bytes"] == pytest.approx(wire)
    assert pred["accumulation, scan"]["all-reduce"] == 4 and pred["accumulation, scan"]["wire_bytes"] == 4 * wire
    assert pred["FSDP, naive"]["all-gather"] == 5
    assert pred["FSDP, naive"]["payload"]["all-gather"] == 4 * 100 + 900
    t = census.predicted_time_s(pred["ZeRO-1"], 8, 1e9)
    assert t == pytest.approx(wire / 1e9)
    with_latency = census.predicted_time_s(pred["ZeRO-1"], 8, 1e9, latency_s=1e-6)
    assert with_latency == pytest.approx(t + 2 * 7e-6)
    with pytest.raises(ValueError):
        census.predict_communication(1, 1, 0, 1, 1)


def test_report_from_rows_round_trip():
    rows = [
        {"kind": "all-gather", "name": "ag", "bytes": 10, "in_loop": True, "runs_per_step": 4},
        {"kind": "all-reduce", "name": "ar", "bytes": 3, "in_loop": False, "runs_per_step": 1},
    ]
    c = census.census(census.report_from_rows(rows))
    assert c["all-gather"] == census.KindCensus(1, 1, 4, 40)
    assert c["all-reduce"] == census.KindCensus(1, 0, 1, 3)
    assert c["reduce-scatter"] == census.KindCensus(0, 0, 0, 0)
    row = census.census_row("x", census.report_from_rows(rows))
    assert row["all-gather"] == "1 (1 in loop), 4/step" and row["bytes per step"] == 43
