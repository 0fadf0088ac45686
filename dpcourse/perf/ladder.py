"""Notebook 09's ladder: the same training step written faster, one rung at a time.

Each :class:`Rung` is a choice of ``block_unroll``, ``compute_dtype`` and
global batch on the config (:mod:`dpcourse.config`); :func:`run_rung`
measures it on one device with the course's harness
(:func:`dpcourse.bench.benchmark`) and keeps the compiled program, so its
HLO and memory can be read without compiling twice. :func:`run_ladder`
compiles every rung side by side first (a fully unrolled rung compiled for
30 to 55 s on a TPU v5e host, and the compiles are independent), then
measures them one at a time. A rung that fails (out of memory at a large
batch, a dtype the backend lacks) is returned as "failed" with its reason
and the ladder goes on, as notebook 07's sweep does.
"""

from __future__ import annotations

import os
import queue
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import jax
import numpy as np

from dpcourse import bench, costs, placement, train
from dpcourse.config import Config
from dpcourse.data import Dataset
from dpcourse.perf import ceilings


@dataclass(frozen=True)
class Rung:
    """One rung: a name for records (``scan_f32``), a label, and the settings."""

    name: str
    label: str
    block_unroll: int | str
    compute_dtype: str
    global_batch: int
    block_backward: str = "autodiff"

    def config(self, cfg: Config) -> Config:
        """``cfg`` with this rung's settings (validated: unknown values raise ValueError)."""
        return cfg.with_overrides(
            block_unroll=self.block_unroll, compute_dtype=self.compute_dtype, block_backward=self.block_backward
        )


def default_rungs(cfg: Config, scan_unroll: int = 8) -> list[Rung]:
    """The course's ladder: scan, scan unrolled, fully unrolled, bfloat16, a larger batch, a Pallas kernel.

    ``scan_unroll`` is capped at ``cfg.block_repeats``. The last rung is the
    one before it with the block's backward pass in one Pallas kernel
    (:func:`dpcourse.perf.backward.block_with_kernel`; off a TPU the kernel runs
    in Pallas's interpret mode, and its time says nothing about a TPU).
    """
    b, big = cfg.ladder_global_batch, cfg.ladder_large_batch
    k = max(1, min(scan_unroll, cfg.block_repeats))
    return [
        Rung("scan_f32", "lax.scan, float32 (the course's step)", 1, "float32", b),
        Rung(f"scan_unroll{k}_f32", f"lax.scan(unroll={k}), float32", k, "float32", b),
        Rung("unrolled_f32", "Python loop (fully unrolled), float32", "full", "float32", b),
        Rung("scan_bf16", "lax.scan, bfloat16 compute, float32 master weights", 1, "bfloat16", b),
        Rung("unrolled_bf16", "fully unrolled, bfloat16 compute", "full", "bfloat16", b),
        Rung(f"unrolled_bf16_batch{big}", f"fully unrolled, bfloat16, global batch {big}", "full", "bfloat16", big),
        Rung(
            f"pallas_bf16_batch{big}",
            f"fully unrolled, bfloat16, global batch {big}, the block's backward pass in a Pallas kernel",
            "full",
            "bfloat16",
            big,
            "pallas",
        ),
    ]


class CompileProbe:
    """Wraps a ``jax.jit`` step so that the executable ``bench.benchmark`` compiles is kept.

    ``bench.benchmark`` calls ``step.lower(*args).compile()``; through the
    probe, ``probe.compiled`` is that executable afterwards.
    """

    def __init__(self, jitted):
        self.jitted = jitted
        self.compiled = None

    def lower(self, *args, **kwargs):
        lowered = self.jitted.lower(*args, **kwargs)
        probe = self

        class _Lowered:
            def compile(self, *a, **k):
                probe.compiled = lowered.compile(*a, **k)
                return probe.compiled

            def __getattr__(self, name):
                return getattr(lowered, name)

        return _Lowered()


def program_bytes(compiled) -> int | None:
    """Device memory one call of a compiled program needs, bytes, from ``memory_analysis()``.

    Arguments + outputs + temporaries, less the outputs that alias (reuse)
    arguments. None where the backend does not report it.
    """
    try:
        m = compiled.memory_analysis()
        return int(m.argument_size_in_bytes + m.output_size_in_bytes + m.temp_size_in_bytes - m.alias_size_in_bytes)
    except Exception:  # noqa: BLE001 - not every backend reports it
        return None


