"""The roofline of the course's step: FLOPs, bytes moved, arithmetic intensity, bounds.

Taught in notebook 09. A kernel is compute-bound when its arithmetic
intensity (FLOPs per byte it moves to and from device memory) exceeds the
device's ridge point (FLOP/s over bytes/s); otherwise memory-bound. The
block matmul is compute-bound at the course's batch sizes; the element-wise
work around it (bias, GELU, the residual mix, their backward) does a few
FLOPs per value and is bound by memory bandwidth. The roofline bound of the
step is the larger of two times: the matmul FLOPs at the matmul ceiling and
the element-wise bytes at the memory bandwidth (no step beats it, whatever
overlaps). Their sum is a no-overlap estimate, not a bound: it is what the
step takes when element-wise kernels run strictly between the matmuls, as
separate kernels do.

The byte count is a model, stated here: every activation of the block is a
``[batch, width]`` array; the passes below assume each element-wise chain is
fused into one kernel (as XLA does), so each listed array crosses device
memory once per read or write. The weights (``width^2`` values) are small
next to the activations at these batches and are left out of the
element-wise count.

Left out, and so an underestimate of the bytes: the residuals that the
block's ``lax.scan`` saves in the forward pass for the backward pass. The
compiled step keeps six ``[block_repeats, batch, width]`` stacks (read from
its HLO; the passes above count some of the same values as reads of ``h``
and ``z``). :func:`residual_bytes_per_step` gives their size, written once
and read once, for comparison.
"""

from __future__ import annotations

from dataclasses import dataclass

from dpcourse.config import Config
from dpcourse.costs import train_flops_per_step
from dpcourse.data import N_CLASSES, N_FEATURES

# Reads and writes of one [batch, width] activation array per block repeat.
FORWARD_PASSES = (
    ("matmul reads h", 1),
    ("matmul writes z = h W + b", 1),
    ("GELU and mix read z and h", 2),
    ("mix writes the next h", 1),
)
BACKWARD_PASSES = (
    ("read the incoming gradient g and z", 2),
    ("write dz = mix g GELU'(z)", 1),
    ("weight gradient h^T dz reads h and dz", 2),
    ("input gradient dz W^T reads dz, writes its result", 2),
    ("dh = (1 - mix) g + that result: two reads, one write", 3),
)
DTYPE_BYTES = {"float32": 4, "bfloat16": 2}


def passes_per_repeat() -> int:
    """Array passes of one block repeat, forward plus backward (15 with the lists above)."""
    return sum(n for _, n in FORWARD_PASSES) + sum(n for _, n in BACKWARD_PASSES)


def dtype_bytes(compute_dtype: str) -> int:
    """Bytes per activation value for a compute dtype.

    Raises:
        ValueError: unknown dtype (the message lists the valid ones).
    """
    if compute_dtype not in DTYPE_BYTES:
        raise ValueError(f"Unknown compute_dtype {compute_dtype!r}. Valid values: {', '.join(DTYPE_BYTES)}.")
    return DTYPE_BYTES[compute_dtype]


def elementwise_bytes_per_step(cfg: Config, global_batch: int) -> float:
    """Bytes the block's element-wise work moves per step (model above).

    ``block_repeats x passes_per_repeat() x global_batch x width x bytes per
    value``, with the bytes of ``cfg.compute_dtype``. The input and output
    layers and the optimizer (a few passes over 1.9 M parameters at full
    size) are small beside it and left out.
    """
    return float(cfg.block_repeats * passes_per_repeat() * global_batch * cfg.width * dtype_bytes(cfg.compute_dtype))


RESIDUAL_STACKS = 6  # [R, B, W] stacks the scan saves for the backward pass (compiled step's HLO)


def residual_bytes_per_step(cfg: Config, global_batch: int, stacks: int = RESIDUAL_STACKS) -> float:
    """Bytes of the residuals the scan saves for the backward pass: written once, read once.

    ``2 x stacks x block_repeats x global_batch x width x bytes per value``.
    Not part of :func:`elementwise_bytes_per_step` (see the module docstring).
    """
    return float(2 * stacks * cfg.block_repeats * global_batch * cfg.width * dtype_bytes(cfg.compute_dtype))


