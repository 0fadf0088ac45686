"""Checkers of lesson 12: the solution passes, each named mistake gets its sentence, untouched is not attempted."""

import pytest

from dpcourse.exercises import lesson12
from dpcourse.exercises.base import BAD_INPUT, CORRECT, NOT_ATTEMPTED, WRONG
from dpcourse.large_batch.batch_size import TradeOff


def expect(feedback, status, mistake=""):
    assert feedback.status == status, feedback
    assert feedback.mistake == mistake or not mistake, feedback


def b_simple(local_sq, global_sq, b, big_b):
    g2 = (big_b * global_sq - b * local_sq) / (big_b - b)
    return (local_sq - global_sq) / (1 / b - 1 / big_b) / g2


B, BB, LN, GN = lesson12.PER_DEVICE_BATCH, lesson12.GLOBAL_BATCH, lesson12.LOCAL_NORM, lesson12.GLOBAL_NORM


def test_noise_scale():
    expect(lesson12.noise_scale(...), NOT_ATTEMPTED)
    right = b_simple(LN**2, GN**2, B, BB)
    assert right == pytest.approx(286.1, abs=0.1)
    expect(lesson12.noise_scale(right), CORRECT)
    expect(lesson12.noise_scale(b_simple(LN**2, GN**2, BB, B)), WRONG, "b-and-B-swapped")
    expect(lesson12.noise_scale(b_simple(GN**2, LN**2, B, BB)), WRONG, "b-and-B-swapped")
    expect(lesson12.noise_scale(b_simple(LN, GN, B, BB)), WRONG, "not-squared")
    expect(lesson12.noise_scale(b_simple(GN**2, GN**2, B, BB)), WRONG, "averaged-norm-twice")
    expect(lesson12.noise_scale(1 / right), WRONG, "ratio-inverted")
    expect(lesson12.noise_scale(1000.0), WRONG)
    expect(lesson12.noise_scale("286"), BAD_INPUT)


FIT = TradeOff(s_min=50.0, e_min=16_000.0, worst_error=0.0)


def test_steps_at_batch():
    expect(lesson12.steps_at_batch(None, FIT, 8192), NOT_ATTEMPTED)
    expect(lesson12.steps_at_batch(50 + 16_000 / 8192, FIT, 8192), CORRECT)
    expect(lesson12.steps_at_batch(50.0, FIT, 8192), WRONG, "s-min-only")
    expect(lesson12.steps_at_batch(16_000 / 8192, FIT, 8192), WRONG, "perfect-scaling")
    expect(lesson12.steps_at_batch(50 * (1 + 8192 / 320), FIT, 8192), WRONG, "ratio-inverted")
    expect(lesson12.steps_at_batch(500.0, FIT, 8192), WRONG)


def test_best_device_count():
    expect(lesson12.best_device_count(...), NOT_ATTEMPTED)
    expect(lesson12.best_device_count(8), CORRECT)
    expect(lesson12.best_device_count(64), WRONG, "most-throughput")
    expect(lesson12.best_device_count(1), WRONG)
    expect(lesson12.best_device_count(16), WRONG)
    expect(lesson12.best_device_count(12), WRONG)
    expect(lesson12.best_device_count(8.5), WRONG)


def test_the_table_has_one_best_row_inside_it():
    times = [r["steps"] * r["ms/step"] for r in lesson12.DEVICE_TABLE]
    best = times.index(min(times))
    assert 0 < best < len(times) - 1 and times.count(min(times)) == 1
    for row in lesson12.DEVICE_TABLE:  # the steps follow the stated model S = 300 (1 + 4096 / B)
        assert row["steps"] == pytest.approx(300 * (1 + 4096 / row["global batch"]))
