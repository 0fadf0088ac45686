"""Tests of coursetools.machine: the machine a run measured on, and when it was too busy to time."""

from __future__ import annotations

import pytest

from coursetools import machine

QUIET = {"cores": 2, "load_average_start": [0.17, 0.78, 2.03], "load_average_end": [3.09, 1.93, 2.22]}


def test_the_committed_cpu_run_s_own_load_is_not_called_busy():
    """baselines/timings.json's cpu run: 0.17 as it started, 3.09 as it ended, on 2 cores (the run's own threads)."""
    assert machine.busy_sentence(QUIET, "cpu.json") is None


@pytest.mark.parametrize(
    ("loads", "said"),
    [
        ({"load_average_start": [2.5, 1, 1]}, "a load average of 2.5 as it started on a 2-core machine (above 2)"),
        ({"load_average_end": [4.1, 8.7, 5.3]}, "a load average of 8.7 as it ended on a 2-core machine (above 4)"),
    ],
)
def test_a_run_measured_on_a_busy_machine_is_refused_in_one_sentence_with_its_figure(loads, said):
    sentence = machine.busy_sentence({**QUIET, **loads}, "build/x/results.json")
    assert sentence.startswith(f"build/x/results.json was measured at {said}: other work shared its cores")
    assert sentence.endswith("or give --allow-busy to record it anyway") and sentence.count(". ") == 0


def test_make_test_s_own_load_at_its_end_is_not_judged():
    """make test runs its layers side by side: only the load before it started is other work."""
    busy_end = {**QUIET, "load_average_end": [2.97, 4.75, 4.49]}
    assert machine.busy_sentence(busy_end, "make test", judge_end=False) is None
    assert machine.busy_sentence({**busy_end, "load_average_start": [3, 3, 3]}, "make test", judge_end=False)


@pytest.mark.parametrize(
    "record", [{}, {"cores": None, "load_average_start": [9, 9, 9]}, {"cores": 2, "load_average_start": None}]
)
def test_a_record_without_cores_or_loads_is_never_refused(record):
    assert machine.busy_sentence(record, "r.json") is None


def test_this_machine_is_described():
    info = machine.machine_info()
    assert info["cores"] >= 1 and set(info) >= {"cpu", "memory_gib", "gpus", "load_average_start"}
