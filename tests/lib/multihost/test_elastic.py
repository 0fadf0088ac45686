"""dpcourse.multihost.elastic: its events survive a kill mid-line, its reference makes the change it is told."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from dpcourse.multihost import elastic
from dpcourse.train import max_abs_diff


def test_events_are_read_back_and_a_line_cut_short_by_a_kill_is_left_out(tmp_path):
    events = elastic.Events(str(tmp_path), 3)
    events("joined")
    events("step", step=1, loss=2.5)
    with open(tmp_path / "events.3.jsonl", "a") as f:
        f.write('{"event": "step", "st')  # SIGKILL in the middle of a write
    read = elastic.read_events(tmp_path, 3)
    assert [e["event"] for e in read] == ["joined", "step"] and read[1]["loss"] == 2.5
    assert read[0]["t"] <= read[1]["t"]
    assert elastic.read_events(tmp_path, 4) == []  # a process that never wrote
    elastic.Events(None, 0)("joined")  # without a folder: nothing written, nothing raised


def test_mesh_order_is_by_process_then_id():
    devs = [SimpleNamespace(process_index=p, id=i) for p, i in ((1, 2048), (0, 1), (0, 0), (2, 4096))]
    assert [(d.process_index, d.id) for d in elastic.mesh_devices(devs)] == [(0, 0), (0, 1), (1, 2048), (2, 4096)]


@pytest.fixture(scope="module")
def cpu_devices():
    import jax  # tests/conftest.py set this session's simulated CPU devices

    return sorted(jax.devices("cpu"), key=lambda d: d.id)[:2]


def test_the_reference_makes_the_change_it_is_told(cpu_devices):
    straight = elastic.reference_params("smoke", 4, 8, cpu_devices, data_source="synthetic")
    same = elastic.reference_params("smoke", 4, 8, cpu_devices, 2, cpu_devices, data_source="synthetic")
    assert max_abs_diff(straight, same) == 0.0  # a change onto the same devices changes nothing
    fewer = elastic.reference_params("smoke", 4, 8, cpu_devices, 2, cpu_devices[:1], data_source="synthetic")
    assert max_abs_diff(straight, fewer) < 1e-5  # the same global batch over fewer devices: the same training
    shorter = elastic.reference_params("smoke", 3, 8, cpu_devices, data_source="synthetic")
    assert max_abs_diff(straight, shorter) > 1e-4  # while a step more is seen


def test_the_reference_runs_under_a_learners_explicit_global_mesh(cpu_devices):
    """Notebook 13's kernel computes only this reference; a mesh the learner set globally must not change it."""
    import jax
    import numpy as np

    before = elastic.reference_params("smoke", 3, 8, cpu_devices, 1, cpu_devices[:1], data_source="synthetic")
    explicit = (jax.sharding.AxisType.Explicit,)
    jax.set_mesh(jax.sharding.Mesh(np.array(cpu_devices), ("data",), axis_types=explicit))
    try:
        under = elastic.reference_params("smoke", 3, 8, cpu_devices, 1, cpu_devices[:1], data_source="synthetic")
    finally:
        jax.set_mesh(None)
    assert max_abs_diff(before, under) == 0.0


def test_the_command_line_refuses_an_unknown_place_to_lose_a_process():
    with pytest.raises(SystemExit):
        elastic.main(["--steps", "2", "--global-batch", "8", "--lose-where", "inside"])


@pytest.mark.parametrize(
    "extra, said",
    [
        (["--heartbeat-timeout-s", "0"], "heartbeat_timeout_s (HEARTBEAT_TIMEOUT_S) must be a whole number from 1"),
        (["--lose-process", "3", "--lose-at", "2"], "lose_process must be a whole number from 0 to 1"),
        (["--global-batch", "7"], "--global-batch must split over 2 processes x --cpu-devices 1"),
        (["--step-s", "nan"], "step_s must be 0 or more seconds"),
    ],
)
def test_the_program_refuses_bad_options_in_one_sentence_before_jax_starts(extra, said, monkeypatch, capsys):
    monkeypatch.setenv("DPCOURSE_NUM_PROCESSES", "2")
    argv = ["--steps", "8", "--global-batch", "8"]
    for flag in dict.fromkeys(extra[::2]):
        if flag in argv:
            i = argv.index(flag)
            del argv[i : i + 2]
    assert elastic.main(argv + extra) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and said in err and err.count("\n") == 1, err
