"""A lesson's sentence that concludes from a number printed beside it is written by a function from that number.

Each entry below is one such sentence: the lesson must print it through the
function named (unit-tested with planted numbers under tests/lib/), and the
static wording it replaced, which a run's own numbers contradicted, must
not come back. Read as text: no lesson runs here.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# (lesson, call the lesson must make, the unit test that plants numbers against it)
GENERATED = [
    ("12_batch_size", "readings.scaling_sentence(", "tests/lib/large_batch/test_readings.py"),
    ("12_batch_size", "readings.rules_sentence(", "tests/lib/large_batch/test_readings.py"),
    ("12_batch_size", "readings.spread_sentence(", "tests/lib/large_batch/test_readings.py"),
    ("12_batch_size", "readings.steps_sentence(", "tests/lib/large_batch/test_readings.py"),
    ("12_batch_size", "readings.same_split_sentence(", "tests/lib/large_batch/test_readings.py"),
    ("12_batch_size", "readings.measured_sentence(", "tests/lib/large_batch/test_readings.py"),
    ("12_batch_size", "time_to_target.regime_sentence(", "tests/lib/large_batch/test_time_to_target.py"),
    ("10_sharded", "census.memory_saving(", "tests/lib/compiled/test_census.py"),
    ("10_sharded", "report.show_state_bytes(", "tests/lib/sharded/test_report.py"),
    ("11_checkpoint", "cost_sentences.size_sentence(", "tests/lib/checkpoints/test_cost_sentences.py"),
    ("11_checkpoint", "cost_sentences.forms_sentence(", "tests/lib/checkpoints/test_cost_sentences.py"),
    ("11_checkpoint", "cost_sentences.hiding_lines(", "tests/lib/checkpoints/test_cost_sentences.py"),
    ("13_elastic", "preemption.grace_sentence(", "tests/lib/multihost/test_preemption.py"),
    ("13_elastic", "elastic_run.ending(", "tests/lib/multihost/test_elastic_run.py"),
    ("07_sweep", "costs.judge_fit(", "tests/lib/test_costs.py"),
    ("07_sweep", "costs.scaling(", "tests/lib/test_costs.py"),
]

# Wording a run's own table contradicted (steps that still fell past B_crit, a linear rule that won at
# one batch, a spread from three seeds read as a bound, Orbax's save() that raises the last failure).
RETIRED = [
    ("12_batch_size", r"no fewer\s+(#\s+)?steps"),
    ("12_batch_size", r"buy no\s+(#\s+)?fewer"),
    ("12_batch_size", r"stop buying time"),
    ("12_batch_size", r"fall only\s+(#\s+)?until"),
    ("12_batch_size", r"always buy\s+(#\s+)?throughput"),
    ("12_batch_size", r"a lower\s+(#\s+)?bound\)"),
    ("12_batch_size", r"smaller than this are luck"),
    ("12_batch_size", r"exactly as N real devices"),
    ("12_batch_size", r"at small batches the points follow"),
    ("12_batch_size", r"square-root\s+(#\s+)?rule works where"),
    ("12_batch_size", r"\(Malladi et al\.'s rule for"),
    ("12_batch_size", r"proportionally\s+(#\s+)?more time"),
    ("12_batch_size", r"a doubling nearly\s+(#\s+)?halves"),
    ("12_batch_size", r"largest\s+(#\s+)?doubling"),
    ("12_batch_size", r"at first in\s+(#\s+)?proportion"),
    ("12_batch_size", r"so the time to\s+(#\s+)?the target falls by less and less"),
    ("04_sharding", r"between\s+(#\s+)?1\.0 and 1\.8"),
    ("07_sweep", r"Throughput over batch size fits"),
    ("10_sharded", r"x less\)\""),
    ("10_sharded", r"the measured column falls a little short"),
    ("10_sharded", r"The saving is at most about K"),
    ("11_checkpoint", r"never waits finishes exactly like"),
    ("11_checkpoint", r"A save is not a checkpoint until"),
    ("11_checkpoint", r"form does not change its size"),
    ("11_checkpoint", r"the rest runs\s+(#\s+)?beside the steps \("),
    ("11_checkpoint", r"makes a save a checkpoint"),
    ("11_checkpoint", r"marks\s+(#\s+)?a complete step with a commit file instead"),
]


def _source(stem: str) -> str:
    return (ROOT / "notebooks" / f"{stem}.py").read_text(encoding="utf-8")


@pytest.mark.parametrize("stem, call, unit_test", GENERATED)
def test_the_lesson_prints_the_sentence_through_its_function(stem, call, unit_test):
    assert call in _source(stem), f"{stem} no longer calls {call}...): update this list"
    name = call.rstrip("(").rsplit(".", 1)[-1]
    assert name in (ROOT / unit_test).read_text(encoding="utf-8"), f"{unit_test} does not test {name}"


@pytest.mark.parametrize("stem, pattern", RETIRED)
def test_wording_the_numbers_contradicted_does_not_come_back(stem, pattern):
    assert not re.search(pattern, _source(stem)), f"{stem} says {pattern!r} again"
