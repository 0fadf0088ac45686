"""Checkers for the exercises of notebook 07 (the sweep: where throughput flattens, all-reduce time)."""

from __future__ import annotations

from collections.abc import Sequence

from dpcourse import costs
from dpcourse.config import Config
from dpcourse.exercises.base import as_number, as_tuple, checker, close, how_far, unavailable, wrong

PLATEAU_FRACTION = 0.9
LINK_BYTES_PER_S = 32e9  # PCIe Gen4 x16, one way (see dpcourse.costs.PEAKS)
N_GPUS = 4


def two_point_model(points: Sequence) -> tuple[tuple[int, float], tuple[int, float]] | None:
    """The smallest and largest sizes of a sweep that ran: ``((B1, t1_s), (B2, t2_s))``, or None."""
    ok = sorted((p.global_batch, p.result.ms_per_step / 1e3) for p in points if p.status == "ok" and p.result)
    if len(ok) < 2 or ok[0][0] == ok[-1][0]:
        return None
    return ok[0], ok[-1]


@checker("ex07_1", "a tuple (plateau_examples_per_s, batch_at_90_percent), or (None, None)")
def plateau(answer, points: Sequence) -> str:
    """Exercise 07.1: from the two extreme measured sizes, the plateau and where 90 % of it is reached.

    With ``step_s = a + b x B`` through the two points, throughput ``B / (a +
    b B)`` tends to ``1 / b`` and reaches 90 % of it at ``B = 9 a / b``. When
    ``a <= 0`` or ``b <= 0`` the model has no plateau to reach and the answer
    is ``(None, None)``. Each number accepted within 2 %; the feedback also
    compares the prediction with the sweep's measured best.
    """
    model_points = two_point_model(points)
    if model_points is None:
        raise unavailable("The sweep has fewer than two sizes that ran on this device count; nothing to predict from.")
    (b1, t1), (b2, t2) = model_points
    slope = (t2 - t1) / (b2 - b1)
    overhead = t1 - slope * b1
    plateau_ans, batch_ans = as_tuple(answer, 2, "(plateau_examples_per_s, batch_at_90_percent)")
    if slope <= 0 or overhead <= 0:
        if plateau_ans is None and batch_ans is None:
            return "Right: in these two measurements the step time has no positive overhead and slope, so no plateau."
        raise wrong(
            f"Here a = {overhead * 1e3:.3g} ms and b = {slope * 1e6:.3g} µs per example: with either not positive the "
            "model has no plateau, so the answer is (None, None)."
        )
    ref_plateau = 1.0 / slope
    ref_batch = PLATEAU_FRACTION / (1 - PLATEAU_FRACTION) * overhead / slope
    if plateau_ans is None or batch_ans is None:
        raise wrong("These two points do give a positive overhead and slope, so there is a plateau: compute it.")
    plateau_ans = as_number(plateau_ans, "the plateau in examples/s", positive=True)
    # The cost model's B = 9 a / b is a real number; any rounding of it is fine.
    batch_ans = as_number(batch_ans, "the global batch", positive=True, whole=False)
    if not close(plateau_ans, ref_plateau, 0.02):
        if close(plateau_ans, ref_plateau / 1e3, 0.02) or close(plateau_ans, ref_plateau * 1e3, 0.02):
            raise wrong("The plateau is off by 1000: ms_per_step is in milliseconds, convert to seconds first.")
        if close(plateau_ans, b2 / t2, 0.02):
            raise wrong(
                "That is the measured throughput at the largest size; the plateau is 1 / b, the limit as B grows."
            )
        raise wrong(f"The plateau is 1 / b with b = (t2 - t1) / (B2 - B1) = {slope * 1e6:.4g} µs per example.")
    if close(batch_ans, overhead / slope, 0.02):
        raise wrong("That is where throughput reaches half the plateau (B = a / b); 90 % needs B = 9 a / b.")
    if not close(batch_ans, ref_batch, 0.02):
        raise wrong(f"B / (a + b B) = 0.9 / b gives B = 9 a / b, with a = {overhead * 1e3:.4g} ms.")
    best = max((p for p in points if p.status == "ok" and p.result), key=lambda p: p.result.examples_per_s)
    return (
        f"Right: plateau {ref_plateau:,.0f} examples/s, 90 % of it at a global batch of {ref_batch:,.0f}. "
        f"The sweep's best was {best.result.examples_per_s:,.0f} examples/s at {best.global_batch}."
    )


@checker("ex07_2", "the predicted all-reduce time in ms (a number)")
def allreduce_ms(answer, cfg: Config) -> str:
    """Exercise 07.2: ring all-reduce time of this profile's float32 gradient on 4 GPUs over PCIe Gen4 x16.

    Reference: :func:`dpcourse.costs.ring_allreduce_s` with
    :func:`dpcourse.costs.gradient_bytes`, 32 GB/s one way, in ms. Within 2 %.
    """
    value = as_number(answer, "a time in milliseconds", positive=True)
    grad = costs.gradient_bytes(cfg)
    ref = costs.ring_allreduce_s(grad, N_GPUS, LINK_BYTES_PER_S) * 1e3
    plain = grad / LINK_BYTES_PER_S * 1e3
    if close(value, ref, 0.02):
        return f"Right: {ref:.4g} ms. Each device sends and receives 2(N-1)/N = 1.5 times the gradient."
    if close(value, ref / 1e3, 0.02):
        raise wrong("That is in seconds; the exercise asks for milliseconds.")
    if close(value, plain, 0.02):
        raise wrong(
            "That sends the gradient once; a ring all-reduce (reduce-scatter, then all-gather) sends 2(N-1)/N times it."
        )
    if close(value, plain * N_GPUS, 0.02) or close(value, plain * (N_GPUS - 1), 0.02):
        raise wrong(
            "A ring does not send every device's whole gradient to every other: each link carries 2(N-1)/N of it."
        )
    if close(value, ref * 8, 0.02) or close(value, ref / 8, 0.02):
        raise wrong("Off by 8: bits versus bytes. The gradient is 4 bytes per value and the link is 32 GB/s (bytes).")
    if close(value, ref / 4, 0.02):
        raise wrong("That counts values, not bytes: each float32 gradient value is 4 bytes.")
    raise wrong(f"Your answer is {how_far(value, ref)}: time = 2(N-1)/N x gradient bytes / link bytes per second.")
