"""Checkers for the exercises of notebook 09 (performance: arithmetic intensity, rungs that reach an MFU)."""

from __future__ import annotations

from collections.abc import Mapping

from dpcourse.exercises.base import as_number, bad_input, checker, close, describe, unavailable, wrong


def matmul_intensity(m: int, k: int, n: int, bytes_per_value: int) -> float:
    """FLOPs per byte of ``[m, k] @ [k, n]``: ``2 m k n / (bytes x (m k + k n + m n))``.

    Reads both inputs and writes the output once (the least traffic); 2 FLOPs
    per multiply-accumulate.
    """
    return 2.0 * m * k * n / (bytes_per_value * (m * k + k * n + m * n))


@checker("ex09_1", "your predicted FLOPs per byte (a number)")
def intensity(answer, m: int, k: int, n: int, bytes_per_value: int) -> str:
    """Exercise 09.1: the arithmetic intensity of one matmul, within 2 % of :func:`matmul_intensity`."""
    value = as_number(answer, "the arithmetic intensity in FLOPs per byte")
    ref = matmul_intensity(m, k, n, bytes_per_value)
    if close(value, ref, 0.02):
        return f"Right: {ref:.4g} FLOPs per byte; above the device's ridge point the matmul is compute-bound."
    if close(value, ref / 2, 0.02):
        also = " (or you took 4 bytes per value: this dtype takes 2)" if bytes_per_value == 2 else ""
        raise wrong(f"Half the answer: a multiply-accumulate is 2 FLOPs{also}.")
    if close(value, 2.0 * m * k * n / (bytes_per_value * (m * k + k * n)), 0.02):
        raise wrong("The output [m, n] must be written too: count its bytes along with both inputs.")
    if bytes_per_value == 4 and close(value, matmul_intensity(m, k, n, 2), 0.02):
        raise wrong("That uses 2 bytes per value; float32 takes 4.")
    if close(value, 2.0 * m * k * n / (m * k + k * n + m * n), 0.02):
        raise wrong("That is FLOPs per value moved; divide by the bytes per value as well.")
    raise wrong(f"Off by a factor {value / ref:.3g}: 2 m k n FLOPs over the bytes of both inputs and the output.")


@checker("ex09_2", "a list of rung names")
def rungs_reaching(answer, measured_mfu: Mapping[str, float], target: float) -> str:
    """Exercise 09.2: which rungs of the measured ladder reach ``target`` MFU.

    ``measured_mfu`` maps each rung's name to its measured MFU (fraction);
    rungs whose MFU is None (no known peak) make the exercise uncheckable.
    """
    if not measured_mfu or any(v is None for v in measured_mfu.values()):
        raise unavailable("No MFU was measured here (no known peak for this device), so no rung can be judged.")
    if isinstance(answer, str) or not isinstance(answer, (list, tuple, set, frozenset)):
        raise bad_input(f"Expected a list of rung names such as {list(measured_mfu)[:2]}; got {describe(answer)}.")
    chosen = set(answer)
    unknown = sorted(str(c) for c in chosen - set(measured_mfu))
    if unknown:
        raise bad_input(f"Unknown rung(s) {unknown}; the rungs are {list(measured_mfu)}.")
    ref = {name for name, mfu in measured_mfu.items() if mfu >= target}
    below = sorted(chosen - ref)
    if below:
        name = below[0]
        raise wrong(f"{name} measured {measured_mfu[name]:.1%} MFU, below the target {target:.0%}.")
    missed = sorted(ref - chosen)
    if missed:
        name = missed[0]
        raise wrong(f"{name} also reaches the target: it measured {measured_mfu[name]:.1%}.")
    if not ref:
        return f"Right: no rung reached {target:.0%} here."
    return f"Right: {', '.join(sorted(ref))} reach {target:.0%} MFU on this device."
