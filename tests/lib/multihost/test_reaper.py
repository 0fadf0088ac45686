"""dpcourse.multihost.reaper: the launcher's clean-up ends its workers, and gives up on one that will not die in bounded time."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from dpcourse.multihost import reaper


def _sleeper():
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"], start_new_session=True)


def test_every_process_is_ended_and_none_reported_stuck():
    procs = {0: _sleeper(), 1: _sleeper()}
    assert reaper.end_all(procs, grace_s=0.5) == {}
    assert all(p.returncode is not None for p in procs.values())


def test_a_process_that_outlives_sigkill_is_named_after_a_bounded_wait_instead_of_blocking():
    # A process in uninterruptible sleep (a hung NFS share) ignores even SIGKILL; play one by letting no
    # signal through, then end it for real.
    proc = _sleeper()
    try:
        start = time.monotonic()
        stuck = reaper.end_all({3: proc}, grace_s=0.2, kill_wait_s=0.5, kill=lambda pid, sig: None)
        # The waits are 0.7 s; a generous bound, far below the "for ever" of a plain wait().
        assert time.monotonic() - start < 30
        assert stuck == {3: proc.pid}
        message = reaper.stuck_message(stuck, 0.5)
        assert f"process 3 (pid {proc.pid}, state S)" in message and "uninterruptible sleep (state D)" in message
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    assert reaper.stuck_message({}) == ""