def block_matmul_intensity(cfg: Config, global_batch: int) -> float:
    """Arithmetic intensity of one forward block matmul ``[B, W] @ [W, W]``, FLOP/byte.

    ``2 B W^2`` FLOPs over the bytes of both inputs and the output,
    ``(2 B W + W^2) x bytes per value``. Full size at B = 4096 in float32:
    about 228 FLOP/byte.
    """
    b, w, nbytes = global_batch, cfg.width, dtype_bytes(cfg.compute_dtype)
    return 2.0 * b * w * w / ((2.0 * b * w + w * w) * nbytes)


def step_intensity(cfg: Config, global_batch: int) -> float:
    """Training FLOPs of the step over its element-wise bytes (FLOP/byte): where the whole step sits."""
    return train_flops_per_step(cfg, global_batch) / elementwise_bytes_per_step(cfg, global_batch)


@dataclass(frozen=True)
class StepBound:
    """Times of one step from the roofline, seconds.

    Attributes:
        compute_s: training FLOPs at the matmul rate.
        memory_s: element-wise bytes at the memory bandwidth.
        serial_s: ``compute_s + memory_s``, the no-overlap estimate
            (element-wise kernels run between matmuls, not during them). An
            estimate, not a bound: it errs low where the byte model leaves
            bytes out (the saved residuals) and high where work overlaps.
        overlap_s: ``max(compute_s, memory_s)``, the roofline bound (perfect
            overlap: no real step does better, for these FLOPs and bytes).
    """

    compute_s: float
    memory_s: float

    @property
    def serial_s(self) -> float:
        return self.compute_s + self.memory_s

    @property
    def overlap_s(self) -> float:
        return max(self.compute_s, self.memory_s)


def step_bound(cfg: Config, global_batch: int, matmul_flops_per_s: float, bytes_per_s: float) -> StepBound:
    """Roofline times of a step from a matmul rate (FLOP/s) and a memory bandwidth (bytes/s).

    Raises:
        ValueError: a rate <= 0.
    """
    if matmul_flops_per_s <= 0 or bytes_per_s <= 0:
        raise ValueError(f"Rates must be > 0, got {matmul_flops_per_s} FLOP/s and {bytes_per_s} bytes/s.")
    return StepBound(
        train_flops_per_step(cfg, global_batch) / matmul_flops_per_s,
        elementwise_bytes_per_step(cfg, global_batch) / bytes_per_s,
    )


def input_output_fraction(cfg: Config) -> float:
    """Share of the step's matmul FLOPs outside the repeated block (input and output layers)."""
    w = cfg.width
    outside = N_FEATURES * w + w * N_CLASSES
    return outside / (outside + cfg.block_repeats * w * w)


def roofline_chart(
    matmul_flops_per_s: float,
    bytes_per_s: float,
    points: list[tuple[str, float, float]],
    title: str,
    note: str = "",
):
    """A log-log roofline: ``min(ceiling, intensity x bandwidth)`` and measured points.

    Args:
        matmul_flops_per_s: the flat roof (FLOP/s), e.g. the measured matmul rate.
        bytes_per_s: the slope (bytes/s), e.g. the measured memory bandwidth.
        points: ``(label, intensity FLOP/byte, achieved FLOP/s)`` to place.

    Returns:
        The matplotlib figure (save it with :func:`dpcourse.record.save_figure`).
    """
    import matplotlib.pyplot as plt
    import numpy as np

    ridge = matmul_flops_per_s / bytes_per_s
    xs = [p[1] for p in points] + [ridge]
    grid = np.geomspace(min(xs) / 4, max(xs) * 4, 200)
    fig, ax = plt.subplots(figsize=(6.5, 3.8))
    ax.plot(grid, np.minimum(matmul_flops_per_s, grid * bytes_per_s), color="black", label="roof (measured ceilings)")
    ax.axvline(ridge, color="grey", linestyle=":", label=f"ridge {ridge:,.0f} FLOP/byte")
    for label, intensity, achieved in points:
        ax.plot([intensity], [achieved], "o", label=label)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("arithmetic intensity (FLOP/byte)")
    ax.set_ylabel("FLOP/s")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7)
    if note:
        fig.text(0.01, -0.02, note, fontsize=8, ha="left", va="top")
    fig.tight_layout()
    return fig
