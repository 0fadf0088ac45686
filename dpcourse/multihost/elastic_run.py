"""Run notebook 13's local processes, preempt or lose one of them on cue, and say in one sentence how the run ended.

:func:`run_local` starts ``python -m dpcourse.multihost.elastic`` once per process, sends one SIGTERM on cue
(a preemption notice), bounds every wait (:func:`silence_bound`) and ends a run with SIGKILL, never a SIGTERM
the processes would take for a preemption; :func:`ending` says from what the run left what happened and what
to do.
"""

from __future__ import annotations

import atexit
import math
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from dpcourse.multihost import reaper
from dpcourse.multihost.elastic import LOSS_KINDS, MAX_HEARTBEAT_TIMEOUT_S, read_arrays, read_events
from dpcourse.multihost.failures import load_average, output_tail
from dpcourse.multihost.parent import PARENT_ENV
from dpcourse.multihost.ports import TcpUnavailable, private_coordinator, private_network, run_folder, tcp_unavailable
from dpcourse.multihost.preemption import PREEMPTED_EXIT_CODE, saved_steps

# What a process prints when JAX ends it because the coordination service went away with process 0.
COORDINATOR_GONE = "Terminating process because the JAX distributed service detected fatal errors"
JOIN_S = 60.0  # after "started": importing JAX (seconds on a loaded machine), then JAX's own bound on the join
COMPILE_S = 60.0  # each of: the imports and data, a restore, a compile (a loaded 2-core machine: tens of s each)
SAVE_S = 60.0  # a save at the agreed step: Orbax's barrier waits this long (dpcourse.checkpoints SAVE_BARRIER_S)
PREEMPT_CUES = ("step", "restore")  # the notice goes after a step, or as the process starts restoring


class _OneSentence:
    """An error shown in a notebook as its sentence alone (IPython's ``_render_traceback_``), not a traceback."""

    def _render_traceback_(self) -> list[str]:
        return [f"{type(self).__name__}: {self}"]


class RunRefused(_OneSentence, ValueError):
    """A parameter of the run cannot work; nothing was started. The message names it and what to change."""


class CheckpointLeftover(RunRefused):
    """The checkpoint folder holds an earlier run's steps, past the cue this run was given."""


class RunEndedEarly(_OneSentence, RuntimeError):
    """The run ended before what a lesson's section needs from it; the message is :func:`ending`'s sentence."""


@dataclass
class ElasticRun:
    """A finished local run of notebook 13.

    Attributes:
        exit_codes: each process's exit status (negative: ended by that signal).
        events: each process's events (``event``, ``t`` wall clock, ``step``, ...).
        stderr: the informative tail of each process's stderr.
        signal_t: wall clock when the launcher sent the preemption notice (None: it sent none).
        stalled: the launcher ended the run: no process reported anything past its bound (:func:`silence_bound`).
        ended_t: wall clock when the last process ended.
        params: final parameters written by the lowest live process (None: none written).
        stall_s: the bound on a silence inside a step, this run's ``stall_s``.
        checkpoint_steps: the steps in the checkpoint folder when the run ended.
        timed_out: the launcher ended the run at its time limit (``timeout_s``, given here when it did).
        started_t: wall clock when the launcher started the first process.
        waited: at a stall, what each live process waited for and how long it may ({process: words}).
        load: the highest 1-minute load average seen during the run; cores: this machine's cores.
        plan: what the run was told (steps, the preemption and loss cues, the heartbeat timeout, the folder).
        interrupted: the learner interrupted the run (the launcher ended every process).
    """

    exit_codes: dict[int, int]
    events: dict[int, list[dict]]
    stderr: dict[int, str]
    signal_t: float | None
    stalled: bool
    ended_t: float
    stall_s: float
    params: dict[str, np.ndarray] | None = None
    checkpoint_steps: list[int] = field(default_factory=list)
    timed_out: float | None = None
    started_t: float = 0.0
    waited: dict[int, str] = field(default_factory=dict)
    load: float | None = None
    cores: int = field(default_factory=lambda: os.cpu_count() or 1)
    plan: dict = field(default_factory=dict)
    interrupted: bool = False

    def first(self, event: str, process: int | None = None) -> dict | None:
        """The earliest event of that name (in ``process``, or in any), or None."""
        found = [e for i, es in self.events.items() if process in (None, i) for e in es if e["event"] == event]
        return min(found, key=lambda e: e["t"]) if found else None

    def last_step(self, process: int) -> int:
        """The last step ``process`` reported done (0: none)."""
        return max((e["step"] for e in self.events.get(process, []) if e["event"] == "step"), default=0)

    def require(self, *names: str) -> list[dict]:
        """The first event of each name; raises :class:`RunEndedEarly` with :func:`ending`'s sentence if one is missing."""
        found = [self.first(name) for name in names]
        if any(e is None for e in found):
            raise RunEndedEarly(ending(self))
        return found

    def busy(self) -> bool:
        """Whether the machine had more runnable work than cores at some moment of the run (1-minute load average)."""
        return self.load is not None and self.load > self.cores


