"""Why a worker of a local multi-process run failed, in words: its output's informative tail, the likely cause, the first cause."""

from __future__ import annotations

import os
import re
import signal
from collections.abc import Sequence

from dpcourse.backend.xlaflags import describe_abort

# Lines of an absl "Check failure" stack dump: addresses, not information.
_STACK_LINE = re.compile(r"^\s+@\s+0x[0-9a-f]+")
_GLOO_NOTICE = re.compile(r"is connected to \d+ peer ranks")
_GLOO_FRAGMENT = re.compile(r"\s*\[Gloo\] Rank\s*$")
# The whole notice, with a line break allowed between any two of its words (where the
# interleaving split it): "[Gloo] Rank 0 is connected to 7 peer ranks. Expected number of
# connected peer ranks is : 7".
_GLOO_WHOLE = re.compile(
    r"\[Gloo\]\s*Rank\s*\d+\s*is\s*connected\s*to\s*\d+\s*peer\s*ranks\.?"
    r"(\s*Expected\s*number\s*of\s*connected\s*peer\s*ranks\s*is\s*:\s*\d+)?"
)


def output_tail(text: str, lines: int = 15) -> str:
    """The last ``lines`` informative lines of a worker's output.

    Drops the addresses of absl's stack dumps and gloo's connection notices
    (``[Gloo] Rank 3 is connected to 7 peer ranks``), also when gloo's C++
    output and Python's were interleaved and split such a notice over two
    lines (``... [Gloo] Rank`` then ``4 is connected to 7 peer ranks ...``).
    """
    kept = []
    for line in _GLOO_WHOLE.sub("", text).splitlines():
        line = _GLOO_FRAGMENT.sub("", line).rstrip()
        if line.strip() and not _STACK_LINE.match(line) and not _GLOO_NOTICE.search(line):
            kept.append(line)
    return "\n".join(kept[-lines:])


class DiskFull(RuntimeError):
    """A launcher could not write its folder (logs, results): the disk is full. Every process was ended."""


BUSY_LOAD_PER_CORE = 1.5  # more runnable processes per core than this: the machine is busy
MAX_LOAD_FACTOR = 4.0  # a start-up bound grows with the load up to this many times


def load_average() -> float | None:
    """The 1-minute load average (None where the platform has none)."""
    try:
        return os.getloadavg()[0]
    except (OSError, AttributeError):  # not on every system
        return None


def _load_per_core() -> float:
    return (load_average() or 0.0) / (os.cpu_count() or 1)


def load_factor() -> float:
    """How much longer than on a quiet machine a start-up may take now: 1 to :data:`MAX_LOAD_FACTOR`.

    The 1-minute load average per core: at a load of 9 on 2 cores, 4
    processes wait for each core, and starting Python and importing JAX
    takes about that many times as long.
    """
    return min(MAX_LOAD_FACTOR, max(1.0, _load_per_core()))


def _load_said() -> str:
    load = _load_per_core() * (os.cpu_count() or 1)
    return f"load average {load:.1f} on {os.cpu_count()} cores"


def busy_note() -> str:
    """`` The machine is busy (...): a re-run ... will do.`` where it is; "" on a quiet machine."""
    if _load_per_core() < BUSY_LOAD_PER_CORE:
        return ""
    return f" The machine is busy ({_load_said()}): a re-run when it is quieter will do."


def too_busy_message(wall_s: float, ready: int, launched: int) -> str:
    """The one sentence for a start-up that outlasted its bound: the machine was too busy, and a re-run will do."""
    return (
        f"The machine was too busy to start the run: after {wall_s:.0f} s only {ready} of {launched} processes had "
        f"started Python and imported JAX ({_load_said()}); nothing in the run is wrong, and a re-run will do once "
        "the machine is quieter (or with fewer processes)."
    )


DISK_FULL_MARKS = ("No space left on device", "Disk quota exceeded", "[Errno 28]", "[Errno 122]")


def disk_full_sentence(folder: str) -> str:
    """One sentence for a run that ran out of disk space in ``folder`` (its logs, results, checkpoints)."""
    return (
        f"The disk that holds {folder} is full (No space left on device), so the run could not write its "
        "output: free some space there, or start Python or JupyterLab with TMPDIR set to a folder on a disk "
        "with room (inside a running kernel it comes too late: Python's tempfile keeps the folder it found first), and run again."
    )


