"""Several processes save and restore together: a job killed mid-run resumes on another process count.

One bounded multi-process run in two launches (python -m dpcourse.multihost.worker
under dpcourse.multihost.launcher, as notebook 11 section 6): 2 processes x 4 CPU
devices save every 2 steps and process 1 dies at step 5; a data file of
the latest step (4) is then cut short; 4 processes x 2 devices agree that
step 4 is damaged, resume from step 2 and finish. The result must be the
training of one process on 8 devices that never stopped.
"""

from __future__ import annotations

import re

import pytest

from dpcourse import train
from dpcourse.checkpoints import checkpoint
from dpcourse.multihost import launcher, worker

PROFILE, SOURCE, STEPS = "smoke", "synthetic", 6
# As tests/test_launcher.py: float32 sums in another order (gloo between processes vs XLA in one) differ by
# about 1e-7; a process training on the wrong rows or from the wrong step moves weights by about 6e-4.
MULTIHOST_TOL = 1e-5
LIMIT_S = 150  # each launch; two JAX imports per process dominate (5 s quiet, over 20 s on a loaded machine)


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_a_job_killed_mid_run_resumes_from_its_last_step_on_another_process_count(tmp_path, cpu_devices):
    common = dict(profile=PROFILE, steps=STEPS, data_source=SOURCE, checkpoint_dir=str(tmp_path), save_every=2)
    with pytest.raises(launcher.WorkerFailed) as info:
        launcher.launch_local(2, 4, fail_process=1, fail_at_step=5, timeout_s=LIMIT_S, init_timeout_s=60, **common)
    assert info.value.process_id == 1 and "injected failure at step 5" in str(info.value)
    with checkpoint.open_manager(tmp_path) as manager:
        assert manager.all_steps() == [2, 4]
    # A damaged latest step: before, every process judged it alone, and the run ended with "already saved ...
    # by another run" (exit status 78) under another process's Gloo traceback.
    data = max((p for p in (tmp_path / "4" / "state").rglob("*") if p.is_file()), key=lambda p: p.stat().st_size)
    data.write_bytes(data.read_bytes()[:1000])
    resumed = launcher.launch_local(4, 2, timeout_s=LIMIT_S, init_timeout_s=60, **common)
    said = resumed.stdout[0]
    assert re.search(rf"step 4 in {re.escape(str(tmp_path))} is damaged \(process \d found: the data of ", said), said
    assert "step 2 is complete: resuming from step 2 (kept as 4.damaged)" in said
    assert resumed.summary["resumed_from"] == 2 and resumed.summary["num_processes"] == 4
    assert len(resumed.summary["losses"]) == STEPS - 2
    reference, _, _ = worker.single_process_reference(PROFILE, STEPS, cpu_devices, SOURCE)
    assert train.max_abs_diff(reference, resumed.params) < MULTIHOST_TOL
    with checkpoint.open_manager(tmp_path) as manager:
        assert manager.latest_step() == STEPS and not checkpoint.half_written(tmp_path)


@pytest.mark.slow
@pytest.mark.processes
@pytest.mark.timeout(300)
@pytest.mark.parametrize("fault", ["read-only", "deleted"])
def test_a_folder_that_turns_read_only_or_vanishes_mid_run_ends_the_launch_in_one_sentence_within_a_minute(
    tmp_path, fault
):
    """Before: every process hung in Orbax's barriers until the launcher's limit (read-only), or the run saved
    its next steps into a new, empty folder of the same name (deleted)."""
    import os
    import shutil
    import subprocess
    import threading
    import time

    folder = tmp_path / "ckpt"
    root = os.geteuid() == 0
    if fault == "deleted":
        make, undo = ["rm", "-rf", str(folder)], ["true"]
    elif root:
        if shutil.which("mount") is None:
            pytest.skip("no mount command to make the folder read-only as root")
        make, undo = ["mount", "--bind", "-o", "ro", str(folder), str(folder)], ["umount", str(folder)]
    else:
        make, undo = ["chmod", "555", str(folder)], ["chmod", "755", str(folder)]
    flipped = []

    def fault_after_the_first_save():
        deadline = time.monotonic() + LIMIT_S
        while not (folder / "25").is_dir() and time.monotonic() < deadline:
            time.sleep(0.05)
        subprocess.run(make, check=True, capture_output=True)
        flipped.append(time.monotonic())

    watcher = threading.Thread(target=fault_after_the_first_save, daemon=True)
    watcher.start()
    try:
        with pytest.raises(launcher.WorkerFailed) as info:
            launcher.launch_local(
                2, 4, profile=PROFILE, steps=400, data_source=SOURCE, checkpoint_dir=str(folder), save_every=25,
                timeout_s=LIMIT_S, init_timeout_s=60,
            )  # fmt: skip
        ended = time.monotonic()
        watcher.join(timeout=LIMIT_S)
    finally:
        subprocess.run(undo, capture_output=True)
    assert flipped and ended - flipped[0] < 60, str(info.value)
    headline = str(info.value).splitlines()[0]
    assert "(exit status 78)" in headline, headline
    if fault == "deleted":
        assert f"The checkpoint directory {folder} was deleted, moved or unmounted" in headline, headline
        assert not folder.exists() or not any(p.name.isdigit() for p in folder.iterdir())
    else:
        assert "the directory cannot be written" in headline, headline
        with checkpoint.open_manager(folder) as manager:
            assert manager.latest_step() is not None and manager.latest_step() >= 25
