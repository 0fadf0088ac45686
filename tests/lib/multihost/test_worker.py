"""dpcourse.multihost.worker: the program each process of a multi-host run executes, and its command line.

These tests start one real ``python -m dpcourse.multihost.worker`` process (a
1-process "cluster" on loopback); the multi-process runs are in
tests/lib/multihost/test_launcher.py.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from dpcourse.multihost import launcher

PROFILE = "smoke"
# Synthetic data, always: no network access, and the same bytes in every process.
SOURCE = "synthetic"
# A failing worker must end within this (seconds), init timeout included; JAX's import alone takes
# over 20 s on a loaded 2-core machine.
BOUND_S = 90


@pytest.mark.slow
@pytest.mark.processes
@pytest.mark.timeout(150)
def test_worker_checks_the_global_batch_against_the_global_device_count():
    """On GKE there is no launcher to check first: the worker itself refuses, and exits at once."""
    coordinator = f"127.0.0.1:{launcher.free_port()}"
    env = {k: v for k, v in launcher.worker_env(0, 1, coordinator, 10).items() if not k.startswith("DPCOURSE_")}
    result = subprocess.run(  # explicit options instead of the environment, on a 1-process "cluster"
        [
            sys.executable,
            "-m",
            "dpcourse.multihost.worker",
            "--coordinator",
            coordinator,
            "--num-processes",
            "1",
            "--process-id",
            "0",
            "--init-timeout-s",
            "10",
            "--profile",
            PROFILE,
            "--data-source",
            SOURCE,
            "--cpu-devices",
            "8",
            "--global-batch",
            "60",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=BOUND_S,
    )
    assert result.returncode == 1
    assert "Global batch 60 does not divide evenly over 8 devices" in result.stderr


def test_worker_without_its_environment_says_what_to_set():
    env = {k: v for k, v in os.environ.items() if not k.startswith("DPCOURSE_")}
    env["JAX_PLATFORMS"] = "cpu"
    result = subprocess.run(
        [sys.executable, "-m", "dpcourse.multihost.worker", "--profile", PROFILE],
        env=env,
        capture_output=True,
        text=True,
        timeout=BOUND_S,
    )
    assert result.returncode == 1
    assert "DPCOURSE_COORDINATOR, DPCOURSE_NUM_PROCESSES, DPCOURSE_PROCESS_ID not set" in result.stderr


def test_the_single_process_reference_is_the_same_under_an_explicit_mesh_set_in_context(cpu_devices):
    # Notebook 11 calls it after a learner may have set an Explicit mesh globally (notebook 03): it
    # trains on its own Auto mesh, as the worker processes do, and gives the same numbers.
    import jax
    import numpy as np

    from dpcourse.multihost import worker

    plain, losses, _ = worker.single_process_reference(PROFILE, 2, cpu_devices, SOURCE)
    explicit = jax.sharding.Mesh(np.array(cpu_devices), ("data",), axis_types=(jax.sharding.AxisType.Explicit,))
    with jax.set_mesh(explicit):
        under, losses_under, _ = worker.single_process_reference(PROFILE, 2, cpu_devices, SOURCE)
    assert losses_under == losses
    assert all(np.array_equal(plain[k], under[k]) for k in plain)


@pytest.mark.timeout(300)
def test_a_checkpoint_at_the_last_step_trains_nothing_and_one_past_it_is_refused(tmp_path, cpu_devices, capsys):
    """A finished Job applied again succeeds without training; asking for fewer steps than saved is an error."""
    from dpcourse.multihost import worker

    common = dict(profile=PROFILE, data_source=SOURCE, global_batch=None, out_dir=None, checkpoint_dir=str(tmp_path))
    first = worker.train_worker(steps=2, **common)
    again = worker.train_worker(steps=2, **common)
    assert len(first["losses"]) == 2 and first["resumed_from"] == 0
    assert again["resumed_from"] == 2 and again["losses"] == [] and again["ms_per_step"] is None
    assert again["params_digest"] == first["params_digest"]
    out = capsys.readouterr().out
    assert "no step trained (the checkpoint already holds step 2)" in out, out
    with pytest.raises(ValueError, match=r"is at step 2, past --steps 1: raise --steps to at least 2"):
        worker.train_worker(steps=1, **common)


def test_a_second_run_on_the_checkpoint_folder_is_refused_by_process_0_naming_the_first(tmp_path, cpu_devices):
    from dpcourse.checkpoints import checkpoint
    from dpcourse.multihost import worker

    with checkpoint.hold(tmp_path, "the first run"), pytest.raises(checkpoint.CheckpointInUse) as caught:
        worker.train_worker(PROFILE, 2, SOURCE, checkpoint_dir=str(tmp_path))
    assert "already held by this process (process" in str(caught.value) and "(the first run)" in str(caught.value)
    worker.train_worker(PROFILE, 2, SOURCE, checkpoint_dir=str(tmp_path))  # free again: it runs, and lets go
    assert not (tmp_path / checkpoint.LOCK_NAME).exists()


def test_a_damaged_latest_step_is_named_and_the_worker_resumes_from_the_one_before(tmp_path, cpu_devices, capsys):
    from dpcourse.multihost import worker

    worker.train_worker(PROFILE, 2, SOURCE, checkpoint_dir=str(tmp_path), save_every=1)
    (tmp_path / "2" / "_CHECKPOINT_METADATA").write_text("{")
    again = worker.train_worker(PROFILE, 2, SOURCE, checkpoint_dir=str(tmp_path), save_every=1)
    assert again["resumed_from"] == 1 and len(again["losses"]) == 1
    assert f"step 2 in {tmp_path} is damaged (its metadata file" in capsys.readouterr().out


def test_at_the_agreed_preemption_step_the_worker_saves_it_and_stops(tmp_path, cpu_devices, monkeypatch):
    """JAX's answer stood in for (every process gets True at the agreed step); the run then resumes from it.

    The agreed step is also a regular save here (every 3 steps): saved once, not twice. A step no regular
    save covers is the real processes' case below.
    """
    from jax.experimental import multihost_utils

    from dpcourse.checkpoints import checkpoint
    from dpcourse.multihost import worker

    monkeypatch.setattr(multihost_utils, "reached_preemption_sync_point", lambda step: step == 3)
    with pytest.raises(worker.Preempted) as stopped:
        worker.train_worker(PROFILE, 6, SOURCE, checkpoint_dir=str(tmp_path), save_every=3)
    assert stopped.value.step == 3
    assert f"every process saved step 3 to {tmp_path}; leaving with status 143" in str(stopped.value)
    assert checkpoint.open_manager(str(tmp_path)).all_steps() == [3]
    monkeypatch.undo()
    resumed = worker.train_worker(PROFILE, 6, SOURCE, checkpoint_dir=str(tmp_path), save_every=3)
    assert resumed["resumed_from"] == 3 and len(resumed["losses"]) == 3


def test_a_resumed_run_tells_the_preemption_service_its_step_before_the_restore(tmp_path, cpu_devices, monkeypatch):
    """A notice during start-up or the restore is agreed at the resumed step plus one, a step the run reaches.

    JAX's service agrees on the largest step any process passed, plus one, and a process that has not
    asked counts as 0: asked first at its first step, a run resumed at 2 would be agreed at step 1 and
    never stop. Here JAX's answer is stood in for: True at step 3, as the service would agree.
    """
    from jax.experimental import multihost_utils

    from dpcourse.multihost import worker

    worker.train_worker(PROFILE, 2, SOURCE, checkpoint_dir=str(tmp_path))  # saves step 2
    asked = []
    monkeypatch.setattr(multihost_utils, "reached_preemption_sync_point", lambda step: asked.append(step) or step == 3)
    with pytest.raises(worker.Preempted) as stopped:
        worker.train_worker(PROFILE, 6, SOURCE, checkpoint_dir=str(tmp_path))
    assert asked[:3] == [2, 2, 3] and stopped.value.step == 3  # before the restore, then each step


def test_with_the_preemption_service_off_the_worker_never_asks(tmp_path, cpu_devices, monkeypatch):
    """The local launcher's workers (lessons 08 and 11) run with the service off: asking would raise there.

    Orbax asks too, for each step it saves (its CheckpointManager saves a preemption step whatever its
    interval): the loop's own questions would come before every step from the first.
    """
    import jax
    from jax.experimental import multihost_utils

    from dpcourse.multihost import worker

    asked = []
    monkeypatch.setattr(multihost_utils, "reached_preemption_sync_point", lambda step: asked.append(step) or False)
    before = jax.config.jax_enable_preemption_service
    jax.config.update("jax_enable_preemption_service", False)
    try:
        assert len(worker.train_worker(PROFILE, 3, SOURCE, checkpoint_dir=str(tmp_path))["losses"]) == 3
    finally:
        jax.config.update("jax_enable_preemption_service", before)
    assert 0 not in asked and 1 not in asked


@pytest.mark.slow
@pytest.mark.processes
@pytest.mark.timeout(240)
def test_a_worker_sent_sigterm_saves_the_agreed_step_and_leaves_with_the_preempted_status(tmp_path):
    """Two real processes, JAX's preemption service on as in a GKE pod: SIGTERM to one, the same save in both."""
    import signal
    import time

    from dpcourse.checkpoints import checkpoint
    from dpcourse.multihost.heartbeat import PROGRESS_ENV
    from dpcourse.multihost.preemption import PREEMPTED_EXIT_CODE

    coordinator = f"127.0.0.1:{launcher.free_port()}"
    folder, procs = tmp_path / "ckpt", []
    # Far more steps than the test waits for: the run ends only through the preemption.
    command = [sys.executable, "-m", "dpcourse.multihost.worker", "--profile", PROFILE, "--data-source", SOURCE]
    command += ["--cpu-devices", "2", "--steps", "1000000", "--checkpoint-dir", str(folder)]
    for process in range(2):
        env = launcher.worker_env(process, 2, coordinator, 60)
        env["JAX_ENABLE_PREEMPTION_SERVICE"] = "true"  # what a pod has; the local launcher turns it off
        env[PROGRESS_ENV] = str(tmp_path / f"progress.{process}")
        procs.append(subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    progress = tmp_path / "progress.1"
    try:
        deadline = time.monotonic() + BOUND_S
        while "step " not in (progress.read_text() if progress.exists() else "") and procs[1].poll() is None:
            assert time.monotonic() < deadline, f"no training step within {BOUND_S} s"
            time.sleep(0.2)
        procs[1].send_signal(signal.SIGTERM)  # process 1 only, as a Spot VM's kubelet would
        outs = [p.communicate(timeout=BOUND_S) for p in procs]
    finally:
        for p in procs:
            p.kill()
    assert [p.returncode for p in procs] == [PREEMPTED_EXIT_CODE] * 2, [err[-2000:] for _, err in outs]
    (step,) = [int(s) for s in re.findall(r"every process saved step (\d+) to", outs[0][0])]
    assert checkpoint.open_manager(str(folder)).all_steps() == [step] and step >= 1
