"""dpcourse.multihost.heartbeat: heartbeats per worker, and the process that stopped is the one named."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

from dpcourse.multihost import heartbeat as progress
from dpcourse.multihost.heartbeat import Heartbeat, Progress, culprit


def test_a_heartbeat_writes_its_stage_and_keeps_beating(tmp_path, monkeypatch):
    monkeypatch.setattr(progress, "BEAT_S", 0.05)
    path = tmp_path / "progress.1"
    beat = Heartbeat(path).start()
    beat.set("step 2 of 3")
    first = json.loads(path.read_text())
    time.sleep(0.3)
    beat.stop()
    later = json.loads(path.read_text())
    assert first["stage"] == later["stage"] == "step 2 of 3" and later["time"] > first["time"]


def test_without_a_progress_file_the_heartbeat_does_nothing(tmp_path, monkeypatch):
    monkeypatch.delenv(progress.PROGRESS_ENV, raising=False)
    beat = Heartbeat().start()
    beat.set("joined")
    assert beat.path is None and list(tmp_path.iterdir()) == []


def test_the_stale_process_is_named_not_the_ones_waiting_for_it():
    seen = {
        0: Progress(0, "step 3 of 10", 0.5, False),
        1: Progress(1, "step 3 of 10", 42.0, False),
        2: Progress(2, "step 3 of 10", 0.4, False),
    }
    assert culprit(seen, alive={0, 1, 2}).process_id == 1
    assert culprit(seen, alive={0, 1, 2}, stale_s=60) is None


def test_a_process_still_importing_is_not_blamed_unless_the_os_says_it_is_stopped():
    seen = {0: Progress(0, "joining the other processes", 0.2, False), 1: Progress(1, None, 25.0, False)}
    assert culprit(seen, alive={0, 1}) is None
    seen[1] = Progress(1, None, 25.0, True)
    found = culprit(seen, alive={0, 1})
    assert found.process_id == 1 and "is stopped (state T" in found.describe()
    assert "before its first heartbeat" in found.describe()


def test_a_sigstopped_process_is_seen_as_stopped():
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        assert not progress.is_stopped(proc.pid)
        proc.send_signal(signal.SIGSTOP)
        deadline = time.monotonic() + 5
        while not progress.is_stopped(proc.pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert progress.is_stopped(proc.pid)
    finally:
        proc.kill()
        proc.wait()


def test_the_message_names_the_stopped_process_its_stage_the_victim_and_what_to_do():
    text = progress.stopped_message(Progress(1, "step 2 of 3", 12.0, True), 3, 20.5, 4242, victim=2)
    assert text.startswith("Worker process 1 of 3 (pid 4242) stopped responding after 20.5 s")
    assert "at 'step 2 of 3'" in text and "Process 2 failed only because it waited for it" in text
    assert "kill -CONT 4242" in text


def test_at_the_time_limit_a_hang_is_called_a_hang_and_only_a_moving_run_is_told_to_raise_the_limit():
    hung = {i: Progress(i, "saving step 2 to /ckpt", 0.5, False, 150.0) for i in (0, 1)}
    message = progress.timeout_message(hung, {0, 1}, 200, {0: 11, 1: 12})
    assert message.startswith("The run hung: no process moved on for at least 150 s")
    assert "process 1 (pid 12) at 'saving step 2 to /ckpt' for 150 s" in message
    assert "Raise timeout_s" not in message and "would not help" in message
    moving = {0: Progress(0, "step 40 of 100", 0.5, False, 0.2), 1: hung[1]}
    message = progress.timeout_message(moving, {0, 1}, 200, {0: 11, 1: 12})
    assert "still going" in message and "Raise timeout_s" in message


def test_a_heartbeat_records_when_its_stage_began(tmp_path):
    beat = Heartbeat(tmp_path / "p")
    beat.set("saving step 2")
    seen = progress.read(tmp_path / "p", 0, os.getpid(), time.time(), now=beat.since + 7.0)
    assert seen.stage == "saving step 2" and abs(seen.stage_age_s - 7.0) < 1e-6
