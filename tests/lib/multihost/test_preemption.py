"""dpcourse.multihost.preemption: the preempted status is the one a shell reports for a process SIGTERM ended."""

from __future__ import annotations

import signal
import subprocess
import sys

from dpcourse.multihost import preemption


def test_the_preempted_status_is_128_plus_sigterm():
    assert preemption.PREEMPTED_EXIT_CODE == 143 == 128 + signal.SIGTERM


def test_a_shell_reports_a_process_ended_by_sigterm_with_the_preempted_status():
    """A container's exit code, as Kubernetes reads it, is its main process's status through a shell: 128 + signal."""
    script = f"{sys.executable} -c 'import os, signal; os.kill(os.getpid(), signal.SIGTERM)'; echo $?"
    out = subprocess.run(["sh", "-c", script], capture_output=True, text=True, timeout=60, check=True)
    assert int(out.stdout.split()[-1]) == preemption.PREEMPTED_EXIT_CODE
