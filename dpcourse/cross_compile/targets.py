"""GPU target descriptions for compiling without a GPU, and the check that the compiler can run.

XLA compiles for a GPU it does not have from a ``GpuTargetConfigProto``
text (the device's limits, clocks, memory) handed to
``jax.experimental.topologies.get_topology_desc``. This module holds three:
the H200 and H100 SXM files XLA ships (``dpcourse/cross_compile/configs/``, Apache-2.0,
attribution in ``dpcourse/cross_compile/configs/NOTICE.md``) and an **approximate** L4
written from NVIDIA's L4 datasheet (its header says which fields are
estimates). It also says whether the optional extra that makes such a compile
possible is installed (:data:`EXTRA_PACKAGES`), without starting JAX.

Where the extra lives: ``make gpu-compile`` installs it into its own folder,
``<environment>/gpu-compile`` (``pip install --target``), which only the
compile subprocess puts on its path (:func:`extra_path`). Installed into the
environment itself (``pip install -e '.[gpu-compile]'``) it works too, but
then every ``import jax`` on a machine without CUDA prints the plugin's
failed start-up check (a traceback) before falling back to the CPU; the side
folder keeps the lessons' own processes free of it.

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


@dataclass(frozen=True)
class GpuTarget:
    """One GPU XLA can compile for without having it.

    Attributes:
        name: the key (``"h200"``), used on command lines and in records.
        label: how tables show it (``"H200"``, ``"L4 (approximate)"``).
        file: the text proto in ``dpcourse/cross_compile/configs/``.
        approximate: True when the description was estimated, not XLA's own.
        source: where the description comes from.
    """

    name: str
    label: str
    file: str
    approximate: bool
    source: str

    def devices_label(self, n_devices: int) -> str:
        """``"8 x H200"``; an approximate target says so (``"2 x L4 (approximate)"``)."""
        return f"{n_devices} x {self.label}"


TARGETS: dict[str, GpuTarget] = {
    t.name: t
    for t in (
        GpuTarget(
            "h100_sxm",
            "H100 SXM",
            "h100_sxm.txtpb",
            False,
            "openxla/xla xla/backends/gpu/target_config/specs/h100_sxm.txtpb (Apache-2.0)",
        ),
        GpuTarget(
            "h200",
            "H200",
            "h200.txtpb",
            False,
            "openxla/xla xla/backends/gpu/target_config/specs/h200.txtpb (Apache-2.0)",
        ),
        GpuTarget(
            "l4",
            "L4 (approximate)",
            "l4.txtpb",
            True,
            "written for this course from the NVIDIA L4 datasheet; SM count, clock, L2 and unit rates estimated",
        ),
    )
}


def target(name: str) -> GpuTarget:
    """The target called ``name`` (case-insensitive).

    Raises:
        ValueError: an unknown name; the message lists the known ones.
    """
    key = str(name).strip().lower()
    if key not in TARGETS:
        raise ValueError(f"Unknown GPU target {name!r}: use one of {', '.join(sorted(TARGETS))}.")
    return TARGETS[key]


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
    spec = target(name)
    text = importlib.resources.files("dpcourse").joinpath("cross_compile", "configs", spec.file).read_text()
    if jaxlib_version is None:
        jaxlib_version = importlib.metadata.version("jaxlib")
    if _version_tuple(jaxlib_version) < (0, 12):
        text = "\n".join(
            line for line in text.splitlines() if not any(line.strip().startswith(f + ":") for f in _NEWER_FIELDS)
        )
    return text


def extra_path() -> Path | None:
    """The folder holding the extra, or None when it is to be found in this environment itself.

    ``$DPCOURSE_GPU_COMPILE_PATH`` when set, else ``<sys.prefix>/gpu-compile``
    when that folder exists (what ``make gpu-compile`` makes).
    """
    import os
    import sys

    if os.environ.get(EXTRA_PATH_ENV):
        return Path(os.environ[EXTRA_PATH_ENV])
    side = Path(sys.prefix) / EXTRA_DIR_NAME
    return side if side.is_dir() else None


def _search_path() -> list[str]:
    import sys

    side = extra_path()
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


def _installed(dist: str) -> str | None:
    if dist != "jaxlib":
        for found in importlib.metadata.distributions(name=dist, path=_search_path()):
            return found.version
        return None
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def install_command(jaxlib_version: str | None = None) -> str:
    """How to install the extra for ``jaxlib_version`` (default: the installed jaxlib)."""
    v = jaxlib_version or _installed("jaxlib") or "<your jaxlib version>"
    return (
        "make gpu-compile (in the course's repository), or: pip install --no-deps --target "
        f"<environment>/{EXTRA_DIR_NAME} jax-cuda12-plugin=={v} jax-cuda12-pjrt=={v} {NVCC_PACKAGE}=={NVCC_VERSION}"
    )


def extra_missing() -> str | None:
    """Why a GPU compile without a GPU cannot run here, or None when it can.

    Checks, without starting JAX, that ``jax-cuda12-plugin`` and
    ``jax-cuda12-pjrt`` are installed (in :func:`extra_path` or this
    environment) at exactly the installed jaxlib's version, and that
    libdevice (``nvidia-cuda-nvcc-cu12``) is present: without it the compile
    segfaults instead of raising. The reason ends with how to fix it.
    """
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
