"""The cost model: FLOPs, gradient bytes, all-reduce time, MFU.

Printed in notebooks 02 and 04; plotted against measurements in 07. Every
device figure below carries its source. Peaks are dense (no structured
sparsity) tensor-core or CUDA-core throughput per GPU.

Which peak applies: JAX's default float32 matmul precision lets XLA use
TF32 tensor cores on NVIDIA GPUs from Ampere on (``jax.default_matmul_precision``
"default"), so MFU for this float32 workload is quoted against the TF32
peak. Set ``jax_default_matmul_precision="highest"`` for true FP32 and
compare against the FP32 peak instead.
"""

from __future__ import annotations

from dataclasses import dataclass

from dpcourse.config import Config
from dpcourse.model import param_count, train_flops_per_example

TFLOP = 1e12
GB = 1e9


@dataclass(frozen=True)
class DevicePeak:
    """Dense peak throughput of one device, FLOP/s, and its main GPU-to-GPU link.

    Attributes:
        name: product name.
        fp32_flops_per_s, tf32_flops_per_s, bf16_flops_per_s: dense peaks.
        link: interconnect used for the all-reduce between GPUs of one node.
        link_bytes_per_s: one-direction bandwidth of that link, bytes/s.
        source: where the figures come from.
    """

    name: str
    fp32_flops_per_s: float
    tf32_flops_per_s: float
    bf16_flops_per_s: float
    link: str
    link_bytes_per_s: float
    source: str

    def peak(self, precision: str = "tf32") -> float:
        """Peak FLOP/s for ``precision`` in {"fp32", "tf32", "bf16"}.

        Raises:
            ValueError: another precision name.
        """
        table = {"fp32": self.fp32_flops_per_s, "tf32": self.tf32_flops_per_s, "bf16": self.bf16_flops_per_s}
        if precision not in table:
            raise ValueError(f"precision must be one of {sorted(table)}, got {precision!r}.")
        return table[precision]


# Datasheet values are quoted "with sparsity" for TF32/BF16; the dense
# figures are half of those. PCIe Gen4 x16: about 32 GB/s each way (PCI-SIG
# 16 GT/s x 16 lanes, 128b/130b encoding). NVLink4 (H100/H200 SXM): 900 GB/s
# in total, 450 GB/s each way; NVLink3 (A100 SXM): 600 GB/s total, 300 each way.
PEAKS: tuple[tuple[str, tuple[str, ...], DevicePeak], ...] = (
    (
        "l4",
        ("L4",),
        DevicePeak(
            "NVIDIA L4",
            30.3 * TFLOP,
            60 * TFLOP,
            121 * TFLOP,
            "PCIe Gen4 x16",
            32 * GB,
            "NVIDIA L4 Tensor Core GPU datasheet: FP32 30.3, TF32 120*, BF16 242* TFLOPS (*with sparsity)",
        ),
    ),
    (
        "a100",
        ("A100",),
        DevicePeak(
            "NVIDIA A100",
            19.5 * TFLOP,
            156 * TFLOP,
            312 * TFLOP,
            "NVLink3 (SXM)",
            300 * GB,
            "NVIDIA A100 Tensor Core GPU datasheet: FP32 19.5, TF32 156 (312*), BF16 312 (624*) TFLOPS",
        ),
    ),
    (
        "h100-pcie",
        ("H100", "PCIe"),
        DevicePeak(
            "NVIDIA H100 PCIe",
            51 * TFLOP,
            378 * TFLOP,
            756 * TFLOP,
            "PCIe Gen5 x16",
            64 * GB,
            "NVIDIA H100 Tensor Core GPU datasheet, PCIe column: FP32 51, TF32 756*, BF16 1,513* TFLOPS",
        ),
    ),
    (
        "h100",
        ("H100",),
        DevicePeak(
            "NVIDIA H100 SXM",
            67 * TFLOP,
            495 * TFLOP,
            989 * TFLOP,
            "NVLink4",
            450 * GB,
            "NVIDIA H100 Tensor Core GPU datasheet, SXM column: FP32 67, TF32 989*, BF16 1,979* TFLOPS",
        ),
    ),
    (
        "h200",
        ("H200",),
        DevicePeak(
            "NVIDIA H200 SXM",
            67 * TFLOP,
            495 * TFLOP,
            989 * TFLOP,
            "NVLink4",
            450 * GB,
            "NVIDIA H200 Tensor Core GPU datasheet, SXM column: FP32 67, TF32 989*, BF16 1,979* TFLOPS",
        ),
    ),
)


def find_peak(device_kind: str) -> DevicePeak | None:
    """The :class:`DevicePeak` for a JAX ``device.device_kind``, or None.

    Matching is by product name in the kind string (``"NVIDIA L4"``,
    ``"NVIDIA H100 80GB HBM3"``, ...). NVL variants and every CPU return
    None: no MFU is computed for them rather than an invented peak.
    """
    kind = device_kind.upper()
    if "NVL" in kind:
        return None
    for _, needles, peak in PEAKS:
        if all(n.upper() in kind for n in needles):
            return peak
    return None


def gradient_bytes(cfg: Config, bytes_per_value: int = 4) -> int:
    """Bytes of one full gradient (float32 by default): 7,454,760 at full size."""
    return param_count(cfg) * bytes_per_value


def train_flops_per_step(cfg: Config, global_batch: int) -> float:
    """Analytic training FLOPs of one step over the global batch."""
    return float(train_flops_per_example(cfg)) * global_batch


