"""The roofline of the course's step: FLOPs, bytes moved, arithmetic intensity, bounds.

Taught in notebook 09. A kernel is compute-bound when its arithmetic
intensity (FLOPs per byte it moves to and from device memory) exceeds the
device's ridge point (FLOP/s over bytes/s); otherwise memory-bound. The
block matmul is compute-bound at the course's batch sizes; the element-wise
work around it (bias, GELU, the residual mix, their backward) does a few
FLOPs per value.

Two byte counts, because what the element-wise work costs depends on the
compiler:

- **The least any program of this step moves**
  (:func:`saved_activation_bytes_per_step`): the backward pass of every
  repeat needs a ``[batch, width]`` array of its forward pass (without it,
  the forward matmul would have to run again: more FLOPs than the step
  counts), 128 such arrays are far larger than any device's on-chip
  memory, so each is written to device memory once and read back once.
  The roofline **bound** is the larger of this time and the matmul FLOPs
  at the matmul ceiling, however its work is fused or overlapped. It is a
  bound only as far as the ceilings are the device's best: on one v5e the
  float32 scan's matmul kernels ran 4 % above the measured rate.
- **Separate element-wise kernels** (:func:`elementwise_bytes_per_step`):
  every activation of the block is a ``[batch, width]`` array; each
  element-wise chain is one kernel that reads its inputs from device memory
  and writes its outputs there (the passes below). That is how the GPU and
  CPU compilers run the step; their sum with the matmul time is the
  **no-overlap estimate**, not a bound. A TPU's compiler fuses the bias,
  the GELU and the mix into the matmuls' own kernels (their operands stay
  on chip), so this count is far above what moves there, and the estimate
  far above the measured step.

The weights (``width^2`` values) are small next to the activations at these
batches and are left out of both counts, as are the input and output
layers and the optimizer (a few passes over 1.9 M parameters at full size):
a bound stays a bound with fewer bytes.
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
    """Bytes the block's element-wise work moves per step as separate kernels (model above).

    ``block_repeats x passes_per_repeat() x global_batch x width x bytes per
    value``, with the bytes of ``cfg.compute_dtype``. The input and output
    layers and the optimizer (a few passes over 1.9 M parameters at full
    size) are small beside it and left out.
    """
    return float(cfg.block_repeats * passes_per_repeat() * global_batch * cfg.width * dtype_bytes(cfg.compute_dtype))


def saved_activation_bytes_per_step(cfg: Config, global_batch: int) -> float:
    """The least bytes any program of the step moves: one ``[batch, width]`` array per repeat, written and read once.

    ``2 x block_repeats x global_batch x width x bytes per value`` (see the
    module docstring). On one TPU v5e (JAX 0.10.2, global batch 4096) the
    fully unrolled float32 step's temporaries were 3.25 GB, about one and a
    half such stacks of 2.1 GB.
    """
    return float(2 * cfg.block_repeats * global_batch * cfg.width * dtype_bytes(cfg.compute_dtype))


RESIDUAL_STACKS = 6  # [R, B, W] stacks the scan saves for the backward pass (compiled step's HLO)


def residual_bytes_per_step(cfg: Config, global_batch: int, stacks: int = RESIDUAL_STACKS) -> float:
    """Bytes of the residuals the scan saves for the backward pass: written once, read once.

    ``2 x stacks x block_repeats x global_batch x width x bytes per value``;
    six stacks in the CPU and GPU compilers' scan programs (read from their
    HLO). Not part of :func:`elementwise_bytes_per_step`, which counts some
    of the same values as reads of ``h`` and ``z``.
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
        memory_s: the least bytes any program of the step moves
            (:func:`saved_activation_bytes_per_step`) at the memory bandwidth.
        unfused_s: the bytes of separate element-wise kernels
            (:func:`elementwise_bytes_per_step`) at the memory bandwidth.
        overlap_s: ``max(compute_s, memory_s)``, the roofline bound (as
            good as the measured ceilings it rests on).
        serial_s: ``compute_s + unfused_s``, the no-overlap estimate of a
            step whose element-wise kernels run between its matmuls (the GPU
            and CPU compilers'). An estimate, not a bound: it errs high where
            work overlaps or is fused into the matmuls (a TPU's compiler), low
            where the byte model leaves bytes out.
    """

    compute_s: float
    memory_s: float
    unfused_s: float

    @property
    def serial_s(self) -> float:
        return self.compute_s + self.unfused_s

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
        saved_activation_bytes_per_step(cfg, global_batch) / bytes_per_s,
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
