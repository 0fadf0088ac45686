"""Time to a target on machines you do not have: fitted steps x a modelled step (GPU rings, TPU slices), read off its table."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from dpcourse import costs
from dpcourse.config import Config
from dpcourse.large_batch.batch_size import TradeOff, _whole


@dataclass(frozen=True)
class Machine:
    """Devices of one kind at several counts: GPUs on a ring, or TPU slices of given shapes.

    Attributes:
        label: what the tables call it ("H200", "TPU v5e").
        peak: the device's figures (:func:`dpcourse.costs.find_peak`).
        shapes: one per row: ``(N,)`` for N GPUs on a ring, the slice's
            topology for a TPU (``(2, 4)`` for a v5e-8).
    """

    label: str
    peak: costs.DevicePeak
    shapes: tuple[tuple[int, ...], ...]

    def name(self, shape: tuple[int, ...]) -> str:
        """A row's machine: ``"8 x H200"`` or ``"v5e-8 (2x4 mesh)"``."""
        if self.peak.is_tpu:
            return costs.slice_name(self.peak, shape)
        return f"{math.prod(shape)} x {self.label}"


def gpus(label: str, device_kind: str, counts: Sequence[int]) -> Machine:
    """``counts`` GPUs of ``device_kind`` on one ring each.

    Raises:
        ValueError: a kind not in the course's peak table, or a count that is
            not a whole number >= 1.
    """
    return Machine(label, _peak(device_kind), tuple((_whole(n, "The number of devices"),) for n in counts))


def tpu_slices(label: str, device_kind: str, shapes: Sequence[tuple[int, ...]]) -> Machine:
    """TPU slices of ``shapes`` chips of ``device_kind`` ("TPU v5 lite" for v5e).

    Raises:
        ValueError: a kind that is not a TPU of the course's peak table, or a
            side of a shape that is not a whole number >= 1.
    """
    peak = _peak(device_kind)
    if not peak.is_tpu:
        raise ValueError(f"{device_kind!r} is not a TPU: use gpus() for it.")
    return Machine(label, peak, tuple(tuple(_whole(side, "A side of a TPU slice") for side in s) for s in shapes))


def _peak(device_kind: str) -> costs.DevicePeak:
    peak = costs.find_peak(device_kind)
    if peak is None:
        raise ValueError(
            f"No published peak for {device_kind!r}: use a kind in dpcourse.costs.PEAKS "
            "(NVIDIA L4, H100, H200; TPU v5 lite, TPU v5, TPU v6 lite)."
        )
    return peak


def step_terms(
    cfg: Config, per_device_batch: int, peak: costs.DevicePeak, shape: tuple[int, ...], latency: bool = True
) -> tuple[float, float]:
    """``(compute_s, all-reduce_s)`` of one data-parallel step of ``cfg`` on ``shape`` devices.

    Compute: the training FLOPs of the per-device batch at the peak of a
    float32 matmul at JAX's default precision (TF32 on a GPU, bf16 on a TPU),
    a lower bound: no kernel reaches the peak. All-reduce of the float32
    gradient: on GPUs :func:`dpcourse.costs.ring_allreduce_s` over the
    datasheet link with, when ``latency``, NCCL's per-step and per-call
    latencies (:data:`dpcourse.backend.peaks.NCCL_RING_BASE_S`); on a TPU
    :func:`dpcourse.costs.tpu_slice_allreduce_s` with its hop latency. No
    fixed cost of the step itself (kernel launches, the optimizer's update):
    none is measured for these devices, so for a small model the compute term
    is far below a real step's.
    """
    compute_s = costs.train_flops_per_step(cfg, per_device_batch) / peak.peak()
    grad = costs.gradient_bytes(cfg)
    n = math.prod(shape)
    if n == 1:
        return compute_s, 0.0
    if peak.is_tpu:
        return compute_s, costs.tpu_slice_allreduce_s(grad, peak, shape, latency)
    ring = costs.ring_allreduce_s(grad, n, peak.link_bytes_per_s, peak.hop_latency_s if latency else 0.0)
    return compute_s, ring + (peak.collective_latency_s if latency else 0.0)


