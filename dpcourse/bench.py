"""Benchmark a training step: compile time apart, warm-up, repeats x steps, median.

Used by notebooks 02 and 04 to 07. Timing follows the course's rules: the
compile is timed on its own (``lower(...).compile()``) and labelled cold
or warm (:func:`compile_step`); ``warmup_steps``
steps run untimed (the first steps after compilation are much slower than
steady state); then ``repeats`` blocks of ``steps`` steps are timed, each
ending with ``jax.block_until_ready`` on the outputs, and the median over
blocks is reported. One run of this on a shared machine is noisy: quote
medians and ratios, not single steps.
"""

from __future__ import annotations

import hashlib
import statistics
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import jax
from jax import monitoring


@dataclass(frozen=True)
class BenchResult:
    """The outcome of :func:`benchmark`.

    Attributes:
        label: what was measured (shown in tables).
        n_devices: devices the step ran on.
        global_batch: examples per step over all devices.
        compile_s: seconds to lower and compile the step.
        compile_kind: ``"cold"``, ``"warm"`` or ``"persistent cache on"``
            (see :func:`compile_kind`); says what ``compile_s`` measured.
        ms_per_step: median over repeats of the mean step time, milliseconds.
        examples_per_s: ``global_batch / (ms_per_step / 1000)``.
        final_loss, final_accuracy: metrics of the last step (means over its
            global batch, computed before that step's update).
        repeat_ms_per_step: the mean step time of every timed repeat, ms.
        steps: total steps run (warm-up included).
    """

    label: str
    n_devices: int
    global_batch: int
    compile_s: float
    ms_per_step: float
    examples_per_s: float
    final_loss: float
    final_accuracy: float
    repeat_ms_per_step: list[float] = field(default_factory=list)
    steps: int = 0
    compile_kind: str = ""

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


# Fingerprints of the programs compiled by compile_step in this process.
_compiled_here: set[str] = set()
# The function name of every XLA compile since this module was imported
# (JAX's backend-compile event, e.g. "jit(train_step)").
_compile_log: list[str] = []


def _log_compiles(event: str, duration: float, **kwargs) -> None:
    if event == "/jax/core/compile/backend_compile_duration":
        _compile_log.append(str(kwargs.get("fun_name", "")))


monitoring.register_event_duration_secs_listener(_log_compiles)


def compile_kind(fingerprint: str) -> str:
    """The label of a first XLA compile of a program in :func:`compile_step`.

    ``"warm"`` when the same program (same lowered text) went through
    :func:`compile_step` before in this process; ``"persistent cache on"``
    when ``jax_compilation_cache_dir`` is set (it may have been read from
    disk); else ``"cold"``.
    """
    if fingerprint in _compiled_here:
        return "warm"
    if jax.config.jax_compilation_cache_dir:
        return "persistent cache on"
    return "cold"


def compile_step(step, *args):
    """Lower and compile ``step`` for ``args``; return (compiled, seconds, kind).

    ``step`` must be a ``jax.jit`` or ``jax.pmap`` function. The compiled
    executable is called with the same argument shapes and shardings. The
    time covers tracing, lowering and XLA's compile. ``kind`` says what it
    measured:

    - ``"cold"``: XLA compiled the program now, and nothing of this function
      (no program with its name, any shape or device count) was compiled
      before in this process since :mod:`dpcourse.bench` was imported.
    - ``"warm"``: the function was compiled before. If JAX still holds the
      program it would hand it back in microseconds, so JAX's caches are
      cleared (other functions recompile on their next call) and it is
      compiled again. "Warm" says only that: it does not claim the recompile
      was faster. On CPU a recompile after ``jax.clear_caches()`` costs
      about what a fresh program's compile costs; an earlier H200 pair
      (0.809 s, then 0.120 s after ``clear_caches``) compared the process's
      first compile, which also pays one-time start-up work, with a later
      one, so it does not show a cache at work. ``tools/clear_caches_check.py``
      times the recompile against another fresh program after a warm-up
      compile, on the machine it runs on. For a cold time of a step, compile
      it in a fresh process.
    - ``"persistent cache on"``: first compile here, but
      ``jax_compilation_cache_dir`` is set, so it may have come from disk.
    """
    start = time.perf_counter()
    lowered = step.lower(*args)
    seen = len(_compile_log)
    compiled = lowered.compile()
    seconds = time.perf_counter() - start
    fingerprint = hashlib.sha256(lowered.as_text().encode()).hexdigest()
    new = _compile_log[seen:]
    if not new:  # served from JAX's in-memory cache: compiled earlier in this process
        jax.clear_caches()
        start = time.perf_counter()
        compiled = step.lower(*args).compile()
        seconds = time.perf_counter() - start
        kind = "warm"
    elif new[-1] in _compile_log[:seen]:  # this function was compiled before
        kind = "warm"
    else:
        kind = compile_kind(fingerprint)
    _compiled_here.add(fingerprint)
    return compiled, seconds, kind