def fresh_folder(path: str | os.PathLike) -> Path:
    """``path`` as a new, empty folder (whatever an earlier run left there is removed): a run that starts afresh."""
    path = Path(path)
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(parents=True)
    return path


def checkpoint_root(prefix: str = "dpcourse-elastic-", need_bytes: int = 64 * 2**20) -> Path:
    """A temporary folder for a lesson's checkpoints (:func:`dpcourse.checkpoints.scratch.scratch_folder`),
    removed when the Python process ends (a kernel shut down or restarted), whatever cell it stopped in."""
    from dpcourse.checkpoints import scratch

    root = scratch.scratch_folder(prefix, need_bytes)
    atexit.register(shutil.rmtree, root, True)
    return root


STEP_ROOM_S = 5.0  # a paced step's own work beyond step_s (compute, the all-reduce) on a loaded 2-core machine
PACED = ("steps", "step_s", "stall_s", "timeout_s", "heartbeat_timeout_s", "recoverable")  # a plan's times


def check_pacing(steps, step_s, stall_s, timeout_s, heartbeat_timeout_s=0, recoverable=False, refuse=True):
    """One sentence (raised as :class:`RunRefused`; ``refuse=False``: returned) on times that cannot work
    together: ``stall_s`` below ``step_s`` + :data:`STEP_ROOM_S`, or the steps (and for a recoverable run a
    heartbeat timeout and a second) past ``timeout_s``; it names them and values that work. None: they can."""
    need, problem = steps * step_s + (heartbeat_timeout_s + 1 if recoverable else 0), None
    if stall_s < step_s + STEP_ROOM_S:
        problem = (
            f"step_s (STEP_S) = {step_s:g} s leaves a step no room within stall_s (STALL_S) = {stall_s:g} s: a "
            f"step reports nothing for step_s, and the launcher ends a run silent for stall_s inside a step, so "
            f"stall_s must be at least step_s + {STEP_ROOM_S:g} s; set STALL_S = {step_s + 2 * STEP_ROOM_S:g} (or "
            f"STEP_S = {max(0.0, stall_s - 2 * STEP_ROOM_S):g})."
        )
    elif need >= timeout_s:
        beat = f" and a heartbeat timeout of {heartbeat_timeout_s:g} s + 1" if recoverable else ""
        problem = (
            f"The run's {steps} steps (STEPS) of at least {step_s:g} s (STEP_S){beat} take {need:g} s, and "
            f"timeout_s (LAUNCH_TIMEOUT_S) = {timeout_s:g} s ends it before: set LAUNCH_TIMEOUT_S = "
            f"{need + timeout_s:g} (what it leaves now for the start-up, on top), or a smaller STEP_S."
        )
    if problem and refuse:
        raise RunRefused(problem)
    return problem


