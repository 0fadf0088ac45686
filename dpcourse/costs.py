"""The cost model: FLOPs, gradient bytes, all-reduce times (GPU rings, TPU ICI), MFU.

Printed in notebooks 02 and 04; plotted against measurements in 07. The
device figures it uses, each with its source, are in
:mod:`dpcourse.backend.peaks` (re-exported here: ``find_peak``,
``DevicePeak``, ``PEAKS``). MFU divides by the peak of the precision a
float32 matmul runs at under JAX's default precision: TF32 on the NVIDIA
GPUs listed, bf16 on a TPU (one MXU pass; ``"highest"`` takes six).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from dpcourse.backend.peaks import (  # noqa: F401  (re-exported: the names lessons use)
    GB,
    ICI_HOP_LATENCY_S,
    NCCL_RING_BASE_S,
    PEAKS,
    TFLOP,
    DevicePeak,
    Ici,
    find_peak,
)
from dpcourse.config import Config
from dpcourse.model import param_count, train_flops_per_example


def gradient_bytes(cfg: Config, bytes_per_value: int = 4) -> int:
    """Bytes of one full gradient (float32 by default): 7,454,760 at full size."""
    return param_count(cfg) * bytes_per_value


def train_flops_per_step(cfg: Config, global_batch: int) -> float:
    """Analytic training FLOPs of one step over the global batch."""
    return float(train_flops_per_example(cfg)) * global_batch


def ring_allreduce_s(n_bytes: float, n_devices: int, link_bytes_per_s: float, latency_s: float = 0.0) -> float:
    """Time of a ring all-reduce: ``2 (N - 1) x latency + 2 (N - 1) / N x bytes / bandwidth``.

    Each device sends and receives ``2 (N - 1) / N`` times the buffer in
    ``2 (N - 1)`` steps (reduce-scatter then all-gather); each step also
    pays a fixed ``latency_s`` (launch and synchronisation). With the
    default ``latency_s=0`` this is the bandwidth term alone, a lower bound.
    For a 7.45 MB gradient over NVLink4 (450 GB/s) the bandwidth term of 8
    GPUs is 29 us, while its 14 ring steps at the 3.4 us NCCL's own tuning
    model gives an NVLink ring step (:data:`dpcourse.backend.peaks.NCCL_RING_STEP_NVLINK_S`)
    add 48 us: the same order. Measure both terms with
    :mod:`dpcourse.perf.linkbench` rather than assuming them.

    Args:
        n_bytes: bytes of the buffer reduced (the gradient), per device.
        link_bytes_per_s: one-direction bandwidth of each device's link.
        latency_s: fixed time per ring step, seconds (>= 0).

    Raises:
        ValueError: ``n_devices`` < 1, a bandwidth <= 0 or a negative latency.
    """
    if n_devices < 1 or link_bytes_per_s <= 0 or latency_s < 0:
        raise ValueError(
            f"Need n_devices >= 1, bandwidth > 0 and latency >= 0, got {n_devices}, {link_bytes_per_s} and {latency_s}."
        )
    steps = 2 * (n_devices - 1)
    return steps * latency_s + steps / n_devices * n_bytes / link_bytes_per_s


def _check_link(n_devices: int, link_bytes_per_s: float, latency_s: float) -> None:
    if n_devices < 1 or link_bytes_per_s <= 0 or latency_s < 0:
        raise ValueError(
            f"Need n_devices >= 1, bandwidth > 0 and latency >= 0, got {n_devices}, {link_bytes_per_s} and {latency_s}."
        )


def all_gather_bytes(n_bytes: float, n_devices: int) -> float:
    """Bytes each device receives in a ring all-gather of an array of ``n_bytes`` (its full size).

    Each device starts with ``1 / N`` of the array and receives the other
    ``(N - 1) / N``: ``(N - 1) / N x n_bytes``. Lesson 10: FSDP gathers the
    parameters this way before using them.

    Raises:
        ValueError: ``n_devices`` < 1 or negative bytes.
    """
    if n_devices < 1 or n_bytes < 0:
        raise ValueError(f"Need n_devices >= 1 and n_bytes >= 0, got {n_devices} and {n_bytes}.")
    return (n_devices - 1) / n_devices * n_bytes


def reduce_scatter_bytes(n_bytes: float, n_devices: int) -> float:
    """Bytes each device sends in a ring reduce-scatter of an array of ``n_bytes`` (its full size).

    The same ``(N - 1) / N x n_bytes`` as an all-gather, in ``N - 1`` steps;
    each device ends with the sum of its ``1 / N`` slice. An all-reduce is a
    reduce-scatter followed by an all-gather (hence the ``2 (N - 1) / N`` of
    :func:`ring_allreduce_s`). Lesson 10: ZeRO and FSDP reduce-scatter the
    gradient.

    Raises:
        ValueError: ``n_devices`` < 1 or negative bytes.
    """
    return all_gather_bytes(n_bytes, n_devices)


def ring_all_gather_s(n_bytes: float, n_devices: int, link_bytes_per_s: float, latency_s: float = 0.0) -> float:
    """Time of a ring all-gather: ``(N - 1) x latency + (N - 1) / N x bytes / bandwidth``.

    Args:
        n_bytes: bytes of the gathered (full) array.
        link_bytes_per_s: one-direction bandwidth of each device's link.
        latency_s: fixed time per ring step, seconds (>= 0); the default 0
            gives the bandwidth term alone, a lower bound.

    Raises:
        ValueError: ``n_devices`` < 1, a bandwidth <= 0 or a negative latency.
    """
    _check_link(n_devices, link_bytes_per_s, latency_s)
    return (n_devices - 1) * latency_s + all_gather_bytes(n_bytes, n_devices) / link_bytes_per_s


def ring_reduce_scatter_s(n_bytes: float, n_devices: int, link_bytes_per_s: float, latency_s: float = 0.0) -> float:
    """Time of a ring reduce-scatter: the same terms as :func:`ring_all_gather_s`.

    Raises:
        ValueError: ``n_devices`` < 1, a bandwidth <= 0 or a negative latency.
    """
    _check_link(n_devices, link_bytes_per_s, latency_s)
    return (n_devices - 1) * latency_s + reduce_scatter_bytes(n_bytes, n_devices) / link_bytes_per_s


def ici_axis_allreduce_s(
    n_bytes: float, axis_len: int, link_bytes_per_s: float, wraparound: bool, hop_latency_s: float = 0.0
) -> float:
    """All-reduce of ``n_bytes`` over one axis of a TPU slice, over ICI, seconds.

    With a wraparound link the axis is a ring and data goes both ways:
    ``2 V / W_ici``, ``W_ici`` the bidirectional bandwidth of a link (twice
    ``link_bytes_per_s``, one direction), in ``2 ceil(N / 2)`` hops (Austin
    et al., "How to Scale Your Model", Google DeepMind 2025, the sharding
    chapter: an all-reduce is a reduce-scatter and an all-gather, each
    ``V / W_ici`` "so long as we have a full ring"). Without one (an axis
    shorter than a full pod axis: a v5e-8 is a 2 x 4 mesh, not a torus) the
    axis is a line: the ring runs one way, ``2 (N - 1) / N x V / W`` with
    ``W`` one direction, in ``2 (N - 1)`` hops, about twice the ring's time
    for long axes (the book: no wraparound "typically doubles the time of
    most communication"). Each hop adds ``hop_latency_s``.

    Raises:
        ValueError: ``axis_len`` < 1, a bandwidth <= 0 or a negative latency.
    """
    _check_link(axis_len, link_bytes_per_s, hop_latency_s)
    if axis_len == 1:
        return 0.0
    if wraparound:
        return n_bytes / link_bytes_per_s + 2 * math.ceil(axis_len / 2) * hop_latency_s
    return 2 * (axis_len - 1) / axis_len * n_bytes / link_bytes_per_s + 2 * (axis_len - 1) * hop_latency_s


def ici_allreduce_s(
    n_bytes: float,
    shape: tuple[int, ...],
    link_bytes_per_s: float,
    wraparound: tuple[bool, ...],
    hop_latency_s: float = 0.0,
) -> float:
    """All-reduce of ``n_bytes`` over every axis of a TPU slice of ``shape`` chips at once, seconds.

    Data parallelism over the whole slice. As the book does for a collective
    over several axes, the axes' bandwidths add (the sharding chapter: over
    several axes the bandwidth grows "by a factor of n_axes"): the bandwidth
    time is ``1 / sum(1 / T_i)`` of the axes' :func:`ici_axis_allreduce_s`
    bandwidth terms, ``2 V / (n_axes W_ici)`` for equal rings; the hops add
    over the axes (the book's latency term: the longest path, the sum of the
    axes' hops), twice (reduce-scatter, then all-gather). The two terms are
    added, as in :func:`ring_allreduce_s`; the book writes their maximum,
    which is at most a factor 2 from the sum.

    Args:
        shape: chips along each axis of the slice, e.g. ``(2, 4)`` for a v5e-8.
        link_bytes_per_s: one link's bandwidth, one direction.
        wraparound: per axis, whether it closes into a ring
            (:meth:`dpcourse.backend.peaks.Ici.wraparound`).
        hop_latency_s: fixed time per hop (about 1 us: ``ICI_HOP_LATENCY_S``).

    Raises:
        ValueError: ``wraparound`` not one flag per axis, or the errors of
            :func:`ici_axis_allreduce_s`.
    """
    if len(wraparound) != len(shape):
        raise ValueError(f"Give one wraparound flag per axis: shape {shape}, wraparound {wraparound}.")
    rates, latency = 0.0, 0.0
    for n, ring in zip(shape, wraparound):
        bandwidth_s = ici_axis_allreduce_s(n_bytes, n, link_bytes_per_s, ring)
        if bandwidth_s > 0:
            rates += 1.0 / bandwidth_s
        latency += ici_axis_allreduce_s(0.0, n, link_bytes_per_s, ring, hop_latency_s)
    return (1.0 / rates if rates else 0.0) + latency


def tpu_slice_allreduce_s(n_bytes: float, peak: DevicePeak, shape: tuple[int, ...], latency: bool = True) -> float:
    """:func:`ici_allreduce_s` on a slice of ``peak``'s TPU (its link, wraparound and hop latency).

    Raises:
        ValueError: ``peak`` is not a TPU, or a shape its torus cannot have.
    """
    if peak.ici is None:
        raise ValueError(f"{peak.name} is not a TPU: use ring_allreduce_s for a GPU's link.")
    return ici_allreduce_s(
        n_bytes, shape, peak.link_bytes_per_s, peak.ici.wraparound(shape), peak.hop_latency_s if latency else 0.0
    )


def tpu_collective_s(
    kind: str, n_bytes: float, peak: DevicePeak, shape: tuple[int, ...], latency: bool = True
) -> float:
    """One ``"all-reduce"``, ``"reduce-scatter"`` or ``"all-gather"`` of ``n_bytes`` over a whole TPU slice, seconds.

    A reduce-scatter or an all-gather is one of the all-reduce's two phases
    (the book: the all-reduce "has 2x the above cost"): half of
    :func:`tpu_slice_allreduce_s`, bandwidth and hops alike.

    Raises:
        ValueError: another kind, or the errors of :func:`tpu_slice_allreduce_s`.
    """
    if kind not in ("all-reduce", "reduce-scatter", "all-gather"):
        raise ValueError(f"kind must be 'all-reduce', 'reduce-scatter' or 'all-gather', got {kind!r}.")
    full = tpu_slice_allreduce_s(n_bytes, peak, shape, latency)
    return full if kind == "all-reduce" else full / 2


def tpu_slice_shape(coords: list[tuple[int, ...]], peak: DevicePeak) -> tuple[int, ...]:
    """The slice's shape from its chips' ``device.coords`` (JAX's TPU devices carry them).

    Chips along each axis (the largest coordinate + 1), trimmed to the torus's
    axes: a v5e's coords are ``(x, y, 0)``, so a v5e-8 gives ``(2, 4)`` or
    ``(4, 2)`` as its coordinates run.

    Raises:
        ValueError: no coordinates, ``peak`` not a TPU, or chips beyond the torus's axes.
    """
    if not coords or peak.ici is None:
        raise ValueError("Give the coords of at least one TPU chip (device.coords) and a TPU's peak.")
    shape = tuple(max(c[i] for c in coords) + 1 for i in range(len(coords[0])))
    dims = peak.ici.torus_dims
    if any(s != 1 for s in shape[dims:]):
        raise ValueError(f"Coordinates span {shape}: more axes than {peak.name}'s {dims}-D torus.")
    return shape[:dims]


def slice_name(peak: DevicePeak, shape: tuple[int, ...]) -> str:
    """A slice's name and topology, e.g. ``"v5e-8 (2x4 mesh)"`` or ``"v5e-256 (16x16 torus)"``."""
    chips = math.prod(shape)
    version = peak.name.split()[2] if peak.name.startswith("Google TPU") else peak.name
    rings = peak.ici.wraparound(shape) if peak.ici else ()
    kind = "torus" if rings and all(rings) else ("mesh" if not any(rings) else "mesh, partly wrapped")
    return f"{version}-{chips} ({'x'.join(map(str, shape))} {kind})"


def achieved_flops_per_s(cfg: Config, global_batch: int, ms_per_step: float) -> float:
    """Training FLOP/s over all devices implied by a measured step time."""
    return train_flops_per_step(cfg, global_batch) / (ms_per_step / 1000.0)


def mfu(
    cfg: Config, global_batch: int, ms_per_step: float, n_devices: int, device_kind: str, precision: str | None = None
) -> float | None:
    """Model-FLOPs utilisation: achieved FLOP/s over ``n_devices x`` peak.

    ``precision=None`` takes the peak of the precision a float32 matmul runs
    at under JAX's default precision (:attr:`DevicePeak.float32_matmul`):
    TF32 on the GPUs listed, bf16 on a TPU.

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

    Times in seconds. ``step_s = compute_s + allreduce_s`` is an estimate,
    not a bound; each term errs in a known direction. ``allreduce_s`` uses
    the datasheet link and, unless ``latency_s`` is given, no per-step
    latency: a lower bound on the communication. The sum assumes no overlap
    of communication with compute, which is what to expect of the course's
    data-parallel step: the gradients and metrics go in one all-reduce after
    the backward pass, and the update needs its result, so nothing is left
    to overlap it with. That holds whether or not XLA's latency-hiding
    scheduler runs: its flag (``xla_gpu_enable_latency_hiding_scheduler``)
    defaults to false, but the GPU compiler also runs it where its
    speed-of-light latency estimator supports the module, Hopper and
    Blackwell GPUs (``xla/service/gpu/gpu_hlo_schedule.cc``,
    ``xla/service/gpu/model/sol_latency_estimator.cc`` in openxla/xla);
    compiled without a GPU with jaxlib 0.10.2, pass dumps show it
    rescheduling the H100 SXM and H200 programs and not running for the
    L4's, and in both the all-reduce waits for nothing but a scalar step
    count. A schedule that does overlap earns :func:`overlapped_step_s`
    instead (notebook 09 reads the schedule with
    :mod:`dpcourse.compiled.schedule`; a profiler trace shows what
    overlapped on a real run). ``compute_s``
    scales a measured time per example, valid while the per-device batch
    keeps the device as busy. ``efficiency = single_step_s / step_s`` at the
    same per-device batch (weak scaling).
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
    grad_bytes_per_value: int = 4,
    latency_s: float = 0.0,
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
        grad_bytes_per_value: 4 for float32 gradients, 2 for bfloat16
            (half the all-reduce bytes).
        latency_s: fixed time per ring step (see :func:`ring_allreduce_s`).
    """
    examples = per_device_batch * (n_devices if shared_cores else 1)
    compute_s = overhead_s + per_example_s * examples
    allreduce_s = 0.0
    if link_bytes_per_s and n_devices > 1:
        allreduce_s = ring_allreduce_s(
            gradient_bytes(cfg, grad_bytes_per_value), n_devices, link_bytes_per_s, latency_s
        )
    step_s = compute_s + allreduce_s
    single_s = overhead_s + per_example_s * per_device_batch
    global_batch = per_device_batch * n_devices
    return Prediction(n_devices, global_batch, compute_s, allreduce_s, step_s, global_batch / step_s, single_s / step_s)


def predict_tpu_step(
    cfg: Config,
    per_device_batch: int,
    peak: DevicePeak,
    shape: tuple[int, ...],
    overhead_s: float,
    per_example_s: float,
    latency: bool = False,
    grad_bytes_per_value: int = 4,
) -> Prediction:
    """:func:`predict_step` for a TPU slice of ``shape`` chips: the all-reduce over ICI.

    The same compute term as :func:`predict_step`; the all-reduce is
    :func:`tpu_slice_allreduce_s` (its hop latency only with ``latency=True``).
    """
    n_devices = math.prod(shape)
    compute_s = overhead_s + per_example_s * per_device_batch
    allreduce_s = tpu_slice_allreduce_s(gradient_bytes(cfg, grad_bytes_per_value), peak, shape, latency)
    step_s = compute_s + allreduce_s
    global_batch = per_device_batch * n_devices
    return Prediction(
        n_devices, global_batch, compute_s, allreduce_s, step_s, global_batch / step_s, compute_s / step_s
    )


def overlapped_step_s(
    compute_s: float, communication_s: float, overlapped_fraction: float, window_compute_s: float | None = None
) -> float:
    """Step time when part of the communication runs inside windows of compute: the overlapped bound.

    The communication in windows (``overlapped_fraction`` of its bytes, as
    :attr:`dpcourse.compiled.schedule.Schedule.overlapped_fraction` reads it
    from the compiled program) costs ``max(window compute, that communication)``;
    the rest adds, as in the no-overlap sum::

        step = (compute - window) + max(window, f x comm) + (1 - f) x comm

    With ``overlapped_fraction=0`` this is the sum ``compute + comm``. With
    ``window_compute_s=None`` all of ``compute_s`` may hide the windows'
    communication, the most optimistic case: ``max(compute, f x comm) + (1 - f) x comm``.
    The compiled program says what the compiler *intends* to overlap; a
    real GPU may overlap less (kernels and transfers share the memory system).

    Args:
        compute_s: the step's compute time, seconds (>= 0).
        communication_s: its communication time, seconds (>= 0), for example
            :func:`ring_allreduce_s` of the gradient.
        overlapped_fraction: of the bytes sent, the fraction inside windows, in [0, 1].
        window_compute_s: compute scheduled inside those windows, seconds
            (0 <= it <= ``compute_s``); None: the whole of ``compute_s``.

    Raises:
        ValueError: a negative time, a fraction outside [0, 1] or a window
            compute beyond ``compute_s``.
    """
    window = compute_s if window_compute_s is None else window_compute_s
    if compute_s < 0 or communication_s < 0 or not 0 <= window <= compute_s:
        raise ValueError(
            f"Need times >= 0 and 0 <= window compute <= compute, got compute {compute_s}, "
            f"communication {communication_s}, window compute {window}."
        )
    if not 0.0 <= overlapped_fraction <= 1.0:
        raise ValueError(f"overlapped_fraction is a fraction in [0, 1], got {overlapped_fraction}.")
    hidden = overlapped_fraction * communication_s
    return (compute_s - window) + max(window, hidden) + (communication_s - hidden)


def bound_for(overlapped_fraction: float | None) -> str:
    """Which step-time model a compiled step earns: ``"no-overlap sum"`` or ``"overlapped bound"``.

    A step whose collectives have no compute in their windows (fraction 0,
    or no collectives: None) is modelled by ``compute + communication``;
    any overlap earns :func:`overlapped_step_s`.
    """
    return "overlapped bound" if overlapped_fraction else "no-overlap sum"


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


def judge_fit(n_points: int, worst_error: float, threshold: float = 0.10) -> str:
    """One sentence on how well a fitted ``overhead + per-example`` line describes its points.

    The line has two parameters, so two points (or fewer) fix it exactly:
    its error there is zero by construction and says nothing. Only from
    three points on is the largest relative error a test of the model.

    Args:
        n_points: measurements the line was fitted to.
        worst_error: largest relative model error over them (signed fraction).
        threshold: largest error still called a good description.
    """
    if n_points < 3:
        return (
            f"Only {n_points} sizes ran: a two-parameter line passes through two points exactly, so its "
            "error there is 0 by construction and does not test the model. Judge it from 3 or more sizes."
        )
    if abs(worst_error) < threshold:
        return f"Largest model error over {n_points} sizes: {worst_error:+.1%}. The model describes them well."
    return (
        f"Largest model error over {n_points} sizes: {worst_error:+.1%}. The model misses some sizes by more "
        f"than {threshold:.0%}: see the reading below."
    )


@dataclass(frozen=True)
class Scaling:
    """One device vs N devices (notebook 07 runs both at the same global batch).

    Attributes:
        n_devices: N.
        one_examples_per_s, many_examples_per_s: measured throughputs.
        per_device_examples_per_s: ``many_examples_per_s / N``.
        speedup: ``many / one``.
        efficiency: ``many / (N x one)``; 1.0 is perfect scaling.
        verdict: "simulated" (simulated CPU devices: no verdict on scaling),
            "communication-bound" (real devices, N slower than one), or "".
    """

    n_devices: int
    one_examples_per_s: float
    many_examples_per_s: float
    per_device_examples_per_s: float
    speedup: float
    efficiency: float
    verdict: str


def scaling(one_examples_per_s: float, many_examples_per_s: float, n_devices: int, simulated: bool) -> Scaling:
    """Per-device throughput, speed-up and scaling efficiency of N devices against one.

    ``efficiency = many / (N x one)``. On real devices a throughput below
    one device's means the step spends more on communication (and
    synchronisation) than the extra devices add: flagged
    "communication-bound". Simulated CPU devices share the same cores, so
    their numbers are flagged "simulated" and never judged.

    Raises:
        ValueError: ``n_devices`` < 1 or a throughput <= 0.
    """
    if n_devices < 1 or one_examples_per_s <= 0 or many_examples_per_s <= 0:
        raise ValueError(
            f"Need n_devices >= 1 and positive throughputs, got {n_devices}, {one_examples_per_s}, "
            f"{many_examples_per_s}."
        )
    speedup = many_examples_per_s / one_examples_per_s
    if simulated:
        verdict = "simulated"
    elif n_devices > 1 and speedup < 1.0:
        verdict = "communication-bound"
    else:
        verdict = ""
    return Scaling(
        n_devices,
        one_examples_per_s,
        many_examples_per_s,
        many_examples_per_s / n_devices,
        speedup,
        speedup / n_devices,
        verdict,
    )