def batch_layout(batches: Sequence[tuple[Any, Any]]) -> tuple[int, int]:
    """``(n_devices, global_batch)`` of placed batches, read from the first batch's labels.

    The labels hold one entry per example, so their size is the global batch
    whether they are ``[global]`` (``jit`` and ``shard_map``) or
    ``[n_devices, per_device]`` (``pmap``); their sharding names the devices.

    Raises:
        ValueError: no batches.
    """
    if not batches:
        raise ValueError("benchmark needs at least one batch.")
    y = batches[0][1]
    sharding = getattr(y, "sharding", None)
    n_devices = len(sharding.device_set) if sharding is not None else 1
    return n_devices, int(y.size)


def benchmark(
    step,
    params,
    opt_state,
    batches: Sequence[tuple[Any, Any]],
    cfg: Any = None,
    *,
    label: str | None = None,
    warmup_steps: int | None = None,
    repeats: int | None = None,
    steps: int | None = None,
    n_devices: int | None = None,
    global_batch: int | None = None,
    precompiled: tuple[Any, float, str] | None = None,
) -> tuple[BenchResult, Any, Any]:
    """Time ``step(params, opt_state, x, y) -> (params, opt_state, metrics)``.

    Step ``i`` (counting warm-up) uses ``batches[i % len(batches)]``; the
    batches should already sit on the device(s) so that no host transfer is
    timed. Parameters and optimizer state are threaded from step to step, so
    the benchmark is also a short training run.

    Args:
        step: a ``jax.jit``/``jax.pmap`` training step.
        batches: ``(x, y)`` pairs placed as ``step`` expects.
        cfg: a :class:`dpcourse.config.Config`; its ``warmup_steps``,
            ``repeats`` and ``steps`` are the defaults of the three below.
        label: what is measured, for tables (default ``"N device(s)"``).
        warmup_steps, repeats, steps: see the module docstring (repeats and
            steps >= 1, warm-up >= 0); each overrides ``cfg``'s.
        n_devices, global_batch: default: read from the batches
            (:func:`batch_layout`).
        precompiled: ``(executable, compile_s, compile_kind)`` of ``step``
            compiled elsewhere (notebook 09 compiles its ladder's rungs side
            by side); ``step`` is then not compiled again.

    Returns:
        ``(result, params, opt_state)`` after the last step.

    Raises:
        ValueError: no batches, or repeats/steps < 1, or warm-up < 0, or
            neither ``cfg`` nor all three counts given.
    """
    warmup_steps = warmup_steps if warmup_steps is not None else getattr(cfg, "warmup_steps", None)
    repeats = repeats if repeats is not None else getattr(cfg, "repeats", None)
    steps = steps if steps is not None else getattr(cfg, "steps", None)
    if None in (warmup_steps, repeats, steps):
        raise ValueError("benchmark needs the config (cfg) or warmup_steps, repeats and steps.")
    found_devices, found_batch = batch_layout(batches)
    n_devices = found_devices if n_devices is None else n_devices
    global_batch = found_batch if global_batch is None else global_batch
    if label is None:
        label = f"{n_devices} device{'s' if n_devices != 1 else ''}"
    if not batches:
        raise ValueError("benchmark needs at least one batch.")
    if repeats < 1 or steps < 1 or warmup_steps < 0:
        raise ValueError(f"Need repeats >= 1, steps >= 1, warmup_steps >= 0; got {repeats}, {steps}, {warmup_steps}.")
    if n_devices == 1:  # a one-device baseline runs outside a global jax.set_mesh(mesh)
        from dpcourse.devices import outside_mesh

        with outside_mesh():
            return _benchmark(
                step,
                params,
                opt_state,
                batches,
                warmup_steps,
                repeats,
                steps,
                label,
                n_devices,
                global_batch,
                precompiled,
            )
    return _benchmark(
        step, params, opt_state, batches, warmup_steps, repeats, steps, label, n_devices, global_batch, precompiled
    )


