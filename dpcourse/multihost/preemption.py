"""What a process does when it is preempted, and lesson 13's sentences read from its numbers.

The exit status a process leaves with after saving at the agreed step; the grace period, a loss seen against
the heartbeat window, and what the lesson learned, each said from the run's own figures.
"""

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


def seen_sentence(seen_s: float, going_s: float, heartbeat_timeout_s: float | None, busy_load=None) -> str:
    """When the survivors saw a process killed between steps gone and trained again (s after the kill), against
    the heartbeat window: JAX's coordination service calls a process dead once its last heartbeat is older than
    the timeout T, a process sends one every T/2 and the service looks once a second (XLA's
    coordination_service_agent.cc and coordination_service.cc), so a kill is seen T/2 to T + 1 s on. A busy
    machine is named only with its evidence, ``busy_load`` (a load above the cores), and only when late."""
    window = ""
    if heartbeat_timeout_s is not None:
        low, high = heartbeat_timeout_s / 2, heartbeat_timeout_s + 1
        where = "inside" if low <= seen_s <= high else "outside"
        late = f" (a busy machine delays the barrier: load {busy_load:.1f})" if busy_load and seen_s > high else ""
        window = f", {where} the {low:g} to {high:g} s a heartbeat timeout of {heartbeat_timeout_s:g} s allows{late}"
    return (
        f"The survivors saw it gone {seen_s:.1f} s after the kill{window}, and trained again {going_s:.1f} s after it"
    )


def learned(figures: dict) -> list[str]:
    """Lesson 13's "What you learned", a sentence a kind of loss, read from the run's recorded ``figures`` (plain
    values by the lesson's record names; [] for a run that measured none): every verdict (steps done twice, a
    loss seen inside the heartbeat window, parameters within the tolerance) is decided from the numbers."""
    f = {k: v for k, v in figures.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
    if not {"preempted_steps_done_twice", "kill_to_seen_gone_s", "lost_in_allreduce_ended_s"} <= f.keys():
        return []

    def twice(name, params):
        n, diff = int(f[name]), f.get(f"{params}_max_abs_param_diff")
        tol = f.get(f"{params}_max_abs_param_diff_tolerance")
        said = "no step done twice" if n == 0 else f"{n} step{'s' * (n != 1)} done twice"
        verdict = "within" if None not in (diff, tol) and diff <= tol else "beyond"
        return (
            said
            if None in (diff, tol)
            else f"{said}; its parameters came {diff:.2g} from the reference's, {verdict} {tol:g}"
        )

    seen = seen_sentence(f["kill_to_seen_gone_s"], f["kill_to_next_step_s"], f.get("heartbeat_timeout_s"))
    return [
        f"Preemption: every process saved the agreed step {f['signal_to_committed_checkpoint_s']:.2f} s after the "
        f"notice, and the restart had {twice('preempted_steps_done_twice', 'preempted_resume')}.",
        f"A process killed between steps: {seen[0].lower()}{seen[1:]}, with "
        f"{twice('survivors_steps_done_twice', 'survivors')}; bringing it back was a restart, "
        f"{f['restart_to_first_step_s']:.1f} s to the first step.",
        f"A loss inside the all-reduce ended the run {f['lost_in_allreduce_ended_s']:.1f} s after the kill, and "
        f"process 0's {f['coordinator_lost_ended_s']:.1f} s after: both go back to the last save, so the "
        "checkpoint interval (section 4) decides what they cost.",
    ]
