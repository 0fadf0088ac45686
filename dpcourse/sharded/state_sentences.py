"""Lesson 10's reading of its state-bytes table: each form's measured saving against the formula's, from the run's numbers.

Taught in notebook 10 (``notebooks/10_sharded.py``, section 2), which prints
this under the table of bytes per device. The formula
(:func:`dpcourse.sharded.forms.state_ratio_formula`) counts every leaf as
sharded; a leaf none of whose dimensions divides by the device count, or
one too small to shard, stays whole, so the measured saving can only fall
short of it, and is 1 where nothing divides.
"""

from __future__ import annotations

from collections.abc import Mapping


def state_ratio_sentence(measured: Mapping[str, float], formula: Mapping[str, float]) -> str:
    """One clause per form: the measured ratio (replicated / this form) against the formula's, and which way it lies.

    Args:
        measured: form -> bytes held under replicated DP / bytes held under this form, measured.
        formula: form -> the same ratio from the formula.

    Raises:
        ValueError: the two name different forms.
    """
    if set(measured) != set(formula):
        raise ValueError(f"Measured forms {sorted(measured)} and formula forms {sorted(formula)} differ.")
    parts = []
    for form, got in measured.items():
        want = formula[form]
        if abs(got - want) <= 0.005 * want:
            how = "as the formula says"
        elif got < want:
            how = "nothing sharded" if abs(got - 1.0) < 0.005 else "short of the formula: some leaves stay whole"
        else:
            how = "above the formula"
        parts.append(f"{form} {got:.2f} against {want:.2f} ({how})")
    return "Replicated / this form, measured against the formula: " + "; ".join(parts) + "."
