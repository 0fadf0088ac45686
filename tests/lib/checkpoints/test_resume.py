"""dpcourse.checkpoints.resume: a run stopped halfway and resumed from its checkpoint equals one that never stopped."""

import json
import subprocess
import sys

import numpy as np
import pytest
from jax.sharding import Mesh

from dpcourse import config, data, train
from dpcourse.checkpoints import checkpoint, resume

STEPS, N_BATCHES = 6, 5


@pytest.fixture(scope="module")
def setup(cpu_devices):
    cfg = config.make_config("smoke")
    dataset = data.load_fashion_mnist(source="synthetic", limit=cfg.max_train_examples, seed=cfg.seed)
    mesh = Mesh(np.array(cpu_devices), ("data",))
    return cfg, dataset, mesh, cfg.global_batch(len(cpu_devices))


def _half_saved(tmp_path, setup, form):
    cfg, dataset, mesh, batch = setup
    step_fn, noisy, xs, ys, state0 = resume.build(cfg, mesh, form, batch, dataset, N_BATCHES)
    straight, losses = resume.train_until(state0, step_fn, noisy, xs, ys, STEPS)
    half, _ = resume.train_until(state0, step_fn, noisy, xs, ys, STEPS // 2)
    run = checkpoint.run_description(cfg, batch)
    with checkpoint.open_manager(tmp_path) as manager:
        checkpoint.save(manager, STEPS // 2, half, run)
    return straight, losses, half, run, state0


def _args(tmp_path, setup, *extra):
    cfg, dataset, _, batch = setup
    run = ["--dir", str(tmp_path), "--profile", cfg.profile, "--data-source", dataset.source]
    return run + ["--global-batch", str(batch), "--n-batches", str(N_BATCHES), *extra]


@pytest.mark.parametrize("form", checkpoint.FORMS)
def test_resumed_from_half_way_the_run_is_bitwise_the_uninterrupted_one_on_the_cpu(tmp_path, setup, form, capsys):
    straight, losses, half, run, state0 = _half_saved(tmp_path, setup, form)
    # The loop steps the key and the data position with the step.
    assert int(straight["step"]) == int(straight["data_position"]) == STEPS and len(losses) == STEPS
    assert not np.array_equal(np.asarray(straight["key"]), np.asarray(half["key"]))
    assert resume.main(_args(tmp_path, setup, "--until", str(STEPS), "--devices", "8", "--form", form)) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["restored_step"] == STEPS // 2 and summary["final_step"] == STEPS
    mesh = setup[2]
    target = checkpoint.abstract_target(state0, checkpoint.state_shardings(state0, mesh, form))
    with checkpoint.open_manager(tmp_path) as manager:
        step, got = checkpoint.restore(manager, target, run)
    assert step == STEPS and train.max_abs_diff(straight, got) == 0.0


def test_resuming_an_empty_directory_is_one_sentence_and_exit_status_1(tmp_path, setup, capsys):
    assert resume.main(_args(tmp_path / "none", setup, "--until", str(STEPS))) == 1
    assert "No complete checkpoint" in capsys.readouterr().err


def test_a_process_killed_during_a_save_leaves_the_previous_step_latest_and_whole(tmp_path, setup):
    _, _, half, run, state0 = _half_saved(tmp_path, setup, "replicated")
    command = [sys.executable, "-m", "dpcourse.checkpoints.resume", *_args(tmp_path, setup, "--kill-at-commit")]
    # One fresh process (JAX's import and one save): 120 s bounds a loaded 2-core machine.
    killed = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert killed.returncode == -9, killed.stderr[-2000:]
    assert checkpoint.half_written(tmp_path) == [f"{STEPS // 2 + 1}{checkpoint.TMP_SUFFIX}"]
    target = checkpoint.abstract_target(state0, checkpoint.state_shardings(state0, setup[2], "replicated"))
    with checkpoint.open_manager(tmp_path) as manager:
        assert manager.latest_step() == STEPS // 2
        step, got = checkpoint.restore(manager, target, run)
    assert step == STEPS // 2 and train.max_abs_diff(half, got) == 0.0
