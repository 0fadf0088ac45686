"""Compare what a lesson's own code cell computed with the package's version, in one sentence.

A lesson writes the code it teaches in its own cells (a learner may edit
them); the package keeps the reusable version that later lessons and the
tests use. After such a cell a lesson calls :func:`compare` (bit for bit or
within an absolute tolerance) or :func:`compare_steps` (training steps: each
leaf against its own scale) with both results: the learner sees whether
their cell still computes what the package does and, when it does not,
what differs in words ("the optimizer's first moment of the block weight"),
by how much, the tolerance, and the likely cause where a ratio says it
("your gradients are 8.00x the reference's (N = 8 devices): summed instead
of averaged?"). The comparison is by numbers, never by source text.
:func:`first_sentence` shows an error's message with its first sentence whole.
Tests: tests/lib/exercises/test_checks.py and tests/lib/test_checks_mutations.py.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
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


def compare(
    mine,
    reference,
    what: str,
    package_name: str,
    atol: float = 0.0,
    start=None,
    factors: Sequence[Factor] = (),
) -> CellCheck:
    """Compare the pytree ``mine`` (from the lesson's cell) with ``reference`` (from the package).

    Args:
        mine: what the lesson's cell produced (a pytree of arrays).
        reference: what ``package_name`` produced from the same inputs.
        what: what the trees are, for the sentence ("the parameters after one step").
        package_name: the package function, e.g. ``"train.make_pmap_step"``.
        atol: largest absolute difference still counted as the same
            (0: bit for bit).
        start: for a step's ``(params, opt_state, metrics)``, the
            ``(params, opt_state)`` it started from: a difference is then
            described leaf by leaf in words, with its likely cause
            (:func:`tree_difference`, constant factors from ``factors``).

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
        described = None
        if start is not None and isinstance(mine, (tuple, list)) and len(mine) == 3:
            described = tree_difference(
                tuple(mine),
                tuple(reference),
                roles=("parameters", "state", "value"),
                starts=(start[0], start[1], None),
                what=what,
                rel=0.0,
                rel_update=0.0,
                factors=factors,
            )
        if described is not None:
            return CellCheck(
                False,
                f"Your cell's {what} differ from {package_name}'s by up to {worst:.3g} (allowed {atol:.3g}): "
                f"{described}. The lesson below runs your version.",
            )
        return CellCheck(
            False,
            f"Your cell's {what} differ from {package_name}'s: {worst_name} by up to {worst:.3g} "
            f"(allowed {atol:.3g}). The lesson below runs your version.",
        )
    exact = "bit for bit" if worst == 0 else f"within {atol:.3g} (largest difference {worst:.3g})"
    return CellCheck(True, f"Your cell's {what} equal {package_name}'s {exact}.")


# --- Training steps: each leaf against its own scale -------------------------------------------

Factor = tuple[float, str, str]
"""A count a wrong step often multiplies by: ``(value, label, likely cause)``."""


def device_factor(n: int) -> Factor:
    """N devices: a gradient N times too large was summed over the devices instead of averaged."""
    why = "summed instead of averaged (a psum for a pmean, a sum for a mean, or a pmean on the sum a missing pcast makes)?"
    return (float(n), f"N = {n} devices", why)


def unbiased_factor(n: int) -> Factor:
    """N/(N-1): a sum over N devices divided by N - 1 (a variance's unbiased count) instead of by N."""
    return (n / (n - 1), f"N/(N\u22121) = {n}/{n - 1}", "divided by N \u2212 1 instead of by N devices?")


def microbatch_factor(k: int) -> Factor:
    """K microbatches: an accumulated gradient K times too large was not divided by K."""
    return (float(k), f"K = {k} microbatches", "the accumulated gradient not divided by K?")


def step_tolerances(platform: str) -> tuple[float, float]:
    """``(rel, rel_update)``: relative differences tolerated for a leaf, and for a parameter's change.

    ``rel`` holds for values (the loss, metrics, gradients, the optimizer's
    moments): float32 sums in another order differ by a few roundings, far
    below 1e-4 of a leaf's size on a CPU (measured: at most 4e-7 for AdamW's
    first moment, 1 device against 8 simulated ones, ``smoke`` and ``cpu``
    profiles); 1e-2 on a GPU, whose default float32 matmul runs as TF32
    (the reasons of :func:`dpcourse.train.equivalence_tolerances`).
    ``rel_update`` holds for the change a step made to a parameter: AdamW
    moves an element whose gradient lies within rounding of zero by up to
    the learning rate either way, so two correct steps differ more there
    (measured on a CPU: at most 3.3e-5 of the change, the ``cpu`` profile's
    input weight); 1e-3 on a CPU, 1e-1 on a GPU (ten times the gradient
    tolerance; not measured on a GPU here). A 1.3x learning rate is 0.3 and
    a 1.02x gradient 0.02 on the optimizer's first moment: both fail.
    """
    return (1e-4, 1e-3) if platform == "cpu" else (1e-2, 1e-1)


_PARAM_WORDS = {
    "w_in": "the input layer's weight",
    "b_in": "the input layer's bias",
    "w_block": "the block weight",
    "b_block": "the block bias",
    "w_out": "the output layer's weight",
    "b_out": "the output layer's bias",
}
_STATE_WORDS = {
    "mu": ("moment1", "the optimizer's first moment (its running mean of the gradients) of"),
    "nu": ("moment2", "the optimizer's second moment (its running mean of the squared gradients) of"),
    "count": ("count", "the optimizer's step count"),
}
_VALUE_WORDS = {"loss": "the loss", "accuracy": "the accuracy"}


def _token(entry):
    for attr in ("key", "name", "idx"):
        if hasattr(entry, attr):
            return getattr(entry, attr)
    return str(entry)


def _param_words(tokens: list) -> str:
    names = [t for t in tokens if isinstance(t, str)]
    if names and names[-1] in _PARAM_WORDS:
        return _PARAM_WORDS[names[-1]]
    return f"the parameter {names[-1]!r}" if names else "the parameter"


def _describe(role: str, tokens: list, keystr: str, what: str) -> tuple[str, str]:
    """``(kind, words)`` of one leaf: what the learner calls it."""
    if role == "parameters":
        return "update", f"the change your step made to {_param_words(tokens)}"
    if role == "gradient":
        return "gradient", f"the gradient of {_param_words(tokens)}"
    if role == "state":
        for i, t in enumerate(tokens):
            if t in _STATE_WORDS:
                kind, words = _STATE_WORDS[t]
                return kind, words if kind == "count" else f"{words} {_param_words(tokens[i + 1 :])}"
        return "state", f"{what}{keystr}"
    last = tokens[-1] if tokens else None
    if isinstance(last, str) and last in _VALUE_WORDS:
        return "value", _VALUE_WORDS[last]
    if not tokens:
        return "value", what
    ordinals = ("first", "second", "third", "fourth", "fifth")
    said = [f"{ordinals[t]} item" if isinstance(t, int) and 0 <= t < len(ordinals) else f"item {t!r}" for t in tokens]
    return "value", f"{what}'s " + ", ".join(said)


@dataclass(frozen=True)
class _Finding:
    kind: str
    words: str
    error: float  # relative difference; inf for a leaf that is zero in the reference only
    factor: float | None  # the constant factor mine = factor x reference, where one fits


def _measure(mine: np.ndarray, ref: np.ndarray, tol: float, elementwise: bool) -> tuple[float, float | None] | None:
    """None within ``tol``, else ``(relative difference, constant factor or None)``."""
    diff = mine - ref
    ref_norm = float(np.linalg.norm(ref))
    if ref_norm == 0.0:
        return None if not np.any(diff) else (float("inf"), None)
    error = float(np.linalg.norm(diff)) / ref_norm
    if elementwise:
        error = max(error, float(np.max(np.abs(diff))) / float(np.max(np.abs(ref))))
    if error <= tol:
        return None
    factor = float(np.vdot(mine, ref)) / ref_norm**2
    rest = float(np.linalg.norm(mine - factor * ref)) / ref_norm
    return error, (factor if rest <= max(tol, 1e-3 * abs(factor)) else None)


def _cause(k: float, factors: Sequence[Factor], otherwise: str) -> str:
    matches = [(label, why) for value, label, why in factors if abs(k - value) <= 0.01 * value]
    if matches:
        return f" ({' or '.join(m[0] for m in matches)}): {' Or '.join(m[1] for m in matches)}"
    for value, label, _ in factors:
        if value > 1 and abs(k - 1 / value) <= 0.01 / value:
            return f" (1/{value:g}, {label}): divided by it once too often?"
    if abs(k + 1) <= 0.01:
        return ": the opposite sign"
    return otherwise


def _named(found: list[_Finding], most: int = 3) -> str:
    """The leaves' words: all of them when few ("the loss and the accuracy"), else the first and a count."""
    words = list(dict.fromkeys(f.words for f in found))
    if len(words) == 1:
        return words[0]
    if len(words) <= most:
        return ", ".join(words[:-1]) + " and " + words[-1]
    return f"{words[0]} and {len(words) - 1} more"


def _explain(found: list[_Finding], noun: str | None, tol: float, factors: Sequence[Factor]) -> str:
    first = found[0]
    ks = [f.factor for f in found]
    named = _named(found)
    tolerated = f"a relative difference of at most {tol:g} is tolerated"
    if all(k is not None for k in ks) and max(ks) - min(ks) <= 0.01 * max(abs(k) for k in ks):
        k = float(np.median(ks))
        if noun == "gradients":
            cause = _cause(k, factors, ": a constant factor on the loss or its gradients?")
            return f"your gradients are {k:.3g}x the reference's{cause} ({named}; {tolerated})"
        if noun == "updates":
            cause = _cause(k, factors, ": a constant factor on the update: the learning rate?")
            return (
                f"your step's changes to the parameters are {k:.3g}x the reference's while the gradients "
                f"agree{cause} ({named}; {tolerated})"
            )
        if noun == "squared gradients":
            cause = _cause(abs(k) ** 0.5, factors, "")
            return (
                f"{named} {_verb(found)} {k:.3g}x the reference's, as if your gradients were "
                f"{abs(k) ** 0.5:.3g}x{cause} ({tolerated})"
            )
        return f"{named} {_verb(found)} {k:.3g}x the reference's{_cause(k, factors, '')} ({tolerated})"
    others = _named(found[1:]) if len(found) > 1 else ""
    also = f"; {others} {_verb(found[1:])} different too" if others else ""
    if first.error == float("inf"):
        return f"{first.words} is zero in the reference's and not in yours{also}"
    return (
        f"{first.words} differs from the reference's by {first.error:.2g} of its own size (relative "
        f"difference; at most {tol:g} is tolerated){also}"
    )


def _verb(found: list[_Finding]) -> str:
    return "is" if len(dict.fromkeys(f.words for f in found)) == 1 else "are"


# The step's quantities in the order it computes them: the loss and the metrics, the gradients
# (and the first moment, a fixed multiple of them after one step), the second moment, the
# updates; the first group that differs is the one reported, the earliest cause.
_ORDER = (
    (("value",), None),
    (("gradient", "moment1"), "gradients"),
    (("moment2",), "squared gradients"),
    (("update",), "updates"),
    (("count", "state"), None),
)


def _weight_decay(changes: list[tuple[np.ndarray, np.ndarray, np.ndarray]]) -> str | None:
    """A difference of updates proportional to the parameters themselves: the weight decay term."""
    if not changes:
        return None
    diff = np.concatenate([(m - r).ravel() for m, r, _ in changes])
    start = np.concatenate([s.ravel() for _, _, s in changes])
    ref = np.concatenate([r.ravel() for _, r, _ in changes])
    start_sq = float(np.vdot(start, start))
    if start_sq == 0.0 or not np.any(diff):
        return None
    c = float(np.vdot(diff, start)) / start_sq
    noise = float(np.linalg.norm(diff - c * start)) / np.sqrt(diff.size) / np.sqrt(start_sq)
    # 20 standard errors: differences of rounding do not follow the parameters' signs.
    if abs(c) <= 20 * noise:
        return None
    share = abs(c) * np.sqrt(start_sq) / max(float(np.linalg.norm(ref)), 1e-300)
    return (
        f"your step's changes to the parameters differ from the reference's by {c:+.2g} x each parameter's "
        f"own value ({share:.2g} of the change, far above rounding): the weight decay term; a flipped sign, "
        "or another weight decay?"
    )


def tree_difference(
    mine,
    reference,
    *,
    roles: str | Sequence[str] = "value",
    starts: Sequence | None = None,
    what: str = "the output",
    rel: float = 1e-4,
    rel_update: float = 1e-3,
    factors: Sequence[Factor] = (),
) -> str | None:
    """None when ``mine`` matches ``reference`` leaf by leaf, else a sentence (lower-case start) saying what differs.

    Each float leaf is compared with its own scale: the root-mean-square of
    ``mine - reference`` relative to the reference leaf's (and, for values,
    the largest element's difference relative to the largest element),
    within ``rel``; a parameter's change (``mine - start`` against
    ``reference - start``) within ``rel_update``. Integer leaves must be
    equal. Where a leaf differs by a constant factor, the sentence says it
    and names the likely cause from ``factors`` (:func:`device_factor`,
    :func:`microbatch_factor`); a difference proportional to the parameters
    is named as the weight decay.

    Args:
        mine, reference: pytrees of the same structure.
        roles: one role for the whole tree, or one per top-level element of a
            tuple or list: ``"parameters"`` (compared as changes from the
            matching ``starts`` entry), ``"state"`` (an optax state:
            ``mu``, ``nu``, ``count``), ``"gradient"`` or ``"value"``.
        starts: the tree ``mine`` started from (one role), or one such tree
            or None per top-level element.
        what: the tree's name, for leaves that have no words of their own.

    Raises:
        ValueError: ``roles`` or ``starts`` does not have one entry per top-level element.
    """
    import jax

    if jax.tree.structure(mine) != jax.tree.structure(reference):
        return f"{what} has another structure than the reference's: {structure_difference(mine, reference)}"
    if isinstance(roles, str):
        parts, role_of, start_of = [(mine, reference)], [roles], [starts]
    else:
        if not isinstance(mine, (tuple, list)) or len(roles) != len(mine) or (starts and len(starts) != len(mine)):
            raise ValueError(f"Give one role (and one start, or None) per top-level element of {what}; got {roles}.")
        parts, role_of = list(zip(mine, reference)), list(roles)
        start_of = list(starts) if starts else [None] * len(mine)
    found: list[_Finding] = []
    changes: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
    for index, ((m_part, r_part), role, start) in enumerate(zip(parts, role_of, start_of)):
        prefix = [] if isinstance(roles, str) else [index]
        start_leaves = [a for _, a in _leaves(start)] if start is not None else None
        for j, ((path, ref), (_, got)) in enumerate(zip(jax.tree_util.tree_leaves_with_path(r_part), _leaves(m_part))):
            ref = np.asarray(jax.device_get(ref))
            tokens = prefix + [_token(e) for e in path]
            keystr = "".join(f"[{t!r}]" for t in tokens)
            kind, words = _describe(role, tokens, keystr, what)
            if got.shape != ref.shape:
                return f"{words} has shape {got.shape}; the reference's has {ref.shape}"
            if got.dtype != ref.dtype:
                return f"{words} has dtype {got.dtype}; the reference's has {ref.dtype}"
            if not ref.size:
                continue
            if not np.issubdtype(ref.dtype, np.floating):
                if not np.array_equal(got, ref):
                    wrong = int(np.sum(got != ref))
                    found.append(_Finding(kind, words, float(wrong) / ref.size, None))
                continue
            g64, r64 = got.astype(np.float64), ref.astype(np.float64)
            s64 = None
            if start_leaves is not None and j < len(start_leaves) and start_leaves[j].shape == ref.shape:
                s64 = start_leaves[j].astype(np.float64)
                g64, r64 = g64 - s64, r64 - s64
            tol = rel_update if kind == "update" else rel
            if kind == "update" and s64 is not None:
                changes.append((g64, r64, s64))
            measured = _measure(g64, r64, tol, elementwise=kind != "update")
            if measured is not None:
                found.append(_Finding(kind, words, *measured))
    for kinds, noun in _ORDER:
        group = [f for f in found if f.kind in kinds]
        group.sort(key=lambda f: f.words != "the loss")  # the loss is computed first, the metrics from it
        if group:
            tol = rel_update if noun == "updates" else rel
            return _explain(group, noun, tol, factors)
    return _weight_decay(changes)


def compare_steps(
    mine,
    reference,
    start,
    what: str,
    reference_name: str,
    platform: str = "cpu",
    factors: Sequence[Factor] = (),
) -> CellCheck:
    """Compare two ``(params, opt_state, metrics)`` after the same steps from ``start = (params, opt_state)``.

    Each leaf against its own scale (:func:`tree_difference`, tolerances
    :func:`step_tolerances` for ``platform``): a parameter by the change the
    steps made, the optimizer state and the metrics as they are. Lessons 04,
    05 and 10 use it for "N devices give the same training as one" and for
    their own cells against the package's forms.

    Returns:
        A :class:`CellCheck`; ``message`` is one sentence (what differs, by
        how much, the tolerance and the likely cause) that an ``assert`` can show.
    """
    rel, rel_update = step_tolerances(platform)
    problem = tree_difference(
        tuple(mine),
        tuple(reference),
        roles=("parameters", "state", "value"),
        starts=(start[0], start[1], None),
        what=what,
        rel=rel,
        rel_update=rel_update,
        factors=factors,
    )
    if problem is None:
        return CellCheck(
            True,
            f"{what} agree with {reference_name}'s, each leaf within its tolerance (a relative difference "
            f"of at most {rel:g}, {rel_update:g} for the change to a parameter).",
        )
    return CellCheck(False, f"{what} differ from {reference_name}'s: {problem}.")


# --- Error messages ---------------------------------------------------------------------------

_SENTENCE_END = re.compile(r"(?<=[.!?])(?<!e\.g\.)(?<!i\.e\.)\s+|\s*\n\s*")


def first_sentence(err: BaseException | str, limit: int = 400, cap: int = 1200) -> str:
    """An error's message from its start: the first sentence whole, then whole sentences within ``limit`` characters.

    A sentence that ends with a colon goes on with what it introduces (JAX's
    ``shard_map`` errors put the explanation after "given the mesh:"). A
    line break counts as a sentence end; whitespace is joined to single spaces
    (``limit=0``: the first sentence only, for a table's one line). A
    first sentence longer than ``limit`` is shown whole; only one longer
    than ``cap`` (a dump, not a sentence) is cut, at a word, with " ...".
    """
    text = str(err).strip()
    pieces = [" ".join(p.split()) for p in _SENTENCE_END.split(text) if p and p.strip()]
    if not pieces:
        return type(err).__name__ if isinstance(err, BaseException) else ""
    out = pieces[0]
    for piece in pieces[1:]:
        if not out.endswith(":") and len(out) + 1 + len(piece) > limit:
            break
        out = f"{out} {piece}"
    if len(out) > max(cap, limit):
        out = out[: max(cap, limit)].rsplit(" ", 1)[0] + " ..."
    return out


def beyond(what: str, value: float, tolerance: float, likely: str = "") -> str:
    """The sentence an ``assert value < tolerance`` shows: what differs, by how much, the tolerance, the likely cause.

    For example ``assert equiv < tol, checks.beyond("the parameters after 3 steps, N devices against one",
    equiv, tol, "a reduction that sums, or a batch split unevenly")``.
    """
    sentence = f"{what[:1].upper()}{what[1:]} differ by {value:.3g}, above the tolerance {tolerance:.3g}"
    return f"{sentence}: {likely}" if likely else f"{sentence}."
