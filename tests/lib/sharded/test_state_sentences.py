"""dpcourse.sharded.state_sentences: lesson 10's state-bytes sentence follows the numbers planted in it."""

import pytest

from dpcourse.sharded import state_sentences


def test_the_sentence_says_where_the_measured_saving_meets_falls_short_of_or_passes_the_formula():
    text = state_sentences.state_ratio_sentence(
        {"replicated DP": 1.0, "ZeRO-1": 2.52, "FSDP": 7.9}, {"replicated DP": 1.0, "ZeRO-1": 2.67, "FSDP": 8.0}
    )
    assert "replicated DP 1.00 against 1.00 (as the formula says)" in text
    assert "ZeRO-1 2.52 against 2.67 (short of the formula: some leaves stay whole)" in text
    assert "FSDP 7.90 against 8.00 (short of the formula" in text
    three = state_sentences.state_ratio_sentence({"FSDP": 1.0}, {"FSDP": 3.0})  # 3 devices: nothing divides
    assert "(nothing sharded)" in three
    assert "(above the formula)" in state_sentences.state_ratio_sentence({"FSDP": 9.0}, {"FSDP": 8.0})
    with pytest.raises(ValueError, match="differ"):
        state_sentences.state_ratio_sentence({"FSDP": 1.0}, {"ZeRO-1": 1.0})
