"""Free device memory between experiments and show that it was freed.

Used by notebooks 02 and 07. JAX frees a device buffer when the last Python
reference to its array goes away; in a notebook, references hide in
variables and in IPython's output history (``Out``, ``_``), so this helper
drops named variables, collects garbage and counts what is still alive.
"""

from __future__ import annotations

import gc
import math
from collections.abc import MutableMapping
from dataclasses import dataclass


@dataclass(frozen=True)
class LiveBuffers:
    """Live JAX arrays in this process: how many and their bytes (all devices)."""

    count: int
    bytes: int

    def __str__(self) -> str:
        return f"{self.count} live arrays, {self.bytes / 1e6:.2f} MB"


def _device_bytes(array) -> int:
    """Bytes an array holds on its devices: a copy replicated on N devices counts N times."""
    shard_shape = array.sharding.shard_shape(array.shape)
    return math.prod(shard_shape) * array.dtype.itemsize * len(array.sharding.addressable_devices)


def _all_live_arrays() -> list:
    """Live arrays on the default backend and on the CPU, each once.

    ``jax.live_arrays()`` covers only the default backend: on a one-GPU host
    the lessons' simulated CPU devices would be missed.
    """
    import jax

    seen: dict[int, object] = {}
    for platform in (None, "cpu"):  # None: the default backend
        for array in jax.live_arrays(platform):
            seen.setdefault(id(array), array)
    return list(seen.values())


def live_buffers() -> LiveBuffers:
    """Count live ``jax.Array`` objects and their total bytes over all shards.

    Covers the default backend's devices and the (simulated) CPU devices.
    ``jax.Array.nbytes`` is the size of the global (logical) array; device
    memory also holds every replica, so each array counts its per-device
    shard size times the devices that hold it.
    """
    arrays = _all_live_arrays()
    return LiveBuffers(len(arrays), int(sum(_device_bytes(a) for a in arrays)))


def free(namespace: MutableMapping[str, object], *names: str) -> tuple[LiveBuffers, LiveBuffers]:
    """Delete ``names`` from ``namespace`` (e.g. ``globals()``), collect, and report.

    Names that are absent are ignored (a cell may be re-run). IPython's
    output cache is cleared too when running under IPython, since it can
    keep arrays alive.

    Returns:
        Live buffers before and after.
    """
    before = live_buffers()
    for name in names:
        namespace.pop(name, None)
    try:
        from IPython import get_ipython

        ip = get_ipython()
        if ip is not None:
            ip.displayhook.flush()
    except ImportError:  # pragma: no cover - IPython ships with the course
        pass
    gc.collect()
    return before, live_buffers()