def check_plan(plan: dict) -> None:
    """Refuse, in one sentence, a run whose parameters cannot work (:class:`RunRefused`), before anything starts."""
    n, steps, batch = plan["n_processes"], plan["steps"], plan["global_batch"]

    def whole(name, value, low, high=None):
        ok = isinstance(value, int) and not isinstance(value, bool) and value >= low and (high is None or value <= high)
        if not ok:
            span = f"from {low} to {high}" if high is not None else f"{low} or more"
            raise RunRefused(f"{name} must be a whole number {span}, got {value!r}.")

    whole("n_processes", n, 1)
    whole("steps", steps, 1)
    if not isinstance(batch, int) or batch < 1 or batch % n:
        raise RunRefused(f"The global batch must be a positive multiple of the {n} processes, got {batch!r}.")
    for name in ("timeout_s", "stall_s"):
        if not (isinstance(plan[name], (int, float)) and 0 < plan[name] < math.inf):
            raise RunRefused(f"{name} must be a number of seconds above 0, got {plan[name]!r}.")
    if not (isinstance(plan["step_s"], (int, float)) and 0 <= plan["step_s"] < math.inf):
        raise RunRefused(f"step_s must be 0 or more seconds, got {plan['step_s']!r}.")
    beat = plan["heartbeat_timeout_s"]
    whole("heartbeat_timeout_s (HEARTBEAT_TIMEOUT_S)", beat, 1, min(MAX_HEARTBEAT_TIMEOUT_S, int(plan["timeout_s"])))
    check_pacing(*(plan[k] for k in PACED))
    if plan["save_every"] is not None:
        whole("save_every", plan["save_every"], 1)
    if plan["preempt_process"] is not None:
        whole("preempt_process", plan["preempt_process"], 0, n - 1)
        if plan["preempt_on"] not in PREEMPT_CUES:
            raise RunRefused(f"preempt_on must be one of {PREEMPT_CUES}, got {plan['preempt_on']!r}.")
        if plan["preempt_on"] == "step":
            whole(
                "preempt_after_step (PREEMPT_AFTER): a step the run reaches, below steps",
                plan["preempt_after_step"],
                1,
                steps - 1,
            )
    if plan["lose_process"] is not None:
        whole("lose_process", plan["lose_process"], 0, n - 1)
        whole("lose_at (LOSE_AT): a step of the run, below steps", plan["lose_at"], 0, steps - 1)
        if plan["lose_where"] not in LOSS_KINDS:
            raise RunRefused(f"lose_where must be one of {LOSS_KINDS}, got {plan['lose_where']!r}.")
    if plan["leave_at"] is not None:
        if plan["lose_process"] is None or not plan["recoverable"]:
            raise RunRefused(
                "leave_at (LEAVE_AT) is where the survivors of a loss leave: give lose_process and "
                "recoverable=True too."
            )
        whole(
            f"leave_at (LEAVE_AT): a step after lose_at ({plan['lose_at']}) and below steps",
            plan["leave_at"],
            plan["lose_at"] + 1,
            steps - 1,
        )


def _check_leftover(plan: dict) -> None:
    """Refuse a cue the run would never reach because its folder holds a later step (an earlier run's)."""
    steps = saved_steps(plan["checkpoint_dir"])
    if not steps:
        return
    cues = []
    if plan["preempt_process"] is not None and plan["preempt_on"] == "step":
        cues.append((plan["preempt_after_step"], "preemption"))
    if plan["lose_process"] is not None:
        cues.append((plan["lose_at"], "loss"))
    for step, what in cues:
        if steps[-1] >= step:
            folder = plan["checkpoint_dir"]
            raise CheckpointLeftover(
                f"The checkpoint folder {folder} already holds step {steps[-1]} from an earlier run, so this run "
                f"would resume there, past its {what} at step {step}: start it on a new folder "
                f"(elastic_run.fresh_folder({str(folder)!r}) empties this one)."
            )


