"""One GPU, one command: ``make gpu-check`` runs the course's check on a machine with one NVIDIA GPU.

A thin plan over the course's own tools, run one after the other, each in
its own process:

1. ``python -m coursetools check-collectives``: one ``shard_map`` +
   ``pmean`` over every device, stopped after 60 s (a hang is named).
2. ``python -m coursetools run --profile full``: every lesson with the
   ``full`` profile. Where one GPU is enough (01, 02, 09 and its GPU rungs)
   the lessons run on the GPU; the multi-device lessons run on simulated
   CPU devices with the ``cpu`` workload, as each lesson's banner says. The
   runner records each lesson's wall time and its peak GPU memory
   (:mod:`coursetools.memwatch`) in ``results.json``.
3. ``python -m pytest`` on the package tests that touch the GPU
   (:data:`GPU_TESTS`).

It writes ``<gpu>-full-jax<version>.json`` in the output folder: the
runner's ``results.json`` (the format of ``baselines/``, which
``python -m coursetools compare`` reads) with a ``gpu_check`` section: the
GPU and its memory, the JAX and jaxlib versions, each step's command, exit
status and wall time. Without an NVIDIA GPU, or with a JAX that cannot
start one, it refuses in one sentence before running anything;
``--dry-run`` prints the plan on any machine.
"""

from __future__ import annotations

import argparse
import json
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from dpcourse.cross_compile.mocked import nvidia_gpus

PROFILE = "full"
BUDGET_S = 8 * 60  # the whole check, on one GPU: what a learner or a lent machine can spare
DEFAULT_OUT = Path("results") / "gpu-check"
# The package tests whose subject is the GPU: the mocked-topology compile (needs a GPU and the CUDA
# plugin), the collective probe over every device, what nvidia-smi says, the memory watch, and the
# device set-up of a one-GPU host.
GPU_TESTS = (
    "tests/lib/cross_compile/test_mocked.py",
    "tests/lib/backend/test_health.py",
    "tests/lib/backend/test_gpuinfo.py",
    "tests/coursetools/test_memwatch.py",
    "tests/lib/test_devices.py",
)
INTERRUPT_GRACE_S = 60  # after Ctrl-C at the budget, the runner writes results.json of what ran


@dataclass(frozen=True)
class Step:
    """One command of the check: its name, its argument list, and what it shows."""

    name: str
    argv: list[str]
    what: str


def plan(out: Path, python: str = sys.executable) -> list[Step]:
    """The check's commands, in order, writing under ``out``."""
    return [
        Step(
            "collectives",
            [python, "-m", "coursetools", "check-collectives"],
            "one shard_map + pmean over every device, stopped after 60 s",
        ),
        Step(
            "lessons",
            [python, "-m", "coursetools", "run", "--profile", PROFILE, "--out", str(out / "lessons")],
            f"every lesson with the {PROFILE} profile: 01, 02 and 09 on the GPU, the multi-device lessons on "
            "simulated CPU devices as each banner says; wall time and peak GPU memory per lesson",
        ),
        Step(
            "tests",
            [python, "-m", "pytest", "-q", "-p", "no:cacheprovider", *GPU_TESTS],
            "the package tests that touch the GPU",
        ),
    ]


def gpu_name(listed: str) -> str:
    """``"NVIDIA H100 80GB HBM3"`` from a line of ``nvidia-smi -L``."""
    return re.sub(r"^GPU \d+: *| *\(UUID:.*\)$", "", listed).strip()


def refusal(gpus: list[str], backend: str | None) -> str | None:
    """Why this machine cannot run the check (one sentence), or None when it can.

    ``gpus``: :func:`nvidia_gpus`; ``backend``: JAX's default backend here
    (:func:`dpcourse.devices.probe_backend`), None when it was not asked.
    """
    if not gpus:
        return (
            "gpu-check needs an NVIDIA GPU, and nvidia-smi lists none on this machine: run it where "
            "`nvidia-smi -L` shows one (make course runs the lessons on the CPU)."
        )
    if backend is not None and backend != "gpu":
        from importlib.metadata import version

        return (
            f"nvidia-smi lists {gpu_name(gpus[0])}, but JAX here starts its {backend} backend: install JAX's "
            f'CUDA plugin at the pinned version (.venv/bin/python -m pip install "jax[cuda12]=={version("jax")}"), '
            "then run make gpu-check again."
        )
    return None


def results_name(gpus: list[str], jax_version: str) -> str:
    """The results file's name in the manner of ``baselines/``: ``h100-80gb-hbm3-full-jax0.10.2.json``."""
    words = gpu_name(gpus[0]).lower().removeprefix("nvidia ") if gpus else "no-gpu"
    return f"{re.sub(r'[^a-z0-9.]+', '-', words).strip('-')}-{PROFILE}-jax{jax_version}.json"


def run_step(step: Step, deadline: float) -> tuple[int, float, bool]:
    """Run ``step`` until it ends or ``deadline`` (``time.monotonic()``); ``(exit status, wall s, timed out)``.

    At the deadline the step gets Ctrl-C (the runner then records the lesson
    as interrupted and writes ``results.json``) and, after
    :data:`INTERRUPT_GRACE_S`, is killed.
    """
    start = time.monotonic()
    proc = subprocess.Popen(step.argv)
    try:
        code = proc.wait(timeout=max(1.0, deadline - start))
        return code, time.monotonic() - start, False
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=INTERRUPT_GRACE_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        return proc.returncode, time.monotonic() - start, True


