"""Checkers of lesson 10: the solution passes, known wrong answers get their sentence, untouched is not attempted."""

import pytest

from dpcourse.exercises import lesson10
from dpcourse.exercises.base import BAD_INPUT, CORRECT, NOT_ATTEMPTED, WRONG

P = lesson10.FULL_PARAMS


def expect(feedback, status, phrase=""):
    assert feedback.status == status, feedback
    assert phrase in feedback.message, feedback


def test_full_params_is_the_model_s():
    from dpcourse import model
    from dpcourse.config import make_config

    assert model.param_count(make_config("full")) == P


def test_10_1_right_and_known_wrong_answers():
    expect(lesson10.zero1_bytes_per_device(...), NOT_ATTEMPTED)
    expect(lesson10.zero1_bytes_per_device(6 * P), CORRECT, "11,182,140")
    expect(lesson10.zero1_bytes_per_device(12 * P), WRONG, "replicated data parallelism")
    expect(lesson10.zero1_bytes_per_device(3 * P), WRONG, "FSDP")
    expect(lesson10.zero1_bytes_per_device(10 * P), WRONG, "gradients")
    expect(lesson10.zero1_bytes_per_device(5 * P), WRONG, "two moments")
    expect(lesson10.zero1_bytes_per_device(48 * P), WRONG, "bits")
    expect(lesson10.zero1_bytes_per_device(7 * P), WRONG, "too large")
    expect(lesson10.zero1_bytes_per_device("6P"), BAD_INPUT)
    expect(lesson10.zero1_bytes_per_device(-1), BAD_INPUT, "positive")


def test_10_2_right_and_known_wrong_answers():
    expect(lesson10.microbatch_count(None), NOT_ATTEMPTED)
    expect(lesson10.microbatch_count(6), CORRECT, "K = 6")
    expect(lesson10.microbatch_count(6.0), CORRECT)
    expect(lesson10.microbatch_count(48), WRONG, "share each microbatch")
    expect(lesson10.microbatch_count(4), WRONG, "Too few")
    expect(lesson10.microbatch_count(1), WRONG, "6,144 examples")
    expect(lesson10.microbatch_count(8), WRONG, "not the smallest")
    expect(lesson10.microbatch_count(7), WRONG, "does not split")
    expect(lesson10.microbatch_count(0.25), WRONG, "whole number")


@pytest.mark.parametrize("answer", [6 * P, 6])
def test_answers_are_stable(answer):
    check = lesson10.zero1_bytes_per_device if answer > 100 else lesson10.microbatch_count
    assert str(check(answer)) == str(check(answer))