def run_local(
    n_processes: int,
    steps: int,
    global_batch: int,
    *,
    profile: str | None = None,
    data_source: str | None = None,
    checkpoint_dir: str | os.PathLike | None = None,
    recoverable: bool = False,
    heartbeat_timeout_s: int = 10,
    step_s: float = 0.0,
    preempt_process: int | None = None,
    preempt_after_step: int | None = None,
    preempt_on: str = "step",
    lose_process: int | None = None,
    lose_at: int | None = None,
    lose_where: str = "between",
    leave_at: int | None = None,
    save_every: int | None = None,
    timeout_s: float = 120.0,
    stall_s: float = 15.0,
) -> ElasticRun:
    """Run ``n_processes`` local processes of one CPU device each; preempt or lose one on cue.

    Args:
        preempt_process, preempt_after_step: send SIGTERM to that process once it reported that step
            (``preempt_on="step"``), or as it begins restoring a checkpoint (``preempt_on="restore"``).
        lose_process, lose_at, lose_where: that process kills itself (SIGKILL) at that step, between two
            steps or inside the step's all-reduce (:mod:`dpcourse.multihost.elastic`).
        leave_at: after a loss, the survivors save at this step and leave (for a restart with every process).
        heartbeat_timeout_s: seconds without a heartbeat before the coordination service calls a process dead:
            how soon survivors see a loss (with ``recoverable``), and how long a slow process may go quiet.
        step_s: the least time a step takes: each process waits out the rest of it (a larger model's step).
        timeout_s: limit for the whole run; stall_s: limit on a silence of every live process inside a step
            (the other stages have the bounds of :func:`silence_bound`).

    Raises:
        RunRefused: a parameter that cannot work (one sentence: a cue past the run, a heartbeat timeout of 0,
            a batch the processes cannot split, ...); CheckpointLeftover: ``checkpoint_dir`` holds an earlier
            run's step past this run's cue. Both before anything starts; both are ValueErrors.
        TcpUnavailable: this machine lets no process open a TCP socket (checked before anything starts).
        KeyboardInterrupt: the run was interrupted; every process was ended first, and the message says so
            (a notebook shows that sentence alone).
    """
    plan = dict(
        n_processes=n_processes, steps=steps, global_batch=global_batch, checkpoint_dir=checkpoint_dir,
        recoverable=recoverable, heartbeat_timeout_s=heartbeat_timeout_s, step_s=step_s, timeout_s=timeout_s,
        stall_s=stall_s, preempt_process=preempt_process, preempt_after_step=preempt_after_step,
        preempt_on=preempt_on, lose_process=lose_process, lose_at=lose_at, lose_where=lose_where,
        leave_at=leave_at, save_every=save_every,
    )  # fmt: skip
    check_plan(plan)
    _check_leftover(plan)
    reason = tcp_unavailable()
    if reason:
        raise TcpUnavailable(reason)
    from dpcourse.multihost.launcher import worker_env

    command = [sys.executable, "-m", "dpcourse.multihost.elastic", "--steps", str(steps)]
    command += ["--global-batch", str(global_batch), "--heartbeat-timeout-s", str(heartbeat_timeout_s)]
    command += ["--step-s", str(step_s)]
    for flag, value in (
        ("--profile", profile),
        ("--data-source", data_source),
        ("--checkpoint-dir", checkpoint_dir),
        ("--lose-process", lose_process),
        ("--lose-at", lose_at),
        ("--lose-where", lose_where if lose_process is not None else None),
        ("--leave-at", leave_at),
        ("--save-every", save_every),
    ):
        if value is not None:
            command += [flag, str(value)]
    if recoverable:
        command.append("--recoverable")
    # The run keeps to this user: the coordinator on a Unix socket in the run's 0700 folder, gloo inside the
    # run's own network namespace where Linux allows one (dpcourse.multihost.ports).
    with run_folder("dpcourse-elastic-") as tmp, private_network() as network:
        out = Path(tmp)
        coordinator = private_coordinator(out)
        procs, logs = {}, {}
        started_t = time.time()
        watched = (None, None, {}, None)
        interrupted = False
        try:
            for i in range(n_processes):
                env = worker_env(i, n_processes, coordinator, init_timeout_s=int(min(60, timeout_s)))
                env["JAX_ENABLE_PREEMPTION_SERVICE"] = "true"  # SIGTERM is a preemption notice here
                env[PARENT_ENV] = str(os.getpid())  # each process ends with this one (a kernel killed)
                logs[i] = open(out / f"stderr.{i}", "w+")  # noqa: SIM115 - closed below, after the process ended
                procs[i] = reaper.start_process(
                    network.prefix + command + ["--out", str(out)], env, subprocess.DEVNULL, logs[i]
                )
            watched = _watch(procs, out, plan)
        except KeyboardInterrupt:
            interrupted = True
        finally:
            # SIGKILL at once: a SIGTERM would reach JAX's preemption handler, and the processes would save a step
            # nobody asked for (the launcher's own end is no preemption).
            reaper.end_all(procs, grace_s=0.0, kill=_sigkill)
            ended_t = time.time()
            texts = {}
            for i, f in logs.items():
                f.seek(0)
                texts[i] = f.read()
                f.close()
        signal_t, stopped, waited, load = watched
        params = read_arrays(out / "params.npz") if (out / "params.npz").exists() else None
        run = ElasticRun(
            exit_codes={i: p.returncode for i, p in procs.items()},
            events={i: read_events(out, i) for i in procs},
            stderr=texts,
            signal_t=signal_t,
            stalled=stopped == "stalled",
            ended_t=ended_t,
            stall_s=stall_s,
            params=params,
            checkpoint_steps=saved_steps(checkpoint_dir),
            timed_out=timeout_s if stopped == "timeout" else None,
            started_t=started_t,
            waited=waited,
            load=_higher(load, load_average()),
            plan=plan,
            interrupted=interrupted,
        )
    if interrupted:
        # Still a KeyboardInterrupt by name (notebook runners report an interrupted run by it), shown as its sentence.
        stop = KeyboardInterrupt(ending(run))
        stop._render_traceback_ = lambda: [f"KeyboardInterrupt: {stop}"]
        raise stop from None
    return run