def device_peak_bytes(device) -> int | None:
    """``peak_bytes_in_use`` of ``device.memory_stats()`` (GPUs), or None (CPUs report nothing).

    A process-wide high-water mark since start: it never goes down, so it
    bounds every rung measured so far, not one rung alone.
    """
    try:
        stats = device.memory_stats() or {}
    except Exception:  # noqa: BLE001
        return None
    value = stats.get("peak_bytes_in_use")
    return int(value) if value is not None else None


@dataclass
class RungResult:
    """A measured (or failed) rung.

    Attributes:
        status: "ok" or "failed"; ``reason`` says why it failed.
        result: the harness's :class:`dpcourse.bench.BenchResult` (None if failed).
        compiled: the executable that ran (None if failed).
        step: the jitted step (to run more steps with the same program).
        final_params: parameters after the benchmark's steps (host arrays).
        program_bytes: see :func:`program_bytes`.
        peak_bytes: see :func:`device_peak_bytes`.
    """

    rung: Rung
    status: str
    reason: str = ""
    result: bench.BenchResult | None = None
    compiled: Any = None
    step: Any = None
    final_params: Any = None
    program_bytes: int | None = None
    peak_bytes: int | None = None

    def mfu_datasheet(self, cfg: Config, device_kind: str) -> float | None:
        """MFU against the datasheet peak of the rung's precision (TF32 or BF16); None if unknown."""
        if self.result is None:
            return None
        return costs.mfu(
            self.rung.config(cfg),
            self.rung.global_batch,
            self.result.ms_per_step,
            1,
            device_kind,
            ceilings.datasheet_precision(self.rung.compute_dtype),
        )

    def fraction_of_ceiling(self, cfg: Config, measured: dict) -> float | None:
        """Achieved FLOP/s over the matmul rate measured for the rung's dtype; None if unmeasured."""
        ceiling = measured.get(ceilings.ceiling_for(self.rung.compute_dtype))
        if self.result is None or ceiling is None or ceiling.rate is None:
            return None
        return costs.achieved_flops_per_s(cfg, self.rung.global_batch, self.result.ms_per_step) / ceiling.rate


def _abstract_args(rcfg: Config, optimizer, init_params: dict, dataset: Dataset, device, global_batch: int):
    """Shapes and placement of a rung's ``(params, opt_state, x, y)``: enough to compile it, no data on the device."""
    from jax.sharding import SingleDeviceSharding

    on = SingleDeviceSharding(device)
    params = jax.tree.map(lambda a: jax.ShapeDtypeStruct(np.shape(a), np.asarray(a).dtype, sharding=on), init_params)
    opt_state = jax.tree.map(
        lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=on), jax.eval_shape(optimizer.init, params)
    )
    x = jax.ShapeDtypeStruct((global_batch, *dataset.images.shape[1:]), dataset.images.dtype, sharding=on)
    y = jax.ShapeDtypeStruct((global_batch,), dataset.labels.dtype, sharding=on)
    return params, opt_state, x, y


def compile_rungs(
    rungs: list[Rung],
    cfg: Config,
    dataset: Dataset,
    device,
    init_params: dict,
    workers: int | None = None,
    progress: bool = False,
) -> dict[str, tuple[Any, Any, float] | BaseException]:
    """Compile every rung's step side by side in threads; ``{name: (jitted step, executable, seconds)}``.

    XLA's compiles of different programs are independent, and a compile
    keeps about one core busy: ``workers`` (default: one per rung, at most
    the machine's cores) run at once. A rung's seconds are its own compile's
    wall time while the others compiled beside it. A compile that raises
    gives its exception instead (the rung then fails with it). ``progress``:
    print a line as each compile starts and ends.
    """

    def lower(rung: Rung):
        rcfg = rung.config(cfg)
        optimizer = train.make_optimizer(rcfg)
        step = jax.jit(train.make_train_step(rcfg, optimizer))
        args = _abstract_args(rcfg, optimizer, init_params, dataset, device, rung.global_batch)
        try:
            return step, step.lower(*args)
        except Exception as err:  # noqa: BLE001 - recorded as the rung's failure
            return err

    def compile_one(name, lowered):
        if isinstance(lowered, Exception):
            return lowered
        step, low = lowered
        said.put(("compiling", name, None))
        start = time.perf_counter()
        try:
            executable = low.compile()
        except Exception as err:  # noqa: BLE001 - recorded as the rung's failure
            return err
        finally:
            said.put(("compiled", name, time.perf_counter() - start))
        return step, executable, time.perf_counter() - start

    # Lowered here, in the caller's thread: a mesh set with jax.set_mesh is this thread's alone, and a
    # step lowered in a worker thread would not see it. Only the compiles run side by side.
    lowered = [lower(rung) for rung in rungs]
    said: queue.Queue = queue.Queue()
    pool = ThreadPoolExecutor(workers or max(1, min(len(rungs), os.cpu_count() or 1)))
    futures = {r.name: pool.submit(compile_one, r.name, low) for r, low in zip(rungs, lowered)}
    try:
        while not all(f.done() for f in futures.values()) or not said.empty():
            try:  # the caller's thread prints (a worker's print can land in another cell) and stays interruptible
                what, name, seconds = said.get(timeout=0.2)
            except queue.Empty:
                continue
            if progress:
                print(f"  {name} compiled in {seconds:.1f} s" if seconds is not None else f"compiling {name} ...")
    except KeyboardInterrupt:
        pool.shutdown(wait=False, cancel_futures=True)
        stop = KeyboardInterrupt("stopped; the compiles already started finish in the background. Run the cell again.")
        stop._render_traceback_ = lambda: [f"KeyboardInterrupt: {stop}"]  # one line in a notebook
        raise stop from None
    pool.shutdown(wait=False)
    return {name: f.result() for name, f in futures.items()}


