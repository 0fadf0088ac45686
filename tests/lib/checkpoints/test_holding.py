"""dpcourse.checkpoints.holding: one writer per checkpoint directory, a killed one's restart let in, a vanished folder seen."""

from __future__ import annotations

import json
import os
import time

import pytest

from dpcourse.checkpoints import checkpoint, folderlock, holding


def test_a_lock_left_by_a_run_on_another_host_blocks_until_it_is_a_minute_old(tmp_path):
    lock = tmp_path / checkpoint.LOCK_NAME
    lock.write_text(json.dumps({"pid": 1, "host": "pod-0-abcde", "started": "2026-01-01T00:00:00+00:00"}))
    with pytest.raises(checkpoint.CheckpointInUse, match=r"process 1 on pod-0-abcde, started 2026-01-01"):
        checkpoint.hold(tmp_path).__enter__()
    old = time.time() - checkpoint.LOCK_STALE_S - 5  # its holder stopped touching it (a preempted pod)
    os.utime(lock, (old, old))
    with checkpoint.hold(tmp_path) as held:
        assert json.loads(held.read_text())["pid"] == os.getpid()
    assert not lock.exists()


def test_a_restarted_pod_with_the_killed_one_s_pid_and_host_name_takes_its_lock(tmp_path, monkeypatch):
    """The GKE Job's pod 0 comes back as PID 1 on host jax-multihost-ckpt-0: it must resume, not exit 78."""
    monkeypatch.setattr(folderlock.socket, "gethostname", lambda: "jax-multihost-ckpt-0")
    killed = {"pid": os.getpid(), "host": "jax-multihost-ckpt-0", "started": "2026-01-01T00:00:00+00:00"}
    for record in (killed, {**killed, "boot": folderlock.boot_id()}):  # written by an older release, or this one
        (tmp_path / checkpoint.LOCK_NAME).write_text(json.dumps(record))
        with checkpoint.hold(tmp_path, "restart") as held:
            assert json.loads(held.read_text())["command"] == "restart"
            with pytest.raises(checkpoint.CheckpointInUse, match="already held by this process"):
                checkpoint.hold(tmp_path).__enter__()
        assert not (tmp_path / checkpoint.LOCK_NAME).exists()


def test_a_lock_that_is_a_folder_is_one_sentence(tmp_path):
    (tmp_path / checkpoint.LOCK_NAME).mkdir()
    with pytest.raises(checkpoint.CheckpointError, match="is a folder, not a file"):
        checkpoint.hold(tmp_path).__enter__()


def test_a_held_directory_that_vanishes_is_said_and_one_not_held_is_not_judged(tmp_path):
    folder = tmp_path / "ckpt"
    holding.check_still_there(folder)  # not held by this process: nothing to say
    with holding.hold(folder):
        holding.check_still_there(folder)
        (folder / holding.LOCK_NAME).rename(tmp_path / "moved")  # as deleting or unmounting the folder does
        with pytest.raises(checkpoint.CheckpointGone, match=f"{folder} was deleted, moved or unmounted"):
            holding.check_still_there(folder)
    holding.check_still_there(folder)  # released: not judged any more