def _sigkill(pgid: int, _signal: int) -> None:
    """``os.killpg`` that always sends SIGKILL (the reaper's first SIGTERM would read as a preemption notice)."""
    os.killpg(pgid, signal.SIGKILL)


def _higher(a: float | None, b: float | None) -> float | None:
    return b if a is None else a if b is None else max(a, b)


def silence_bound(last: dict | None, plan: dict) -> tuple[str, float | None]:
    """What a process waits for after its last event ``last``, and how long it may stay silent then (s).

    The bound starts at the first moment a process can report (its
    ``started`` event) and grows with what it waits for: importing JAX and
    joining (:data:`JOIN_S` beyond JAX's own bound on the join), the imports
    and the data, a restore, a compile (:data:`COMPILE_S` each), a save
    (:data:`SAVE_S`), the liveness barrier of a recoverable run (up to a
    heartbeat timeout, and the coordination service's check once a second),
    a step's all-reduce (``stall_s``). None: no bound but the run's
    (a process that has not reported yet).
    """
    name = None if last is None else last["event"]
    stall = float(plan["stall_s"])
    if name is None:
        return "starting Python", None
    if name == "started":
        return "importing JAX and joining the others", JOIN_S + min(60, plan["timeout_s"])
    if name == "joined":
        return "importing Orbax and loading the data", max(stall, COMPILE_S)
    if name in ("loaded", "restoring", "resumed", "compiling", "live"):
        return "restoring or compiling", max(stall, COMPILE_S)
    if name == "sync point":
        return "saving the agreed step", max(stall, SAVE_S)
    if name == "step" and plan["recoverable"]:
        return "the liveness barrier before the next step", stall + plan["heartbeat_timeout_s"] + 1.0
    return "the step's all-reduce" if name in ("alive", "step") else "leaving", stall


