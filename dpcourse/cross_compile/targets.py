"""What this course compiles for without the device: GPU models and TPU slices, and whether this machine can.

One interface for both (:class:`Target`): a **GPU target** is a model XLA
compiles for from a ``GpuTargetConfigProto`` text (the device's limits,
clocks, memory) handed to ``jax.experimental.topologies.get_topology_desc``:
the H200 and H100 SXM files XLA ships (``dpcourse/cross_compile/configs/``,
Apache-2.0, attribution in ``configs/NOTICE.md``) and an **approximate** L4
written from NVIDIA's L4 datasheet (its header says which fields are
estimates). A **TPU target** is a slice topology that libtpu describes
itself (``get_topology_desc(platform="tpu", topology_name="v5e:2x4")``):
its chips, their kind and the links between them, with no TPU here.

Each platform has an optional extra that makes such a compile possible
(:data:`EXTRAS`): JAX's CUDA plugin and libdevice for GPUs, libtpu for
TPUs. :func:`extra_missing` says, without starting JAX, whether it is
installed at the version the installed JAX needs. ``make gpu-compile`` and
``make tpu-compile`` install them into their own folders,
``<environment>/gpu-compile`` and ``<environment>/tpu-compile`` (``pip
install --target``), which only the compile subprocess puts on its path
(:func:`extra_path`): installed into the environment itself, the CUDA
plugin's failed start-up check prints a traceback at every ``import jax``
on a machine without CUDA, and libtpu makes JAX look for TPU chips.

Measured with jaxlib 0.10.2 and 0.12.0.1 on a machine with no GPU and no
driver: without libdevice (from ``nvidia-cuda-nvcc-cu12``) the compiling
process segfaults instead of raising, so :func:`extra_missing` looks for it
first; jaxlib 0.10.2 refuses the field ``collective_memory_granularity``
("Failed to parse GpuTargetConfigProto"), so :func:`config_text` drops it for
jaxlib before 0.12.
"""

from __future__ import annotations

import importlib.metadata
import importlib.resources
import re
from dataclasses import dataclass
from pathlib import Path

DEVICE_COUNTS = (2, 4, 8)
NVCC_PACKAGE = "nvidia-cuda-nvcc-cu12"
NVCC_VERSION = "12.9.86"
EXTRA_PACKAGES = ("jax-cuda12-plugin", "jax-cuda12-pjrt", NVCC_PACKAGE)
_NEWER_FIELDS = ("collective_memory_granularity",)  # unknown to jaxlib < 0.12
EXTRA_PATH_ENV = "DPCOURSE_GPU_COMPILE_PATH"
EXTRA_DIR_NAME = "gpu-compile"
LIBTPU_PACKAGE = "libtpu"
PLATFORMS = ("gpu", "tpu")


@dataclass(frozen=True)
class Extra:
    """The optional extra one platform's compile needs: what it is called, where it lives, how to install it."""

    platform: str
    title: str
    path_env: str
    dir_name: str
    make: str
    size: str


EXTRAS: dict[str, Extra] = {
    "gpu": Extra("gpu", "GPU-compile extra", EXTRA_PATH_ENV, EXTRA_DIR_NAME, "make gpu-compile", "about 510 MB"),
    # libtpu 0.0.42's wheel is 209 MB, 656 MB installed (measured, pip install --target).
    "tpu": Extra(
        "tpu", "TPU-compile extra", "DPCOURSE_TPU_COMPILE_PATH", "tpu-compile", "make tpu-compile", "a 209 MB wheel"
    ),
}


@dataclass(frozen=True)
class Target:
    """One device XLA can compile for without having it: a GPU model or a TPU slice.

    Attributes:
        name: the key (``"h200"``, ``"v5e_2x4"``), used on command lines and in records.
        label: how tables show it (``"H200"``, ``"L4 (approximate)"``, ``"TPU v5e 2x4"``).
        platform: ``"gpu"`` or ``"tpu"``: the backend of its compile jobs.
        approximate: True when the description was estimated, not XLA's or libtpu's own.
        source: where the description comes from.
        file: a GPU's text proto in ``dpcourse/cross_compile/configs/`` (empty for a TPU).
        topology: a TPU slice's name as libtpu takes it (``"v5e:2x4"``; empty for a GPU).
        chips: a TPU slice's chip count (0 for a GPU: any count of GPUs compiles).
    """

    name: str
    label: str
    platform: str
    approximate: bool
    source: str
    file: str = ""
    topology: str = ""
    chips: int = 0

    def devices_label(self, n_devices: int) -> str:
        """``"8 x H200"``, ``"2 x L4 (approximate)"``, ``"8 x TPU v5e (2x4 slice)"``."""
        if self.platform == "tpu":
            kind, shape = self.label.rsplit(" ", 1)
            return f"{n_devices} x {kind} ({shape} slice)"
        return f"{n_devices} x {self.label}"