def batch_mark(global_batch: int, trained: Sequence[int]) -> str:
    """ "trained" (a batch trained to the target here), "interpolated" (between two) or "extrapolated"."""
    if global_batch in trained:
        return "trained"
    if min(trained) < global_batch < max(trained):
        return "interpolated"
    return "extrapolated"


def rows(
    trade_off: TradeOff,
    per_device_batch: int,
    machine: Machine,
    cfg: Config,
    trained: Sequence[int],
    latency: bool = True,
) -> list[dict]:
    """One row per shape of ``machine``: steps from the fit, the modelled step, time to the target.

    Keys: ``machine``, ``devices``, ``global batch``, ``batch`` (see
    :func:`batch_mark`; the steps of every row come from the fit),
    ``steps``, ``compute µs``, ``all-reduce µs``, ``of which latency µs``
    (the all-reduce's latency terms), ``ms/step``, ``time to target ms``.
    """
    per_device_batch = _whole(per_device_batch, "The per-device batch")
    out = []
    for shape in machine.shapes:
        n = math.prod(shape)
        batch = n * per_device_batch
        compute_s, comm_s = step_terms(cfg, per_device_batch, machine.peak, shape, latency)
        latency_s = comm_s - step_terms(cfg, per_device_batch, machine.peak, shape, False)[1]
        steps = trade_off.steps_at(batch)
        out.append(
            {
                "machine": machine.name(shape),
                "devices": n,
                "global batch": batch,
                "batch": batch_mark(batch, trained),
                "steps": steps,
                "compute µs": compute_s * 1e6,
                "all-reduce µs": comm_s * 1e6,
                "of which latency µs": latency_s * 1e6,
                "ms/step": (compute_s + comm_s) * 1e3,
                "time to target ms": steps * (compute_s + comm_s) * 1e3,
            }
        )
    return out


def fastest(table: Sequence[dict]) -> dict:
    """The row with the shortest time to the target (the first of equals).

    Raises:
        ValueError: an empty table.
    """
    if not table:
        raise ValueError("No rows: give a machine at least one device count.")
    return min(table, key=lambda r: r["time to target ms"])


LEVELLED = 0.01  # a last row less than 1% below the one before: the table shows a level, not a fall


def reading(table: Sequence[dict], label: str) -> str:
    """The sentence the table supports: at which device count its time to the target is shortest.

    Read from the rows, so it changes when they do. Shortest at the last row
    means still falling there only when it is at least :data:`LEVELLED` below
    the row before; a smaller gap is read as a level, and a column that rose
    on the way is said to. Anywhere else, every larger count in the table
    takes at least as long.
    """
    best = fastest(table)
    last = table[-1]
    where = (
        f"{label}: time to the target is shortest at {best['devices']} devices, {best['machine']}: "
        f"{best['time to target ms']:.3g} ms (global batch {best['global batch']}, {best['batch']})"
    )
    if best is not last:
        which = ", the smallest count in the table" if best is table[0] else ""
        return (
            f"{where}{which}; every larger count in the table takes at least as long "
            f"({last['time to target ms']:.3g} ms at {last['devices']})."
        )
    if len(table) == 1:
        return f"{where}, the only count in the table."
    prev = table[-2]
    drop = 1 - best["time to target ms"] / prev["time to target ms"]
    rises = [(a, b) for a, b in zip(table, table[1:]) if b["time to target ms"] > a["time to target ms"]]
    up = [f"{r['time to target ms']:.5g} ms at {r['devices']}" for r in rises[0]] if rises else []
    bumpy = f"; the column is not monotonic (it rises from {up[0]} to {up[1]})" if rises else ""
    gap = f"{drop:.1%} below the {prev['time to target ms']:.4g} ms at {prev['devices']}{bumpy}"
    if drop < LEVELLED:
        return f"{where}, the largest count in the table, only {gap}: the time has levelled off there."
    return f"{where}, the largest count in the table, {gap}: it still falls there."


