"""dpcourse.multihost.parent: a launched process ends when its launcher is killed, and only then."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from dpcourse.multihost import parent

CHILD = "from dpcourse.multihost import parent; print(parent.follow_parent(), flush=True); import time; time.sleep(60)"
# The launcher: starts the child with its own pid named, prints the child's pid, then waits to be killed.
LAUNCHER = f"""
import os, subprocess, sys, time
env = {{**os.environ, {parent.PARENT_ENV!r}: str(os.getpid())}}
child = subprocess.Popen([sys.executable, "-c", {CHILD!r}], env=env, stdout=subprocess.PIPE, text=True)
print(child.pid, child.stdout.readline().strip(), flush=True)
time.sleep(60)
"""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:  # a zombie is dead, only not yet reaped
        return f.read().rsplit(")", 1)[-1].split()[0] != "Z"


def test_a_process_dies_with_its_launcher_killed_by_sigkill():
    launcher = subprocess.Popen([sys.executable, "-c", LAUNCHER], stdout=subprocess.PIPE, text=True)
    try:
        pid_text, how = launcher.stdout.readline().split()
        child = int(pid_text)
        assert how in ("prctl", "thread") and _alive(child)
        launcher.send_signal(signal.SIGKILL)  # a notebook's kernel killed with kill -9
        launcher.wait(timeout=10)
        deadline = time.monotonic() + 5
        while _alive(child) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _alive(child), "the launched process outlived its launcher"
    finally:
        launcher.kill()


def test_without_a_launcher_named_nothing_is_followed_and_a_gone_one_ends_the_process_at_once():
    assert parent.follow_parent({}) is None and parent.follow_parent({parent.PARENT_ENV: "x"}) is None
    env = dict(os.environ, **{parent.PARENT_ENV: "1"})  # not this process's parent: the launcher is gone
    code = "from dpcourse.multihost import parent; parent.follow_parent(); print('went on')"
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == -signal.SIGKILL and "went on" not in done.stdout