def run_steps(steps: list[Step], out: Path, budget_s: float) -> tuple[list[dict], dict | None, float]:
    """Run ``steps`` in order within ``budget_s`` seconds from now, stopping at the first one past it.

    Returns:
        Each step run (name, argv, exit status, wall s, timed out), the
        runner's ``results.json`` under ``out/lessons`` when these steps wrote
        it (None for an earlier run's file or none), and the seconds taken.
    """
    start, started_at, done = time.monotonic(), time.time(), []
    for step in steps:
        code, wall, late = run_step(step, start + budget_s)
        done.append(
            {"name": step.name, "argv": step.argv, "exit_status": code, "wall_s": round(wall, 1), "timed_out": late}
        )
        if late:
            break
    lessons_file = out / "lessons" / "results.json"
    fresh = lessons_file.exists() and lessons_file.stat().st_mtime >= started_at  # not an earlier check's
    lessons = json.loads(lessons_file.read_text(encoding="utf-8")) if fresh else None
    return done, lessons, time.monotonic() - start


def installed(name: str) -> str | None:
    """The installed version of distribution ``name``, or None."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(name)
    except PackageNotFoundError:
        return None


def results_payload(lessons: dict | None, gpus: list[str], steps: list[dict], wall_s: float) -> dict:
    """The results file: the runner's ``results.json`` (``lessons``) with the check's ``gpu_check`` section."""
    from dpcourse.backend.gpuinfo import gpu_memory_totals

    payload = dict(lessons or {"schema": 1, "profile": PROFILE, "notebooks": [], "records": []})
    payload["gpu_check"] = {
        "gpus": [gpu_name(g) for g in gpus],
        "gpu_memory_bytes": gpu_memory_totals(),
        "jax_version": installed("jax"),
        "jaxlib_version": installed("jaxlib"),
        "budget_s": BUDGET_S,
        "wall_s": round(wall_s, 1),
        "steps": steps,
        "passed": all(s["exit_status"] == 0 and not s["timed_out"] for s in steps) and wall_s <= BUDGET_S,
    }
    return payload


def check_summary(payload: dict, check: str, peak_key: str, peak_label: str) -> str:
    """Plain-text lines of a check's results: each lesson's status, wall time, peak memory and error, then the verdict.

    Args:
        check: the payload's section and the command's name (``"gpu_check"``, ``"tpu_check"``).
        peak_key: each notebook's peak-memory field (``"peak_gpu_bytes"``).
        peak_label: that column's heading (``"peak GPU MiB"``).
    """
    width = max(len(peak_label), 13)
    lines = [f"{'lesson':<18} {'status':<12} {'wall s':>8} {peak_label:>{width}}"]
    for nb in payload.get("notebooks", []):
        used = nb.get(peak_key)
        peak = f"{used / 2**20:,.0f}" if used is not None else "-"
        lines.append(f"{nb['notebook']:<18} {nb['status']:<12} {nb['wall_s']:>8.1f} {peak:>{width}}")
        if nb.get("error"):
            lines.append(f"  {nb['error'][:200]}")
    section = payload[check]
    for s in section["steps"]:
        late = ", stopped at the time budget" if s["timed_out"] else ""
        lines.append(f"{s['name']}: exit status {s['exit_status']} in {s['wall_s']:.0f} s{late}")
    verdict = "passed" if section["passed"] else "FAILED"
    name = check.replace("_", "-")
    lines.append(f"{name} {verdict}: {section['wall_s']:.0f} s of a {section['budget_s']:.0f} s budget")
    return "\n".join(lines)


def summary(payload: dict) -> str:
    """:func:`check_summary` of the GPU check: peak GPU memory per lesson."""
    return check_summary(payload, "gpu_check", "peak_gpu_bytes", "peak GPU MiB")


def main(argv: list[str] | None = None) -> int:
    """``make gpu-check``: refuse without a GPU, run :func:`plan`, write the results file; exit 1 when a step failed."""
    parser = argparse.ArgumentParser(prog="python -m coursetools.gpucheck", description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"output folder (default {DEFAULT_OUT})")
    parser.add_argument("--dry-run", action="store_true", help="print the plan and what this machine has; run nothing")
    args = parser.parse_args(argv)
    steps, gpus = plan(args.out), nvidia_gpus()
    if args.dry_run:
        for i, step in enumerate(steps, 1):
            print(f"{i}. {step.name}: {step.what}\n   {' '.join(step.argv)}")
        print(f"results: {args.out / results_name(gpus, '<version>')} (budget {BUDGET_S} s)")
        print(f"this machine: {refusal(gpus, None) or 'nvidia-smi lists ' + gpu_name(gpus[0])}")
        return 0
    from coursetools.outfolder import write_json_atomic
    from dpcourse.backend.xlaflags import exit_on_bad_xla_flags
    from dpcourse.devices import DeviceSetupError, probe_backend

    problem = refusal(gpus, None)
    if problem is None:
        exit_on_bad_xla_flags()
        try:
            problem = refusal(gpus, probe_backend())
        except (DeviceSetupError, RuntimeError) as err:
            problem = f"JAX could not start here: {err}"
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        return 2
    if len(gpus) > 1:
        print(f"gpu-check: {len(gpus)} GPUs listed; the lessons choose their devices as they do for a learner")
    args.out.mkdir(parents=True, exist_ok=True)
    done, lessons, wall_s = run_steps(steps, args.out, BUDGET_S)
    payload = results_payload(lessons, gpus, done, wall_s)
    path = write_json_atomic(args.out / results_name(gpus, payload["gpu_check"]["jax_version"] or "unknown"), payload)
    print(summary(payload))
    print(f"gpu-check: results in {path} (the format of baselines/; python -m coursetools compare reads it)")
    return 0 if payload["gpu_check"]["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
