"""Run notebook 13's local processes, preempt or lose one of them on cue, and say in one sentence how the run ended.

:func:`run_local` starts ``python -m dpcourse.multihost.elastic`` once per
process (lesson 08's environment, :func:`dpcourse.multihost.launcher.worker_env`,
with JAX's preemption service on), watches the events each one writes, sends
SIGTERM to one process once it reports a given step (a preemption notice), and
bounds every wait: the whole run by ``timeout_s``, and a run in which no
process reported anything for ``stall_s`` (processes waiting in an all-reduce
that will never finish) is ended by the launcher. :func:`ending` says what
happened and what to do, in one sentence, from what the run left.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from dpcourse.multihost import reaper
from dpcourse.multihost.distributed import format_coordinator_address
from dpcourse.multihost.elastic import read_events
from dpcourse.multihost.failures import output_tail
from dpcourse.multihost.ports import TcpUnavailable, free_port, tcp_unavailable
from dpcourse.multihost.preemption import PREEMPTED_EXIT_CODE

# What a process prints when JAX ends it because the coordination service went away with process 0.
COORDINATOR_GONE = "Terminating process because the JAX distributed service detected fatal errors"


@dataclass
class ElasticRun:
    """A finished local run of notebook 13.

    Attributes:
        exit_codes: each process's exit status (negative: ended by that signal).
        events: each process's events (``event``, ``t`` wall clock, ``step``, ...).
        stderr: the informative tail of each process's stderr.
        signal_t: wall clock when the launcher sent SIGTERM (None: it sent none).
        stalled: the launcher ended the run because no process reported anything for ``stall_s``.
        ended_t: wall clock when the last process ended.
        params: final parameters written by the lowest live process (None: none written).
        stall_s: the bound on silence this run had.
        checkpoint_steps: the steps in the checkpoint folder when the run ended.
        timed_out: the launcher ended the run at its time limit (``timeout_s``, given here when it did).
        started_t: wall clock when the launcher started the first process.
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

    def first(self, event: str, process: int | None = None) -> dict | None:
        """The earliest event of that name (in ``process``, or in any), or None."""
        found = [e for i, es in self.events.items() if process in (None, i) for e in es if e["event"] == event]
        return min(found, key=lambda e: e["t"]) if found else None

    def last_step(self, process: int) -> int:
        """The last step ``process`` reported done (0: none)."""
        return max((e["step"] for e in self.events.get(process, []) if e["event"] == "step"), default=0)


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
        preempt_process, preempt_after_step: send SIGTERM to that process once it reported that step.
        lose_process, lose_at, lose_where: that process kills itself (SIGKILL) at that step, between two
            steps or inside the step's all-reduce (:mod:`dpcourse.multihost.elastic`).
        leave_at: after a loss, the survivors save at this step and leave (for a restart with every process).
        heartbeat_timeout_s: seconds without a heartbeat before the coordination service calls a process dead:
            how soon survivors see a loss (with ``recoverable``), and how long a slow process may go quiet.
        step_s: the least time a step takes: each process waits out the rest of it (a larger model's step).
        timeout_s: limit for the whole run; stall_s: limit on a silence of every live process.

    Raises:
        TcpUnavailable: this machine lets no process open a TCP socket (checked before anything starts).
        ValueError: fewer than 1 process, or a global batch the processes' devices cannot split.
    """
    if n_processes < 1 or global_batch % n_processes:
        raise ValueError(f"Need n_processes >= 1 dividing the global batch, got {n_processes} and {global_batch}.")
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
    coordinator = format_coordinator_address("127.0.0.1", free_port())
    with tempfile.TemporaryDirectory(prefix="dpcourse-elastic-") as tmp:
        out = Path(tmp)
        procs, logs = {}, {}
        started_t = time.time()
        try:
            for i in range(n_processes):
                env = worker_env(i, n_processes, coordinator, init_timeout_s=int(min(60, timeout_s)))
                env["JAX_ENABLE_PREEMPTION_SERVICE"] = "true"  # SIGTERM is a preemption notice here
                logs[i] = open(out / f"stderr.{i}", "w+")  # noqa: SIM115 - closed below, after the process ended
                procs[i] = subprocess.Popen(
                    command + ["--out", str(out)],
                    env=env,
                    stdout=subprocess.DEVNULL,
                    stderr=logs[i],
                    stdin=subprocess.DEVNULL,
                    start_new_session=True,
                )
            signal_t, stopped = _watch(procs, out, preempt_process, preempt_after_step, timeout_s, stall_s)
        finally:
            reaper.end_all(procs, grace_s=1.0)
            ended_t = time.time()
            texts = {}
            for i, f in logs.items():
                f.seek(0)
                texts[i] = f.read()
                f.close()
        params = None
        if (out / "params.npz").exists():
            with np.load(out / "params.npz") as npz:
                params = {k: np.array(npz[k]) for k in npz.files}
        steps_saved = []
        if checkpoint_dir is not None and Path(checkpoint_dir).is_dir():
            steps_saved = sorted(int(p.name) for p in Path(checkpoint_dir).iterdir() if p.name.isdigit())
        return ElasticRun(
            exit_codes={i: p.returncode for i, p in procs.items()},
            events={i: read_events(out, i) for i in procs},
            stderr=texts,
            signal_t=signal_t,
            stalled=stopped == "stalled",
            ended_t=ended_t,
            stall_s=stall_s,
            params=params,
            checkpoint_steps=steps_saved,
            timed_out=timeout_s if stopped == "timeout" else None,
            started_t=started_t,
        )


def _watch(procs, out, preempt_process, preempt_after_step, timeout_s, stall_s) -> tuple[float | None, str | None]:
    """Wait for every process to end, within the bounds; send the preemption notice on cue.

    Returns:
        When SIGTERM was sent (None: not sent), and why the wait stopped early: ``"stalled"``,
        ``"timeout"``, or None when every process ended.
    """
    start = time.monotonic()
    signal_t, seen, heard = None, -1, time.monotonic()
    while time.monotonic() - start < timeout_s:
        codes = {i: p.poll() for i, p in procs.items()}
        if all(c is not None for c in codes.values()):
            return signal_t, None
        events = {i: read_events(out, i) for i in procs}
        count = sum(len(es) for es in events.values())
        if count != seen:
            seen, heard = count, time.monotonic()
        elif time.monotonic() - heard > stall_s:
            return signal_t, "stalled"
        if signal_t is None and preempt_process is not None:
            done = [e["step"] for e in events[preempt_process] if e["event"] == "step"]
            if done and max(done) >= preempt_after_step and codes[preempt_process] is None:
                procs[preempt_process].send_signal(signal.SIGTERM)
                signal_t = time.time()
        time.sleep(0.05)
    return signal_t, "timeout"


def ending(run: ElasticRun) -> str:
    """One sentence: how the run ended, from its exit statuses and events, and what to do next."""
    codes = run.exit_codes
    saved = [e["step"] for es in run.events.values() for e in es if e["event"] == "saved"]
    latest = f"step {max(run.checkpoint_steps)}" if run.checkpoint_steps else "no step yet"
    killed = run.first("killed")
    if all(c == 0 for c in codes.values()):
        return f"Every process finished: exit status 0 from all {len(codes)}."
    if saved and all(c in (PREEMPTED_EXIT_CODE, -signal.SIGKILL) for c in codes.values()):
        return (
            f"Every live process saved step {max(saved)} and left with status {PREEMPTED_EXIT_CODE} "
            "(preempted): restart every process; each resumes from that step."
        )
    gloo = [
        i for i, c in codes.items() if c not in (0, PREEMPTED_EXIT_CODE, -signal.SIGKILL) and "Gloo" in run.stderr[i]
    ]
    if killed is not None and killed["where"] == "collective" and gloo and not run.stalled:
        lost = next(i for i, es in run.events.items() if any(e["event"] == "killed" for e in es))
        return (
            f"Process {lost} was lost inside the all-reduce of step {killed['step'] + 1}; the others' all-reduce "
            f"failed (gloo: the connection closed) {run.ended_t - killed['t']:.1f} s later, and the CPU's collectives "
            f"cannot cancel one in flight and go on: restart every process from the latest checkpoint ({latest})."
        )
    if killed is not None and run.stalled:
        lost = next(i for i, es in run.events.items() if any(e["event"] == "killed" for e in es))
        waited = run.ended_t - killed["t"]
        return (
            f"Process {lost} was lost inside the all-reduce of step {killed['step'] + 1}; the CPU's collectives "
            f"(gloo) cannot cancel an all-reduce in flight, so the others waited in it until the launcher ended "
            f"them after {waited:.1f} s without news (its bound: {run.stall_s:g} s): restart every process from "
            f"the latest checkpoint ({latest})."
        )
    if codes.get(0) == -signal.SIGKILL and any(COORDINATOR_GONE in run.stderr.get(i, "") for i in codes if i):
        waited = run.ended_t - killed["t"] if killed else float("nan")
        return (
            f"Process 0, which runs the coordination service, was lost; JAX ended every other process within "
            f"{waited:.1f} s (SIGABRT: the service that says who is alive went with it): restart every process "
            f"from the latest checkpoint ({latest})."
        )
    if run.timed_out is not None:
        return f"The run passed its limit of {run.timed_out:g} s and the launcher ended it (statuses {codes})."
    if run.stalled:
        return f"No process reported anything for {run.stall_s:g} s and the launcher ended them (statuses {codes})."
    bad = next((i for i, c in codes.items() if c not in (0, PREEMPTED_EXIT_CODE)), None)
    if bad is None:
        return f"The processes ended with statuses {codes}, and no step was saved at a preemption."
    return f"Process {bad} failed (exit status {codes[bad]}): {output_tail(run.stderr.get(bad, ''), 1)}"
