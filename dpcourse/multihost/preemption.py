"""What a process does when it is preempted: the exit status it leaves with after saving at the agreed step."""

from __future__ import annotations

import signal

# The status a process leaves with after it saved at the preemption step every process agreed on:
# 128 + SIGTERM (15), the exit code Kubernetes reports for a container that SIGTERM ended, so a Job's
# podFailurePolicy can retry it as a preemption rather than count it as a failure.
PREEMPTED_EXIT_CODE = 128 + int(signal.SIGTERM)


def grace_sentence(signal_to_commit_s: float, grace_s: float, gke_spot_s: float) -> str:
    """One sentence: the time from SIGTERM to a committed checkpoint against the two grace periods.

    ``grace_s`` is Kubernetes' default ``terminationGracePeriodSeconds``,
    ``gke_spot_s`` what GKE gives an ordinary Pod when it shuts a Spot node
    down (both in :mod:`dpcourse.checkpoints.interval`, with their sources).
    A save still running when a grace period ends is cut off by SIGKILL.

    Raises:
        ValueError: a time that is not a positive number.
    """
    for name, value in (("signal_to_commit_s", signal_to_commit_s), ("grace_s", grace_s), ("gke_spot_s", gke_spot_s)):
        if not (isinstance(value, (int, float)) and 0 < value < float("inf")):
            raise ValueError(f"{name} is a time in seconds > 0, got {value!r}.")
    said = f"From the signal to the committed checkpoint: {signal_to_commit_s:.2f} s"
    (short_s, short), (long_s, long) = sorted(((grace_s, "Kubernetes' default"), (gke_spot_s, "a GKE Spot node's Pod")))
    both = f"{grace_s:g} s (Kubernetes' default) and {gke_spot_s:g} s (a GKE Spot node's Pod)"
    if signal_to_commit_s < short_s:
        margin = short_s / signal_to_commit_s
        return f"{said}, inside both grace periods, {both}: {margin:.0f} times shorter than the shorter one."
    if signal_to_commit_s < long_s:
        return (
            f"{said}, inside {long_s:g} s ({long}) but past {short_s:g} s ({short}): there SIGKILL cuts the save off."
        )
    return f"{said}, past both grace periods, {both}: SIGKILL would cut the save off; save less, or sooner."
