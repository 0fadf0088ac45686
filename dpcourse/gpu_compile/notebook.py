"""What lessons 04, 05 and 09 call to show where the GPU compiler and the CPU compiler put the collectives."""

from __future__ import annotations

from dpcourse.gpu_compile import compile as deviceless
from dpcourse.gpu_compile import mocked
from dpcourse.gpu_compile import targets as gpu_targets
from dpcourse.gpu_compile.mocked import CPU_ONLY_CAVEAT, PASS_NAME

__all__ = ["CPU_ONLY_CAVEAT", "PASS_NAME", "records", "show_compilers", "show_gpu_placement", "table_rows"]


OVERLAP_FIELDS = ("overlapped_fraction", "windows_with_compute", "sync_collectives")


def records(results: list[deviceless.CompileResult]) -> list[dict]:
    """One flat record per result and step (the rows of placement.json).

    Fields: backend, target, target_label, approximate, deviceless,
    n_devices, profile, step, collectives, all_reduces, in_loop,
    runs_per_step, bytes_per_step (result bytes per device),
    sent_bytes_per_step (bytes each device sends in ring collectives,
    :func:`dpcourse.compiled.census.sent_bytes`; None where a trip count is
    unknown), compile_s, flops, bytes_accessed (cost_analysis), temp_bytes
    (memory_analysis), overlapped_fraction, windows_with_compute,
    sync_collectives (the GPU schedule, :mod:`dpcourse.compiled.schedule`;
    None on the CPU), scheduler_ran, disabled_passes, jax_version,
    jaxlib_version, error.
    """
    from dpcourse.compiled import census

    out = []
    for res in results:
        base = {
            "backend": res.backend,
            "target": res.target,
            "target_label": res.target_label,
            "approximate": res.approximate,
            "deviceless": res.deviceless,
            "n_devices": res.n_devices,
            "profile": res.profile,
        }
        tail = {
            "disabled_passes": res.disabled_passes,
            "jax_version": res.jax_version,
            "jaxlib_version": res.jaxlib_version,
        }
        if res.error:
            out.append({**base, "step": None, **tail, "error": res.error})
            continue
        for name, s in res.steps.items():
            out.append(
                {
                    **base,
                    "step": name,
                    "collectives": s.count,
                    "all_reduces": sum(c["kind"] == "all-reduce" for c in s.collectives),
                    "in_loop": s.in_loop,
                    "runs_per_step": s.runs_per_step,
                    "bytes_per_step": s.bytes_per_step,
                    "sent_bytes_per_step": census.sent_bytes_per_step(
                        census.report_from_rows(s.collectives), res.n_devices
                    ),
                    "compile_s": s.compile_s,
                    "flops": s.cost.get("flops"),
                    "bytes_accessed": s.cost.get("bytes accessed"),
                    "temp_bytes": s.memory.get("temp_size_in_bytes"),
                    **{k: (s.schedule if res.backend == "gpu" else {}).get(k) for k in OVERLAP_FIELDS},
                    "scheduler_ran": s.scheduler_ran,
                    **tail,
                    "error": s.error,
                }
            )
    return out


def table_rows(recs: list[dict]) -> list[dict]:
    """Rows for :func:`dpcourse.show.table` or a text table: where each step's collectives land."""
    rows = []
    for r in recs:
        where = r["target_label"] if r["backend"] == "gpu" else "CPU (simulated)"
        row = {"backend": r["backend"], "compiled for": f"{r['n_devices']} x {where}", "profile": r["profile"]}
        if r.get("error"):
            rows.append({**row, "step": "(not compiled)", "collectives": r["error"]})
            continue
        rows.append(
            {
                **row,
                "step": r["step"],
                "collectives": r["collectives"],
                "inside loop": r["in_loop"],
                "runs per step": "unknown" if r["runs_per_step"] is None else r["runs_per_step"],
                "bytes per step": "unknown" if r["bytes_per_step"] is None else f"{r['bytes_per_step']:,}",
                "compile s": r["compile_s"],
            }
        )
    return rows


def show_compilers(
    profile: str,
    steps: dict[str, str] | None = None,
    target: str = "h200",
    counts: tuple[int, ...] = gpu_targets.DEVICE_COUNTS,
    cpu_devices: int | None = 8,
    disable_passes: tuple[str, ...] = (),
) -> list[deviceless.CompileResult]:
    """Notebooks: compile ``steps`` for ``counts`` x ``target`` without a GPU and for CPU devices; show both.

    One subprocess, one table per result. ``cpu_devices=None`` leaves the CPU
    out (a notebook on CPU devices has just shown it). Without the extra it
    prints one line saying how to get it and shows the CPU compiler's answer
    only.

    Returns:
        The results (GPU ones first; a GPU result has ``error`` set when the
        extra is missing).
    """
    from IPython.display import display

    from dpcourse import show

    missing = gpu_targets.extra_missing()
    gpu_jobs = [] if missing else [deviceless.Job("gpu", target, n, profile) for n in counts]
    jobs = gpu_jobs + ([deviceless.Job("cpu", "cpu", cpu_devices, profile)] if cpu_devices else [])
    if missing:
        print(f"GPU compile without a GPU is not available here: {missing}")
    results = deviceless.compile_jobs(jobs, steps, disable_passes=disable_passes)
    passes = f", XLA passes off: {', '.join(disable_passes)}" if disable_passes else ""
    for res in results:
        caption = f"{res.label} ({profile} profile, JAX {res.jax_version or '?'}{passes})"
        display(show.table(table_rows(records([res])), caption=caption))
    return results


def show_gpu_placement(
    profile: str,
    backend: str,
    steps: dict[str, str] | None = None,
    counts: tuple[int, ...] = (8,),
    disable_passes: tuple[str, ...] = (),
) -> list:
    """Notebooks 04, 05 and 09: the GPU compiler's and the CPU compiler's placement of ``steps``, on any machine.

    With the gpu-compile extra (:mod:`dpcourse.gpu_compile.targets`) it compiles for
    ``counts`` x H200 without a GPU and, when ``backend`` is not ``"cpu"``
    (the notebook has shown the CPU's answer itself), for 8 simulated CPU
    devices, and shows them (:func:`show_compilers`). Without
    it, on a machine with an NVIDIA GPU and the CUDA plugin, the mocked
    topologies (:func:`show_mocked_gpu_placement`); elsewhere one line
    saying how to get the extra.

    Args:
        steps: step name -> builder ``"module:function"`` (default: the
            course's three, :data:`dpcourse.gpu_compile.compile.COURSE_STEPS`).
        disable_passes: XLA passes to switch off in the compile (experiments).

    Returns:
        :class:`dpcourse.gpu_compile.compile.CompileResult` list, or the mocked
        path's :class:`dpcourse.gpu_compile.mocked.PlacementReport` list, or [] when neither can run.
    """

    missing = gpu_targets.extra_missing()
    if missing is None:
        cpu = None if backend == "cpu" else 8  # on CPU devices the notebook has just shown the CPU's answer
        return show_compilers(profile, steps, counts=counts, cpu_devices=cpu, disable_passes=disable_passes)
    if mocked.gpu_unavailable_reason() is None and not disable_passes and steps is None:
        return mocked.show_mocked_gpu_placement(profile, backend)
    print(f"The GPU compiler's placement is not shown: {missing}")
    return []