def regime_sentence(table: Sequence[dict], b_crit: float, label: str, workload: str) -> str:
    """Which term of the modelled step decides the table, read from its rows: the all-reduce or the steps.

    Where the all-reduce is at least half of the step at the smallest count,
    it grows with every device added while each device's compute stays: the
    step's cost decides where the time is shortest. Where compute is most of
    the step, the sentence says where ``B_crit`` lies against the rows (a
    doubling cuts the fitted steps by more than a quarter below it, less past
    it: :func:`dpcourse.large_batch.readings.doubling_cut`), and reads the
    row after the shortest time: there the step's growth, all of it the
    all-reduce's, outweighs the cut of the steps, so the all-reduce decides
    even with compute most of the step. Shortest at the last row: the steps,
    and with them ``B_crit``, still decide.

    Raises:
        ValueError: an empty table or a ``b_crit`` that is not > 0.
    """
    if not table:
        raise ValueError("No rows: give a machine at least one device count.")
    if not b_crit > 0:
        raise ValueError(f"The critical batch must be > 0, got {b_crit}.")
    first, last, best = table[0], table[-1], fastest(table)

    def comm_share(row: dict) -> float:
        return row["all-reduce µs"] / (row["all-reduce µs"] + row["compute µs"])

    share = comm_share(first)
    head = f"{label}, {workload}: "
    step_change = last["ms/step"] / first["ms/step"] - 1
    steps_fall = 1 - last["steps"] / first["steps"]
    trend = (
        f"from {first['devices']} to {last['devices']} devices the fitted steps fall by {steps_fall:.0%} "
        f"and the modelled step {_change(step_change)}"
    )
    shortest = (
        f"the time is shortest at {best['devices']} devices (global batch {best['global batch']:,}, "
        f"{best['global batch'] / b_crit:.2g} x B_crit)."
    )
    if share >= 0.5:
        latency = first["of which latency µs"] / first["all-reduce µs"]
        return head + (
            f"the all-reduce is {share:.0%} of the modelled step at {first['devices']} devices "
            f"({first['all-reduce µs']:.3g} µs, {latency:.0%} of it latency, against {first['compute µs']:.3g} µs "
            f"of compute) and {comm_share(last):.0%} at {last['devices']}: the time is the steps times an "
            f"all-reduce that changes with the device count, so B_crit alone does not decide: {trend}; {shortest}"
        )
    lo, hi = first["global batch"], last["global batch"]
    if lo >= b_crit:
        where = f"every row is past B_crit ({b_crit:,.0f}), where a doubling saves less than a quarter of the steps"
    elif hi <= b_crit:
        where = f"every row is below B_crit ({b_crit:,.0f}), where a doubling saves more than a quarter of the steps"
    else:
        where = (
            f"B_crit ({b_crit:,.0f}) lies inside the table: below it a doubling saves more than a quarter "
            "of the steps, past it less"
        )
    text = head + (
        f"compute is {1 - share:.0%} of the modelled step at {first['devices']} devices "
        f"({first['compute µs']:.3g} µs against {first['all-reduce µs']:.3g} µs of all-reduce) and "
        f"{1 - comm_share(last):.0%} at {last['devices']}; {where}: {trend}; {shortest}"
    )
    if best is last and len(table) > 1 and 1 - best["time to target ms"] / table[-2]["time to target ms"] < LEVELLED:
        return text + (
            f" At the largest count the time is less than {LEVELLED:.0%} below the row before: the cut of the steps "
            "and the all-reduce's growth nearly cancel there."
        )
    if best is last:
        return text + " The time still falls at the largest count: the steps, and with them B_crit, decide here."
    nxt = table[table.index(best) + 1]
    cut = 1 - nxt["steps"] / best["steps"]
    return text + (
        f" At {nxt['devices']} devices the fitted steps fall by only {cut:.1%} while the all-reduce grows from "
        f"{best['all-reduce µs']:.3g} to {nxt['all-reduce µs']:.3g} µs (the step by {nxt['ms/step'] / best['ms/step'] - 1:.1%}), "
        f"with compute still {1 - comm_share(nxt):.0%} of it: the all-reduce's growth against a cut of the steps "
        "that small decides where the time turns up, not B_crit alone."
    )


def _change(fraction: float) -> str:
    """A relative change in words: "grows by 43%", "grows 253-fold", "shrinks by 5%"."""
    if fraction >= 1:
        return f"grows {1 + fraction:.3g}-fold"
    return f"{'grows' if fraction >= 0 else 'shrinks'} by {abs(fraction):.0%}"