def port_taken(stderr: str) -> bool:
    """Whether a worker's stderr says the coordinator's port was taken.

    When the port is taken, JAX 0.10.2 usually raises "Failed to start RPC
    server", but now and then crashes (SIGSEGV) right after logging "Failed
    to add port to server": look for both.
    """
    return any(s in stderr for s in ("Failed to start RPC server", "Failed to add port", "CoordinatorPortInUse"))


def diagnose(
    stderr: str,
    exit_code: int,
    process_id: int,
    launched: Sequence[int],
    num_processes: int,
    coordinator: str,
    init_timeout_s: int,
) -> str:
    """A sentence on the likely cause of a worker's failure."""
    n_launched = len(launched)
    flags = describe_abort(stderr)
    if flags:
        return f"Process {process_id} stopped at JAX's start: {flags}"
    if any(mark in stderr for mark in DISK_FULL_MARKS):
        return disk_full_sentence("the run's files (its temp folder, or the checkpoint folder)")
    if port_taken(stderr):
        return (
            f"The coordinator could not listen on {coordinator}: the port is already in use. "
            "Pass another port, or port=None to pick a free one."
        )
    if "DEADLINE_EXCEEDED" in stderr and ("RegisterTask" in stderr or "Barrier" in stderr):
        if 0 not in launched:
            return (
                f"The coordinator at {coordinator} could not be reached within {init_timeout_s} s: process 0, "
                "which runs it, was not launched, so nothing listens there. On real hosts: check the "
                "address, that process 0 started, and that the port is open between the hosts."
            )
        if n_launched < num_processes:
            return (
                f"num_processes={num_processes}, but only {n_launched} process(es) were launched: the "
                f"coordinator waits for all {num_processes} to join and gave up after "
                f"{init_timeout_s} s. Launch as many processes as num_processes says."
            )
        return (
            f"Process {process_id} could not reach the coordinator at {coordinator}, or not every one of "
            f"the {num_processes} processes joined, within {init_timeout_s} s. Check that process 0 "
            "started, that the address is right and reachable, and that every process was launched." + busy_note()
        )
    if "stopped sending heartbeats" in stderr:
        return (
            f"Process {process_id} was stopped by JAX because another process stopped sending heartbeats "
            "(it died); look for the first process that failed."
        )
    # Not anchored at a line's start: another thread's unfinished line may run into the sentence.
    said = re.search(r"\[process \d+\] error: (.+)$", stderr, re.MULTILINE)
    if said:  # the worker said what went wrong in one sentence (a checkpoint it cannot use, say)
        return f"Process {process_id} stopped: {said[1]}"
    if "injected failure" in stderr:
        return f"Process {process_id} was told to fail (fail_process={process_id})."
    if "does not divide evenly" in stderr:
        return "The global batch does not divide by the global device count (see the error above)."
    if exit_code < 0:
        name = signal.Signals(-exit_code).name if -exit_code in signal.Signals._value2member_map_ else str(-exit_code)
        return f"Process {process_id} was ended by signal {name} (a crash, or the machine ran out of memory)."
    return f"Process {process_id} raised an error (its stderr is below)."


_CAUSE_SAID = re.compile(r"\[process \d+\] (error: |injected failure)")
# What a process prints when it fails because another one did (a consequence, never the headline).
_CONSEQUENCE = re.compile(
    r"gloo/transport|Connection (closed|reset) by peer|stopped sending heartbeats|UNAVAILABLE:|DEADLINE_EXCEEDED"
)


# Exit statuses of a process that did not fail by itself: success, still running, ended by the launcher.
_NOT_FAILED = (0, None, -signal.SIGTERM, -signal.SIGKILL)


def first_cause(failed: tuple[int, int], exit_codes: dict[int, int], texts: dict[int, tuple[str, str]]):
    """The failure to headline: a process that said its own cause, rather than one that failed because of it.

    The launcher sees the first process to exit with an error, but a
    process whose partner stopped (a Gloo connection closed, heartbeats
    missed) may exit first; the one that said why in its own sentence
    (``[process N] error: ...``) is the cause.
    """
    i, _ = failed
    if _CAUSE_SAID.search(texts[i][1]):
        return failed
    for j, code in sorted(exit_codes.items()):
        if code not in _NOT_FAILED and j != i and _CAUSE_SAID.search(texts[j][1]):
            return j, code
    if _CONSEQUENCE.search(texts[i][1]):
        for j, code in sorted(exit_codes.items()):
            if code not in _NOT_FAILED and j != i and not _CONSEQUENCE.search(texts[j][1]):
                return j, code
    return failed
