"""Lesson 11's conclusions on a resumed run, a checkpoint's size and a save's time, from the run's own numbers.

Taught in notebook 11 (``notebooks/11_checkpoint.py``, sections 4-9 and 7),
which prints these sentences under the tables they read: each says what
this run's figures show, whichever way they came out.
"""

from __future__ import annotations

from collections.abc import Mapping


def size_sentence(form: str, disk_bytes: int, array_bytes: int) -> str:
    """The folder's bytes against the arrays': did zstd take off more than Orbax's metadata added?"""
    if array_bytes <= 0:
        raise ValueError(f"Need the arrays' bytes > 0, got {array_bytes}.")
    ratio = disk_bytes / array_bytes
    if disk_bytes < array_bytes:
        verdict = "zstd saved more than the metadata added"
    elif disk_bytes > array_bytes:
        verdict = "the metadata added more than zstd saved"
    else:
        verdict = "zstd saved as much as the metadata added"
    return f"{form}: the folder holds {ratio:.2f} x the arrays' bytes ({verdict})"


def forms_sentence(disk_bytes: Mapping[str, int]) -> str:
    """How far apart the saved forms' folders are, against the largest of them."""
    if len(disk_bytes) < 2:
        raise ValueError(f"Need the folders of 2 or more forms, got {dict(disk_bytes)}.")
    low, high = min(disk_bytes.values()), max(disk_bytes.values())
    names = " and ".join(disk_bytes)
    if low == high:
        return f"{names}: the same {high:,} bytes on disk."
    return f"{names}: {low:,} to {high:,} bytes on disk, {(high - low) / high:.2%} apart."


def hiding_lines(steps_s: float, sync_save_s: float, blocked_s: float, async_total_s: float, k: int) -> list[str]:
    """What an asynchronous save beside ``k`` steps hid of a synchronous one, from the four times measured.

    Args:
        steps_s: the ``k`` steps alone.
        sync_save_s: one synchronous save.
        blocked_s: how long the asynchronous ``save`` call held the loop.
        async_total_s: the asynchronous save, the ``k`` steps and the wait for the save, together.
    """
    in_turn_s = steps_s + sync_save_s
    lines = [
        f"{k} steps, then a synchronous save: {in_turn_s:.3f} s",
        f"an asynchronous save beside the same steps: {async_total_s:.3f} s",
        f"  of which the loop waited {blocked_s:.3f} s for the save",
    ]
    hidden = in_turn_s - async_total_s
    if 0 < hidden <= sync_save_s:
        lines.append(f"saving asynchronously hid {hidden:.3f} s ({hidden / sync_save_s:.0%}) of the synchronous save")
    elif hidden > sync_save_s:
        lines.append("the two runs differ by more than the whole save: these times vary more than the save")
        lines.append("lasts on this machine; run the cell again")
    else:
        lines.append("nothing was hidden here: the write and the steps took turns on the same cores")
    return lines


# The resumed runs lesson 11 records (``resume_max_abs_diff_<key>``), in words.
RESUMED_AS = {
    "replicated": "replicated, the same devices",
    "fsdp": "FSDP, the same devices",
    "fewer_devices": "half the devices",
    "next_session": "the next session",
    "other_process_count": "another process count",
}


def resumed_sentence(resumed: Mapping[str, tuple[float, float]]) -> str:
    """How each resumed run compared with the run that never stopped: ``{key: (max |diff|, tolerance)}``.

    A tolerance of 0 asks for bitwise equality (the same arithmetic); another, for rounding within it.
    """
    said: dict[str, list[str]] = {"bitwise equal": [], "within rounding": [], "outside the tolerance": []}
    for key, (diff, tol) in resumed.items():
        verdict = "bitwise equal" if diff == tol == 0 else "within rounding" if diff < tol else "outside the tolerance"
        said[verdict].append(RESUMED_AS[key])
    worst = max(((d, t) for d, t in resumed.values() if d < t), default=None)
    if worst is not None:
        said["within rounding"][-1] += f" (at most {worst[0]:.1e}, tolerance {worst[1]:g})"
    parts = [f"{verdict} on {', '.join(names)}" for verdict, names in said.items() if names]
    return f"This run's resumed runs against the ones that never stopped: {'; '.join(parts)}."
