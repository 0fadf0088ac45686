"""The host machine: the cores this process may use and its memory, and what they mean for simulated devices (01)."""

from __future__ import annotations

import os


def host_cores() -> int:
    """The CPU cores this process may run on (its affinity mask where the OS has one, else ``os.cpu_count()``)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # macOS and Windows have no affinity call
        return os.cpu_count() or 1


def host_memory_bytes() -> int | None:
    """The host's physical memory in bytes (POSIX ``sysconf``); None where the OS does not report it."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):
        return None


def host_sentence(cores: int, memory_bytes: int | None, cpu_devices: int) -> str:
    """What ``cpu_devices`` simulated devices can and cannot add on a host of ``cores`` cores and ``memory_bytes``.

    Simulated devices are logical: XLA runs all of them on the same cores and
    in the same memory, so N of them add no compute and no memory to one.

    Raises:
        ValueError: a core or device count below 1, or a negative memory size.
    """
    if cores < 1 or cpu_devices < 1 or (memory_bytes is not None and memory_bytes < 0):
        raise ValueError(
            f"Need at least 1 core and 1 CPU device and a memory size >= 0, got {cores}, {cpu_devices} and {memory_bytes}."
        )
    memory = "memory not reported" if memory_bytes is None else f"{memory_bytes / 2**30:.1f} GiB of memory"
    cores_word = "core" if cores == 1 else "cores"
    if cpu_devices == 1:
        return f"This host: {cores} {cores_word}, {memory}; one CPU device uses them all."
    share = (
        f"{cpu_devices} simulated devices share {cores} {cores_word} (about {cores / cpu_devices:.2g} each)"
        if cpu_devices > cores
        else f"{cpu_devices} simulated devices on {cores} {cores_word}"
    )
    return (
        f"This host: {cores} {cores_word}, {memory}. {share} and the same memory: one device's step "
        f"can already use every core, so splitting the batch over {cpu_devices} adds no compute "
        "and no speed; they are here for placement, collectives and correctness."
    )
