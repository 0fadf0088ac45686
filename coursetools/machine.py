"""The machine a run measured on: CPU, cores, memory, GPUs, load average, and whether it was too busy to time.

:func:`machine_info` is what the runner records in every ``results.json``
(:mod:`coursetools.runner`); :func:`busy_sentence` is why
``python -m coursetools timings --update`` refuses a run whose load average
says other work shared its cores.
"""

from __future__ import annotations

import os
import platform
import subprocess
from pathlib import Path

# A run on an idle machine keeps every core busy and a thread or two waiting: the committed cpu run
# (baselines/timings.json, 2 cores) read a load average of 0.17 as it started and 3.09 as it ended.
# Before the run, anything above the core count is other work; at its end, above twice the core count.
START_LOAD_PER_CORE = 1.0
END_LOAD_PER_CORE = 2.0


def load_average() -> list[float] | None:
    """The 1-, 5- and 15-minute load averages (runnable processes), or None where the OS has none."""
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except (OSError, AttributeError):
        return None


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text(encoding="utf-8").splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _memory_gib() -> float | None:
    try:
        for line in Path("/proc/meminfo").read_text(encoding="utf-8").splitlines():
            if line.startswith("MemTotal:"):
                return round(int(line.split()[1]) / 2**20, 1)
    except (OSError, ValueError, IndexError):
        pass
    return None


def _gpus() -> list[str]:
    """GPU names from ``nvidia-smi`` (no JAX started), empty where there is none."""
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True, text=True, timeout=10
        )
    except (OSError, subprocess.TimeoutExpired):
        return []
    return [line.strip() for line in out.stdout.splitlines() if line.strip()] if out.returncode == 0 else []


def machine_info() -> dict:
    """The machine a run ran on: CPU model, cores, memory (GiB), GPUs, OS, the load average at the start, and
    whether the GPU- and TPU-compile extras were installed (04, 05, 09 and 10 compile for GPUs and TPU slices
    without them only with the extras, which adds seconds to each)."""
    from dpcourse.cross_compile.targets import extra_missing

    return {
        "cpu": _cpu_model(),
        "cores": os.cpu_count(),
        "memory_gib": _memory_gib(),
        "gpus": _gpus(),
        "os": platform.platform(terse=True),
        "python": platform.python_version(),
        "load_average_start": load_average(),
        "gpu_compile_extra": extra_missing() is None,
        "tpu_compile_extra": extra_missing("tpu") is None,
    }


def busy_sentence(machine: dict, what: str, *, judge_end: bool = True) -> str | None:
    """Why ``machine`` (a run's record) was too busy for its times to be the lessons' own; None when it was not.

    ``what`` names the run in the sentence (``"build/x/results.json"``). The
    1-minute load average at the start is compared with the core count
    (:data:`START_LOAD_PER_CORE`), and, with ``judge_end``, the highest of the
    three at the end with twice it (:data:`END_LOAD_PER_CORE`): a run of one
    lesson at a time. ``make test`` runs its layers side by side, so its own
    load at the end says nothing of other work (``judge_end=False``). A record
    without cores or loads (an OS without a load average) is never refused.
    """
    cores = machine.get("cores")
    if not isinstance(cores, int) or cores < 1:
        return None
    start, end = machine.get("load_average_start"), machine.get("load_average_end")
    if start and start[0] > START_LOAD_PER_CORE * cores:
        when, load, limit = "as it started", start[0], START_LOAD_PER_CORE * cores
    elif judge_end and end and max(end) > END_LOAD_PER_CORE * cores:
        when, load, limit = "as it ended", max(end), END_LOAD_PER_CORE * cores
    else:
        return None
    return (
        f"{what} was measured at a load average of {load:g} {when} on a {cores}-core machine (above {limit:g}): "
        "other work shared its cores, so its times are not the lessons' own and nothing was recorded; run it "
        "again on a quieter machine, or give --allow-busy to record it anyway"
    )
