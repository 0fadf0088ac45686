"""Compare what a lesson's own code cell computed with the package's version, in one sentence.

A lesson writes the code it teaches in its own cells (a learner may edit
them); the package keeps the reusable version that later lessons and the
tests use. After such a cell a lesson calls :func:`compare` with both
results: the learner sees whether their cell still computes what the
package does and, when it does not, which leaf differs and by how much.
The comparison is by numbers, never by source text. A test of each lesson
runs the cell untouched and pins it to the package (tests/lib/test_checks.py
and the lessons' own tests).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class CellCheck:
    """The outcome of :func:`compare`.

    Attributes:
        same: every leaf has the reference's shape and dtype and lies within
            the tolerance.
        message: one sentence: what matched, or the first leaf that differs.
    """

    same: bool
    message: str

    def _repr_html_(self) -> str:
        from dpcourse.show import banner

        return banner(self.message, "note" if self.same else "warning")._repr_html_()

    def __repr__(self) -> str:
        return ("" if self.same else "[WARNING] ") + self.message


def _leaves(tree) -> list[tuple[str, np.ndarray]]:
    import jax

    out = []
    for path, leaf in jax.tree_util.tree_leaves_with_path(tree):
        if hasattr(leaf, "dtype") and jax.dtypes.issubdtype(leaf.dtype, jax.dtypes.prng_key):
            leaf = jax.random.key_data(leaf)
        out.append((jax.tree_util.keystr(path) or "the value", np.asarray(jax.device_get(leaf))))
    return out


def structure_difference(mine, reference, most: int = 4) -> str:
    """What separates two pytrees' structures, as a phrase: the leaf paths one has and the other lacks.

    For example ``"missing ['b'], extra ['bias']"`` for ``{"bias": ...}`` against
    ``{"b": ...}``; with the same paths, the containers that differ (``"a
    tuple where the reference has a list"``). At most ``most`` paths a side.
    """
    import jax

    def paths(tree) -> list[str]:
        return [jax.tree_util.keystr(p) or "the value" for p, _ in jax.tree_util.tree_leaves_with_path(tree)]

    ours, theirs = paths(mine), paths(reference)

    def listed(items: list[str]) -> str:
        return ", ".join(items[:most]) + (f" and {len(items) - most} more" if len(items) > most else "")

    missing = [p for p in theirs if p not in set(ours)]
    extra = [p for p in ours if p not in set(theirs)]
    parts = ([f"missing {listed(missing)}"] if missing else []) + ([f"extra {listed(extra)}"] if extra else [])
    if parts:
        return ", ".join(parts)
    return f"a {type(mine).__name__} where the reference has a {type(reference).__name__}, with the same leaves"


def compare(mine, reference, what: str, package_name: str, atol: float = 0.0) -> CellCheck:
    """Compare the pytree ``mine`` (from the lesson's cell) with ``reference`` (from the package).

    Args:
        mine: what the lesson's cell produced (a pytree of arrays).
        reference: what ``package_name`` produced from the same inputs.
        what: what the trees are, for the sentence ("the parameters after one step").
        package_name: the package function, e.g. ``"train.make_pmap_step"``.
        atol: largest absolute difference still counted as the same
            (0: bit for bit).

    Returns:
        A :class:`CellCheck`; it renders as a note (same) or a warning.
    """
    import jax

    ours, theirs = _leaves(mine), _leaves(reference)
    if jax.tree.structure(mine) != jax.tree.structure(reference):
        return CellCheck(
            False,
            f"Your cell's {what} have another structure than {package_name}'s "
            f"({len(ours)} arrays against {len(theirs)}; {structure_difference(mine, reference)}): the cells "
            "below assume the package's.",
        )
    worst, worst_name = 0.0, ""
    for (name, a), (_, b) in zip(ours, theirs):
        if a.shape != b.shape:
            return CellCheck(
                False, f"In your cell's {what}, {name} has shape {a.shape}; {package_name} gives {b.shape}."
            )
        if a.dtype != b.dtype:
            return CellCheck(
                False, f"In your cell's {what}, {name} has dtype {a.dtype}; {package_name} gives {b.dtype}."
            )
        if a.size:
            diff = float(np.max(np.abs(a.astype(np.float64) - b.astype(np.float64))))
            if diff > worst:
                worst, worst_name = diff, name
    if worst > atol:
        return CellCheck(
            False,
            f"Your cell's {what} differ from {package_name}'s: {worst_name} by up to {worst:.3g} "
            f"(allowed {atol:.3g}). The lesson below runs your version.",
        )
    exact = "bit for bit" if worst == 0 else f"within {atol:.3g} (largest difference {worst:.3g})"
    return CellCheck(True, f"Your cell's {what} equal {package_name}'s {exact}.")
