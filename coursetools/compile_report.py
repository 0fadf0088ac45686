"""The compilers' answer to "where does the all-reduce land?": the table, placement.json, the notebook cell.

``python -m coursetools.compile_report`` (``make placement``) compiles the
course's data-parallel steps (:data:`dpcourse.cross_compile.compile.COURSE_STEPS`) for
every GPU target of :mod:`dpcourse.cross_compile.targets` at 2, 4 and 8 GPUs without a
GPU, for every TPU slice of it without a TPU, and for 8 simulated CPU devices, prints
one table and writes ``results/placement/placement.json``: one record per (backend,
target, device count, profile, step), and ``lessons.json`` and ``lessons_tpu.json``
beside it: the whole results (every collective) the lessons show when an extra is
missing; ``--store`` (``make placement-store``) also writes them into the
package, where :mod:`dpcourse.cross_compile.stored` reads them.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from coursetools import overlap_report
from coursetools.outfolder import write_atomic
from dpcourse.backend.xlaflags import exit_on_bad_xla_flags
from dpcourse.cross_compile import compile as deviceless
from dpcourse.cross_compile import targets as gpu_targets
from dpcourse.cross_compile.notebook import PASS_NAME
from dpcourse.cross_compile.result import records, table_rows  # noqa: F401 - the tables of make placement

DEFAULT_JSON = Path("results") / "placement" / "placement.json"
# `make placement` compiles the smoke profile for every target and device
# count, and the full profile where it is cheap: one GPU target at 8 devices
# and the CPU (each full compile of the three steps takes seconds to tens of
# seconds on a 2-core machine).
FULL_JOBS = (("gpu", "h200", 8), ("tpu", "v5e_2x4", 8), ("cpu", "cpu", 8))
# TPU slices at the full profile: 8 to 35 s per step on a shared 2-core machine (measured), so the
# v5e 2x4 only, and for lesson 10's forms none (the lessons show the smoke profile's, labelled).
LESSON10_FULL_BACKENDS = ("gpu", "cpu")
# Lesson 10's forms (dpcourse.cross_compile.steps.STEPS: ZeRO-1, FSDP, gradient accumulation), with
# --lesson10 (make placement passes it): every profile asked for on 8 devices of every target and
# the CPU, except the full profile, compiled for 8 x H200 and the CPU only (FULL_JOBS).
LESSON10_DEVICES = 8
# The lessons' GPU results at LESSON10_DEVICES, and 04's compile with the pass off, kept whole
# (every collective) beside placement.json; `make placement-store` copies them into the package.
STORED_NAME = "lessons.json"
TPU_STORED_NAME = "lessons_tpu.json"
NO_MOTION_STEPS = {"jit": deviceless.COURSE_STEPS["jit"]}
NO_MOTION_TPU = "v5e_2x4"  # the TPU slice of 04's experiment (the smoke profile)
# Lesson 09's fast step (repeats unrolled, bfloat16), as its data-parallel section names it: the smoke
# profile on 8 x H200 and the lessons' TPU slices (a full unroll at the full profile compiles for
# tens of seconds; a run of another profile shows the smoke one, labelled).
FAST_LESSON_STEPS = {"fast": deviceless.FAST_STEPS["jit_unrolled_bf16"]}


def fast_jobs(profiles: list[str], targets: list[str]) -> list:
    """The jobs of lesson 09's fast step that ``make placement`` stores: smoke, on H200 x 8 and the lessons' slices."""
    from dpcourse.cross_compile.notebook import LESSON_TPU_TARGETS

    if "smoke" not in profiles:
        return []
    jobs = [deviceless.Job("gpu", "h200", LESSON10_DEVICES, "smoke")] if "h200" in targets else []
    return jobs + [j for j in _tpu_jobs(targets, "smoke") if j.target in LESSON_TPU_TARGETS]


def _tpu_jobs(targets: list[str], profile: str, chips: int | None = None) -> list:
    """A job per TPU slice of ``targets`` (of ``chips`` chips only, when given)."""
    slices = [gpu_targets.target(t) for t in targets if gpu_targets.target(t).platform == "tpu"]
    return [deviceless.Job("tpu", t.name, t.chips, profile) for t in slices if chips is None or t.chips == chips]


def _gpus(targets: list[str]) -> list[str]:
    return [t for t in targets if gpu_targets.target(t).platform == "gpu"]


def lesson10_jobs(profiles: list[str], targets: list[str]) -> list:
    """The jobs of ``--lesson10``: :data:`LESSON10_DEVICES` devices of each target, and the CPU, per profile.

    TPU slices of :data:`LESSON10_DEVICES` chips only (the v5e 2x4): lesson 10 compares its forms on 8 devices.
    """
    jobs = []
    for profile in profiles:
        if profile == "full":
            full = [(b, t, n) for b, t, n in FULL_JOBS if b in LESSON10_FULL_BACKENDS]
            jobs += [deviceless.Job(b, t, n, profile) for b, t, n in full if b == "cpu" or t in targets]
            continue
        jobs += [deviceless.Job("gpu", t, LESSON10_DEVICES, profile) for t in _gpus(targets)]
        jobs += _tpu_jobs(targets, profile, LESSON10_DEVICES)
        jobs.append(deviceless.Job("cpu", "cpu", LESSON10_DEVICES, profile))
    return jobs


# The course's own GPU (the L4 of docs/gke.md's nodes) is compiled at every count; the other GPUs, whose
# 2- and 4-GPU programs place the all-reduce as the L4's do, at the largest count only (unless asked alone).
EVERY_COUNT_GPU = "l4"


def jobs_for(profiles: list[str], targets: list[str], counts: tuple[int, ...], cpu_devices: int = 8):
    """The jobs of ``make placement``: the GPUs at their counts and every TPU slice per profile, and the CPU."""
    gpus = _gpus(targets)
    gpu_counts = {t: counts if t == EVERY_COUNT_GPU or len(gpus) == 1 else (max(counts),) for t in gpus}
    jobs = []
    for profile in profiles:
        if profile == "full" and len(profiles) > 1:
            jobs += [deviceless.Job(b, t, n, profile) for b, t, n in FULL_JOBS if b == "cpu" or t in targets]
            continue
        jobs += [deviceless.Job("gpu", t, n, profile) for t in gpus for n in gpu_counts[t]]
        jobs += _tpu_jobs(targets, profile)
        jobs.append(deviceless.Job("cpu", "cpu", cpu_devices, profile))
    return jobs


SENT_TOLERANCE = 0.10  # measured bytes sent vs the cost model: the metrics and rounding are far below this


def predicted_sent_bytes(step: str, profile: str, n_devices: int) -> float:
    """The cost model's bytes sent per device per step for lesson 10's ``step`` (a key of ``steps.SHARDED_STEPS``).

    From :func:`dpcourse.compiled.census.predict_communication` at the
    profile's sizes, with ``sharded_steps.ACCUM_K`` microbatches.

    Raises:
        KeyError: a step that is not one of lesson 10's.
    """
    from dpcourse import config, costs
    from dpcourse.compiled import census
    from dpcourse.cross_compile import steps as sharded_steps

    cfg = config.make_config(profile)
    pred = census.predict_communication(
        costs.gradient_bytes(cfg), cfg.width * cfg.width * 4, n_devices, sharded_steps.ACCUM_K, cfg.block_repeats
    )
    return pred[sharded_steps.FORM_LABELS[step]]["wire_bytes"]


def check_lesson10(recs: list[dict]) -> list[str]:
    """What in lesson 10's GPU records differs from the efficient ZeRO-1 the lesson teaches (empty: as taught).

    ``zero1_allreduce_first`` compiled for a GPU at 2 or more devices: one
    all-reduce and one all-gather per step, neither inside a loop, and bytes
    sent within :data:`SENT_TOLERANCE` of :func:`predicted_sent_bytes`.
    """
    problems = []
    for r in recs:
        if r.get("error") or r.get("step") != "zero1_allreduce_first" or r["backend"] != "gpu":
            continue
        if r["n_devices"] < 2 or r.get("disabled_passes"):
            continue
        where = f"{r['backend']} {r['target']} x{r['n_devices']} {r['profile']} {r['step']}"
        want = predicted_sent_bytes(r["step"], r["profile"], r["n_devices"])
        sent = r.get("sent_bytes_per_step")
        shape = (r["all_reduces"], r["collectives"], r["in_loop"], r["runs_per_step"])
        if shape != (1, 2, 0, 2):
            problems.append(
                f"{where}: expected 1 all-reduce and 1 all-gather per step, outside any loop; got "
                f"{r['all_reduces']} all-reduce(s) of {r['collectives']} collective(s), {r['in_loop']} in a loop, "
                f"{r['runs_per_step']} runs"
            )
        elif sent is None or abs(sent / want - 1) > SENT_TOLERANCE:
            problems.append(
                f"{where}: sends {sent} bytes per device per step, the cost model {want:,.0f} "
                f"(more than {SENT_TOLERANCE:.0%} apart)"
            )
    return problems


METRIC_BYTES = 8  # loss and accuracy, two float32 values, reduced with the gradient


def check(recs: list[dict]) -> list[str]:
    """What in ``recs`` differs from the placement the course teaches (empty: all as taught).

    Every course step compiled for a GPU or a TPU slice, and the device-axis and
    ``shard_map`` steps on the CPU: one all-reduce per step, outside any
    loop, of the float32 gradient and the two metrics. Plain ``jit`` on the
    CPU: the shared block's gradient reduced inside the backward loop. A
    change in JAX or XLA that moves an all-reduce makes ``make placement``
    fail with the record that moved.
    """
    from dpcourse import config, costs

    problems = []
    for r in recs:
        where = f"{r['backend']} {r['target']} x{r['n_devices']} {r['profile']} {r['step']}"
        if r.get("error"):
            problems.append(f"{where}: not compiled: {r['error']}")
            continue
        if r["step"] not in deviceless.COURSE_STEPS or r.get("disabled_passes"):
            continue
        if r["backend"] == "cpu" and r["step"] == "jit":
            if r["in_loop"] < 1:
                problems.append(f"{where}: the CPU compiler no longer reduces inside the loop ({r['in_loop']})")
            continue
        expected = costs.gradient_bytes(config.make_config(r["profile"])) + METRIC_BYTES
        got = (r["all_reduces"], r["collectives"], r["in_loop"], r["runs_per_step"], r["bytes_per_step"])
        if got != (1, 1, 0, 1, expected):
            problems.append(
                f"{where}: expected 1 all-reduce per step outside any loop of {expected:,} bytes; got "
                f"{r['all_reduces']} all-reduce(s) of {r['collectives']} collective(s), {r['in_loop']} in a loop, "
                f"{r['runs_per_step']} runs, {r['bytes_per_step']} bytes"
            )
    return problems


def group_devices(step) -> int | None:
    """Devices in the replica group of a compiled step's one all-reduce, read back from its schedule.

    The schedule counts what each device sends in a ring over the group XLA wrote in the
    program (``replica_groups``): ``2 (n - 1) / n`` of the all-reduce's bytes
    (:func:`dpcourse.compiled.census.sent_bytes`), so ``n = 2 V / (2 V - sent)``.
    """
    sent, size = step.schedule.get("sent_bytes_per_step"), step.bytes_per_step
    return None if not sent or not size or sent >= 2 * size else round(2 * size / (2 * size - sent))


def ici_rows(results: list[deviceless.CompileResult]) -> list[dict]:
    """Each TPU slice's compiled all-reduce beside the ICI model's time for it: a prediction, no slice ran it."""
    from dpcourse import costs

    rows = []
    for res in results:
        if res.backend != "tpu" or res.error:
            continue
        shape = tuple(int(side) for side in gpu_targets.target(res.target).topology.split(":")[1].split("x"))
        for name, step in res.steps.items():
            if step.error or name not in deviceless.COURSE_STEPS:
                continue
            predicted = costs.tpu_slice_allreduce_s(step.bytes_per_step, costs.find_peak(res.device_kind), shape)
            row = {"compiled for": f"{res.n_devices} x {res.target_label}", "profile": res.profile, "step": name}
            rows.append(
                {
                    **row,
                    "all-reduce bytes": f"{step.bytes_per_step:,}",
                    "devices in its group": group_devices(step),
                    "ICI model's time, predicted (us)": f"{predicted * 1e6:.1f}",
                }
            )
    return rows


def slice_problems(rows: list[dict]) -> list[str]:
    """The rows of :func:`ici_rows` whose all-reduce spans fewer devices than the slice has chips."""
    return [
        f"{r['compiled for']} {r['profile']} {r['step']}: the all-reduce spans {r['devices in its group']} chips"
        for r in rows
        if r["devices in its group"] != int(r["compiled for"].split(" x ")[0])
    ]


def format_table(rows: list[dict]) -> str:
    """A plain-text table of ``rows`` (columns: the union of their keys, in order)."""
    cols: list[str] = []
    for row in rows:
        cols += [k for k in row if k not in cols]
    cells = [[str(row.get(c, "")) for c in cols] for row in rows]
    widths = [max([len(c)] + [len(line[i]) for line in cells]) for i, c in enumerate(cols)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(cols, widths))]
    lines += ["  ".join(v.ljust(w) for v, w in zip(line, widths)) for line in cells]
    return "\n".join(lines)


def stored_payload(results: list[deviceless.CompileResult]) -> dict:
    """What :mod:`dpcourse.cross_compile.notebook` shows without the extra: the results, their JAX and the date (UTC)."""
    from dataclasses import asdict
    from datetime import UTC, datetime

    versions = {(r.jax_version, r.jaxlib_version) for r in results if not r.error} or {("", "")}
    if len(versions) != 1:
        raise ValueError(f"Compile results from more than one JAX version: {sorted(versions)}.")
    (jax_version, jaxlib_version) = versions.pop()
    return {
        "made_by": "make placement",
        "date": datetime.now(UTC).strftime("%Y-%m-%d"),
        "jax_version": jax_version,
        "jaxlib_version": jaxlib_version,
        "results": [asdict(r) for r in results],
    }


def stored_path(platform: str = "gpu") -> Path:
    """Where the package keeps the stored results of ``platform`` (:data:`dpcourse.cross_compile.stored.STORED_FILES`)."""
    from coursetools.paths import ROOT
    from dpcourse.cross_compile.stored import STORED_FILES

    return ROOT.joinpath("dpcourse", *STORED_FILES[platform])


def compile_in_parallel(jobs: list, steps: dict | None, workers: int) -> list[deviceless.CompileResult]:
    """:func:`dpcourse.cross_compile.compile.compile_jobs` over ``workers`` subprocesses at once; results in job order.

    The jobs are dealt round-robin (so the slow full-profile jobs spread out).
    A compile keeps about one core busy: two subprocesses take about half the
    time of one on a machine with two or more cores.
    """
    from concurrent.futures import ThreadPoolExecutor

    parts = max(1, min(workers, len(jobs)))
    chunks = [list(range(i, len(jobs), parts)) for i in range(parts)]
    with ThreadPoolExecutor(max_workers=parts) as pool:
        futures = [pool.submit(deviceless.compile_jobs, [jobs[i] for i in chunk], steps) for chunk in chunks]
        results: list = [None] * len(jobs)
        for chunk, future in zip(chunks, futures):
            for i, result in zip(chunk, future.result()):
                results[i] = result
    return results


def output_paths(args: argparse.Namespace, platform: str | None = None) -> list[Path]:
    """The files a run writes: ``--out``, the stored files beside it, and the package's copies with ``--store``.

    With ``platform``, only that platform's stored files (:data:`STORED_NAME`, :data:`TPU_STORED_NAME`).
    """
    platforms = [platform] if platform else ["gpu", "tpu"]
    names = {"gpu": STORED_NAME, "tpu": TPU_STORED_NAME}
    paths = [args.out.parent / names[p] for p in platforms] + (
        [stored_path(p) for p in platforms] if args.store else []
    )
    return ([] if platform else [args.out]) + paths


def unwritable(path: Path) -> str | None:
    """Why ``path`` cannot be written as a file (it is a folder, or a file or a read-only folder is in the way)."""
    if path.is_dir():
        return f"{path} is a folder; give a file name such as {path / 'placement.json'}"
    parent = path.parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if not parent.is_dir():
        return f"{parent} is a file, so {path} cannot be written; give a path in a folder"
    if not os.access(parent, os.W_OK | os.X_OK) or (path.exists() and not os.access(path, os.W_OK)):
        return f"{path} cannot be written (no write permission in {parent}); give a path you may write"
    return None


def checked_arguments(args: argparse.Namespace) -> tuple[list[str], list[str], tuple[int, ...]]:
    """``(profiles, targets, counts)`` from ``args``, every one checked, and the output files writable.

    Raises:
        ValueError: one sentence naming the bad argument and what it takes.
    """
    from dpcourse.config import profile_names

    if args.workers < 1:
        raise ValueError(f"--workers must be at least 1, got {args.workers}")
    profiles = args.profile or ["smoke", "full"]
    unknown = [p for p in profiles if p not in profile_names()]
    if unknown:
        raise ValueError(f"--profile {unknown[0]!r} is not a profile: use one of {', '.join(profile_names())}")
    targets = list(dict.fromkeys(gpu_targets.target(t).name for t in (args.target or list(gpu_targets.TARGETS))))
    words = [w.strip() for w in args.devices.split(",")]
    if not all(w.isdigit() and int(w) >= 1 for w in words):
        raise ValueError(
            f"--devices takes GPU counts of 1 or more, comma-separated (such as 2,4,8); got {args.devices!r}"
        )
    for path in output_paths(args):
        problem = unwritable(path)
        if problem:
            raise ValueError(problem)
    return profiles, targets, tuple(int(w) for w in words)


def main(argv: list[str] | None = None) -> int:
    """``make placement``: compile, print the table, write placement.json; exit 1 if one failed :func:`check`."""
    parser = argparse.ArgumentParser(description="Where the all-reduce lands: GPU and TPU (without them) and CPU.")
    parser.add_argument("--profile", action="append", help="workload profile (repeatable; default smoke and full)")
    parser.add_argument("--target", action="append", help=f"target (default all: {', '.join(gpu_targets.TARGETS)})")
    parser.add_argument("--devices", default="2,4,8", help="GPU counts, comma-separated")
    parser.add_argument("--out", type=Path, default=DEFAULT_JSON, help="where to write the records")
    parser.add_argument("--allow-missing-extra", action="store_true", help="compile the CPU only when it is missing")
    parser.add_argument("--lesson10", action="store_true", help="also compile lesson 10's steps (SHARDED_STEPS)")
    parser.add_argument("--overlap", action="store_true", help="also the overlap forms (coursetools.overlap_report)")
    parser.add_argument("--workers", type=int, default=2, help="compile subprocesses at a time (default 2)")
    parser.add_argument("--store", action="store_true", help=f"also write {STORED_NAME} into the package (stored)")
    args = parser.parse_args(argv)
    try:  # every argument and the output folders before any compile: nothing is written on a bad one
        profiles, targets, counts = checked_arguments(args)
    except ValueError as err:
        parser.error(str(err))
    # The compile workers inherit XLA_FLAGS: a bad token would end each one with XLA's whole flag list.
    exit_on_bad_xla_flags()
    for platform in ("gpu", "tpu"):
        mine = [t for t in targets if gpu_targets.target(t).platform == platform]
        missing = gpu_targets.extra_missing(platform) if mine else None
        if missing and not args.allow_missing_extra:
            print(f"placement: FAILED: {missing}", file=sys.stderr)
            return 1
        if missing:
            print(f"placement: {platform.upper()} targets skipped: {missing}")
            targets = [t for t in targets if t not in mine]
    t0 = time.perf_counter()
    results = compile_in_parallel(jobs_for(profiles, targets, counts), None, args.workers)
    if args.lesson10:
        from dpcourse.cross_compile import steps

        results += compile_in_parallel(lesson10_jobs(profiles, targets), steps.SHARDED_STEPS, args.workers)
    # What the lessons show without an extra (lessons.json, lessons_tpu.json, the stored files): not the overlap forms.
    lessons = [r for r in results if r.backend == "gpu" and r.n_devices == LESSON10_DEVICES and not r.error]
    lessons_tpu = [r for r in results if r.backend == "tpu" and not r.error]
    if args.overlap:
        gpus = _gpus(targets)
        results += compile_in_parallel(overlap_report.jobs(profiles, gpus), overlap_report.EXTRA_STEPS, args.workers)
    if "h200" in targets:  # 04's experiment: the pass switched off
        jobs = [deviceless.Job("gpu", "h200", LESSON10_DEVICES, p) for p in profiles]
        lessons += deviceless.compile_jobs(jobs, NO_MOTION_STEPS, disable_passes=(PASS_NAME,))
    fast = (
        deviceless.compile_jobs(fast_jobs(profiles, targets), FAST_LESSON_STEPS) if fast_jobs(profiles, targets) else []
    )
    lessons += [r for r in fast if r.backend == "gpu"]
    lessons_tpu += [r for r in fast if r.backend == "tpu"]
    if NO_MOTION_TPU in targets and "smoke" in profiles:  # the same experiment on the TPU compiler
        job = deviceless.Job("tpu", NO_MOTION_TPU, gpu_targets.target(NO_MOTION_TPU).chips, "smoke")
        lessons_tpu += deviceless.compile_jobs([job], NO_MOTION_STEPS, disable_passes=(PASS_NAME,))
    wall = time.perf_counter() - t0
    recs = records(results)
    print(format_table(table_rows(recs)))
    slices = ici_rows([r for r in results if not r.disabled_passes])  # costs.tpu_slice_allreduce_s, 1 us a hop
    if slices:
        print("\nTPU slices: the compiled all-reduce and the ICI model's time for it (a prediction, not measured):")
        print(format_table(slices))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(args.out, json.dumps(recs, indent=1) + "\n")
    for platform, kept in (("gpu", lessons), ("tpu", lessons_tpu)):
        if not any(gpu_targets.target(t).platform == platform for t in targets):
            continue  # not compiled in this run: its stored file stays as it was
        for path in output_paths(args, platform):
            path.parent.mkdir(parents=True, exist_ok=True)
            write_atomic(path, json.dumps(stored_payload(kept), indent=1) + "\n")
            print(f"placement: {len(kept)} compile results the lessons show without the {platform} extra in {path}")
    if args.store and _gpus(targets):  # notebook 09's section 8, stored
        from coursetools.paths import ROOT
        from dpcourse.cross_compile.notebook import OVERLAP_FILE

        path = overlap_report.store(ROOT.joinpath("dpcourse", *OVERLAP_FILE))
        print(f"placement: notebook 09's overlap compiles stored in {path}")
    problems = check(recs) + check_lesson10(recs)
    problems += slice_problems(slices)
    if args.overlap:
        print("\nfraction of bytes sent inside windows with matmul FLOPs (such windows/collectives, LHS ran):")
        print(format_table(overlap_report.table_rows(recs)))
        problems += overlap_report.check(recs)
    print(f"placement: {len(recs)} records in {args.out} ({wall:.1f} s)")
    for line in problems:
        print(f"placement: FAILED: {line}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
