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
    assert "though the model's cut for this step (-14%) is beyond it" in flat  # 404 / (2 (1024 + 404))
    noisy = readings.steps_sentence({1024: 60, 2048: 58}, 404.0, 0.2)
    assert "luck; the model's own cut for this step (-14%) is within it too, too small" in noisy
    early = readings.steps_sentence({128: 60, 256: 58}, 404.0, 0.09)  # both below B_crit: the model cuts 38%
    assert "though the model's cut for this step (-38%) is beyond it" in early and "past B_crit" not in early
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


def test_the_rules_sentence_names_a_winner_only_beyond_the_seeds_spread():
    # linear best at 256 (80 steps against 110: 32% apart); sqrt and linear within 1 step at 64.
    steps = {
        ("same", 64): 200,
        ("sqrt", 64): 200,
        ("linear", 64): 200,
        ("same", 256): 150,
        ("sqrt", 256): 110,
        ("linear", 256): 80,
        ("same", 1024): 120,
        ("sqrt", 1024): 83,
        ("linear", 1024): 84,
        ("same", 4096): 100,
        ("sqrt", 4096): 80,
        ("linear", 4096): None,
    }
    text = readings.rules_sentence(steps, batch_size.LR_RULES, [64, 256, 1024, 4096], 0.09)
    assert text.startswith(
        'Fewest steps by rule, read against the seeds\' spread (9%): "linear" at 256; "sqrt" at 4,096'
    )
    assert 'No winner at 64 (every rule: 200); 1,024 ("same" 120, "sqrt" 83, "linear" 84)' in text
    assert 'Not reached: "linear" at 4,096.' in text
    # The smoke run that named "sqrt" at 256 by 83 steps against 84 with a 39% spread: no winner anywhere.
    wide = readings.rules_sentence(steps, batch_size.LR_RULES, [64, 256, 1024, 4096], 0.39)
    assert "no rule took fewer than the others by more than the spread at any batch" in wide
    assert '1,024 ("same" 120, "sqrt" 83, "linear" 84)' in wide and '256 ("same" 150, "sqrt" 110, "linear" 80)' in wide
    unknown = readings.rules_sentence(steps, batch_size.LR_RULES, [64, 256], float("nan"))
    assert "no spread measured" in unknown and "Every run reached the target." in unknown
    nothing = {(r, 64): None for r in batch_size.LR_RULES}
    assert readings.rules_sentence(nothing, batch_size.LR_RULES, [64], 0.1).startswith("No rule reached")


def test_two_counts_are_told_apart_only_beyond_the_spread():
    assert readings.told_apart(80, 110, 0.09) and not readings.told_apart(83, 84, 0.09)
    assert not readings.told_apart(50, 100, float("nan"))


def test_the_cut_the_model_predicts_holds_for_any_growth_of_the_batch():
    fit = batch_size.TradeOff(s_min=50.0, e_min=50.0 * 81, worst_error=0.0)
    for small, large in ((64, 128), (64, 256), (16, 256)):
        assert readings.step_cut(small, large, fit.b_crit) == pytest.approx(
            1 - fit.steps_at(large) / fit.steps_at(small)
        )
    assert readings.step_cut(64, 128, 81) == pytest.approx(readings.doubling_cut(64, 81))
    assert [readings.growth(64, b) for b in (128, 256, 160)] == ["a doubling", "a fourfold batch", "a 2.5-fold batch"]
    with pytest.raises(ValueError, match="smallest first"):
        readings.step_cut(256, 64, 81)


def test_a_fourfold_step_is_called_so_and_read_against_the_models_cut_for_it():
    # The smoke run: 16 / 64 / 256, fewest steps rising from 74 to 83, B_crit 81, seeds 39%.
    text = readings.steps_sentence({16: 150, 64: 74, 256: 83}, 81.0, 0.39)
    assert "From global batch 64 to 256 (a fourfold batch; 0.8 and 3.2 x B_crit)" in text
    assert f"predicts -{readings.step_cut(64, 256, 81.0):.0%} for this step" in text
    assert "doubling" not in text and "cannot tell the change from luck" in text
    scaling = readings.scaling_sentence({16: 150, 64: 74, 256: 83})
    assert "16 to 64 (a fourfold batch)" in scaling and "perfect scaling would give 38" in scaling


def test_the_measured_sentence_reads_how_the_step_time_grew():
    def rows(*values):
        return [dict(zip(("global batch", "ms/step", "time to target s"), v)) for v in values]

    # The smoke run: 2.71 / 2.56 / 2.55 ms at 16 / 64 / 256, the largest batch soonest.
    flat = readings.measured_sentence(rows((16, 2.71, 0.3), (64, 2.56, 0.2), (256, 2.55, 0.19)), True)
    assert "from 2.71 to 2.55 ms (x0.94)" in flat and "hardly followed the batch" in flat
    assert "soonest at global batch 256 (0.19 s)" in flat and "proportion" not in flat
    assert "only the step counts carry over" in flat
    steep = readings.measured_sentence(rows((64, 2.0, None), (2048, 50.0, 2.8)), False)
    assert "about in proportion" in steep and "soonest at global batch 2,048" in steep
    assert "this machine's devices" in steep
    middle = readings.measured_sentence(rows((64, 2.0, None), (256, 4.0, None)), True)
    assert "by less than the batch" in middle and "No run reached the target." in middle
    with pytest.raises(ValueError, match="2 or more"):
        readings.measured_sentence(rows((64, 2.0, 1.0)), True)
    with pytest.raises(ValueError, match="ms/step > 0"):
        readings.measured_sentence(rows((64, 0.0, 1.0), (128, 2.0, 1.0)), True)


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