def ring_allreduce_s(n_bytes: float, n_devices: int, link_bytes_per_s: float) -> float:
    """Time of a bandwidth-bound ring all-reduce: ``2 (N - 1) / N x bytes / bandwidth``.

    Each device sends and receives ``2 (N - 1) / N`` times the buffer
    (reduce-scatter then all-gather); latency terms are left out.

    Raises:
        ValueError: ``n_devices`` < 1 or a bandwidth <= 0.
    """
    if n_devices < 1 or link_bytes_per_s <= 0:
        raise ValueError(f"Need n_devices >= 1 and bandwidth > 0, got {n_devices} and {link_bytes_per_s}.")
    return 2.0 * (n_devices - 1) / n_devices * n_bytes / link_bytes_per_s


def achieved_flops_per_s(cfg: Config, global_batch: int, ms_per_step: float) -> float:
    """Training FLOP/s over all devices implied by a measured step time."""
    return train_flops_per_step(cfg, global_batch) / (ms_per_step / 1000.0)


def mfu(
    cfg: Config, global_batch: int, ms_per_step: float, n_devices: int, device_kind: str, precision: str = "tf32"
) -> float | None:
    """Model-FLOPs utilisation: achieved FLOP/s over ``n_devices x`` peak.

    Returns:
        A fraction in [0, 1] or more (a wrong peak would show), or None when
        the device's peak is not known (CPUs, unlisted GPUs).
    """
    peak = find_peak(device_kind)
    if peak is None:
        return None
    return achieved_flops_per_s(cfg, global_batch, ms_per_step) / (n_devices * peak.peak(precision))


@dataclass(frozen=True)
class Prediction:
    """Predicted data-parallel step on ``n_devices`` (cost model).

    Times in seconds. ``step_s = compute_s + allreduce_s`` (no overlap of
    communication with compute assumed). ``efficiency = single_step_s /
    step_s`` at the same per-device batch (weak scaling).
    """

    n_devices: int
    global_batch: int
    compute_s: float
    allreduce_s: float
    step_s: float
    examples_per_s: float
    efficiency: float


def predict_step(
    cfg: Config,
    per_device_batch: int,
    n_devices: int,
    overhead_s: float,
    per_example_s: float,
    link_bytes_per_s: float | None,
    shared_cores: bool = False,
) -> Prediction:
    """Predict step time from a fitted single-device model plus the all-reduce.

    Args:
        per_device_batch: examples per device.
        overhead_s: fixed time per step (launches, optimizer), seconds.
        per_example_s: seconds per example on one device.
        link_bytes_per_s: one-way link bandwidth; None leaves the all-reduce
            out (unknown link, e.g. simulated devices).
        shared_cores: simulated CPU devices share the host's cores, so all
            shards' compute adds up instead of running side by side.
    """
    examples = per_device_batch * (n_devices if shared_cores else 1)
    compute_s = overhead_s + per_example_s * examples
    allreduce_s = 0.0
    if link_bytes_per_s and n_devices > 1:
        allreduce_s = ring_allreduce_s(gradient_bytes(cfg), n_devices, link_bytes_per_s)
    step_s = compute_s + allreduce_s
    single_s = overhead_s + per_example_s * per_device_batch
    global_batch = per_device_batch * n_devices
    return Prediction(n_devices, global_batch, compute_s, allreduce_s, step_s, global_batch / step_s, single_s / step_s)


@dataclass(frozen=True)
class StepTimeFit:
    """``step_s = overhead_s + per_example_s x batch``, fitted to measurements.

    Attributes:
        overhead_s: fixed time per step, seconds (>= 0).
        per_example_s: time per example of the batch, seconds (> 0).
        through_origin: the unconstrained best line had a negative overhead,
            which is not physical, so the line was refitted through zero.
    """

    overhead_s: float
    per_example_s: float
    through_origin: bool

    def step_s(self, batch: float) -> float:
        return self.overhead_s + self.per_example_s * batch

    def examples_per_s(self, batch: float) -> float:
        return batch / self.step_s(batch)


def fit_step_time(batches: list[int], step_s: list[float]) -> StepTimeFit:
    """Least-squares fit of ``step_s = overhead_s + per_example_s x batch`` (notebook 07).

    When the best line has a negative overhead, it is refitted through the
    origin and ``through_origin`` says so.

    Raises:
        ValueError: fewer than two points, all batches equal, or a step time
            that does not grow with the batch (slope <= 0): then no
            overhead-plus-per-example model describes the measurements.
    """
    if len(batches) != len(step_s) or len(set(batches)) < 2:
        raise ValueError("Need at least two measurements at different batch sizes to fit.")
    n = len(batches)
    mean_b = sum(batches) / n
    mean_t = sum(step_s) / n
    cov = sum((b - mean_b) * (t - mean_t) for b, t in zip(batches, step_s))
    var = sum((b - mean_b) ** 2 for b in batches)
    slope = cov / var
    intercept = mean_t - slope * mean_b
    through_origin = intercept < 0
    if through_origin:
        intercept = 0.0
        slope = sum(b * t for b, t in zip(batches, step_s)) / sum(b * b for b in batches)
    if slope <= 0:
        raise ValueError(
            "The step time does not grow with the batch in these measurements "
            "(noise, or too small a workload): no per-example time to fit."
        )
    return StepTimeFit(intercept, slope, through_origin)


def fit_overhead_and_per_example(batches: list[int], step_s: list[float]) -> tuple[float, float]:
    """``(overhead_s, per_example_s)`` of :func:`fit_step_time` (same rules and errors)."""
    fit = fit_step_time(batches, step_s)
    return fit.overhead_s, fit.per_example_s
