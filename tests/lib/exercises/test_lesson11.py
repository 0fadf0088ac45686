"""Checkers of lesson 11: the solution passes, known wrong answers get their sentence, untouched is not attempted."""

from dpcourse.exercises import lesson11
from dpcourse.exercises.base import BAD_INPUT, CORRECT, NOT_ATTEMPTED, WRONG

P = lesson11.FULL_PARAMS


def expect(feedback, status, phrase=""):
    assert feedback.status == status, feedback
    assert phrase in feedback.message, feedback


def test_full_params_is_the_model_s():
    from dpcourse import model
    from dpcourse.config import make_config

    assert model.param_count(make_config("full")) == P


def test_11_1_right_and_known_wrong_answers():
    expect(lesson11.checkpoint_bytes(...), NOT_ATTEMPTED)
    expect(lesson11.checkpoint_bytes(12 * P), CORRECT, "22,364,280")
    expect(lesson11.checkpoint_bytes(4 * P), WRONG, "parameters alone")
    expect(lesson11.checkpoint_bytes(16 * P), WRONG, "gradients")
    expect(lesson11.checkpoint_bytes(8 * P), WRONG, "two moments")
    expect(lesson11.checkpoint_bytes(96 * P), WRONG, "once")
    expect(lesson11.checkpoint_bytes(20 * P), WRONG, "too large")
    expect(lesson11.checkpoint_bytes("12P"), BAD_INPUT)


def test_11_2_right_and_known_wrong_answers():
    expect(lesson11.resume_step(None), NOT_ATTEMPTED)
    expect(lesson11.resume_step(300), CORRECT, "never committed")
    expect(lesson11.resume_step(400), WRONG, "not committed")
    expect(lesson11.resume_step(430), WRONG, "saved step")
    expect(lesson11.resume_step(0), WRONG, "start over")
    expect(lesson11.resume_step(200), WRONG, "last one to complete")
    expect(lesson11.resume_step(300.5), WRONG, "whole")
