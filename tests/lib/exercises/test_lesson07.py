"""The checkers of lesson 07 (dpcourse.exercises.lesson07): right answers pass, each planted mistake is named."""

import pytest

from dpcourse import costs
from dpcourse.bench import BenchResult, SweepPoint
from dpcourse.config import make_config
from dpcourse.exercises import lesson07
from dpcourse.exercises.base import BAD_INPUT, CORRECT, NOT_ATTEMPTED, UNAVAILABLE, WRONG

CFG = make_config("smoke")


def expect(feedback, status, phrase=""):
    assert feedback.status == status, feedback
    assert phrase in feedback.message, feedback


def _point(batch, ms):
    result = BenchResult(
        label=f"b{batch}",
        n_devices=8,
        global_batch=batch,
        compile_s=0.1,
        ms_per_step=ms,
        examples_per_s=batch / (ms / 1e3),
        final_loss=2.0,
        final_accuracy=0.1,
    )
    return SweepPoint(batch, "ok", result=result)


POINTS = [SweepPoint(12, "skipped", "does not divide"), _point(32, 3.0), _point(64, 4.0), _point(128, 6.0)]


def test_07_1_plateau():
    a, b = 2.0e-3, 1.0 / 32 * 1e-3  # through (32, 3 ms) and (128, 6 ms)
    expect(lesson07.plateau((1 / b, 9 * a / b), POINTS), CORRECT)
    expect(lesson07.plateau((1 / b, a / b), POINTS), WRONG, "half the plateau")
    expect(lesson07.plateau((1 / b / 1e3, 9 * a / b), POINTS), WRONG, "off by 1000")
    expect(lesson07.plateau((128 / 6e-3, 9 * a / b), POINTS), WRONG, "largest size")
    expect(lesson07.plateau((None, None), POINTS), WRONG, "there is a plateau")
    expect(lesson07.plateau(32000.0, POINTS), BAD_INPUT, "tuple of 2")
    expect(lesson07.plateau(..., POINTS), NOT_ATTEMPTED)
    flat = [_point(32, 3.0), _point(64, 2.5)]
    expect(lesson07.plateau((None, None), flat), CORRECT)
    expect(lesson07.plateau((1e4, 100), flat), WRONG, "(None, None)")
    expect(lesson07.plateau((None, None), POINTS[:2]), UNAVAILABLE)


def test_07_2_allreduce():
    grad = costs.gradient_bytes(CFG)
    ref = 1.5 * grad / 32e9 * 1e3
    expect(lesson07.allreduce_ms(ref, CFG), CORRECT)
    expect(lesson07.allreduce_ms(grad / 32e9 * 1e3, CFG), WRONG, "sends the gradient once")
    expect(lesson07.allreduce_ms(ref / 1e3, CFG), WRONG, "in seconds")
    expect(lesson07.allreduce_ms(ref * 8, CFG), WRONG, "bits versus bytes")
    expect(lesson07.allreduce_ms(4 * grad / 32e9 * 1e3, CFG), WRONG, "every device's whole gradient")
    expect(lesson07.allreduce_ms(ref / 4, CFG), WRONG, "values, not bytes")
    expect(lesson07.allreduce_ms(..., CFG), NOT_ATTEMPTED)


@pytest.mark.slow
@pytest.mark.lesson
def test_07_1_the_lessons_own_fit_is_not_accepted_as_the_plateau():
    # The lesson fits all sizes; its plateau (1 / slope of that fit) is not the two-point answer.
    bent = [_point(32, 3.0), _point(64, 4.6), _point(128, 6.0)]  # not on one line, as a real sweep
    fit = costs.fit_step_time([32, 64, 128], [3.0e-3, 4.6e-3, 6.0e-3])
    lifted = (1.0 / fit.per_example_s, 9.0 * fit.overhead_s / fit.per_example_s)
    expect(lesson07.plateau(lifted, bent), WRONG, "The plateau is 1 / b")
