"""Measure this device's ceilings: matmul FLOP/s per precision and memory bandwidth.

Taught in notebook 09: MFU against a datasheet peak says how far the step is
from the hardware's advertised rate; the rate a large matmul actually
reaches on this device, measured here, says how far it is from what XLA can
do on it. Both are shown, labelled. Timing follows the course's rules (see
:mod:`dpcourse.bench`): compile apart, untimed warm-up, ``repeats`` blocks of
``steps`` calls ending with ``jax.block_until_ready``. A ceiling is what the
device can do, so :func:`measure_all` keeps the fastest block (other work on
a shared machine only ever slows a block down) and the best of two matmul
sizes (``n`` and ``2 n``: a size below the plateau would understate it).
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np

# name -> (dtype, matmul precision). JAX's "default" float32 precision runs
# as TF32 on NVIDIA GPUs from Ampere on, and as one bfloat16 pass on a TPU's
# matrix units; "highest" is true float32 (six bfloat16 passes on a TPU).
# Source: the docstring of jax.lax.Precision (jax/_src/lax/lax.py, JAX 0.10.2).
MATMUL_SETTINGS: dict[str, tuple[str, str]] = {
    "float32 highest": ("float32", "highest"),
    "float32 default": ("float32", "default"),
    "bfloat16": ("bfloat16", "default"),
}


@dataclass(frozen=True)
class Ceiling:
    """One measured rate.

    Attributes:
        name: what was measured (a key of :data:`MATMUL_SETTINGS`, or
            ``"memory bandwidth"``).
        status: "ok" or "failed" (e.g. a dtype the backend lacks).
        rate: FLOP/s for a matmul, bytes/s for the bandwidth; None if failed.
        ms_per_call: median time of one call, ms; None if failed.
        reason: why it failed ("" when ok).
        size: the matmul side ``n`` (or the values, for the bandwidth) of
            the rate kept.
    """

    name: str
    status: str
    rate: float | None = None
    ms_per_call: float | None = None
    reason: str = ""
    size: int | None = None


def time_calls(fn, args: tuple, warmup: int = 2, repeats: int = 3, steps: int = 5, best: bool = False) -> float:
    """Median (``best``: fastest) block's seconds per call of ``fn(*args)`` (compiled once, outside the timing).

    Raises:
        ValueError: ``repeats`` or ``steps`` < 1, or ``warmup`` < 0.
    """
    if repeats < 1 or steps < 1 or warmup < 0:
        raise ValueError(f"Need repeats >= 1, steps >= 1, warmup >= 0; got {repeats}, {steps}, {warmup}.")
    compiled = jax.jit(fn).lower(*args).compile()
    out = None
    for _ in range(warmup):
        out = compiled(*args)
    jax.block_until_ready(out)
    blocks = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(steps):
            out = compiled(*args)
        jax.block_until_ready(out)
        blocks.append((time.perf_counter() - start) / steps)
    return min(blocks) if best else statistics.median(blocks)


def _failure(name: str, err: Exception) -> Ceiling:
    from dpcourse.backend.mesh_guard import stop_if_foreign
    from dpcourse.exercises.checks import first_sentence

    stop_if_foreign(err)  # a mesh the learner set is not the device's ceiling: the lesson stops, in one sentence

    return Ceiling(name, "failed", reason=f"{type(err).__name__}: {first_sentence(err, 0)}")


def random_operands(n: int, device) -> tuple:
    """Two ``[n, n]`` float32 matrices of standard normal values, made on ``device`` itself.

    Made there with ``jax.random`` rather than copied from the host: two
    16384 x 16384 matrices are 2 GiB that NumPy takes seconds to draw.
    """
    keys = jax.device_put(jax.random.split(jax.random.key(0)), device)
    draw = jax.jit(lambda k: jax.random.normal(k, (n, n), jnp.float32))
    return draw(keys[0]), draw(keys[1])


def matmul_rate(n: int, setting: str, device, operands: tuple | None = None, **timing) -> Ceiling:
    """FLOP/s of an ``[n, n] @ [n, n]`` matmul (``2 n^3`` FLOPs) on ``device``.

    Args:
        n: matrix side (8192 fills an H200; the ``cpu`` profile uses 512).
        setting: a key of :data:`MATMUL_SETTINGS`.
        operands: two float32 ``[n, n]`` arrays on ``device`` to multiply
            (cast to the setting's dtype); None draws them
            (:func:`random_operands`).
        timing: ``warmup``, ``repeats``, ``steps`` for :func:`time_calls`.

    Returns:
        A :class:`Ceiling`; status "failed" with the reason when the backend
        cannot run it (a missing dtype, out of memory), instead of raising.

    Raises:
        ValueError: unknown ``setting`` or ``n`` < 1.
    """
    if setting not in MATMUL_SETTINGS:
        raise ValueError(f"Unknown matmul setting {setting!r}. Valid: {', '.join(MATMUL_SETTINGS)}.")
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}.")
    dtype, precision = MATMUL_SETTINGS[setting]
    try:
        a, b = (x.astype(dtype) for x in (operands or random_operands(n, device)))
        seconds = time_calls(lambda a, b: jnp.matmul(a, b, precision=precision), (a, b), **timing)
    except Exception as err:  # noqa: BLE001 - a ceiling that cannot run is recorded, not fatal
        return _failure(setting, err)
    return Ceiling(setting, "ok", 2.0 * n**3 / seconds, seconds * 1e3, size=n)


def memory_bandwidth(n_values: int, device, **timing) -> Ceiling:
    """Bytes/s of an element-wise ``y = 2 x + 1`` over ``n_values`` float32 values.

    Counts one read and one write of the array (``8 n_values`` bytes per
    call): the rate that bounds the step's element-wise work.

    Raises:
        ValueError: ``n_values`` < 1.
    """
    if n_values < 1:
        raise ValueError(f"n_values must be >= 1, got {n_values}.")
    name = "memory bandwidth"
    try:
        x = jax.device_put(np.ones(n_values, np.float32), device)
        seconds = time_calls(lambda x: 2.0 * x + 1.0, (x,), **timing)
    except Exception as err:  # noqa: BLE001
        return _failure(name, err)
    return Ceiling(name, "ok", 8.0 * n_values / seconds, seconds * 1e3, size=n_values)


def _best(results: list[Ceiling]) -> Ceiling:
    ok = [c for c in results if c.status == "ok"]
    return max(ok, key=lambda c: c.rate) if ok else results[0]


def measure_all(
    n: int, device, bandwidth_values: int | None = None, sizes: tuple[int, ...] | None = None, **timing
) -> dict[str, Ceiling]:
    """Every matmul setting of :data:`MATMUL_SETTINGS` and the memory bandwidth, each at its best.

    Args:
        n: the profile's matmul side (``cfg.matmul_size``).
        bandwidth_values: float32 values of the bandwidth pass (default
            ``4 n^2``, four matrices' worth).
        sizes: matmul sides to try (default ``(n, 2 n)``); the highest rate
            is kept, with its size in :attr:`Ceiling.size`.
        timing: ``warmup``, ``repeats``, ``steps`` (default 2, 5, 5); the
            fastest block is kept (``best=True`` of :func:`time_calls`).
    """
    timing = {"repeats": 5, **timing, "best": True}
    sizes = sizes or (n, 2 * n)
    tried: dict[str, list[Ceiling]] = {s: [] for s in MATMUL_SETTINGS}
    for k in sizes:  # one pair of operands per size, shared by the settings
        try:
            operands = random_operands(k, device)
        except Exception as err:  # noqa: BLE001 - a size that cannot be held is recorded per setting
            for s in MATMUL_SETTINGS:
                tried[s].append(_failure(s, err))
            continue
        for s in MATMUL_SETTINGS:
            tried[s].append(matmul_rate(k, s, device, operands, **timing))
        del operands
    out = {s: _best(results) for s, results in tried.items()}
    out["memory bandwidth"] = memory_bandwidth(bandwidth_values or 4 * n * n, device, **timing)
    return out


TPU_HIGHEST_PASSES = 6  # bfloat16 passes of a float32 matmul at "highest" on a TPU (jax.lax.Precision)


def precision_words(platform: str) -> dict[str, str]:
    """What each :data:`MATMUL_SETTINGS` key computes on ``platform`` ("cpu", "gpu", "tpu"), for the ceilings table.

    Measured on one TPU v5e (JAX 0.10.2, 8192^3 matmuls): float32 default
    160 TFLOP/s, "high" 63, "highest" 31, bfloat16 183: about 1, 3 and 6
    bfloat16 passes, as JAX's documentation says.
    """
    if platform == "tpu":
        return {
            "float32 highest": f"float32 in {TPU_HIGHEST_PASSES} bfloat16 passes on the matrix units",
            "float32 default": "float32 inputs rounded to bfloat16: one pass on the matrix units",
            "bfloat16": "bfloat16 inputs, float32 accumulation",
        }
    if platform == "gpu":
        return {
            "float32 highest": "true float32",
            "float32 default": "TF32 on NVIDIA GPUs from Ampere on (10-bit mantissa inputs)",
            "bfloat16": "bfloat16 inputs, float32 accumulation",
        }
    as_written = "true float32: a CPU has no lower-precision matrix unit that float32 could use"
    return {
        "float32 highest": as_written,
        "float32 default": as_written,
        "bfloat16": "bfloat16 inputs and outputs in XLA's CPU kernels (its rate says whether faster than float32 here)",
    }


def datasheet_rate(setting: str, peak, platform: str) -> tuple[float | None, str]:
    """The datasheet peak a :data:`MATMUL_SETTINGS` key is compared with, and its words.

    ``peak``: a :class:`dpcourse.costs.DevicePeak` or None. On a GPU the
    FP32, TF32 and BF16 peaks; on a TPU every float32 matmul runs on the
    bfloat16 units, so default precision is held to the BF16 peak and
    ``highest`` to a sixth of it (:data:`TPU_HIGHEST_PASSES`).

    Raises:
        ValueError: unknown ``setting``.
    """
    if setting not in MATMUL_SETTINGS:
        raise ValueError(f"Unknown matmul setting {setting!r}. Valid: {', '.join(MATMUL_SETTINGS)}.")
    if peak is None:
        return None, ""
    if platform == "tpu":
        bf16 = peak.peak("bf16")
        if setting == "float32 highest":
            return bf16 / TPU_HIGHEST_PASSES, f"BF16 peak / {TPU_HIGHEST_PASSES}"
        return bf16, "BF16 peak"
    key = {"float32 highest": "fp32", "float32 default": "tf32", "bfloat16": "bf16"}[setting]
    return peak.peak(key), f"{key.upper()} peak"


def ceiling_for(compute_dtype: str) -> str:
    """The :data:`MATMUL_SETTINGS` key a step in ``compute_dtype`` is compared with.

    The course's float32 step runs at JAX's default precision (TF32 on
    NVIDIA GPUs), so it is held to "float32 default"; bfloat16 to "bfloat16".

    Raises:
        ValueError: an unknown compute dtype.
    """
    table = {"float32": "float32 default", "bfloat16": "bfloat16"}
    if compute_dtype not in table:
        raise ValueError(f"Unknown compute_dtype {compute_dtype!r}. Valid values: {', '.join(table)}.")
    return table[compute_dtype]


def datasheet_precision(compute_dtype: str) -> str | None:
    """The :meth:`dpcourse.costs.DevicePeak.peak` precision for a compute dtype: "bf16", or None for float32.

    None is the precision a float32 matmul runs at under JAX's default
    precision on the device (:attr:`dpcourse.costs.DevicePeak.float32_matmul`):
    TF32 on the NVIDIA GPUs listed, one bf16 pass on a TPU.
    """
    ceiling_for(compute_dtype)  # validates
    return "bf16" if compute_dtype == "bfloat16" else None
