"""Checkers for the exercises of notebook 10 (ZeRO-1 bytes per device, the accumulation count)."""

from __future__ import annotations

from dpcourse.exercises.base import as_number, checker, close, how_far, wrong

FULL_PARAMS = 1_863_690  # the full-size model (dpcourse.model.param_count of the full profile)
ZERO1_DEVICES = 4
TARGET_BATCH, GPUS, FITS = 49_152, 8, 1_024  # exercise 10.2


def zero1_reference(n_params: int = FULL_PARAMS, n_devices: int = ZERO1_DEVICES) -> float:
    """Parameters (4 bytes each, whole) plus AdamW's two moments (8 bytes, sharded N ways)."""
    return 4 * n_params + 8 * n_params / n_devices


@checker("ex10_1", "the bytes of parameters plus AdamW state on each device, a number")
def zero1_bytes_per_device(answer) -> str:
    """Exercise 10.1: ZeRO-1 on 4 devices at full size, parameters + AdamW state per device.

    Right within 1 %: ``4 P + 8 P / 4 = 6 P`` bytes for ``P = 1,863,690``.
    Each known wrong answer (replicated, FSDP, gradients counted, moments
    of 4 bytes in all, a bit/byte slip) gets its own sentence.
    """
    value = as_number(answer, "the bytes per device", positive=True)
    p, n = FULL_PARAMS, ZERO1_DEVICES
    ref = zero1_reference()
    if close(value, ref, 0.01):
        return (
            f"Right: {ref:,.0f} bytes. ZeRO-1 keeps the parameters whole (4 bytes each) and one quarter of "
            "AdamW's two moments (8 bytes per parameter over 4 devices)."
        )
    if close(value, 12 * p, 0.01):
        raise wrong(
            "That is replicated data parallelism: ZeRO-1 shards AdamW's moments over the devices, "
            "so each device keeps only its slice of mu and nu."
        )
    if close(value, 12 * p / n, 0.01):
        raise wrong(
            "That shards the parameters too, which is FSDP: under ZeRO-1 every device still holds every "
            "parameter, for its forward pass."
        )
    if close(value, 4 * p + 4 * p + 8 * p / n, 0.01) or close(value, 16 * p, 0.01):
        raise wrong(
            "The gradients are counted: they exist only during the step (temporary memory), not between "
            "steps; the question asks for what persists."
        )
    if close(value, 4 * p + 4 * p / n, 0.01) or close(value, 8 * p, 0.01):
        raise wrong("AdamW keeps two moments per parameter, mu and nu, 4 bytes each: 8 bytes per parameter.")
    if close(value, 8 * ref, 0.01):
        raise wrong("Those are bits, not bytes (8 times too many).")
    raise wrong(f"Not the 4 + 8 / N bytes per parameter of ZeRO-1: {how_far(value, ref)}.")


def smallest_k(global_batch: int = TARGET_BATCH, gpus: int = GPUS, fits: int = FITS) -> int:
    """The smallest K with ``global_batch % K == 0``, microbatch divisible by ``gpus`` and per-GPU part ``<= fits``."""
    for k in range(1, global_batch + 1):
        if global_batch % k == 0 and (global_batch // k) % gpus == 0 and global_batch // k // gpus <= fits:
            return k
    raise ValueError("no valid K")  # pragma: no cover - the exercise's figures have one


@checker("ex10_2", "a whole number K of microbatches")
def microbatch_count(answer) -> str:
    """Exercise 10.2: the smallest accumulation count for 49,152 examples on 8 GPUs fitting 1,024 each.

    Right: 6 (49,152 / 8 = 6,144 examples per GPU per step, 1,024 per
    microbatch). Known wrong: 48 (the 8 GPUs forgotten), too few, counts
    that do not divide, and valid but larger counts.
    """
    value = as_number(answer, "K", positive=True)
    if value != int(value):
        raise wrong("K counts microbatches: a whole number.")
    k = int(value)
    ref = smallest_k()
    per_gpu = TARGET_BATCH // GPUS
    if k == ref:
        return (
            f"Right: K = {ref}. Each GPU sees {per_gpu:,} examples per step, so {ref} microbatches of "
            f"{per_gpu // ref:,} examples each fit; the update is still the one of the full batch."
        )
    if k == TARGET_BATCH // FITS:
        raise wrong(
            f"That fits the whole batch through one GPU. The {GPUS} GPUs share each microbatch, so each "
            f"sees 1/{GPUS} of it: fewer microbatches are needed."
        )
    if k < ref:
        raise wrong(
            f"Too few: with K = {k} each GPU would hold {per_gpu // k:,} examples at once, more than the "
            f"{FITS:,} that fit."
        )
    if TARGET_BATCH % k or (TARGET_BATCH // k) % GPUS:
        raise wrong(f"K = {k} does not split {TARGET_BATCH:,} into microbatches that divide over {GPUS} GPUs.")
    raise wrong(
        f"K = {k} works but is not the smallest: more, smaller microbatches use each GPU less fully "
        "for the same update."
    )