# XLA's own descriptions of GPUs (openxla/xla, Apache-2.0); a target whose source is another was estimated.
XLA_SPEC = "openxla/xla xla/backends/gpu/target_config/specs/{}.txtpb (Apache-2.0)"


def _gpu(name: str, label: str, source: str = XLA_SPEC) -> Target:
    return Target(name, label, "gpu", source != XLA_SPEC, source.format(name), file=f"{name}.txtpb")


def _tpu(topology: str, chips: int, source: str) -> Target:
    kind, shape = topology.split(":")
    return Target(f"{kind}_{shape}", f"TPU {kind} {shape}", "tpu", False, source, topology=topology, chips=chips)


L4_SOURCE = "written for this course from the NVIDIA L4 datasheet; SM count, clock, L2 and unit rates estimated"
GPU_TARGETS: dict[str, Target] = {
    t.name: t for t in (_gpu("h100_sxm", "H100 SXM"), _gpu("h200", "H200"), _gpu("l4", "L4 (approximate)", L4_SOURCE))
}
# TPU slices: libtpu's own description of each topology (chips, their kind, the links); the chip
# counts are those JAX reports for them (len(get_topology_desc(...).devices), libtpu 0.0.42).
TPU_TARGETS: dict[str, Target] = {
    t.name: t
    for t in (
        _tpu("v5e:2x4", 8, "libtpu's topology v5e:2x4: the 8-chip slice of a TPU v5e-8 (Kaggle's TPU VM)"),
        _tpu("v5e:4x4", 16, "libtpu's topology v5e:4x4: a v5e-16, 4 hosts (its chips' process_index 0-3) of 4 chips"),
        _tpu("v5p:2x2x2", 8, "libtpu's topology v5p:2x2x2: an 8-chip v5p slice (a 3-D mesh, no wraparound links)"),
        _tpu("v5p:4x4x4", 64, "libtpu's topology v5p:4x4x4: a 64-chip v5p slice (a cube, wraparound links)"),
        _tpu("v6e:16x16", 256, "libtpu's topology v6e:16x16: a whole 256-chip Trillium pod"),
    )
}
TARGETS: dict[str, Target] = {**GPU_TARGETS, **TPU_TARGETS}


def target(name: str, platform: str | None = None) -> Target:
    """The target called ``name`` (case-insensitive; a TPU's ``"v5e:2x4"`` is ``"v5e_2x4"``).

    Args:
        platform: ``"gpu"`` or ``"tpu"`` to look among that platform's targets only.

    Raises:
        ValueError: an unknown name (or one of another platform); the message lists the known ones.
    """
    known = {"gpu": GPU_TARGETS, "tpu": TPU_TARGETS}.get(platform, TARGETS)
    key = str(name).strip().lower().replace(":", "_")
    if key not in known:
        what = f"{platform.upper()} target" if platform in PLATFORMS else "target"
        raise ValueError(f"Unknown {what} {name!r}: use one of {', '.join(sorted(known))}.")
    return known[key]


def _version_tuple(version: str) -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", version)[:3])


def config_text(name: str, jaxlib_version: str | None = None) -> str:
    """The target's ``GpuTargetConfigProto`` text, as ``jaxlib_version`` can parse it.

    Args:
        name: a key of :data:`TARGETS`.
        jaxlib_version: the jaxlib that will read it (default: the installed
            one). Before 0.12 the lines of fields it does not know are removed.

    Raises:
        ValueError: an unknown target.
    """
    spec = target(name, "gpu")
    text = importlib.resources.files("dpcourse").joinpath("cross_compile", "configs", spec.file).read_text()
    if jaxlib_version is None:
        jaxlib_version = importlib.metadata.version("jaxlib")
    if _version_tuple(jaxlib_version) < (0, 12):
        text = "\n".join(
            line for line in text.splitlines() if not any(line.strip().startswith(f + ":") for f in _NEWER_FIELDS)
        )
    return text


def extra_path(platform: str = "gpu") -> Path | None:
    """The folder holding ``platform``'s extra, or None when it is to be found in this environment itself.

    Its environment variable (``$DPCOURSE_GPU_COMPILE_PATH``,
    ``$DPCOURSE_TPU_COMPILE_PATH``) when set, else ``<sys.prefix>/gpu-compile``
    or ``<sys.prefix>/tpu-compile`` when that folder exists (what ``make
    gpu-compile`` and ``make tpu-compile`` make).
    """
    import os
    import sys

    extra = EXTRAS[platform]
    if os.environ.get(extra.path_env):
        return Path(os.environ[extra.path_env])
    side = Path(sys.prefix) / extra.dir_name
    return side if side.is_dir() else None


def _search_path(platform: str = "gpu") -> list[str]:
    import sys

    side = extra_path(platform)
    return ([str(side)] if side else []) + sys.path


