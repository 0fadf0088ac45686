"""End a launch's worker processes within a bounded time, and name any that the kernel will not let die.

The launcher (:mod:`dpcourse.multihost.launcher`) ends every worker it
started whatever happened: SIGTERM to the worker's process group, SIGKILL
after a grace period. A process in uninterruptible sleep (Linux state
``D``: waiting on a disk or a network file system that stopped answering,
such as a hung NFS share of checkpoints) does not die even on SIGKILL until
that I/O returns; :func:`end_all` waits for it a bounded time, then returns
its pid instead of blocking the launcher's clean-up for ever.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from pathlib import Path

GRACE_S = 3.0  # SIGTERM to SIGKILL
KILL_WAIT_S = 10.0  # SIGKILL to giving up on a process that does not die


def start_process(command: list[str], env: dict[str, str], stdout, stderr) -> subprocess.Popen:
    """``command`` as a process of a local run: no stdin, a session of its own (:func:`end_all` ends its group)."""
    return subprocess.Popen(
        command, env=env, stdout=stdout, stderr=stderr, stdin=subprocess.DEVNULL, start_new_session=True
    )


def state(pid: int) -> str | None:
    """The state letter Linux reports for ``pid`` (``R``, ``S``, ``D``, ``T``, ``Z``, ...); None where unreadable."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[-1].split()[0]


def end_all(
    procs: dict[int, subprocess.Popen], grace_s: float = GRACE_S, kill_wait_s: float = KILL_WAIT_S, kill=os.killpg
) -> dict[int, int]:
    """End every process of ``procs`` still running: SIGTERM to its group, SIGKILL ``grace_s`` later.

    Args:
        procs: the launched processes by process id; each leads its own process group.
        kill: ``os.killpg`` (tests replace it to play a process that does not die).

    Returns:
        The processes still alive ``kill_wait_s`` after their SIGKILL, ``{process id: pid}``
        (empty when every one ended). Nothing waits on them any longer.
    """
    running = {i: p for i, p in procs.items() if p.poll() is None}
    for proc in running.values():
        with contextlib.suppress(ProcessLookupError):
            kill(proc.pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    killed = {}
    for i, proc in running.items():
        try:
            proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                kill(proc.pid, signal.SIGKILL)
            killed[i] = proc
    deadline = time.monotonic() + kill_wait_s
    stuck = {}
    for i, proc in killed.items():
        try:
            proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            stuck[i] = proc.pid
    return stuck


def stuck_message(stuck: dict[int, int], kill_wait_s: float = KILL_WAIT_S) -> str:
    """One sentence naming the processes that outlived SIGKILL, and why that happens; "" when none did."""
    if not stuck:
        return ""
    named = ", ".join(f"process {i} (pid {pid}, state {state(pid) or '?'})" for i, pid in sorted(stuck.items()))
    return (
        f" Still alive {kill_wait_s:.0f} s after SIGKILL: {named}. A process the kernel will not end is in "
        "uninterruptible sleep (state D), waiting on a disk or network file system that does not answer "
        "(a hung NFS share, say); it ends when that I/O returns or fails. Check the mount (`df`, `mount`) "
        "and the pid with `cat /proc/<pid>/stack`."
    )
