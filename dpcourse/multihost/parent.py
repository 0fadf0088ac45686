"""A launched process that ends when its launcher does: no worker goes on training after the kernel was killed.

:func:`dpcourse.multihost.elastic_run.run_local` gives each process the
launcher's pid in ``DPCOURSE_PARENT_PID``; :func:`follow_parent` (called
first thing in the process) asks Linux to send it SIGKILL when that parent
dies (``prctl(PR_SET_PDEATHSIG)``, man 2 prctl), and elsewhere watches
``os.getppid()`` from a thread. A launcher ended by ``kill -9`` (a
notebook's kernel killed) then leaves no process writing more steps.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import threading
import time

PARENT_ENV = "DPCOURSE_PARENT_PID"
PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
WATCH_S = 0.2  # how often the thread checks the parent where prctl is unavailable


def follow_parent(env: dict[str, str] | None = None) -> str | None:
    """End this process when the launcher named in ``DPCOURSE_PARENT_PID`` is gone.

    Returns:
        How: ``"prctl"`` (Linux), ``"thread"`` (elsewhere), ``"gone"`` (the
        launcher died before this call: the process has been told to end), or
        None (no launcher named: nothing to follow).
    """
    text = (os.environ if env is None else env).get(PARENT_ENV, "")
    if not text.strip().isdigit():
        return None
    parent = int(text)
    how = "thread"
    if sys.platform.startswith("linux"):
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            if libc.prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0) == 0:
                how = "prctl"
        except (OSError, AttributeError):
            pass
    if os.getppid() != parent:  # the launcher died before the death signal was asked for
        os.kill(os.getpid(), signal.SIGKILL)
        return "gone"
    if how == "thread":
        threading.Thread(target=_watch, args=(parent,), name="dpcourse-parent", daemon=True).start()
    return how


def _watch(parent: int) -> None:
    while os.getppid() == parent:
        time.sleep(WATCH_S)
    os.kill(os.getpid(), signal.SIGKILL)
