"""Measured times, written into the lessons and the README from a committed record: ``python -m dpcourse timings``.

Every course run's ``results.json`` holds each notebook's wall time, the
machine (CPU, cores, memory), its load average at the start and end, and
the course commit (:func:`machine_info`, filled in by the runner).
``python -m dpcourse timings --update RESULTS.json ...`` copies those
figures into ``baselines/timings.json`` (the committed record) and writes
from it each lesson's ``**Time.**`` line and the README's block between
``<!-- timings:begin -->`` and ``<!-- timings:end -->``;
``--make-test-seconds S`` adds a measured ``make test`` time.
``--check`` (and tests/test_timings.py) fails when a lesson or the README
says anything else than the record, so the text cannot drift from what
was measured.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import platform
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RECORD = ROOT / "baselines" / "timings.json"
README = ROOT / "README.md"
NOTEBOOK_DIR = ROOT / "notebooks"
BEGIN, END = "<!-- timings:begin -->", "<!-- timings:end -->"
TIME_LINE = re.compile(r"^# \*\*Time[.*].*$", re.MULTILINE)


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
    """The machine a run ran on: CPU model, cores, memory (GiB), GPUs, OS, and the load average at the start."""
    return {
        "cpu": _cpu_model(),
        "cores": os.cpu_count(),
        "memory_gib": _memory_gib(),
        "gpus": _gpus(),
        "os": platform.platform(terse=True),
        "python": platform.python_version(),
        "load_average_start": load_average(),
    }


def course_commit() -> str | None:
    """The course's git commit (short), with ``+changes`` when the work tree differs; None outside git."""
    try:
        head = subprocess.run(
            ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=10
        )
        if head.returncode != 0:
            return None
        dirty = subprocess.run(
            ["git", "-C", str(ROOT), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            timeout=10,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return head.stdout.strip() + ("+changes" if dirty.stdout.strip() else "")
