"""What lessons 04, 05, 09 and 10 call to show the GPU and TPU compilers' collectives, on any machine.

Three ways to the same :class:`dpcourse.cross_compile.result.CompileResult`
for a GPU target, tried in order: the GPU-compile extra (a target
description, no GPU needed, :mod:`dpcourse.cross_compile.compile`); else, on
a machine with an NVIDIA GPU, mocked topologies
(:mod:`dpcourse.cross_compile.mocked`); else the result ``make placement``
stored in the package (:mod:`dpcourse.cross_compile.stored`), labelled as
stored, with the JAX version and the date it was made. For a TPU slice,
two: the TPU-compile extra (libtpu describes the slice, no TPU needed), else
the stored result. A stored result is read back, never recorded as this
run's figure. ``python -m dpcourse.cross_compile.notebook --report --profile
full`` prints the mocked GPUs' and 8 CPU devices' table.
"""

from __future__ import annotations

import argparse
import os
import sys

from dpcourse.cross_compile import compile as deviceless
from dpcourse.cross_compile import mocked as gpu_placement
from dpcourse.cross_compile import targets as gpu_targets
from dpcourse.cross_compile.result import CompileResult, records, table_rows
from dpcourse.cross_compile.stored import (  # noqa: F401 - what lessons and tools read here before stored.py held it
    OVERLAP_FILE,
    STORED_FILE,
    STORED_PROFILE,
    TPU_STORED_FILE,
    find_stored,
    stored_overlap,
    stored_payload,
    stored_results,
)

PASS_NAME = "while-loop-all-reduce-code-motion"
CPU_ONLY_CAVEAT = (
    "This is the CPU compiler's placement. XLA's GPU compiler, measured with JAX 0.10.2 and 0.12.0.1 "
    "for H100 SXM, H200 and L4 targets, and the TPU compiler (libtpu 0.0.42 and 0.0.50) for v5e, v5p "
    "and v6e slices, move this all-reduce out of the loop (on the GPU: pass "
    "while-loop-all-reduce-code-motion, then gpu-all-reduce-combiner merges it into one): the compiles "
    "below show it."
)
# The TPU slices the lessons show beside the GPUs: Kaggle's TPU v5e-8 and a whole Trillium pod.
LESSON_TPU_TARGETS = ("v5e_2x4", "v6e_16x16")
_EXTRA_SAYS = {
    "gpu": "the GPU-compile extra (make gpu-compile, about 510 MB) compiles it on this machine",
    "tpu": "the TPU-compile extra (make tpu-compile, libtpu: a 209 MB wheel) compiles it on this machine",
}
EXTRA_SAYS = _EXTRA_SAYS["gpu"]


def _stored_line(results: list[CompileResult], missing: str, platform: str = "gpu") -> str:
    says = _EXTRA_SAYS[platform]
    if not results:
        return f"Not shown: no stored result of this compile, and {says} ({missing.split('.')[0]})."
    res = results[0]
    what = f" for {platform.upper()}s" if platform == "tpu" else ""
    return f"Stored result{what} (made by {res.stored}, JAX {res.jax_version}, {res.profile} profile): {says}."


def stored_overlap_line(results: list[CompileResult], missing: str) -> str:
    """The line above a stored schedule: stored, when, which JAX and profile, and what the extra adds."""
    return _stored_line(results, missing)


def show_results(results: list[CompileResult], passes: tuple[str, ...] = ()) -> None:
    """One table per result: where each step's collectives land, captioned with where it was compiled for."""
    from IPython.display import display

    from dpcourse import show

    off = f", XLA passes off: {', '.join(passes)}" if passes else ""
    for res in results:  # a stored result's JAX version is in the line above its tables
        jax = "" if res.stored else f", JAX {res.jax_version or '?'}"
        caption = f"{res.label} ({res.profile} profile{jax}{off})"
        display(show.table(table_rows(records([res])), caption=caption))


def _tpu_jobs(tpu_targets: tuple[str, ...], profile: str) -> list[deviceless.Job]:
    return [deviceless.Job("tpu", t, gpu_targets.target(t, "tpu").chips, profile) for t in tpu_targets]