def run_ladder(
    rungs: list[Rung], cfg: Config, dataset: Dataset, device, init_params: dict, progress: bool = True
) -> list[RungResult]:
    """Compile the rungs side by side (:func:`compile_rungs`), then measure each in turn (:func:`run_rung`).

    With ``progress`` each compile says when it starts and how long it took, and a bar follows the
    measuring. The stop button ends it with one line (KeyboardInterrupt).
    """
    from dpcourse import show

    compiled = compile_rungs(rungs, cfg, dataset, device, init_params, progress=progress)
    todo = show.progress(rungs, desc="measuring", unit="rung") if progress else rungs
    try:
        return [run_rung(rung, cfg, dataset, device, init_params, compiled[rung.name]) for rung in todo]
    except KeyboardInterrupt:
        stop = KeyboardInterrupt("stopped while measuring the ladder. Run the cell again.")
        stop._render_traceback_ = lambda: [f"KeyboardInterrupt: {stop}"]
        raise stop from None


def run_rung(
    rung: Rung, cfg: Config, dataset: Dataset, device, init_params: dict, precompiled: Any = None
) -> RungResult:
    """Measure one rung on ``device`` with the course harness, from ``init_params``.

    Every rung starts from the same parameters and runs the same batches
    for the same number of steps, so final parameters and losses of two
    rungs can be compared. Any exception (out of memory, an unsupported
    dtype) gives a "failed" result with its reason instead of raising.

    ``precompiled``: the rung's entry of :func:`compile_rungs` (its step, its
    executable and compile seconds, or the exception its compile raised);
    without it the harness compiles the step itself.

    Raises:
        ValueError: the rung's settings are not valid config values (a
            mistake in the ladder, not a failure of the device).
    """
    rcfg = rung.config(cfg)
    try:
        if isinstance(precompiled, BaseException):
            raise precompiled
        optimizer = train.make_optimizer(rcfg)
        step = jax.jit(train.make_train_step(rcfg, optimizer)) if precompiled is None else precompiled[0]
        placed = placement.place_single_device(rcfg, dataset, device, optimizer, init_params, rung.global_batch)
        probe = CompileProbe(step)
        ready = None if precompiled is None else (precompiled[1], precompiled[2], "cold, compiled beside the others")
        if ready is not None:
            probe.compiled = ready[0]
        result, params, _ = bench.benchmark(
            probe,
            placed.params,
            placed.opt_state,
            placed.batches,
            warmup_steps=rcfg.warmup_steps,
            repeats=rcfg.repeats,
            steps=rcfg.steps,
            label=rung.label,
            n_devices=1,
            global_batch=rung.global_batch,
            precompiled=ready,
        )
        final = jax.tree.map(np.asarray, jax.device_get(params))
    except Exception as err:  # noqa: BLE001 - a failed rung is recorded and the ladder goes on
        from dpcourse.backend.mesh_guard import stop_if_foreign
        from dpcourse.exercises.checks import first_sentence

        stop_if_foreign(err)  # a mesh the learner set fails every rung: the lesson stops, in one sentence

        return RungResult(rung, "failed", f"{type(err).__name__}: {first_sentence(err, 0)}")
    return RungResult(
        rung,
        "ok",
        result=result,
        compiled=probe.compiled,
        step=step,
        final_params=final,
        program_bytes=program_bytes(probe.compiled),
        peak_bytes=device_peak_bytes(device),
    )


