"""Checkers for the exercises of notebook 11 (a checkpoint's size, the step a run resumes from)."""

from __future__ import annotations

from dpcourse.exercises.base import as_number, checker, close, how_far, wrong

FULL_PARAMS = 1_863_690  # the full-size model (dpcourse.model.param_count of the full profile)
SAVE_EVERY, PREEMPTED_AT, SAVING = 100, 430, 400  # exercise 11.2


@checker("ex11_1", "the bytes of arrays in one checkpoint, a number")
def checkpoint_bytes(answer) -> str:
    """Exercise 11.1: the arrays of one full-size checkpoint, parameters and AdamW state in float32.

    Right within 1 %: ``4 P + 8 P = 12 P`` bytes for ``P = 1,863,690``
    (22,364,280). Known wrong: the parameters alone, gradients counted,
    one moment only, a copy per device (8 devices), bits.
    """
    value = as_number(answer, "the bytes of a checkpoint", positive=True)
    p = FULL_PARAMS
    ref = 12 * p
    if close(value, ref, 0.01):
        return (
            f"Right: {ref:,} bytes. The parameters (4 bytes each) and AdamW's two moments (4 + 4), "
            "every array once, however it was sharded when saved."
        )
    if close(value, 4 * p, 0.01):
        raise wrong("That is the parameters alone: a run resumed without AdamW's moments forgets its history.")
    if close(value, 16 * p, 0.01):
        raise wrong("The gradients are counted: they live only inside a step and are never saved.")
    if close(value, 8 * p, 0.01):
        raise wrong("AdamW keeps two moments per parameter, mu and nu: 8 bytes, on top of the 4 of the parameter.")
    if close(value, 8 * ref, 0.01):
        raise wrong("That counts a copy per device (or bits): a checkpoint holds every array once.")
    raise wrong(f"Not the 4 + 8 bytes per parameter of parameters plus AdamW state: {how_far(value, ref)}.")


@checker("ex11_2", "a step number")
def resume_step(answer) -> str:
    """Exercise 11.2: saves every 100 steps, preempted at step 430 during the save of step 400.

    Right: 300 (the step 400 was never committed). Known wrong: 400 (a
    half-written step is never restored), 430, 0.
    """
    value = as_number(answer, "the step", positive=False)
    if value != int(value):
        raise wrong("Steps are whole numbers.")
    step = int(value)
    last = SAVING - SAVE_EVERY
    if step == last:
        return (
            f"Right: step {last}. The save of step {SAVING} was still a temporary folder when the node went: "
            f"never committed, never listed by latest_step(); steps {last + 1} to {PREEMPTED_AT} run again."
        )
    if step == SAVING:
        raise wrong(
            f"Step {SAVING} was being written, not committed: Orbax renames a step's folder only once every "
            "array is written, and never restores one without the rename."
        )
    if step == PREEMPTED_AT:
        raise wrong(f"Nothing was saved at step {PREEMPTED_AT}: a run resumes from a saved step, not where it stopped.")
    if step == 0:
        raise wrong("The earlier saves are complete: the run need not start over.")
    raise wrong(f"Saves happen every {SAVE_EVERY} steps: which was the last one to complete?")