def _benchmark(
    step, params, opt_state, batches, warmup_steps, repeats, steps, label, n_devices, global_batch, precompiled=None
):
    x0, y0 = batches[0]
    compiled, compile_s, kind = precompiled or compile_step(step, params, opt_state, x0, y0)
    i = 0
    metrics = None
    for _ in range(warmup_steps):
        x, y = batches[i % len(batches)]
        params, opt_state, metrics = compiled(params, opt_state, x, y)
        i += 1
    jax.block_until_ready((params, opt_state, metrics))
    repeat_ms = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(steps):
            x, y = batches[i % len(batches)]
            params, opt_state, metrics = compiled(params, opt_state, x, y)
            i += 1
        jax.block_until_ready((params, opt_state, metrics))
        repeat_ms.append((time.perf_counter() - start) * 1000.0 / steps)
    ms = statistics.median(repeat_ms)
    loss = float(jax.device_get(metrics["loss"]).ravel()[0])
    accuracy = float(jax.device_get(metrics["accuracy"]).ravel()[0])
    result = BenchResult(
        label=label,
        n_devices=n_devices,
        global_batch=global_batch,
        compile_s=compile_s,
        ms_per_step=ms,
        examples_per_s=global_batch / (ms / 1000.0),
        final_loss=loss,
        final_accuracy=accuracy,
        repeat_ms_per_step=repeat_ms,
        steps=i,
        compile_kind=kind,
    )
    return result, params, opt_state


@dataclass(frozen=True)
class SweepPoint:
    """One global batch size of a sweep (notebook 07).

    ``status`` is "ok", "skipped" (does not divide by the device count) or
    "failed" (an exception, e.g. out of memory); ``reason`` says why.
    """

    global_batch: int
    status: str
    reason: str = ""
    result: BenchResult | None = None


def sizes_for_devices(global_batches: Sequence[int], n_devices: int) -> tuple[list[int], list[str]]:
    """Round each global batch (examples) to the nearest multiple of ``n_devices`` (at least one per device).

    A profile's sweep sizes are powers of two: on 3, 5, 6 or 7 devices most
    or all of them do not divide, and :func:`sweep` would skip them all.
    Sizes that already divide are kept; duplicates after rounding are dropped.

    Returns:
        ``(sizes, changes)``: the sizes in the original order, and one
        ``"256 -> 255"`` entry per rounded size (empty when none changed).
    """
    sizes, changes = [], []
    for size in global_batches:
        fitted = size if size % n_devices == 0 else max(n_devices, round(size / n_devices) * n_devices)
        if fitted != size:
            changes.append(f"{size} -> {fitted}")
        if fitted not in sizes:
            sizes.append(fitted)
    return sizes, changes


def sweep(
    global_batches: Sequence[int], n_devices: int, run_one, cleanup=None, progress: bool = True
) -> list[SweepPoint]:
    """Run ``run_one(global_batch) -> BenchResult`` for each size, and survive failures.

    Sizes that do not divide by ``n_devices`` are skipped with the reason; an
    exception in ``run_one`` (out of memory, a compile error) is recorded as
    "failed" with its message and the sweep goes on; ``cleanup()`` (free
    device buffers) runs after every size that was attempted, whether it
    passed or failed (a skipped size allocates nothing).
    """
    from dpcourse.show import progress as progress_bar  # a tqdm text bar; without tqdm, one line says so

    points = []
    # stdout: JupyterLab shows stderr in a red box, which reads as an error.
    sizes = list(global_batches)
    for size in progress_bar(sizes, desc="sweep", unit="size") if progress else sizes:
        if size < 1 or size % n_devices:
            lower = max(n_devices, (size // n_devices) * n_devices)
            points.append(
                SweepPoint(
                    size,
                    "skipped",
                    f"{size} does not divide by {n_devices} devices (nearest valid: {lower} or {lower + n_devices})",
                )
            )
            continue
        try:
            points.append(SweepPoint(size, "ok", result=run_one(size)))
        except Exception as err:  # noqa: BLE001 - a failed size must not stop the sweep
            from dpcourse.backend.mesh_guard import stop_if_foreign
            from dpcourse.exercises.checks import first_sentence

            stop_if_foreign(err)  # a mesh the learner set stops every size: the lesson stops, in one sentence

            points.append(SweepPoint(size, "failed", f"{type(err).__name__}: {first_sentence(err, 0)}"))
        finally:
            if cleanup is not None:
                cleanup()
    return points
