"""Checkers for the exercises of notebook 12 (the noise scale from two norms, steps at a new batch, the best device count)."""

from __future__ import annotations

from dpcourse.exercises.base import as_number, checker, close, how_far, wrong

# Exercise 12.1: what one step of an 8-device run printed (norms, not squared).
PER_DEVICE_BATCH, GLOBAL_BATCH = 32, 256
LOCAL_NORM, GLOBAL_NORM = 1.30, 0.60  # |G_b| (each device's gradient), |G_B| (the averaged one)

# Exercise 12.3: a workload with S(B) = 300 (1 + 4096 / B), 256 examples per device, 8 GPUs per
# node; past one node the all-reduce crosses a slower network and the step slows down.
DEVICE_TABLE = (
    {"devices": 1, "global batch": 256, "steps": 5100, "ms/step": 20.0},
    {"devices": 2, "global batch": 512, "steps": 2700, "ms/step": 21.0},
    {"devices": 4, "global batch": 1024, "steps": 1500, "ms/step": 22.0},
    {"devices": 8, "global batch": 2048, "steps": 900, "ms/step": 23.0},
    {"devices": 16, "global batch": 4096, "steps": 600, "ms/step": 40.0},
    {"devices": 32, "global batch": 8192, "steps": 450, "ms/step": 60.0},
    {"devices": 64, "global batch": 16384, "steps": 375, "ms/step": 90.0},
)


def _b_simple(local_sq: float, global_sq: float, b: float, big_b: float) -> float:
    g2 = (big_b * global_sq - b * local_sq) / (big_b - b)
    trace = (local_sq - global_sq) / (1.0 / b - 1.0 / big_b)
    return trace / g2


@checker("ex12_1", "the noise scale B_simple in examples, a number")
def noise_scale(answer) -> str:
    """Exercise 12.1: ``B_simple = tr(Sigma) / |G|^2`` from ``|G_b| = 1.30`` (b = 32) and ``|G_B| = 0.60`` (B = 256).

    Right within 1 %: about 286 examples. Named mistakes: b and B (or the
    two norms) swapped (a negative trace), the norms not squared, the
    averaged norm used for both (a trace of 0), the ratio upside down.
    """
    value = as_number(answer, "the noise scale", positive=False)
    b, big_b = PER_DEVICE_BATCH, GLOBAL_BATCH
    ref = _b_simple(LOCAL_NORM**2, GLOBAL_NORM**2, b, big_b)
    if close(value, ref, 0.01):
        return (
            f"Right: about {ref:.0f} examples. |G|^2 ~ (B|G_B|^2 - b|G_b|^2)/(B - b) and "
            "tr(Sigma) ~ (|G_b|^2 - |G_B|^2)/(1/b - 1/B), with squared norms; on a real run, average "
            "each over many steps before dividing."
        )
    if close(value, _b_simple(LOCAL_NORM**2, GLOBAL_NORM**2, big_b, b), 0.01) or close(
        value, _b_simple(GLOBAL_NORM**2, LOCAL_NORM**2, b, big_b), 0.01
    ):
        raise wrong(
            "b and B are swapped (or the two norms are): the gradient of the smaller batch b, one device's, "
            "is the noisier one, so |G_b| > |G_B| and tr(Sigma) comes out positive.",
            "b-and-B-swapped",
        )
    if close(value, _b_simple(LOCAL_NORM, GLOBAL_NORM, b, big_b), 0.01):
        raise wrong(
            "The norms are not squared: both estimates are of squared norms, |G_b|^2 and |G_B|^2.", "not-squared"
        )
    if abs(value) < 1e-9:
        raise wrong(
            "One norm is used twice: with |G_B| in both places (or |G_b|) the trace estimate is 0. The noise "
            "is what differs between one device's gradient and the averaged one.",
            "averaged-norm-twice",
        )
    if value > 0 and close(1.0 / value, ref, 0.01):
        raise wrong("The ratio is upside down: B_simple = tr(Sigma) / |G|^2, noise over signal.", "ratio-inverted")
    raise wrong(f"Not tr(Sigma) / |G|^2 from these norms: {how_far(abs(value), ref) if value > 0 else 'negative'}.")


@checker("ex12_2", "the predicted steps to the target, a number")
def steps_at_batch(answer, trade_off, global_batch: int) -> str:
    """Exercise 12.2: ``S(B) = S_min + E_min / B`` at ``global_batch`` from the lesson's fit.

    Right within 1 %. Named mistakes: S_min alone, E_min / B alone (perfect
    scaling), the ratio ``B / B_crit`` where ``B_crit / B`` belongs.
    """
    value = as_number(answer, "the steps", positive=True, whole=False)
    ref = trade_off.steps_at(global_batch)
    if close(value, ref, 0.01):
        return (
            f"Right: about {ref:.0f} steps: S_min (1 + B_crit / B) = {trade_off.s_min:.0f} x "
            f"(1 + {trade_off.b_crit:.0f} / {global_batch})."
        )
    if close(value, trade_off.s_min, 0.01):
        raise wrong("That is S_min, the steps of an infinite batch: a finite batch needs E_min / B more.", "s-min-only")
    if close(value, trade_off.e_min / global_batch, 0.01):
        raise wrong(
            "That is E_min / B alone, perfect scaling: it leaves out S_min, the steps no batch can save.",
            "perfect-scaling",
        )
    if close(value, trade_off.s_min * (1 + global_batch / trade_off.b_crit), 0.01):
        raise wrong("B / B_crit is upside down: S = S_min (1 + B_crit / B) falls as the batch grows.", "ratio-inverted")
    raise wrong(f"Not S_min + E_min / B at B = {global_batch}: {how_far(value, ref)}.")


@checker("ex12_3", "a device count from the table")
def best_device_count(answer) -> str:
    """Exercise 12.3: the device count of :data:`DEVICE_TABLE` with the shortest time to the target (steps x ms/step).

    Right: 8. Named mistakes: 64 (the most examples/s and the fewest steps),
    1 (the fastest step), a count not in the table.
    """
    value = as_number(answer, "the device count", positive=True, whole=True)
    times = {row["devices"]: row["steps"] * row["ms/step"] / 1000.0 for row in DEVICE_TABLE}
    best = min(times, key=times.get)
    n = int(value)
    if n == best:
        return (
            f"Right: {best} devices, {times[best]:.1f} s to the target. More devices still raise the examples "
            f"per second, but the steps they save cost more time each than they save: {times[64]:.1f} s at 64."
        )
    if n not in times:
        raise wrong(f"{n} is not a row of the table: the counts are {', '.join(map(str, times))}.")
    if n == max(times):
        raise wrong(
            f"{n} devices give the most examples per second and the fewest steps, but each step is slower: "
            f"{times[n]:.1f} s to the target. Multiply steps by ms/step for every row.",
            "most-throughput",
        )
    if n == 1:
        raise wrong(f"One device has the fastest step but needs {DEVICE_TABLE[0]['steps']} of them: {times[1]:.0f} s.")
    raise wrong(f"{n} devices take {times[n]:.1f} s to the target; one row takes less.")
