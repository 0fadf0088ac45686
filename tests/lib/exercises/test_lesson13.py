"""Checkers of lesson 13: the solution passes, known wrong answers get their sentence, untouched is not attempted."""

from dpcourse.checkpoints import interval
from dpcourse.exercises import lesson13
from dpcourse.exercises.base import BAD_INPUT, CORRECT, NOT_ATTEMPTED, WRONG


def expect(feedback, status, phrase=""):
    assert feedback.status == status, feedback
    assert phrase in feedback.message, feedback


def test_13_1_the_agreed_step_is_one_past_the_largest_reached():
    expect(lesson13.agreed_step(...), NOT_ATTEMPTED)
    expect(lesson13.agreed_step(44), CORRECT, "largest step any process had reached, 43")
    expect(lesson13.agreed_step(43), WRONG, "already passed")
    expect(lesson13.agreed_step(42), WRONG, "ahead of every one")
    expect(lesson13.agreed_step(41), WRONG, "ahead of every one")
    expect(lesson13.agreed_step(50), WRONG, "next step after the largest")
    expect(lesson13.agreed_step("44th"), BAD_INPUT)


def test_13_2_the_survivors_split_the_same_global_batch():
    expect(lesson13.survivor_batch(None), NOT_ATTEMPTED)
    expect(lesson13.survivor_batch(32), CORRECT, "3 live devices")
    expect(lesson13.survivor_batch(24), WRONG, "share before the loss")
    expect(lesson13.survivor_batch(96), WRONG, "whole global batch")
    expect(lesson13.survivor_batch(48), WRONG, "too large")


def test_13_3_daly_and_young_pass_the_known_slips_do_not():
    daly = interval.daly_interval_s(30.0, 6 * 3600.0)
    assert round(daly) == 1119  # the docstring's figure
    expect(lesson13.checkpoint_interval(...), NOT_ATTEMPTED)
    expect(lesson13.checkpoint_interval(daly), CORRECT, "1,119 s")
    young = interval.young_interval_s(30.0, 6 * 3600.0)
    assert round(young) == 1138
    for answer in (young, 1138, 1140):  # nearer Young's than Daly's: told it is Young's, with Daly's value
        expect(lesson13.checkpoint_interval(answer), CORRECT, "Young's sqrt(2 x save x MTBF); Daly's")
        assert "(Daly's formula)" not in lesson13.checkpoint_interval(answer).message
    expect(lesson13.checkpoint_interval(1125), CORRECT, "(Daly's formula)")  # nearer Daly's
    expect(lesson13.checkpoint_interval((2 * 30 * 6) ** 0.5), WRONG, "as hours")
    expect(lesson13.checkpoint_interval(2 * 30 * 6 * 3600), WRONG, "square root")
    expect(lesson13.checkpoint_interval(300), WRONG, "too small")
