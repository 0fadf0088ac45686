"""Mocked GPU topologies: their form, device count and environment, and whether this machine can compile them.

One backend of :mod:`dpcourse.cross_compile.compile` (``Job("mocked", "1x4x1", 4,
profile)``), for a machine with a GPU and without the GPU-compile extra
(docs/gpu.md). JAX compiles for a *mocked* multi-GPU topology (config
``jax_mock_gpu_topology``, environment ``JAX_MOCK_GPU_TOPOLOGY``, read when
the backend starts; form ``<slices>x<hosts per slice>x<GPUs per host>``, e.g.
``1x4x1`` for 4 GPUs). Nothing runs on the mocked GPUs: the programs are
only compiled, so one real GPU is enough. Each topology needs a fresh
process (:func:`dpcourse.cross_compile.compile.compile_mocked` starts one per
topology). This module imports nothing of the package: the compile uses it.
"""

from __future__ import annotations

import importlib.util
import math
import os
import pkgutil
import shutil
import subprocess

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
    return tuple(int(p) for p in parts)


def topology_device_count(topology: str) -> int:
    """GPUs in a mocked topology: slices x hosts x GPUs per host (see :func:`parse_topology`)."""
    return math.prod(parse_topology(topology))


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


def nvidia_gpus(timeout_s: float = 10.0) -> list[str]:
    """The GPUs ``nvidia-smi -L`` lists (``"GPU 0: NVIDIA H100 80GB HBM3 (UUID: ...)"``); empty without it."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return []
    try:
        out = subprocess.run([exe, "-L"], capture_output=True, text=True, timeout=timeout_s)
    except (OSError, subprocess.TimeoutExpired):
        return []
    return [line.strip() for line in out.stdout.splitlines() if line.startswith("GPU ")] if out.returncode == 0 else []


def gpu_unavailable_reason() -> str | None:
    """Why mocked topologies cannot be compiled on this machine, or None when they can.

    Needs at least one NVIDIA GPU (listed by ``nvidia-smi -L``) and jaxlib's
    CUDA plugin. Starts no JAX backend.
    """
    if not nvidia_gpus():
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
