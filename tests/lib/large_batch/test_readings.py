"""dpcourse.large_batch.readings: lesson 12's sentences follow the numbers planted in them, whichever way they point."""

import math

import pytest

from dpcourse.large_batch import batch_size, readings


def test_a_doubling_cuts_a_quarter_of_the_steps_at_b_crit_and_a_tenth_at_four_times_it():
    fit = batch_size.TradeOff(s_min=50.0, e_min=50.0 * 404, worst_error=0.0)
    for batch, share in ((404, 0.25), (4 * 404, 0.10)):
        assert readings.doubling_cut(batch, fit.b_crit) == pytest.approx(share)
        assert 1 - fit.steps_at(2 * batch) / fit.steps_at(batch) == pytest.approx(share)
    with pytest.raises(ValueError, match="> 0"):
        readings.doubling_cut(0, 404)


def test_steps_that_still_fall_past_b_crit_by_more_than_the_spread_are_said_to_fall():
    # The run the lesson's old text contradicted: 73 -> 56 steps from 1,024 to 2,048, B_crit 404, seeds 9%.
    text = readings.steps_sentence({512: 90, 1024: 73, 2048: 56}, 404.0, 0.09)
    assert "fell from 73 to 56 (-23%" in text and "2.5 and 5.1 x B_crit" in text
    assert "predicts -14%" in text
    assert "still fell past B_crit" in text and "no fewer" not in text


def test_steps_within_the_spread_are_said_to_be_luck_and_a_rise_is_named():
    flat = readings.steps_sentence({1024: 60, 2048: 58}, 404.0, 0.09)
    assert "cannot tell the change from luck" in flat and "still fell" not in flat
    assert "past B_crit leads one to expect" in flat
    early = readings.steps_sentence({128: 60, 256: 58}, 404.0, 0.09)  # both below B_crit
    assert "the model expects a clear cut below B_crit" in early and "past B_crit" not in early
    fell_early = readings.steps_sentence({128: 90, 256: 58}, 404.0, 0.09)
    assert fell_early.endswith("the steps still fell.")
    rise = readings.steps_sentence({1024: 60, 2048: 80}, 404.0, 0.09)
    assert "rose from 60 to 80 (+33%" in rise and "took more steps" in rise
    unknown = readings.steps_sentence({1024: 60, 2048: 40}, 404.0, float("nan"))
    assert "cannot say" in unknown
    with pytest.raises(ValueError, match="2 or more"):
        readings.steps_sentence({1024: 60}, 404.0, 0.1)


def test_the_spread_is_a_floor_not_a_verdict_of_luck():
    assert readings.seed_spread([100, 110, 91]) == pytest.approx(19 / (301 / 3))
    assert math.isnan(readings.seed_spread([100, None]))
    text = readings.spread_sentence([100, 110, 91], 256)
    assert "19%" in text and "cannot be told from luck" in text and "low estimate" in text
    assert "are luck" not in text
    assert "no spread to read" in readings.spread_sentence([100, None, None], 256)


def test_the_rules_sentence_names_the_winner_at_each_batch_from_the_table():
    # The run that contradicted "the linear rule stalls": linear best at 256 (80 steps against 110).
    steps = {
        ("same", 64): 200,
        ("sqrt", 64): 200,
        ("linear", 64): 200,
        ("same", 256): 150,
        ("sqrt", 256): 110,
        ("linear", 256): 80,
        ("same", 1024): 120,
        ("sqrt", 1024): 73,
        ("linear", 1024): None,
    }
    text = readings.rules_sentence(steps, batch_size.LR_RULES, [64, 256, 1024])
    assert text.startswith('Fewest steps: every rule at 64; "linear" at 256; "sqrt" at 1,024.')
    assert 'Not reached: "linear" at 1,024.' in text
    flipped = dict(steps)
    flipped["linear", 256], flipped["sqrt", 256] = 110, 80
    assert '"sqrt" at 256, 1,024' in readings.rules_sentence(flipped, batch_size.LR_RULES, [64, 256, 1024])
    nothing = {(r, 64): None for r in batch_size.LR_RULES}
    assert readings.rules_sentence(nothing, batch_size.LR_RULES, [64]).startswith("No rule reached")


def test_the_same_split_sentence_carries_counts_only_for_the_cpus_arithmetic():
    cpu = readings.same_split_sentence("cpu", 3e-7, 56, 56, 8)
    assert "the same step count" in cpu and "3e-07" in cpu and "TF32" in cpu and "bfloat16" in cpu
    tpu = readings.same_split_sentence("tpu", 2e-3, 57, 56, 8)
    assert "step counts 57 and 56" in tpu and "carry over" not in tpu


def test_the_scaling_sentence_says_whether_the_smallest_batches_followed_perfect_scaling():
    near = readings.scaling_sentence({64: 309, 256: 80, 1024: 60})
    assert "perfect scaling would give 77" in near and "97% of perfect scaling" in near and "within 10%" in near
    bent = readings.scaling_sentence({64: 309, 256: 110})
    assert "70% of perfect scaling" in bent and "bent away" in bent
    with pytest.raises(ValueError, match="2 or more"):
        readings.scaling_sentence({64: 309})