def libdevice_path() -> Path | None:
    """``libdevice.10.bc`` from the ``nvidia-cuda-nvcc-cu12`` wheel, or None when it is absent.

    Looks in :func:`extra_path` and on ``sys.path`` without importing
    anything (XLA finds it in the same place: ``nvidia/cuda_nvcc``).
    """
    for root in _search_path():
        found = Path(root) / "nvidia" / "cuda_nvcc" / "nvvm" / "libdevice" / "libdevice.10.bc"
        if found.is_file():
            return found
    return None


def _installed(dist: str, platform: str = "gpu") -> str | None:
    if dist not in ("jaxlib", "jax"):
        for found in importlib.metadata.distributions(name=dist, path=_search_path(platform)):
            return found.version
        return None
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def libtpu_wanted(requirements: list[str] | None = None) -> str | None:
    """The libtpu release the installed JAX's ``tpu`` extra takes (``"0.0.42"`` for JAX 0.10.2), or None.

    Read from JAX's own metadata (``Requires-Dist: libtpu==0.0.42.*; extra
    == "tpu"``), or from ``requirements`` (such lines) when given.
    """
    if requirements is None:
        try:
            requirements = importlib.metadata.requires("jax") or []
        except importlib.metadata.PackageNotFoundError:
            return None
    for line in requirements:
        found = re.match(r"\s*libtpu\s*==\s*([\d.]+?)(?:\.\*)?\s*;.*extra\s*==\s*[\"']tpu[\"']", line)
        if found:
            return found.group(1)
    return None


def install_command(jaxlib_version: str | None = None, platform: str = "gpu") -> str:
    """How to install ``platform``'s extra for ``jaxlib_version`` (default: the installed jaxlib and JAX)."""
    extra = EXTRAS[platform]
    if platform == "tpu":
        v = libtpu_wanted() or "<the version your JAX's tpu extra names>"
        return (
            f"{extra.make} (in the course's repository), or: pip install --no-deps --target "
            f"<environment>/{extra.dir_name} {LIBTPU_PACKAGE}=={v}"
        )
    v = jaxlib_version or _installed("jaxlib") or "<your jaxlib version>"
    return (
        f"{extra.make} (in the course's repository), or: pip install --no-deps --target "
        f"<environment>/{extra.dir_name} jax-cuda12-plugin=={v} jax-cuda12-pjrt=={v} {NVCC_PACKAGE}=={NVCC_VERSION}"
    )


def _tpu_missing() -> str | None:
    have = _installed(LIBTPU_PACKAGE, "tpu")
    wanted = libtpu_wanted()
    if have is None:
        problem = f"{LIBTPU_PACKAGE} is not installed"
    elif wanted is not None and not (have == wanted or have.startswith(wanted + ".")):
        problem = f"{LIBTPU_PACKAGE} is {have}, not the {wanted} that JAX {_installed('jax')} takes"
    elif not any((Path(root) / "libtpu" / "libtpu.so").is_file() for root in _search_path("tpu")):
        problem = f"{LIBTPU_PACKAGE} {have} is installed without its libtpu.so"
    else:
        return None
    return f"{problem}. Install the {EXTRAS['tpu'].title}: {install_command(platform='tpu')}"


def extra_missing(platform: str = "gpu") -> str | None:
    """Why a compile for ``platform`` (``"gpu"`` or ``"tpu"``) without the device cannot run here, or None when it can.

    GPU: checks, without starting JAX, that ``jax-cuda12-plugin`` and
    ``jax-cuda12-pjrt`` are installed (in :func:`extra_path` or this
    environment) at exactly the installed jaxlib's version, and that
    libdevice (``nvidia-cuda-nvcc-cu12``) is present: without it the compile
    segfaults instead of raising. TPU: that libtpu is installed at the
    version the installed JAX's ``tpu`` extra takes (:func:`libtpu_wanted`),
    with its shared library. The reason ends with how to fix it.

    Raises:
        ValueError: a platform other than ``"gpu"`` and ``"tpu"``.
    """
    if platform not in PLATFORMS:
        raise ValueError(f"Unknown platform {platform!r}: use 'gpu' or 'tpu'.")
    if platform == "tpu":
        return _tpu_missing()
    jaxlib = _installed("jaxlib")
    if jaxlib is None:
        return "jaxlib is not installed"
    problems = []
    for dist in EXTRA_PACKAGES[:2]:
        have = _installed(dist)
        if have is None:
            problems.append(f"{dist} is not installed")
        elif have != jaxlib:
            problems.append(f"{dist} is {have}, not jaxlib's {jaxlib}")
    if libdevice_path() is None:
        problems.append(f"libdevice is missing ({NVCC_PACKAGE} is not installed; it brings ptxas and libdevice)")
    if not problems:
        return None
    return "; ".join(problems) + f". Install the GPU-compile extra: {install_command(jaxlib)}"
