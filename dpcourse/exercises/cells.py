"""Check a lesson's own code cell against the package's reusable version, with numbers.

Lessons 02 to 05 write the code they teach (the forward pass, the loss, the
training step, the device-axis step, the ``shard_map`` step) in their own
editable cells; ``dpcourse.model`` and ``dpcourse.train`` keep the reusable
versions that later lessons and the tests use. :func:`check_against` runs
both on the same arguments and says in a sentence what differs, so a learner
who changed a cell learns what the change did (never by comparing source).
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import numpy as np

from dpcourse.exercises.base import CORRECT, WRONG, ExerciseFailed, Feedback, strict, under_global_mesh
from dpcourse.exercises.checks import (
    Factor,
    device_factor,
    first_sentence,
    step_tolerances,
    tree_difference,
    unbiased_factor,
)


def _name(fn: Callable) -> str:
    """``module.name`` of a function (of the wrapped one for a ``functools.partial``); the bare name for ``__main__``."""
    while isinstance(fn, functools.partial):
        fn = fn.func
    name = getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None) or type(fn).__name__
    module = getattr(fn, "__module__", None)
    maker, _, inner = name.rpartition(".<locals>.")  # a step made by a function: make_step.<locals>.step
    if maker:
        return inner if module in (None, "__main__") else f"{inner} (made by {module}.{maker})"
    return name if module in (None, "__main__") else f"{module}.{name}"


def _platform(tree) -> str:
    import jax

    for leaf in jax.tree.leaves(tree):
        devices = getattr(leaf, "devices", None)
        if callable(devices):
            return next(iter(devices())).platform
    return jax.default_backend()


def tolerance(platform: str) -> float:
    """Largest tolerated relative difference of a value (an output, a gradient) on ``platform``.

    :func:`dpcourse.exercises.checks.step_tolerances` gives the reasons: float32
    on a CPU (1e-4, far above a few roundings); 1e-2 on a GPU, whose
    default float32 matmul runs as TF32.
    """
    return step_tolerances(platform)[0]


def _is_scalar_float(leaf) -> bool:
    return np.ndim(leaf) == 0 and np.issubdtype(np.asarray(leaf).dtype, np.floating)


def _same_layout(tree, other) -> bool:
    import jax

    leaves, treedef = jax.tree.flatten(tree)
    other_leaves, other_def = jax.tree.flatten(other)
    return (
        bool(leaves) and treedef == other_def and all(np.shape(a) == np.shape(b) for a, b in zip(leaves, other_leaves))
    )


def step_roles(out, args: tuple) -> tuple[str | tuple[str, ...], object]:
    """``(roles, starts)`` for :func:`dpcourse.exercises.checks.tree_difference` of a function's output.

    An element of a tuple output laid out like ``args[0]`` is the updated
    parameters (compared by the change from ``args[0]``); one laid out like
    another argument is state (the optimizer's, compared by its change);
    anything else is a value. A single output is a value.
    """
    if not isinstance(out, (tuple, list)):
        return "value", None
    roles, starts = [], []
    for part in out:
        match = next((j for j, arg in enumerate(args) if _same_layout(part, arg)), None)
        roles.append("value" if match is None else "parameters" if match == 0 else "state")
        starts.append(None if match is None else args[match])
    return tuple(roles), tuple(starts)


def _device_count(tree) -> int:
    import jax

    counts = [len(leaf.sharding.device_set) for leaf in jax.tree.leaves(tree) if isinstance(leaf, jax.Array)]
    return max(counts, default=1)


def _sentence(problem: str) -> str:
    return problem if problem.endswith(("?", ".")) else problem + "."


def compare_trees(
    reference,
    mine,
    what: str,
    rel: float,
    *,
    roles: str | tuple[str, ...] = "value",
    starts=None,
    rel_update: float | None = None,
    factors: tuple[Factor, ...] = (),
) -> str | None:
    """None when ``mine`` matches ``reference`` (structure, shapes, dtypes, each leaf within ``rel`` of its own size).

    Else a sentence: what differs in words, by how much, the tolerance and
    the likely cause (:func:`dpcourse.exercises.checks.tree_difference`, whose
    ``roles``, ``starts`` and ``factors`` these are); ``rel_update``
    (default ``10 x rel``) is the tolerance of a parameter's change.
    """
    problem = tree_difference(
        mine,
        reference,
        roles=roles,
        starts=starts,
        what=what,
        rel=rel,
        rel_update=10 * rel if rel_update is None else rel_update,
        factors=factors,
    )
    return None if problem is None else _sentence(problem)


def compiled_call(fn: Callable, args: tuple):
    """``jax.jit(fn)(*args)``; ``fn(*args)`` where ``fn`` cannot be traced (Python control flow on values).

    Compiled, a ``shard_map`` step takes a fraction of a second; run op by op
    outside ``jit`` it takes seconds, at each check. Traced afresh at each
    call: ``jax.jit(fn)`` would reuse the trace of an earlier check of the
    same function, made before a global it reads (a helper, a constant) was
    changed, and judge the old code.
    """
    import jax

    try:
        return jax.jit(lambda *a: fn(*a))(*args)
    except (jax.errors.ConcretizationTypeError, TypeError):
        return fn(*args)


_TRACER_ERRORS = (
    "ConcretizationTypeError",
    "TracerArrayConversionError",
    "TracerIntegerConversionError",
    "TracerBoolConversionError",
)


def _hint(err: BaseException) -> str:
    """What a known JAX error means in a step cell, or ""."""
    text = str(err)
    if "out_specs" in text and ("vary" in text or "replicat" in text):
        return (
            " In words: an output whose out_specs is P() (the same on every device) still differs between"
            " devices: average it over the axis with jax.lax.pmean, as the gradients are, before"
            " returning it (the loss and the metrics too)."
        )
    return ""


def check_against(
    reference: Callable, mine: Callable, *args, rel: float | None = None, factors: tuple[Factor, ...] = ()
) -> Feedback:
    """Run ``mine(*args)`` and ``reference(*args)`` (compiled) and compare their outputs (and gradients).

    Outputs must have the same structure, shapes and dtypes, and each leaf
    must lie within ``rel`` of the reference leaf's own size (default:
    :func:`tolerance` for the platform of ``args``): a step's updated
    parameters by the change from ``args[0]`` (within ``10 x rel`` on that
    platform's scale, :func:`dpcourse.exercises.checks.step_tolerances`), its
    optimizer state by its change, its loss and metrics as they are
    (:func:`step_roles`). When the first output is a float scalar (a loss)
    and ``args[0]`` holds float arrays (the parameters), the gradients of
    that scalar with respect to ``args[0]`` are compared too, so a cell
    that gets the loss right but cuts the gradient (a ``stop_gradient``,
    say) is caught. A constant factor is named with its likely cause: N
    (the devices ``args`` live on) for a sum instead of a mean, and each of
    ``factors`` (e.g. :func:`dpcourse.exercises.checks.microbatch_factor`).
    Neither function may donate its arguments.

    Returns:
        A :class:`Feedback` (it renders as a box in a notebook): "correct"
        when everything matches, else "wrong" with a sentence naming what
        differs in words ("the optimizer's first moment of the block
        weight"), by how much, the tolerance and the likely cause, or what
        ``mine`` raised (its message's first sentence whole).

    Raises:
        ExerciseFailed: in strict mode (``DPCOURSE_EXERCISES_STRICT=1``, the
            course's CI) when the two differ.
    """
    import jax

    label = f"{_name(mine)} (your cell) vs {_name(reference)}"
    platform = _platform(args)
    rel_value, rel_update = step_tolerances(platform)
    if rel is not None:
        rel_value, rel_update = rel, 10 * rel
    n = _device_count(args)
    factors = tuple(factors) + ((device_factor(n),) if n > 1 else ()) + ((unbiased_factor(n),) if n > 2 else ())
    ref_out = compiled_call(reference, args)
    roles, starts = step_roles(ref_out, args)
    try:
        my_out = compiled_call(mine, args)
        problem = compare_trees(
            ref_out,
            my_out,
            "the output",
            rel_value,
            roles=roles,
            starts=starts,
            rel_update=rel_update,
            factors=factors,
        )
    except Exception as raised:  # noqa: BLE001 - the learner reads a sentence
        err = under_global_mesh(raised)
        problem = f"your cell raised {type(err).__name__}: {first_sentence(err)}" + _hint(err)
    if problem is None:
        first_ref = jax.tree.leaves(ref_out)[0] if jax.tree.leaves(ref_out) else None
        params_float = all(np.issubdtype(np.asarray(a).dtype, np.floating) for a in jax.tree.leaves(args[0]))
        if first_ref is not None and _is_scalar_float(first_ref) and args and params_float:

            def grad_of(fn):
                return compiled_call(jax.grad(lambda p: jax.tree.leaves(fn(p, *args[1:]))[0]), args[:1])

            ref_grad = grad_of(reference)
            try:
                problem = compare_trees(
                    ref_grad, grad_of(mine), "the gradient", rel_value, roles="gradient", factors=factors
                )
            except Exception as raised:  # noqa: BLE001 - the learner reads a sentence
                err = under_global_mesh(raised)
                problem = f"taking the gradient of your cell's loss raised {type(err).__name__}: {first_sentence(err)}"
                if type(err).__name__ in _TRACER_ERRORS:
                    problem += " (jax.grad traces your cell: use jax.numpy, not numpy, float() or int(), on values)"
    if problem is None:
        feedback = Feedback(
            label,
            CORRECT,
            "Right: same outputs (and gradients) as the package's version, in numbers: each leaf within "
            f"{rel_value:g} of its own size, a parameter's change within {rel_update:g}.",
        )
    else:
        feedback = Feedback(label, WRONG, f"Your cell computes something else: {problem}")
    if strict() and not feedback.correct:
        raise ExerciseFailed(str(feedback))
    return feedback
