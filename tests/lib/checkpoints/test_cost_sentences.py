"""dpcourse.checkpoints.cost_sentences: lesson 11's size and time sentences follow the numbers planted in them."""

import pytest

from dpcourse.checkpoints import cost_sentences


def test_the_size_sentence_says_which_of_zstd_and_the_metadata_won():
    # The run's numbers: 3,017,245 bytes on disk for 3,231,884 bytes of arrays.
    assert cost_sentences.size_sentence("replicated", 3_017_245, 3_231_884) == (
        "replicated: the folder holds 0.93 x the arrays' bytes (zstd saved more than the metadata added)"
    )
    assert "the metadata added more than zstd saved" in cost_sentences.size_sentence("fsdp", 3_300_000, 3_231_884)
    assert "as much as" in cost_sentences.size_sentence("fsdp", 100, 100)
    with pytest.raises(ValueError, match="> 0"):
        cost_sentences.size_sentence("fsdp", 100, 0)


def test_the_forms_sentence_reads_how_far_apart_the_folders_are():
    text = cost_sentences.forms_sentence({"replicated": 3_017_245, "fsdp": 3_017_335})
    assert text == "replicated and fsdp: 3,017,245 to 3,017,335 bytes on disk, 0.00% apart."
    assert "10.00% apart" in cost_sentences.forms_sentence({"replicated": 900, "fsdp": 1_000})
    assert "the same 5 bytes" in cost_sentences.forms_sentence({"a": 5, "b": 5})
    with pytest.raises(ValueError, match="2 or more"):
        cost_sentences.forms_sentence({"a": 5})


def test_the_hiding_lines_say_what_this_run_hid_or_that_it_hid_nothing():
    # The run's numbers: 0.790 s of steps, a 0.135 s synchronous save, 1.171 s all together: nothing hidden.
    lines = cost_sentences.hiding_lines(0.790, 0.135, 0.023, 1.171, 4)
    assert lines[0] == "4 steps, then a synchronous save: 0.925 s"
    assert lines[-1].startswith("nothing was hidden here")
    hid = cost_sentences.hiding_lines(0.790, 0.135, 0.023, 0.850, 4)
    assert hid[-1] == "saving asynchronously hid 0.075 s (56%) of the synchronous save"
    noisy = cost_sentences.hiding_lines(0.790, 0.135, 0.023, 0.500, 4)
    assert "vary more than the save" in noisy[-2]


def test_the_resumed_sentence_names_what_was_bitwise_within_rounding_or_outside():
    text = cost_sentences.resumed_sentence({"replicated": (0.0, 0.0), "fewer_devices": (1.49e-8, 1e-5)})
    assert text.endswith(
        "bitwise equal on replicated, the same devices; within rounding on half the devices (at most "
        "1.5e-08, tolerance 1e-05)."
    )
    assert "outside the tolerance on FSDP" in cost_sentences.resumed_sentence({"fsdp": (1e-9, 0.0)})