def run_steps(step, cfg: Config, device, init_params: dict, batches: list, n_steps: int):
    """Run ``n_steps`` steps of ``step`` from ``init_params`` and a fresh optimizer state.

    Args:
        step: a jitted step or a compiled executable (e.g. ``RungResult.compiled``,
            so nothing recompiles) taking ``(params, opt_state, x, y)``.
        batches: ``(x, y)`` pairs on ``device``; step ``i`` uses ``batches[i % len(batches)]``.

    Returns:
        ``(losses, params, opt_state)``: the loss of every step (floats, each
        computed before that step's update) and the final state.
    """
    optimizer = train.make_optimizer(cfg)
    params = jax.device_put(init_params, device)
    opt_state = optimizer.init(params)
    losses = []
    for i in range(n_steps):
        params, opt_state, metrics = step(params, opt_state, *batches[i % len(batches)])
        losses.append(metrics["loss"])
    return [float(v) for v in jax.device_get(losses)], params, opt_state


# The Pallas rung's first-step gradient may be at most this many times as far from float32's as
# its twin's, JAX's own bfloat16 derivative of the same step (notebook 09, section 4). Both round
# to bfloat16; the kernel sums the weight gradient in float32. Measured by notebook 09 itself on
# 2026-12-06 (JAX 0.10.2): the kernel's 0.71 % against its twin's 0.80 % at smoke and 3.12 % against
# 3.40 % at cpu (2-core CPU), 18.8 % against 19.1 % at full on one TPU v5e. A wrong kernel is wrong by
# about 100 % (a test forgets the derivative: more than 50 %).
KERNEL_GRADIENT_FACTOR = 2.0


def gradient_error(first_moment, reference, b1: float = 0.9) -> float:
    """How far a first-step gradient is from a reference: the largest ``|g - ref| / |ref|`` over the parameters.

    Args:
        first_moment: AdamW's ``mu`` after one step from a fresh state
            (``train.adam_first_moment``), which is ``(1 - b1) x`` the gradient.
        reference: the gradient to compare with, a tree of the same structure.
        b1: AdamW's first-moment decay (optax's default 0.9).

    Returns:
        The largest over the leaves of the Euclidean norms' ratio (a fraction).

    Raises:
        ValueError: a reference leaf is all zeros (nothing to compare relative to).
    """
    worst = 0.0
    for index, (mu, ref) in enumerate(zip(jax.tree.leaves(first_moment), jax.tree.leaves(reference))):
        g = np.asarray(mu, np.float64) / (1.0 - b1)
        ref = np.asarray(ref, np.float64)
        scale = np.linalg.norm(ref)
        if scale == 0:
            raise ValueError(f"Reference gradient leaf {index} is all zeros: there is no scale to compare with.")
        worst = max(worst, float(np.linalg.norm(g - ref) / scale))
    return worst


BF16_UNIT_ROUNDOFF = 2.0**-8  # bfloat16 keeps 8 significant bits: unit roundoff 2^-8 (machine epsilon 2^-7)
BF16_LOSS_REL_TOL = 0.02  # see bf16_loss_tolerance


def bf16_logit_tolerance(cfg: Config) -> float:
    """Largest tolerated relative logit error of the bfloat16 forward pass against float32.

    The error is ``rms(logits_bf16 - logits_f32) / rms(logits_f32)``
    (:func:`logit_rel_error`). Why ``(4 + block_repeats) x 2^-8``: bfloat16
    rounds to 8 significant bits (unit roundoff ``u = 2^-8``). Every repeat
    rounds the residual stream ``h`` to bfloat16, and that error is carried
    on by the ``(1 - block_mix)`` part of the mix while the signal itself
    shrinks from repeat to repeat, so the relative error grows about
    linearly with the repeats instead of averaging out; the input and output
    layers and the matmul inputs add a few ``u``. Measured at initialisation
    (2-core CPU, JAX 0.10.2, batch 256): 0.6 % at 1 repeat, 3.2 % at 16 and
    21 % at 128 (full width; 23 % at width 256), about ``0.4 u`` per repeat:
    the tolerance (2.0 %, 7.8 %, 52 %) leaves a margin of 2.4 to 3.3. A
    wrong cast or a wrong mix in one rung moves the logits by far more.
    The float32 master weights and the float32 loss do not remove this error:
    it is in the forward pass.
    """
    return (4 + cfg.block_repeats) * BF16_UNIT_ROUNDOFF


