"""Checkers for the exercises of notebook 09 (performance: where a matmul turns compute-bound, rungs that reach a target)."""

from __future__ import annotations

import math
from collections.abc import Mapping

from dpcourse.exercises.base import as_number, bad_input, checker, close, describe, how_far, unavailable, wrong


def matmul_intensity(m: int, k: int, n: int, bytes_per_value: int) -> float:
    """FLOPs per byte of ``[m, k] @ [k, n]``: ``2 m k n / (bytes x (m k + k n + m n))``.

    Reads both inputs and writes the output once (the least traffic); 2 FLOPs
    per multiply-accumulate.
    """
    return 2.0 * m * k * n / (bytes_per_value * (m * k + k * n + m * n))


def ridge_batch_reference(width: int, ridge_flop_per_byte: float, bytes_per_value: int) -> float | None:
    """Smallest batch ``B`` at which ``[B, W] @ [W, W]`` reaches the ridge point; None if it never does.

    Solves ``matmul_intensity(B, W, W, bytes) = ridge``:
    ``B = ridge x bytes x W / (2 (W - ridge x bytes))``. The intensity
    tends to ``W / bytes`` as ``B`` grows, so for ``W <= ridge x bytes``
    no batch makes the matmul compute-bound.
    """
    rb = ridge_flop_per_byte * bytes_per_value
    if width <= rb:
        return None
    return rb * width / (2.0 * (width - rb))


@checker("ex09_1", "the predicted global batch (a number), or math.inf if no batch reaches the ridge")
def ridge_batch(answer, width: int, ridge_flop_per_byte: float | None, bytes_per_value: int = 2) -> str:
    """Exercise 09.1: the batch at which the block matmul ``[B, W] @ [W, W]`` becomes compute-bound.

    ``ridge_flop_per_byte`` is the measured ridge point (matmul FLOP/s over
    memory bytes/s). The reference is :func:`ridge_batch_reference`, from
    :func:`matmul_intensity`; a number is accepted within 2 %.
    """
    if not ridge_flop_per_byte or ridge_flop_per_byte <= 0:
        raise unavailable("No ridge point was measured here (a ceiling failed), so there is nothing to check against.")
    ref = ridge_batch_reference(width, ridge_flop_per_byte, bytes_per_value)
    limit = width / bytes_per_value
    never = isinstance(answer, (int, float)) and math.isinf(answer) and answer > 0
    if ref is None:
        if never:
            return f"Right: the intensity never exceeds W / bytes = {limit:.4g} FLOP/byte, below the ridge."
        raise wrong(
            f"As B grows the intensity tends to W / bytes = {limit:.4g} FLOP/byte, below the ridge "
            f"{ridge_flop_per_byte:.4g}: no batch gets there, so the answer is math.inf."
        )
    if never:
        raise wrong(
            f"The intensity tends to W / bytes = {limit:.4g} FLOP/byte, above the ridge: some batch reaches it."
        )
    value = as_number(answer, "a global batch", positive=True)
    if close(value, ref, 0.02) or (value == int(value) and int(value) - 1 < ref <= int(value)):
        return (
            f"Right: from about B = {ref:.4g} the block matmul does more FLOPs per byte than the ridge "
            f"{ridge_flop_per_byte:.4g}, so it is compute-bound (the intensity levels off at {limit:.4g})."
        )
    if close(value, ridge_batch_reference(width, 2 * ridge_flop_per_byte, bytes_per_value) or -1.0, 0.02):
        also = " (or takes 4 bytes per value: bfloat16 takes 2)" if bytes_per_value == 2 else ""
        raise wrong(f"That counts a multiply-accumulate as 1 FLOP{also}: each is 2 FLOPs.")
    if bytes_per_value == 4 and close(value, ridge_batch_reference(width, ridge_flop_per_byte, 2) or -1.0, 0.02):
        raise wrong("That uses 2 bytes per value; float32 takes 4.")
    rb = ridge_flop_per_byte * bytes_per_value
    if 2 * width > rb and close(value, rb * width / (2.0 * width - rb), 0.02):
        raise wrong("The output [B, W] must be written too: count its bytes along with both inputs.")
    raise wrong(
        "Solve 2 B W^2 / (bytes x (2 B W + W^2)) = ridge for B: the inputs [B, W] and [W, W] and the output "
        f"[B, W] all move (your answer is {how_far(value, ref)})."
    )


@checker("ex09_2", "a list of rung names")
def rungs_reaching(answer, measured_mfu: Mapping[str, float], target: float) -> str:
    """Exercise 09.2: which rungs of the measured ladder reach ``target``.

    ``measured_mfu`` maps each rung's label to its measured utilisation (a
    fraction: MFU against the datasheet, or of the measured ceiling); a rung
    with None (it failed) does not reach any target.
    """
    if not measured_mfu or all(v is None for v in measured_mfu.values()):
        raise unavailable("No rung has a measured fraction here (all failed or no reference), so none can be judged.")
    if isinstance(answer, str) or not isinstance(answer, (list, tuple, set, frozenset)):
        raise bad_input(f"Expected a list of rung names such as {list(measured_mfu)[:2]}; got {describe(answer)}.")
    chosen = set(answer)
    unknown = sorted(str(c) for c in chosen - set(measured_mfu))
    if unknown:
        raise bad_input(f"Unknown rung(s) {unknown}; the rungs are {list(measured_mfu)}.")
    ref = {name for name, mfu in measured_mfu.items() if mfu is not None and mfu >= target}
    below = sorted(chosen - ref)
    if below:
        name = below[0]
        got = measured_mfu[name]
        raise wrong(
            f"{name} " + ("failed" if got is None else f"measured {got:.1%}") + f", below the target {target:.0%}."
        )
    missed = sorted(ref - chosen)
    if missed:
        name = missed[0]
        raise wrong(f"{name} also reaches the target: it measured {measured_mfu[name]:.1%}.")
    if not ref:
        return f"Right: no rung reached {target:.0%} here."
    return f"Right: {', '.join(sorted(ref))} reach the target {target:.0%} on this device."
