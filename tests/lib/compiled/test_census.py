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
    assert row["all-gather"] == "1 (1 in loop), 4/step" and row["result bytes per step"] == 43
    assert "sent per device" not in row
    with_n = census.census_row("x", census.report_from_rows(rows), 8)
    assert with_n["sent per device"] == round(7 / 8 * 40 + 2 * 7 / 8 * 3)


def test_form_rows_gives_a_labelled_row_per_compiled_step_in_order():
    from types import SimpleNamespace

    ar = {"kind": "all-reduce", "name": "ar", "bytes": 800, "in_loop": False, "runs_per_step": 1}
    ag = {"kind": "all-gather", "name": "ag", "bytes": 80, "in_loop": True, "runs_per_step": 3}
    steps = {"dp": SimpleNamespace(collectives=[ar]), "fsdp": SimpleNamespace(collectives=[ag, ar])}
    rows = census.form_rows(steps, {"dp": "replicated DP", "fsdp": "FSDP"}, 8)
    assert [r["form"] for r in rows] == ["replicated DP", "FSDP"]
    assert rows[0]["sent per device"] == 1400 and rows[1]["result bytes per step"] == 3 * 80 + 800
    assert rows[1]["all-gather"] == "1 (1 in loop), 3/step"
    with pytest.raises(KeyError):
        census.form_rows(steps, {"dp": "replicated DP"}, 8)


def test_bytes_sent_follow_the_ring_formulas_of_each_kind():
    # A reduce-scatter's result is the 1/N slice: it sends N - 1 slices, (N - 1) / N of the full array.
    assert census.sent_bytes("reduce-scatter", 100, 8) == pytest.approx(700)
    assert census.sent_bytes("all-gather", 800, 8) == pytest.approx(700)
    assert census.sent_bytes("all-reduce", 800, 8) == pytest.approx(1400)
    assert census.sent_bytes("collective-permute", 64, 8) == 64
    assert census.sent_bytes("all-reduce", 800, 1) == 0
    with pytest.raises(ValueError, match="n_devices >= 1"):
        census.sent_bytes("all-reduce", 8, 0)


def test_census_gives_bytes_sent_only_when_told_the_device_count():
    rows = [
        {"kind": "reduce-scatter", "name": "rs", "bytes": 32, "in_loop": True, "runs_per_step": 16},
        {"kind": "all-reduce", "name": "ar", "bytes": 8, "in_loop": False, "runs_per_step": 1},
    ]
    report = census.report_from_rows(rows)
    assert census.census(report)["reduce-scatter"].sent_bytes_per_step is None
    c = census.census(report, 8)
    assert c["reduce-scatter"].sent_bytes_per_step == pytest.approx(16 * 7 * 32)
    assert census.sent_bytes_per_step(report, 8) == pytest.approx(16 * 7 * 32 + 2 * 7 / 8 * 8)
    unknown = census.report_from_rows([{**rows[0], "runs_per_step": None}])
    assert census.sent_bytes_per_step(unknown, 8) is None


def test_zero1_with_the_all_reduce_first_is_predicted_at_one_and_a_half_times_replicated_dp():
    pred = census.predict_communication(1_000, 100, 8, 4, 2)
    row = pred["ZeRO-1, all-reduce first"]
    assert (row["all-reduce"], row["all-gather"], row["reduce-scatter"]) == (1, 1, 0)
    assert row["wire_bytes"] == pytest.approx(1.5 * pred["replicated DP"]["wire_bytes"])


def test_the_memory_saving_sentence_reads_which_way_the_bytes_went():
    assert census.memory_saving(4_000, 1_000, 4).endswith("(4.00x less: about K)")
    # The cpu profile's run: 12,714,520 against 2,994,000 bytes, 4.25 times with K = 4.
    assert census.memory_saving(12_714_520, 2_994_000, 4).endswith("(4.25x less: more than K)")
    assert census.memory_saving(102_296, 29_648, 4).endswith("(3.45x less: below K)")
    assert "1,000" in census.memory_saving(4_000, 1_000, 4)
    grew = census.memory_saving(1_000, 1_250, 4)
    assert grew.endswith("(1.25x more: accumulation saved nothing here)") and "less" not in grew
    assert "the same" in census.memory_saving(1_000, 1_000, 4)
    assert "no temporary bytes" in census.memory_saving(0, 0, 4)