def _watch(procs, out, plan) -> tuple[float | None, str | None, dict[int, str], float | None]:
    """Wait for every process to end, within the bounds; send the preemption notice on cue.

    Returns:
        When SIGTERM was sent (None: not sent); why the wait stopped early: ``"stalled"``,
        ``"timeout"``, or None when every process ended; at a stall, what each live process waited
        for; the highest 1-minute load average seen.
    """
    start = time.monotonic()
    signal_t, load, sampled = None, load_average(), start
    target = plan["preempt_process"]
    while time.monotonic() - start < plan["timeout_s"]:
        codes = {i: p.poll() for i, p in procs.items()}
        if all(c is not None for c in codes.values()):
            return signal_t, None, {}, load
        if time.monotonic() - sampled >= 1.0:
            load, sampled = _higher(load, load_average()), time.monotonic()
        events = {i: read_events(out, i) for i in procs}
        live = [i for i, c in codes.items() if c is None]
        lasts = {i: events[i][-1] if events[i] else None for i in live}
        bounds = {i: silence_bound(lasts[i], plan) for i in live}
        heard = [e["t"] for e in lasts.values() if e is not None]
        if heard and all(b is not None for _, b in bounds.values()):
            silent_s = time.time() - max(heard)
            if silent_s > max(b for _, b in bounds.values()):
                waited = {i: f"{what} (bound {b:g} s)" for i, (what, b) in bounds.items()}
                return signal_t, "stalled", waited, load
        if signal_t is None and target is not None and codes[target] is None:
            mine = events[target]
            if plan["preempt_on"] == "restore":
                due = any(e["event"] in ("restoring", "resumed") for e in mine)
            else:
                due = any(e["event"] == "step" and e["step"] >= plan["preempt_after_step"] for e in mine)
            if due:
                procs[target].send_signal(signal.SIGTERM)
                signal_t = time.time()
        time.sleep(0.05)
    return signal_t, "timeout", {}, load


def _who(run: ElasticRun, event: str) -> int | None:
    return next((i for i, es in run.events.items() if any(e["event"] == event for e in es)), None)


def _machine_made_it_late(run: ElasticRun) -> bool:
    """The machine, not the settings, made it late: a load above the cores, times that agree, a join bound kept."""
    times = [run.plan.get(k) for k in PACED]
    settings = None not in times and check_pacing(*times, refuse=False)
    return run.busy() and not settings and run.plan.get("timeout_s", JOIN_S) >= JOIN_S


def _busy_words(run: ElasticRun) -> str:
    return f"load average {run.load:.1f} on {run.cores} cores" if run.load is not None else "load unknown"


