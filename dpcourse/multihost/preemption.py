"""What a process does when it is preempted: the exit status it leaves with after saving at the agreed step."""

from __future__ import annotations

import os
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


def ask_from(step: int) -> bool:
    """Tell JAX's preemption service the step this process starts from, right after joining, before any restore.

    ``multihost_utils.reached_preemption_sync_point(step)`` is True in every
    process at the same step: once a notice spread, each process sends the
    last step it passed (0 before its first call) and the service agrees on
    the largest plus one (XLA's ``preemption_sync_manager.cc``,
    ``ComputeSyncCallCounter``). A resumed run that first asks at its first
    step would, for a notice during its start-up or restore, be agreed at
    step 1, below its own: it trains on and the notice is lost. Asked with the
    step it resumes from (the latest in its checkpoint folder) right after
    joining, it is agreed at that step plus one, or later. The loop then asks
    with each step, as Orbax does when it saves (with the step it saves),
    so the two never disagree.

    Returns:
        Whether ``step`` itself is the agreed one (a notice agreed before this process asked: leave now).
    """
    from jax.experimental import multihost_utils

    return bool(multihost_utils.reached_preemption_sync_point(step))


def saved_steps(folder: str | os.PathLike | None) -> list[int]:
    """The numbered step folders of a checkpoint folder, oldest first ([] for none), read without JAX or Orbax."""
    if folder is None or not os.path.isdir(folder):
        return []
    return sorted(int(name) for name in os.listdir(folder) if name.isdigit())


def latest_saved_step(folder: str | os.PathLike | None) -> int:
    """The highest of :func:`saved_steps` (0: none)."""
    return max(saved_steps(folder), default=0)


_early = {"notice": False, "previous": None}


def hold_early_notice() -> None:
    """Keep a SIGTERM that comes before JAX's preemption service listens (start-up, the join), for :func:`pass_on_notice`.

    Call it first thing in a process whose preemption service will be on:
    JAX installs its own SIGTERM handler only in ``jax.distributed.initialize``,
    and until then SIGTERM would end the process at once.
    """
    _early["notice"] = False

    def note(signum, frame) -> None:
        _early["notice"] = True

    _early["previous"] = signal.signal(signal.SIGTERM, note)


def pass_on_notice(service_on: bool = True) -> bool:
    """After ``jax.distributed.initialize``: send a SIGTERM held by :func:`hold_early_notice` to JAX's handler.

    ``service_on``: JAX's preemption service started (its handler replaced
    the one held here); otherwise the handler from before comes back, and a
    held SIGTERM ends the process as it would have.

    Returns:
        Whether a notice had come before (with the service on, it is now JAX's, which spreads it).
    """
    if not service_on and _early["previous"] is not None:
        signal.signal(signal.SIGTERM, _early["previous"])
    if not _early["notice"]:
        return False
    _early["notice"] = False
    os.kill(os.getpid(), signal.SIGTERM)
    return True
