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


# NVIDIA H200 Tensor Core GPU datasheet (SXM column): BF16 1,979 TFLOPS with sparsity, so
# 989 TFLOP/s dense (dpcourse.costs.PEAKS), and GPU memory bandwidth 4.8 TB/s.
H200_BF16_FLOPS_PER_S = 989e12
H200_HBM_BYTES_PER_S = 4.8e12
H200_BF16_RIDGE = H200_BF16_FLOPS_PER_S / H200_HBM_BYTES_PER_S  # about 206 FLOP/byte
FULL_WIDTH = 1024  # the full profile's cfg.width (dpcourse.config)


def _is_inf(answer) -> bool:
    try:
        return not isinstance(answer, bool) and math.isinf(float(answer)) and float(answer) > 0
    except (TypeError, ValueError):
        return False


# Wrong answers without a named mistake, per exercise, in this kernel: the first gets a hint, later
# ones the equation to solve.
_WRONG_TRIES: dict[str, int] = {}


@checker("ex09_1", "the predicted global batch (a whole number), or math.inf if no batch reaches the ridge")
def ridge_batch(answer, width: int, ridge_flop_per_byte: float | None, bytes_per_value: int = 2) -> str:
    """Exercise 09.1: the batch at which the block matmul ``[B, W] @ [W, W]`` becomes compute-bound.

    ``ridge_flop_per_byte`` is the ridge point (matmul FLOP/s over memory
    bytes/s; the lesson uses the H200's datasheet figures,
    :data:`H200_BF16_RIDGE`, so the answer does not move between runs). The
    reference is :func:`ridge_batch_reference`, from :func:`matmul_intensity`;
    a batch is a whole number: the smallest whole ``B`` at or above the
    reference is right (and any whole number within 1 %, for a ridge rounded
    on the way).
    """
    if not ridge_flop_per_byte or ridge_flop_per_byte <= 0:
        raise unavailable("No ridge point was given here, so there is nothing to check against.")
    ref = ridge_batch_reference(width, ridge_flop_per_byte, bytes_per_value)
    limit = width / bytes_per_value
    never = _is_inf(answer)
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
    # Wholeness is checked last here: a fraction from a known wrong formula gets that formula's reason.
    value = as_number(answer, "a global batch", positive=True, whole=False)
    whole = value == int(value)
    if close(value, ref, 0.02) and not whole:
        raise wrong(
            "Your B solves the equation, but a batch is a whole number of examples: give the smallest "
            "whole batch whose intensity reaches the ridge."
        )
    if whole and value == math.floor(ref) < math.ceil(ref):
        at = matmul_intensity(value, width, width, bytes_per_value)
        raise wrong(
            f"At B = {int(value)} the intensity is {at:.4g} FLOP/byte, just below the ridge "
            f"{ridge_flop_per_byte:.4g}: the matmul is still memory-bound. Round B up, not down."
        )
    if whole and (value == math.ceil(ref) or abs(value - ref) <= 0.01 * ref):
        return (
            f"Right: from B = {math.ceil(ref)} the block matmul does more FLOPs per byte than the ridge "
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
    as_number(value, "a global batch", whole=True)  # a fraction: say that a batch is whole
    _WRONG_TRIES["ex09_1"] = tries = _WRONG_TRIES.get("ex09_1", 0) + 1
    if tries == 1:
        raise wrong(
            f"Your answer is {how_far(value, ref)}. The intensity is the FLOPs over the bytes moved: count the "
            "bytes of every array the matmul reads and writes, and find the smallest B where the ratio reaches "
            "the ridge."
        )
    raise wrong(
        "Solve 2 B W^2 / (bytes x (2 B W + W^2)) = ridge for B: the inputs [B, W] and [W, W] and the output "
        f"[B, W] all move (your answer is {how_far(value, ref)})."
    )


NOISE_BAND = 0.2  # rungs within 20 % of the target (relative) count either way in exercise 09.2


def percent(fraction: float) -> str:
    """A fraction as a percentage to 2 significant figures: 0.027 -> "2.7%", 0.5 -> "50%", 0.0012 -> "0.12%"."""
    return f"{float(f'{fraction * 100:.2g}'):g}%"


COURSE_TARGET = 0.5  # the course's speed target: half of the measured ceiling of the rung's precision


def exercise_target(
    measured: Mapping[str, float | None], course_target: float = COURSE_TARGET, band: float = NOISE_BAND
) -> tuple[float, str]:
    """The target exercise 09.2 asks about, and one sentence saying why.

    The course's target (half of the measured ceiling) when the ladder has
    rungs clearly on both sides of it (beyond ``band``). Where it does not, as
    on a CPU, where no rung gets near 50 %, an answer of "none" (or "all")
    would be right whatever the learner did; the target is then the geometric
    middle of the widest gap between two neighbouring measured fractions, if
    that gap puts both rungs clearly on their sides (a ratio of at least
    ``((1 + band) / (1 - band))**2``), rounded to 2 significant figures.
    Otherwise the course's target stays. Failed rungs (None) are left out.
    """
    values = sorted(v for v in measured.values() if v is not None and v > 0)
    above = [v for v in values if v >= course_target * (1 + band)]
    below = [v for v in values if v <= course_target * (1 - band)]
    if above and below:
        return course_target, f"The target is the course's: {percent(course_target)} of the measured ceiling."
    gaps = [(hi / lo, lo, hi) for lo, hi in zip(values, values[1:]) if hi > lo]
    if not gaps:
        return course_target, (
            f"The target is the course's, {percent(course_target)} of the measured ceiling;\n"
            "the rungs here all measured the same, so no other target lies between two of them."
        )
    _, lo, hi = max(gaps)
    middle = math.sqrt(lo * hi)
    target = next(t for t in (float(f"{middle:.{d}g}") for d in (2, 3, 4, 17)) if lo < t < hi)
    # Not (above and below): either no rung is clearly above, or none clearly below (some may be near it).
    where = "No rung clearly reaches" if not above else "No rung is clearly below"
    noise = exercise_band(measured, target, band)
    said = (
        ""
        if noise == band
        else f"\nRungs within {percent(noise)} of it count either way (the two nearest lie just outside)."
    )
    return target, (
        f"{where} the course's {percent(course_target)} here, so this exercise asks about\n"
        f"{percent(target)} ({target:.2g}) of the measured ceiling instead, between two rungs.{said}"
    )


def exercise_band(measured: Mapping[str, float | None], target: float, band: float = NOISE_BAND) -> float:
    """The noise band of exercise 09.2: ``band``, narrowed so that a rung lies clearly on each side of ``target``.

    Only for a target :func:`exercise_target` set between two rungs: with rungs on both sides of the target but all of them within ``band``,
    every answer would count as right; the band then shrinks to just inside
    the nearest rung on either side (their fractions are the ones the table
    printed, so the learner reads the same numbers the check uses).
    """
    if target == COURSE_TARGET:
        return band  # the course's own target: a rung near it counts either way, whatever the others
    values = [v for v in measured.values() if v is not None and v > 0]
    higher = [v / target - 1 for v in values if v > target]
    lower = [1 - v / target for v in values if v < target]
    if not higher or not lower:
        return band
    if max(higher) >= band and max(lower) >= band:
        return band
    return min(band, 0.99 * min(max(higher), max(lower)))


def _and(items: list[str]) -> str:
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


@checker("ex09_2", "a list of rung names (the table's first column)")
def rungs_reaching(answer, measured: Mapping[str, float | None], target: float, band: float = NOISE_BAND) -> str:
    """Exercise 09.2: which rungs of the measured ladder reach ``target``.

    ``measured`` maps each rung's name (as the ladder table shows it) to its
    fraction of the measured ceiling; None (it failed) reaches no target.
    Timings on a shared machine move by tens of percent from run to run, so
    a rung within ``band`` of the target (``|fraction / target - 1| <
    band``) is right whether it is listed or not: only rungs clearly above
    must be listed and only rungs clearly below must not.
    """
    if not measured or all(v is None for v in measured.values()):
        raise unavailable("No rung has a measured fraction here (all failed or no reference), so none can be judged.")
    if isinstance(answer, str) or not isinstance(answer, (list, tuple, set, frozenset)):
        raise bad_input(f"Expected a list of rung names such as {list(measured)[:2]}; got {describe(answer)}.")
    chosen = set(answer)
    unknown = sorted(str(c) for c in chosen - set(measured))
    if unknown:
        raise bad_input(f"Unknown rung(s) {unknown}; the rungs are {list(measured)}.")
    band = exercise_band(measured, target, band)
    above = {k for k, v in measured.items() if v is not None and v >= target * (1 + band)}
    near = {k for k, v in measured.items() if v is not None and target * (1 - band) < v < target * (1 + band)}
    below = sorted(chosen - above - near)
    if below:
        said = [
            f"{name} " + ("failed" if measured[name] is None else f"measured {percent(measured[name])}")
            for name in below
        ]
        each = "" if len(below) == 1 else " each"
        raise wrong(f"{_and(said)},{each} clearly below the target {percent(target)}.")
    missed = sorted(above - chosen)
    if missed:
        verb = "also reaches" if len(missed) == 1 else "also reach"
        raise wrong(
            f"{_and(missed)} {verb} the target {percent(target)}: look at "
            f"{'its' if len(missed) == 1 else 'their'} fraction of the measured ceiling."
        )
    verb = "reaches" if len(above) == 1 else "reach"
    said = (
        f"{', '.join(sorted(above))} {verb} the target {percent(target)}"
        if above
        else f"no rung clearly reaches {percent(target)}"
    )
    if near:
        said += (
            f"; {', '.join(sorted(near))} lie within {band:.0%} of it, where run-to-run noise decides, "
            "so either way is right"
        )
    return f"Right: {said}."


BOUNDS = ("no-overlap sum", "overlapped bound")  # dpcourse.costs.bound_for's answers
CHANGES = ("smaller combine threshold", 'optimization_level="O1"', "none of these")


@checker("ex09_3", 'a pair (bound, change): one of check.BOUNDS and one of check.CHANGES, e.g. ("...", "...")')
def overlap_bound(answer, fractions: Mapping[str, float | None]) -> str:
    """Exercise 09.3: the bound a printed schedule earns, and the change that would put compute in a window.

    ``fractions`` maps ``"plain"`` and the compiled changes of :data:`CHANGES`
    (``"smaller combine threshold"``, ``'optimization_level="O1"'``) to the
    fraction of bytes sent inside windows of compute
    (:attr:`dpcourse.compiled.schedule.Schedule.overlapped_fraction`), as
    notebook 09 compiled them for one GPU. The bound is
    :func:`dpcourse.costs.bound_for` of the plain step's fraction; a change is
    right when its compile has a larger fraction than the plain step's
    ("none of these" when neither has).
    """
    from dpcourse import costs

    plain = fractions.get("plain") if fractions else None
    if plain is None:
        raise unavailable("No schedule was compiled here (the GPU-compile extra is missing), so there is no answer.")
    if isinstance(answer, str) or not isinstance(answer, (tuple, list)) or len(answer) != 2:
        raise bad_input(f'Expected a pair such as ("{BOUNDS[0]}", "{CHANGES[0]}"); got {describe(answer)}.')
    bound, change = answer
    if bound not in BOUNDS:
        raise bad_input(f"The bound is one of {list(BOUNDS)}; got {describe(bound)}.")
    if change not in CHANGES:
        raise bad_input(f"The change is one of {list(CHANGES)}; got {describe(change)}.")
    right_bound = costs.bound_for(plain)
    opens = [c for c in CHANGES[:2] if (fractions.get(c) or 0.0) > plain]
    if bound != right_bound:
        if plain:
            raise wrong(f"{plain:.0%} of the bytes sent have compute in their window: that earns the overlapped bound.")
        raise wrong(
            "The only all-reduce's window holds no compute (scalar bookkeeping at most): nothing hides, "
            "so the step costs compute plus communication."
        )
    if change not in (opens or ["none of these"]):
        if change == "none of these":
            raise wrong(f"{opens[0]} compiled with compute inside a window here: look at its fraction.")
        got = fractions.get(change)
        said = "was not compiled here" if got is None else f"compiled with {got:.0%} in windows, no more than the plain"
        raise wrong(f"{change} {said} step's {plain:.0%}.")
    why = (
        f"{change} gives a gradient its own collective, which the scheduler can start while other work remains"
        if change == CHANGES[0]
        else f"{change} compiled with more compute inside windows"
    )
    if change == "none of these":
        why = "neither change put compute inside a window on this GPU"
    return f"Right: the plain step earns the {right_bound}; {why}."