def ending(run: ElasticRun) -> str:
    """One sentence: how the run ended, decided from what happened, and what to do next.

    What happened: who ended the processes (they themselves, the launcher at
    a bound or its time limit, an interrupt), where a planned kill fell
    (between two steps, inside the all-reduce, process 0), who sent a
    SIGTERM (the launcher's preemption notice; its own end is SIGKILL),
    which step was agreed and saved, and how busy the machine was.
    """
    codes, plan = run.exit_codes, run.plan
    n = len(codes)
    latest = f"step {max(run.checkpoint_steps)}" if run.checkpoint_steps else "no step yet"
    folder = plan.get("checkpoint_dir")
    killed, lost = run.first("killed"), _who(run, "killed")
    agreed, seen = run.first("sync point"), run.first("live")
    kill_words = ""
    if killed is not None:
        i = killed["step"]
        where = (
            f"inside the all-reduce of step {i + 1}"
            if killed["where"] == "collective"
            else f"between steps {i} and {i + 1}"
        )
        kill_words = f"Process {lost} was killed (SIGKILL, as planned) {where}"
    if run.interrupted:
        kept = f"its checkpoint folder {folder} holds {latest}" if folder else "it had no checkpoint folder"
        return (
            f"You interrupted the run {run.ended_t - run.started_t:.1f} s after it started: every process was "
            f"ended (statuses {codes}), and {kept}; run the cell again to start afresh."
        )
    if run.stalled or run.timed_out is not None:
        if killed is not None and killed["where"] == "collective" and lost != 0:
            return (
                f"{kill_words}; the CPU's collectives (gloo) cannot cancel an all-reduce in flight, so the others "
                f"waited in it until the launcher ended them {run.ended_t - killed['t']:.1f} s after the kill "
                f"(its bound: {run.stall_s:g} s without news): restart every process from the latest checkpoint "
                f"({latest})."
            )
        what = "; ".join(f"process {i}: {w}" for i, w in sorted(run.waited.items())) or "no process had reported"
        limit = f"passed its limit of {run.timed_out:g} s" if run.timed_out is not None else "went silent"
        if _machine_made_it_late(run):
            return (
                f"The machine was too busy for this run ({_busy_words(run)}): it {limit} while waiting for {what}, "
                f"and the launcher ended it (statuses {codes}); nothing is wrong with the run: run the cell again, "
                "when fewer programs run."
            )
        cause = f"{kill_words}, and then the run" if killed is not None else "The run"
        return (
            f"{cause} {limit} while waiting for {what} ({_busy_words(run)}), and the launcher ended it (statuses "
            f"{codes}): look at the processes' stderr (run.stderr), and restart from the latest checkpoint "
            f"({latest})."
        )
    resumed = run.first("resumed")
    if killed is not None:
        if lost == 0 and any(COORDINATOR_GONE in run.stderr.get(i, "") for i in codes if i):
            return (
                f"{kill_words}: process 0 runs the coordination service, and JAX ended every other process within "
                f"{run.ended_t - killed['t']:.1f} s (SIGABRT: the service that says who is alive went with it): "
                f"restart every process from the latest checkpoint ({latest})."
            )
        others = {i: c for i, c in codes.items() if i != lost}
        if killed["where"] == "collective" and any("Gloo" in run.stderr.get(i, "") for i in others):
            return (
                f"{kill_words}; the others' all-reduce failed (gloo: the connection closed) "
                f"{run.ended_t - killed['t']:.1f} s later, and the CPU's collectives cannot cancel one in flight "
                f"and go on: restart every process from the latest checkpoint ({latest})."
            )
        if seen is not None and set(others.values()) == {PREEMPTED_EXIT_CODE}:
            saved = max(e["step"] for es in run.events.values() for e in es if e["event"] == "saved")
            return (
                f"{kill_words}; the survivors saw it gone {seen['t'] - killed['t']:.1f} s later, went on without "
                f"it, saved step {saved} and left with status {PREEMPTED_EXIT_CODE}: restart every process; each "
                f"resumes from step {saved}."
            )
        if set(others.values()) == {0}:
            return (
                f"{kill_words}; the survivors went on without it to the last step, {plan.get('steps')}, and "
                f"finished (exit status 0), so there is nothing to restart."
            )
    if run.signal_t is not None:
        target = plan.get("preempt_process")
        if agreed is not None and set(codes.values()) == {PREEMPTED_EXIT_CODE}:
            return (
                f"Process {target} got the preemption notice (SIGTERM); every process saved step "
                f"{agreed['step']}, the step they agreed on, and left with status {PREEMPTED_EXIT_CODE}: restart "
                f"every process; each resumes from step {agreed['step']}."
            )
        if agreed is None and set(codes.values()) == {0}:
            return (
                f"Process {target} got the preemption notice (SIGTERM), but the run reached its last step, "
                f"{plan.get('steps')}, before the processes agreed on a step to save, and every process finished "
                "(exit status 0): send the notice earlier."
            )
    if all(c == 0 for c in codes.values()):
        if resumed is not None and resumed["step"] >= plan.get("steps", math.inf):
            return (
                f"Every process finished (exit status 0 from all {n}) without training a step: the checkpoint "
                f"folder {folder} already held step {resumed['step']}, a finished run's; give a new run a new folder."
            )
        return f"Every process finished: exit status 0 from all {n}."
    bad = next((i for i, c in sorted(codes.items()) if c not in (0, PREEMPTED_EXIT_CODE) and i != lost), None)
    if bad is None:
        return f"The processes ended with statuses {codes}, and no step was saved at a preemption."
    said = output_tail(run.stderr.get(bad, ""), 1)
    if _machine_made_it_late(run) and "DEADLINE_EXCEEDED" in run.stderr.get(bad, ""):
        return (
            f"The machine was too busy for this run ({_busy_words(run)}): process {bad} gave up waiting for the "
            f"others to join (exit status {codes[bad]}); nothing is wrong with the run: run the cell again, when "
            "fewer programs run."
        )
    return f"Process {bad} failed (exit status {codes[bad]}): {said}"
