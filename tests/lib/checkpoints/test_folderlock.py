"""dpcourse.checkpoints.folderlock: one holder at a time, the holder named, a dead holder's lock replaced, only one's own released."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import pytest

from dpcourse.checkpoints import folderlock


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_a_second_holder_is_refused_with_the_first_named_and_release_frees_it(tmp_path):
    lock = folderlock.acquire(tmp_path, ".lock", "first")
    with pytest.raises(folderlock.FolderLocked) as caught:
        folderlock.acquire(tmp_path, ".lock", "second")
    err = caught.value
    assert err.this_process and err.same_host and err.holder["command"] == "first"
    assert folderlock.describe(err.holder).startswith(f"process {os.getpid()} on {socket.gethostname()}, started 20")
    folderlock.release(lock)
    assert not lock.exists() and folderlock.acquire(tmp_path, ".lock").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == [".lock"]  # no temporary file left


def test_a_lock_of_a_dead_process_here_is_replaced_and_another_s_is_never_released(tmp_path):
    (tmp_path / ".lock").write_text(json.dumps({"pid": _dead_pid(), "host": socket.gethostname()}))
    lock = folderlock.acquire(tmp_path, ".lock")
    assert json.loads(lock.read_text())["pid"] == os.getpid()
    lock.write_text(json.dumps({"pid": 1, "host": "elsewhere"}))
    folderlock.release(lock)  # not this process's: kept
    assert lock.exists()
    with pytest.raises(folderlock.FolderLocked) as caught:
        folderlock.acquire(tmp_path, ".lock")
    assert not caught.value.same_host and caught.value.holder["host"] == "elsewhere"
