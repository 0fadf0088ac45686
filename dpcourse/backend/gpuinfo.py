"""What ``nvidia-smi`` says about the GPUs: each one's total memory (notebook 01).

JAX reports the size of its own allocator pool (``memory_stats()["bytes_limit"]``),
not the memory of the device; the total comes from the driver.
"""

from __future__ import annotations

import shutil
import subprocess

MIB = 1024**2


def parse_memory_totals(csv_text: str) -> list[int]:
    """Bytes per GPU from ``nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits``.

    One line per GPU, each a number of MiB (``"143771"``).

    Raises:
        ValueError: a line that is not a whole number of MiB (the message shows it).
    """
    totals = []
    for line in csv_text.splitlines():
        line = line.strip()
        if not line:
            continue
        if not line.isdigit():
            raise ValueError(f"nvidia-smi memory.total line {line!r} is not a whole number of MiB.")
        totals.append(int(line) * MIB)
    return totals


def gpu_memory_totals(timeout_s: float = 10.0) -> list[int] | None:
    """Total memory of every GPU the driver sees, bytes, in ``nvidia-smi``'s order; None without it.

    ``nvidia-smi`` lists every GPU of the machine, also those hidden from
    this process by ``CUDA_VISIBLE_DEVICES``, and may order them otherwise
    than CUDA: use :func:`uniform_gpu_memory` to attach a total to JAX's
    devices.
    """
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    try:
        out = subprocess.run(
            [exe, "--query-gpu=memory.total", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=timeout_s,
        )
        return parse_memory_totals(out.stdout) if out.returncode == 0 else None
    except (OSError, subprocess.TimeoutExpired, ValueError):
        return None


def uniform_gpu_memory(totals: list[int] | None) -> int | None:
    """The one total all GPUs share, bytes; None when unknown or when the GPUs differ.

    When every GPU has the same memory, which JAX device is which
    ``nvidia-smi`` row does not matter; otherwise the course says "unknown"
    rather than guess the order.
    """
    if not totals or len(set(totals)) != 1:
        return None
    return totals[0]
