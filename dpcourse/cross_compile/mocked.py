"""Mocked GPU topologies: compile the course's steps for N GPUs on a machine with one NVIDIA GPU.

One backend of :mod:`dpcourse.cross_compile.compile` (``Job("mocked", "1x4x1", 4,
profile)``), for a machine with a GPU and without the GPU-compile extra
(docs/gpu.md). JAX compiles for a *mocked* multi-GPU topology (config
``jax_mock_gpu_topology``, environment ``JAX_MOCK_GPU_TOPOLOGY``, read when
the backend starts; form ``<slices>x<hosts per slice>x<GPUs per host>``, e.g.
``1x4x1`` for 4 GPUs). Nothing runs on the mocked GPUs: the programs are
only compiled, so one real GPU is enough. Each topology needs a fresh
process (:func:`compile_mocked` starts one per topology), and the results
are :class:`dpcourse.cross_compile.result.CompileResult`, as for a GPU target
description or simulated CPU devices.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import pkgutil
import shutil
import subprocess
import sys

MOCK_TOPOLOGY_ENV = "JAX_MOCK_GPU_TOPOLOGY"
GPU_TOPOLOGIES = ("1x2x1", "1x4x1", "1x8x1")


def parse_topology(topology: str) -> tuple[int, int, int]:
    """Split a mocked GPU topology ``"<slices>x<hosts>x<gpus per host>"`` into three ints.

    Raises:
        ValueError: not three positive whole numbers joined by ``x``; the
            message gives an example.
    """
    parts = str(topology).strip().lower().split("x")
    if len(parts) != 3 or not all(p.strip().isdigit() and int(p) >= 1 for p in parts):
        raise ValueError(
            f"GPU topology {topology!r} is not of the form <slices>x<hosts per slice>x<GPUs per host> "
            "with positive whole numbers, e.g. '1x4x1' for 4 GPUs."
        )
    slices, hosts, per_host = (int(p) for p in parts)
    return slices, hosts, per_host


def topology_device_count(topology: str) -> int:
    """GPUs in a mocked topology: slices x hosts x GPUs per host (see :func:`parse_topology`)."""
    slices, hosts, per_host = parse_topology(topology)
    return slices * hosts * per_host


def _cuda_plugin_names() -> list[str]:
    names = [n for n in ("jax_cuda12_plugin", "jax_cuda13_plugin") if importlib.util.find_spec(n) is not None]
    # jax_plugins is a namespace package holding xla_cuda12 / xla_cuda13 when installed;
    # find_spec looks without importing it.
    spec = importlib.util.find_spec("jax_plugins")
    if spec is not None and spec.submodule_search_locations:
        names += [
            f"jax_plugins.{m.name}" for m in pkgutil.iter_modules(spec.submodule_search_locations) if "cuda" in m.name
        ]
    return names


def _nvidia_gpus(timeout_s: float = 10.0) -> list[str]:
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return []
    try:
        out = subprocess.run([exe, "-L"], capture_output=True, text=True, timeout=timeout_s)
    except (OSError, subprocess.TimeoutExpired):
        return []
    return [line for line in out.stdout.splitlines() if line.startswith("GPU ")] if out.returncode == 0 else []


def gpu_unavailable_reason() -> str | None:
    """Why mocked topologies cannot be compiled on this machine, or None when they can.

    Needs at least one NVIDIA GPU (listed by ``nvidia-smi -L``) and jaxlib's
    CUDA plugin. Starts no JAX backend.
    """
    if not _nvidia_gpus():
        return "no NVIDIA GPU here (nvidia-smi is absent or lists no GPU)"
    if not _cuda_plugin_names():
        return "jaxlib's CUDA plugin is not installed (pip install 'jax[cuda12]' or 'jax[cuda13]')"
    return None


def mocked_env(topology: str, base: dict | None = None) -> dict[str, str]:
    """``base`` (default ``os.environ``) with the mocked topology set, for a process JAX has not started in.

    ``JAX_PLATFORMS=cuda``, ``JAX_MOCK_GPU_TOPOLOGY=topology``, one visible
    GPU (the first already visible) and no memory preallocation (the process
    only compiles; a notebook may hold the GPU).

    Raises:
        ValueError: a bad topology (see :func:`parse_topology`).
    """
    parse_topology(topology)
    env = dict(os.environ if base is None else base)
    visible = env.get("CUDA_VISIBLE_DEVICES", "").split(",")[0].strip() or "0"
    env.update(
        {
            "JAX_PLATFORMS": "cuda",
            MOCK_TOPOLOGY_ENV: topology,
            "CUDA_VISIBLE_DEVICES": visible,
            "XLA_PYTHON_CLIENT_PREALLOCATE": "false",
        }
    )
    return env


def compile_mocked(
    profile: str,
    topologies: tuple[str, ...] = GPU_TOPOLOGIES,
    steps: dict[str, str] | None = None,
    disable_passes: tuple[str, ...] = (),
    timeout_s: float = 600.0,
) -> list:
    """Compile ``steps`` for each mocked topology, one fresh process each; one result per topology.

    Args:
        profile: the workload profile (``"full"``, ``"cpu"``, ``"smoke"``).
        topologies: mocked topologies (:data:`GPU_TOPOLOGIES`).
        steps: step name -> builder ``"module:function"`` (default
            :data:`dpcourse.cross_compile.compile.COURSE_STEPS`).
        disable_passes: XLA passes to switch off.

    Returns:
        :class:`dpcourse.cross_compile.result.CompileResult` list, backend
        ``"mocked"``; each has ``error`` set when this machine cannot compile
        them (:func:`gpu_unavailable_reason`) or its worker failed.

    Raises:
        ValueError: a bad topology or builder name.
    """
    from dpcourse.cross_compile import compile as deviceless

    jobs = [deviceless.Job("mocked", t, topology_device_count(t), profile) for t in topologies]
    return [deviceless.compile_jobs([job], steps, disable_passes, timeout_s)[0] for job in jobs]


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
        mocked = res.backend == "mocked"
        suffix = f"gpu_{res.target}" if mocked else f"{res.platform}_{res.n_devices}"
        kind = f"{res.device_kind} (mocked topology {res.target})" if mocked else res.device_kind
        where = dict(backend=res.platform, device_kind=kind, device_count=res.n_devices)
        for name, s in res.steps.items():
            for metric, value, unit in (
                (f"collectives_per_step_{name}_{suffix}", s.runs_per_step, "count"),
                (f"collectives_in_loop_{name}_{suffix}", s.in_loop, "count"),
                (f"collective_bytes_per_step_{name}_{suffix}", s.bytes_per_step, "bytes"),
            ):
                written.append(recorded.record(metric, value, unit, **where))
    return [w for w in written if w is not None]


def report(profile: str, topologies: tuple[str, ...] = GPU_TOPOLOGIES, cpu_devices: int = 8) -> list:
    """Mocked GPUs (where this machine can) and ``cpu_devices`` simulated CPU devices; prints the table."""
    from dpcourse.cross_compile import compile as deviceless
    from dpcourse.cross_compile.result import records, table_rows

    reason = gpu_unavailable_reason()
    results = [] if reason else compile_mocked(profile, topologies)
    if reason:
        print(f"Mocked GPU topologies cannot be compiled here: {reason}.")
    results += deviceless.compile_jobs([deviceless.Job("cpu", "cpu", cpu_devices, profile)])
    for row in table_rows(records(results)):
        print("  ".join(f"{k}={v}" for k, v in row.items()))
    return results


def main(argv: list[str] | None = None) -> int:
    """``python -m dpcourse.cross_compile.mocked --report --profile full``: mocked 2, 4 and 8 GPUs and 8 CPU devices.

    Exits 1 when a compile that could run here failed.
    """
    parser = argparse.ArgumentParser(description="Compile the course's steps for mocked GPU topologies and the CPU.")
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
    reason = gpu_unavailable_reason()
    results = report(args.profile)
    return 0 if all(r.error is None for r in results if r.backend == "cpu" or reason is None) else 1


def __getattr__(name: str):
    # What notebooks 04, 05 and 09 called here before dpcourse.cross_compile.notebook held it.
    if name in ("CPU_ONLY_CAVEAT", "PASS_NAME", "show_gpu_placement", "records", "table_rows"):
        from dpcourse import _moved
        from dpcourse.cross_compile import notebook as gpu_notebook

        _moved.warn_moved(f"dpcourse.cross_compile.mocked.{name}", f"dpcourse.cross_compile.notebook.{name}")
        return getattr(gpu_notebook, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


if __name__ == "__main__":
    sys.exit(main())