def _cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def _compile_side_by_side(jobs: list, steps: dict[str, str], passes: tuple[str, ...]) -> list[CompileResult]:
    """Compile ``jobs``, one result per job in order: one worker, or on 4 cores or more one per TPU slice beside it.

    A slice's full-profile step takes half a minute to compile; on a host
    with cores to spare (a TPU VM has 13 or more) the slices compile at the
    same time as each other and the GPU targets. On two cores one worker
    does it all: the workers would only share the cores and each import JAX.
    """
    if not jobs:
        return []
    rest = [j for j in jobs if j.backend != "tpu"]
    groups = ([rest] if rest else []) + [[j] for j in jobs if j.backend == "tpu"]
    if _cores() < 4 or len(groups) < 2:
        return deviceless.compile_jobs(jobs, steps, disable_passes=passes)
    pending = [deviceless.start_jobs(g, steps, passes) for g in groups]
    by_job = {j: r for p, g in zip(pending, groups) for j, r in zip(g, p.results())}
    return [by_job[j] for j in jobs]


def show_gpu_placement(
    profile: str,
    backend: str,
    steps: dict[str, str] | None = None,
    counts: tuple[int, ...] = (8,),
    disable_passes: tuple[str, ...] = (),
    target: str = "h200",
    tpu_targets: tuple[str, ...] = LESSON_TPU_TARGETS,
) -> list[CompileResult]:
    """Notebooks 04, 05 and 09: the GPU and TPU compilers' placement of ``steps`` on ``counts`` x ``target`` and the slices.

    With the GPU extra: compiled without a GPU, and, when ``backend`` is not
    ``"cpu"`` (a notebook on CPU devices has just shown the CPU's answer),
    for 8 simulated CPU devices too. Without it, on a machine with an NVIDIA
    GPU: the mocked topologies of ``counts`` GPUs. Elsewhere: the stored
    result, with one line saying so and what the extra adds. Then each TPU
    slice of ``tpu_targets``: compiled with the TPU extra (in the same
    process as the GPU targets), else stored.

    Args:
        steps: step name -> builder ``"module:function"`` (default
            :data:`dpcourse.cross_compile.compile.COURSE_STEPS`).
        disable_passes: XLA passes to switch off in the compile (experiments).
        tpu_targets: keys of :data:`dpcourse.cross_compile.targets.TPU_TARGETS` (``()``: none).

    Returns:
        The results shown, GPUs (and the CPU) first, then the TPU slices (a
        stored one has ``stored`` set; a result that failed has ``error`` set); possibly empty.

    Raises:
        ValueError: an unknown TPU target.
    """
    steps = dict(deviceless.COURSE_STEPS if steps is None else steps)
    passes = tuple(disable_passes)
    tpu_jobs = _tpu_jobs(tuple(tpu_targets), profile)
    missing, tpu_missing = gpu_targets.extra_missing(), gpu_targets.extra_missing("tpu") if tpu_jobs else None
    jobs = tpu_jobs if tpu_missing is None else []
    if missing is None:
        jobs = [deviceless.Job("gpu", target, n, profile) for n in counts] + jobs
        jobs += [deviceless.Job("cpu", "cpu", 8, profile)] if backend != "cpu" else []
    compiled = _compile_side_by_side(jobs, steps, passes)
    results = [r for r in compiled if r.backend != "tpu"]
    if missing is not None and gpu_placement.gpu_unavailable_reason() is None:
        results = deviceless.compile_mocked(profile, tuple(f"1x{n}x1" for n in counts), steps, passes)
        record(results)
    elif missing is not None:
        results = find_stored([deviceless.Job("gpu", target, n, profile) for n in counts], steps, passes)
        print(_stored_line(results, missing))
    if tpu_jobs and tpu_missing is None:
        results += [r for r in compiled if r.backend == "tpu"]
    elif tpu_jobs:
        found = find_stored(tpu_jobs, steps, passes)
        print(_stored_line(found, tpu_missing, "tpu"))
        results += found
    show_results(results, passes)
    return results


class GpuCompile:
    """Lesson 10's background compile for GPUs and TPU slices (:func:`start_gpu_compile`); :meth:`results` collects it."""

    def __init__(self, jobs, steps, pending, missing, stored_jobs=()):
        self.jobs, self.steps, self.pending, self.missing = jobs, steps, pending, missing
        self.stored_jobs = list(stored_jobs)  # (job, why it is not compiled here), read from the stored results

    def results(self) -> list[CompileResult]:
        """The compiled results (waiting for the worker), then the stored ones of the rest with a line saying so."""
        out = self.pending.results() if self.pending is not None else []
        for platform in ("gpu", "tpu"):
            wanted = [j for j, _ in self.stored_jobs if j.backend == platform]
            if wanted:
                found = find_stored(wanted, self.steps)
                why = next(w for j, w in self.stored_jobs if j.backend == platform)
                print(_stored_line(found, why, platform))
                out += found
        return out


