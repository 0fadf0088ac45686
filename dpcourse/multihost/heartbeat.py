"""Each worker's heartbeat: its stage and step, written to a file the launcher reads to name a stopped process.

A worker (:mod:`dpcourse.multihost.worker`) started by the launcher finds a
file path in ``DPCOURSE_PROGRESS_FILE``. :class:`Heartbeat` writes its stage
there (``starting``, ``joined``, ``step 3 of 10``, ...) and a time, every
:data:`BEAT_S` seconds from a background thread and at each stage. A
process that is stopped (``SIGSTOP``, Ctrl-Z) or hung writes nothing more,
so its beat grows old while the others' stay fresh: the launcher
(:mod:`dpcourse.multihost.launcher`) names that process, instead of the one
that gave up waiting for it. On Linux the launcher also reads the process's
state in ``/proc/<pid>/stat`` (``T``: stopped).
"""

from __future__ import annotations

import json
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from dpcourse.multihost import reaper

PROGRESS_ENV = "DPCOURSE_PROGRESS_FILE"
BEAT_S = 1.0
STALE_S = 5.0  # a beat older than this, while other processes beat, means the process stopped
WATCH_STALE_S = 30.0  # while the run goes on, the launcher ends it at once for a beat this old (or state T)


class Heartbeat:
    """Write this process's stage and time to ``path`` (default ``$DPCOURSE_PROGRESS_FILE``); no-op without one."""

    def __init__(self, path: str | os.PathLike | None = None) -> None:
        path = path if path is not None else os.environ.get(PROGRESS_ENV)
        self.path = Path(path) if path else None
        self.stage = "starting"
        self.since = time.time()  # when the stage began
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> Heartbeat:
        if self.path is not None:
            self.beat()
            self._thread = threading.Thread(target=self._run, name="dpcourse-heartbeat", daemon=True)
            self._thread.start()
        return self

    def set(self, stage: str) -> None:
        """Record a new stage (``joined``, ``step 2 of 10``) at once."""
        self.stage, self.since = stage, time.time()
        self.beat()

    def beat(self) -> None:
        if self.path is None:
            return
        tmp = self.path.with_name(f".{self.path.name}.tmp")
        try:
            tmp.write_text(json.dumps({"stage": self.stage, "time": time.time(), "since": self.since}))
            os.replace(tmp, self.path)
        except OSError:  # the launcher's folder is gone: it has ended the run
            pass

    def _run(self) -> None:
        while not self._stop.wait(BEAT_S):
            self.beat()

    def stop(self) -> None:
        self._stop.set()


@dataclass(frozen=True)
class Progress:
    """What the launcher knows of one process: its last stage, how old its beat is, whether the OS says stopped."""

    process_id: int
    stage: str | None
    age_s: float | None
    stopped: bool
    stage_age_s: float | None = None  # how long it has been at this stage (None: unknown)

    def describe(self) -> str:
        where = f"at '{self.stage}'" if self.stage else "before its first heartbeat"
        if self.stopped:
            return f"process {self.process_id} is stopped (state T: SIGSTOP or Ctrl-Z) {where}"
        return f"process {self.process_id} stopped making progress {where}, {self.age_s:.0f} s ago"


def is_stopped(pid: int) -> bool:
    """Whether the OS reports ``pid`` as stopped (Linux ``/proc``; False where that cannot be read)."""
    return reaper.state(pid) in ("T", "t")


def read(path: Path, process_id: int, pid: int, started: float, now: float | None = None) -> Progress:
    """The progress of process ``process_id`` (its heartbeat file ``path``, its ``pid``, launched at ``started``)."""
    now = time.time() if now is None else now
    try:
        beat = json.loads(path.read_text())
        stage, age = str(beat["stage"]), now - float(beat["time"])
        stage_age = now - float(beat.get("since", beat["time"]))
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        stage, age, stage_age = None, now - started, now - started
    return Progress(process_id, stage, age, is_stopped(pid), stage_age)


def culprit(progress: dict[int, Progress], alive: set[int], stale_s: float = STALE_S) -> Progress | None:
    """The live process that stopped while the others went on: stopped by the OS, else the one with the oldest beat.

    Returns None when no live process stands out (none is stopped, and no
    beat is older than ``stale_s`` while another's is fresh).
    """
    candidates = [progress[i] for i in sorted(alive) if i in progress]
    stopped = [p for p in candidates if p.stopped]
    if stopped:
        return stopped[0]
    fresh = [p for p in progress.values() if p.stage is not None and p.age_s < stale_s]
    # Only a process that has beaten can be stale: one still importing JAX (slow on a loaded machine)
    # has not started its heartbeat; if it is stopped, the OS says so above.
    stale = sorted((p for p in candidates if p.stage is not None and p.age_s >= stale_s), key=lambda p: -p.age_s)
    return stale[0] if stale and (fresh or len(candidates) == 1) else None


HANG_ADVICE = (
    "If you stopped it (Ctrl-Z, kill -STOP), resume it with `kill -CONT <pid>` or end it; otherwise it hangs: "
    "run again with fewer steps or a smaller profile, and look at its stderr below."
)


def stopped_message(p: Progress, num_processes: int, wall_s: float, pid: int, victim: int | None = None) -> str:
    """The launcher's sentence for a process that stopped: which one, where, and what to do."""
    after = f" Process {victim} failed only because it waited for it." if victim is not None else ""
    return (
        f"Worker process {p.process_id} of {num_processes} (pid {pid}) stopped responding after {wall_s:.1f} s: "
        f"{p.describe()}.{after} Every process was ended. {HANG_ADVICE.replace('<pid>', str(pid))}"
    )


HUNG_S = 60.0  # a live process at one stage this long, at the time limit, is hung rather than slow


def timeout_message(progress: dict[int, Progress], alive: set[int], timeout_s: float, pids: dict[int, int]) -> str:
    """The launcher's sentence when the time limit passed: a hang (no stage moved for :data:`HUNG_S`) or a slow run.

    A process that beats but stays at one stage (``saving step 4``) has a
    thread blocked in a call that never returns: more time would not help,
    so it is named with its stage; only a run still moving is told to
    raise ``timeout_s``.
    """
    live = [progress[i] for i in sorted(alive) if i in progress]
    # Only a process that has beaten can hang here; one without a beat is still importing JAX.
    hung = [p for p in live if p.stage is not None and p.stage_age_s is not None and p.stage_age_s >= HUNG_S]
    if live and len(hung) == len(live):
        named = "; ".join(
            f"process {p.process_id} (pid {pids[p.process_id]}) at '{p.stage}' for {p.stage_age_s:.0f} s" for p in hung
        )
        return (
            f"The run hung: no process moved on for at least {min(p.stage_age_s for p in hung):.0f} s before the "
            f"{timeout_s:.0f} s limit ({named}). A longer limit would not help: the stage named is where a call "
            "never returned (a save or restore on a file system that does not answer, a collective waiting for "
            "a process that is gone); look at its stderr below."
        )
    where = "; ".join(f"process {p.process_id} at '{p.stage or 'starting (no heartbeat yet)'}'" for p in live)
    return (
        f"The run was still going at the {timeout_s:.0f} s limit ({where or 'no process had reported'}). "
        "Raise timeout_s for a larger profile or more steps, or read the stderr below."
    )
