"""Measured all-reduce: a timed ``psum`` over every device of a mesh, and the link it implies.

Notebook 07 puts these measurements beside the datasheet link of
:mod:`dpcourse.costs`. The ring all-reduce model is
``t(bytes) = 2 (N - 1) x latency + 2 (N - 1) / N x bytes / bandwidth``
(:func:`dpcourse.costs.ring_allreduce_s`), a straight line in the bytes, so
timing a few sizes and fitting that line measures both terms. The bandwidth
found is NCCL's "bus bandwidth": the one-way link speed a ring would need.
On simulated CPU devices the "link" is a copy through the host's memory.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P


@dataclass(frozen=True)
class AllReducePoint:
    """One timed all-reduce size.

    Attributes:
        n_bytes: float32 bytes reduced, per device.
        seconds: median time of one all-reduce, seconds.
        bus_bytes_per_s: ``2 (N - 1) / N x n_bytes / seconds``, bytes/s.
    """

    n_bytes: int
    seconds: float
    bus_bytes_per_s: float


@dataclass(frozen=True)
class LinkFit:
    """The ring model fitted to timed all-reduces.

    Attributes:
        latency_s: fixed time per ring step, seconds (>= 0; includes the
            collective's launch and synchronisation, and what is left of the
            program's dispatch after :func:`time_allreduce` spreads it over the chain).
        bus_bytes_per_s: one-way bandwidth implied by the slope, bytes/s.
        n_points: sizes fitted.
    """

    latency_s: float
    bus_bytes_per_s: float
    n_points: int


def time_allreduce(mesh: Mesh, n_bytes: int, axis: str = "data", chain: int = 8, repeats: int = 3) -> float:
    """Median seconds of one ``lax.psum`` of ``n_bytes`` float32 bytes per device over ``axis``.

    One compiled program runs ``chain`` dependent psums in a loop (each
    reduces the previous result), so the dispatch of one Python call (and
    the loop's own per-iteration cost) is spread over ``chain`` all-reduces:
    amortised, not removed. What is left of it, about ``dispatch / chain``
    per all-reduce, ends up in the latency that :func:`fit_link` fits. The
    program is compiled and run once before timing.

    Raises:
        ValueError: ``n_bytes`` < 4, or ``chain``/``repeats`` < 1.
    """
    if n_bytes < 4 or chain < 1 or repeats < 1:
        raise ValueError(f"Need n_bytes >= 4, chain >= 1, repeats >= 1; got {n_bytes}, {chain}, {repeats}.")
    n = mesh.shape[axis]
    per_device = n_bytes // 4

    def chained(v):
        # Values grow by N per psum: 8 ** 8 stays far inside float32.
        return jax.lax.fori_loop(0, chain, lambda _, x: jax.lax.psum(x, axis), v)

    # check_vma=False: the loop carries psum's (invariant) result back in as
    # its (varying) input; the values are what the timing needs, not the types.
    run = jax.jit(jax.shard_map(chained, mesh=mesh, in_specs=P(axis), out_specs=P(axis), check_vma=False))
    x = jax.device_put(np.ones(n * per_device, np.float32), NamedSharding(mesh, P(axis)))
    jax.block_until_ready(run(x))
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(run(x))
        times.append((time.perf_counter() - start) / chain)
    return statistics.median(times)


def measure(mesh: Mesh, sizes_bytes: Sequence[int], axis: str = "data", **kwargs) -> list[AllReducePoint]:
    """:func:`time_allreduce` for each size; ``kwargs`` go to it."""
    n = mesh.shape[axis]
    points = []
    for size in sizes_bytes:
        seconds = time_allreduce(mesh, int(size), axis, **kwargs)
        points.append(AllReducePoint(int(size), seconds, 2 * (n - 1) / n * size / seconds))
    return points


def fit_link(points: Sequence[AllReducePoint], n_devices: int) -> LinkFit:
    """Fit ``t = 2 (N - 1) x latency + 2 (N - 1) / N x bytes / bandwidth`` by least squares.

    Residuals are weighted by ``1 / t`` (relative errors), so the small
    sizes, which carry the latency, count as much as the large ones. A negative intercept (noise at small sizes) is clipped to a zero latency
    and the slope refitted through the origin.

    Raises:
        ValueError: fewer than two distinct sizes, ``n_devices`` < 2, or a
            time that does not grow with the bytes (no bandwidth to fit).
    """
    if n_devices < 2:
        raise ValueError(f"An all-reduce needs at least 2 devices, got {n_devices}.")
    sizes = np.array([p.n_bytes for p in points], dtype=np.float64)
    times = np.array([p.seconds for p in points], dtype=np.float64)
    if len(set(sizes.tolist())) < 2:
        raise ValueError("Need all-reduce times at two or more different sizes to fit the link.")
    slope, intercept = np.polyfit(sizes, times, 1, w=1.0 / times)
    if intercept < 0:
        # Through the origin, relative errors: minimise sum((s b - t)^2 / t^2).
        u = sizes / times
        intercept, slope = 0.0, float(u.sum() / (u @ u))
    if slope <= 0:
        raise ValueError("The all-reduce time does not grow with its size here (noise): no bandwidth to fit.")
    steps = 2 * (n_devices - 1)
    return LinkFit(float(intercept) / steps, steps / n_devices / float(slope), len(points))
