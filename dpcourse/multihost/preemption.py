"""What a process does when it is preempted: the exit status it leaves with after saving at the agreed step."""

from __future__ import annotations

import signal

# The status a process leaves with after it saved at the preemption step every process agreed on:
# 128 + SIGTERM (15), the exit code Kubernetes reports for a container that SIGTERM ended, so a Job's
# podFailurePolicy can retry it as a preemption rather than count it as a failure.
PREEMPTED_EXIT_CODE = 128 + int(signal.SIGTERM)