def logit_rel_error(params: dict, x, cfg: Config) -> float:
    """``rms(bf16 logits - float32 logits) / rms(float32 logits)`` of ``cfg``'s forward pass on ``x [batch, 784]``."""
    from dpcourse import model

    def logits(dtype):
        fn = jax.jit(lambda p, x: model.forward(p, x, cfg.block_repeats, cfg.block_mix, cfg.block_unroll, dtype))
        return np.asarray(jax.device_get(fn(params, x)), np.float64)

    ref, low = logits("float32"), logits("bfloat16")
    return float(np.sqrt(np.mean((low - ref) ** 2)) / np.sqrt(np.mean(ref**2)))


def bf16_loss_tolerance(loss_f32: float) -> float:
    """Largest tolerated median ``|loss_bf16 - loss_f32|`` over the first steps, absolute: 2 % of the float32 loss.

    A check that training still works, not of the arithmetic: at
    initialisation the logits are small (rms 0.011 at full size, because the
    residual mix shrinks ``h`` over 128 repeats), so the softmax is nearly
    uniform and the loss is about ``log 10`` whatever the logits' relative
    error (21 % at full size, see :func:`bf16_logit_tolerance`): measured, the
    loss moved 0.012 %. The arithmetic is checked on the logits
    (:func:`logit_rel_error`). A wrong cast, or a bfloat16 loss or optimizer
    that breaks training, moves the loss by more than 2 % at most of the
    first steps (a rung that merely learns more slowly need not: at full size
    the float32 loss falls by only 1.5 % in its first 10 steps); one step where the loss jumps can differ by more
    (:func:`loss_curve_gap`). Measured: notebook 09's records
    ``median_abs_loss_diff_bf16_vs_f32`` and ``max_abs_loss_diff_bf16_vs_f32``.
    """
    return BF16_LOSS_REL_TOL * abs(loss_f32)


@dataclass(frozen=True)
class CurveGap:
    """How far one loss curve is from a reference over the same steps (absolute loss differences)."""

    median: float
    largest: float
    step_of_largest: int  # 0-based
    jump_at_largest: float  # how far the reference loss moved into that step (from the step before)


def loss_curve_gap(losses: list[float], reference: list[float]) -> CurveGap:
    """The median and largest ``|loss - reference|`` over the steps, and where the largest falls.

    The check of notebook 09 holds the median to :func:`bf16_loss_tolerance`:
    a bfloat16 step that casts wrongly or breaks training moves the loss at
    most steps. The largest difference is reported with the step it falls on:
    where the loss jumps (a hard batch), it is most sensitive to the
    parameters, and any rounding difference grows there. Measured on one TPU
    v5e (JAX 0.10.2, full profile, synthetic data, batch 4096): the float32
    loss jumped from 2.249 to 2.712 at step 4; bfloat16 reached 3.010 there
    (0.297 apart) and float32 at ``highest`` precision 2.770 (0.058 apart, also
    more than 2 %), while the median difference was 0.0015.

    Raises:
        ValueError: the curves differ in length or are empty.
    """
    if len(losses) != len(reference) or not losses:
        raise ValueError(f"Need two loss curves of the same length >= 1, got {len(losses)} and {len(reference)}.")
    diffs = [abs(a - b) for a, b in zip(losses, reference)]
    k = int(np.argmax(diffs))
    return CurveGap(float(np.median(diffs)), diffs[k], k, 0.0 if k == 0 else float(reference[k] - reference[k - 1]))


def sweep_single_device(
    cfg: Config,
    dataset: Dataset,
    device,
    init_params: dict,
    global_batches,
    progress: bool = True,
    measured: dict[int, bench.BenchResult] | None = None,
) -> list[bench.SweepPoint]:
    """A global batch sweep of ``cfg``'s step (its ``block_unroll`` and ``compute_dtype``) on one device.

    For a single-device sweep on the GPU of a one-GPU machine (pick the
    device with :func:`dpcourse.perf.single_device.measurement_device`), beside
    notebook 07's multi-device sweep. Each size runs as a :class:`Rung`
    through :func:`run_rung`; a size that fails is recorded by
    :func:`dpcourse.bench.sweep` as "failed" with its reason. ``measured``:
    results of this same step at some of the sizes (the ladder's rungs),
    taken as they are instead of compiling and running it again.
    """

    def run_one(global_batch: int) -> bench.BenchResult:
        if measured and global_batch in measured:
            return measured[global_batch]
        rung = Rung(
            f"batch{global_batch}", f"global batch {global_batch}", cfg.block_unroll, cfg.compute_dtype, global_batch
        )
        out = run_rung(rung, cfg, dataset, device, init_params)
        if out.status != "ok":
            raise RuntimeError(out.reason)
        return out.result

    return bench.sweep(global_batches, 1, run_one, progress=progress)
