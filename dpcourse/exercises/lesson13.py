"""Checkers for the exercises of notebook 13 (the agreed preemption step, the survivors' batch, the interval)."""

from __future__ import annotations

from dpcourse.checkpoints import interval
from dpcourse.exercises.base import as_number, checker, close, how_far, wrong

REPORTED_STEPS = (41, 43, 42)  # exercise 13.1: the steps the processes had reached when the notice spread
GLOBAL_BATCH, PROCESSES = 96, 4  # exercise 13.2: one CPU device a process, one process lost
SAVE_S, MTBF_H = 30.0, 6.0  # exercise 13.3


@checker("ex13_1", "a step number")
def agreed_step(answer) -> str:
    """Exercise 13.1: JAX's preemption sync point is the largest step any process reached, plus one.

    Right: 44 for steps (41, 43, 42). Known wrong: 43 (the largest, a step
    already taken), 42 (the process that got the notice), 41 (the smallest).
    """
    value = as_number(answer, "the step", positive=True, whole=True)
    step = int(value)
    right = max(REPORTED_STEPS) + 1
    if step == right:
        return (
            f"Right: step {right}. The service takes the largest step any process had reached, "
            f"{max(REPORTED_STEPS)}, and agrees on the next one, which no process has passed yet."
        )
    if step == max(REPORTED_STEPS):
        raise wrong(f"Process 1 has already passed step {step}: it can only stop at a step still ahead of it.")
    if step in REPORTED_STEPS:
        raise wrong("Not the step of one process: it must be ahead of every one of them, so each can still stop there.")
    raise wrong(f"The agreed step is the next step after the largest any process reached; {step} is not.")


@checker("ex13_2", "a number of examples")
def survivor_batch(answer) -> str:
    """Exercise 13.2: the global batch kept after one process of four is lost: each survivor's share.

    Right: 96 / 3 = 32 examples. Known wrong: 24 (the share before the
    loss: the global batch shrank), 96 (a whole global batch each).
    """
    value = as_number(answer, "examples per device", positive=True)
    right = GLOBAL_BATCH // (PROCESSES - 1)
    if close(value, right, 0.0):
        return (
            f"Right: {right} examples. The {GLOBAL_BATCH} examples of the global batch are split over the "
            f"{PROCESSES - 1} live devices, so the mean gradient is over the same examples as before."
        )
    if close(value, GLOBAL_BATCH / PROCESSES, 0.0):
        raise wrong(
            f"That is the share before the loss: {PROCESSES - 1} x {GLOBAL_BATCH // PROCESSES} is a smaller global "
            "batch, another training than the reference's."
        )
    if close(value, GLOBAL_BATCH, 0.0):
        raise wrong("That is the whole global batch on every device: each device takes only its share.")
    raise wrong(f"Split the same global batch over the live devices: {how_far(value, right)}.")


@checker("ex13_3", "an interval in seconds")
def checkpoint_interval(answer) -> str:
    """Exercise 13.3: Daly's optimal checkpoint interval for a 30 s save and a 6 h MTBF.

    Right within 2 %: Daly's 1,119 s; an answer nearer Young's first-order
    1,138 s (within 1 %) is right too, and told it is Young's. Known wrong:
    the MTBF in hours, the square root left out.
    """
    value = as_number(answer, "an interval in seconds", positive=True)
    mtbf_s = MTBF_H * 3600.0
    daly = interval.daly_interval_s(SAVE_S, mtbf_s)
    young = interval.young_interval_s(SAVE_S, mtbf_s)
    # Which formula the answer is: the nearer of the two (they differ by under 2 %, so a window alone cannot say).
    nearer_young = abs(value - young) < abs(value - daly)
    if nearer_young and close(value, young, 0.01):
        return (
            f"Right to first order: {young:,.0f} s is Young's sqrt(2 x save x MTBF); Daly's next terms give "
            f"{daly:,.0f} s, {100 * (young - daly) / young:.1f}% shorter."
        )
    if close(value, daly, 0.02):
        return f"Right: about {daly:,.0f} s, {daly / 60:.0f} min of training between two saves (Daly's formula)."
    if close(value, (2 * SAVE_S * MTBF_H) ** 0.5, 0.02):
        raise wrong("The MTBF went in as hours: every time in the formula is in seconds.")
    if close(value, 2 * SAVE_S * mtbf_s, 0.02):
        raise wrong("The square root is missing: the interval grows as the square root of save x MTBF.")
    raise wrong(
        f"Not Daly's (or Young's) interval for a {SAVE_S:g} s save and a {MTBF_H:g} h MTBF: {how_far(value, daly)}."
    )