def start_gpu_compile(
    steps: dict[str, str], targets: tuple[str, ...], n_devices: int, profile: str, tpu_targets: tuple[str, ...] = ()
) -> GpuCompile:
    """Start compiling ``steps`` for ``n_devices`` x each GPU target and each TPU slice without them, in the background.

    A platform whose extra is missing starts nothing, and
    :meth:`GpuCompile.results` gives the stored results for its targets instead.

    Raises:
        ValueError: an unknown target or a bad builder name.
    """
    jobs = [deviceless.Job("gpu", t, n_devices, profile) for t in targets] + _tpu_jobs(tuple(tpu_targets), profile)
    why = {p: gpu_targets.extra_missing(p) for p in ("gpu", "tpu") if any(j.backend == p for j in jobs)}
    runnable = [j for j in jobs if why.get(j.backend) is None]
    pending = deviceless.start_jobs(runnable, steps) if runnable else None
    stored = [(j, why[j.backend]) for j in jobs if why.get(j.backend) is not None]
    return GpuCompile(jobs, dict(steps), pending, why.get("gpu") or "", stored)


def record(results: list) -> list:
    """Record each step's collectives per step, in-loop count and bytes (dpcourse.record).

    Metric names carry the platform and the topology
    (``collectives_in_loop_jit_gpu_1x4x1``) or the CPU device count
    (``..._cpu_8``), and each record's ``backend``, ``device_kind`` and
    ``device_count`` are those of the compile, so ``compare`` never matches a
    mocked GPU figure with a CPU one. Results with an error record nothing.
    """
    from dpcourse import record as recorded

    written = []
    for res in results:
        if res.error:
            continue
        is_mocked = res.backend == "mocked"
        suffix = f"gpu_{res.target}" if is_mocked else f"{res.platform}_{res.n_devices}"
        kind = f"{res.device_kind} (mocked topology {res.target})" if is_mocked else res.device_kind
        where = dict(backend=res.platform, device_kind=kind, device_count=res.n_devices)
        for name, s in res.steps.items():
            for metric, value, unit in (
                (f"collectives_per_step_{name}_{suffix}", s.runs_per_step, "count"),
                (f"collectives_in_loop_{name}_{suffix}", s.in_loop, "count"),
                (f"collective_bytes_per_step_{name}_{suffix}", s.bytes_per_step, "bytes"),
            ):
                written.append(recorded.record(metric, value, unit, **where))
    return [w for w in written if w is not None]


def report(profile: str, topologies: tuple[str, ...] = gpu_placement.GPU_TOPOLOGIES, cpu_devices: int = 8) -> list:
    """Mocked GPUs (where this machine can) and ``cpu_devices`` simulated CPU devices; prints the table."""
    reason = gpu_placement.gpu_unavailable_reason()
    results = [] if reason else deviceless.compile_mocked(profile, topologies)
    if reason:
        print(f"Mocked GPU topologies cannot be compiled here: {reason}.")
    results += deviceless.compile_jobs([deviceless.Job("cpu", "cpu", cpu_devices, profile)])
    for row in table_rows(records(results)):
        print("  ".join(f"{k}={v}" for k, v in row.items()))
    return results


def main(argv: list[str] | None = None) -> int:
    """``python -m dpcourse.cross_compile.notebook --report --profile full``: mocked 2, 4 and 8 GPUs and 8 CPU devices.

    Exits 1 when a compile that could run here failed.
    """
    parser = argparse.ArgumentParser(
        prog="python -m dpcourse.cross_compile.notebook",  # also when run by an old name (sys.argv[0] unset)
        description="Compile the course's steps for mocked GPU topologies and the CPU.",
    )
    parser.add_argument("--report", action="store_true", help="every mocked topology (with a GPU) and 8 CPU devices")
    parser.add_argument("--profile", required=True)
    args = parser.parse_args(argv)
    if not args.report:
        parser.error("give --report")
    from dpcourse.backend.xlaflags import exit_on_bad_xla_flags
    from dpcourse.config import profile_names

    if args.profile not in profile_names():
        parser.error(f"--profile {args.profile!r} is not a profile: use one of {', '.join(profile_names())}")
    exit_on_bad_xla_flags()  # each compile worker inherits XLA_FLAGS
    reason = gpu_placement.gpu_unavailable_reason()
    results = report(args.profile)
    return 0 if all(r.error is None for r in results if r.backend == "cpu" or reason is None) else 1


if __name__ == "__main__":
    sys.exit(main())
