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

from dpcourse.checks import structure_difference
from dpcourse.exercises.base import CORRECT, WRONG, ExerciseFailed, Feedback, strict


def _name(fn: Callable) -> str:
    """``module.name`` of a function (of the wrapped one for a ``functools.partial``); the bare name for ``__main__``."""
    while isinstance(fn, functools.partial):
        fn = fn.func
    name = getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None) or type(fn).__name__
    module = getattr(fn, "__module__", None)
    return name if module in (None, "__main__") else f"{module}.{name}"


def _platform(tree) -> str:
    import jax

    for leaf in jax.tree.leaves(tree):
        devices = getattr(leaf, "devices", None)
        if callable(devices):
            return next(iter(devices())).platform
    return jax.default_backend()


def tolerance(platform: str) -> float:
    """Largest tolerated difference, relative to the reference's largest element.

    The same reasoning as :func:`dpcourse.train.equivalence_tolerances`:
    float32 on a CPU (1e-4, far above a few roundings); 1e-2 on a GPU, whose
    default float32 matmul runs as TF32.
    """
    return 1e-4 if platform == "cpu" else 1e-2


def _is_scalar_float(leaf) -> bool:
    return np.ndim(leaf) == 0 and np.issubdtype(np.asarray(leaf).dtype, np.floating)


def compare_trees(reference, mine, what: str, rel: float) -> str | None:
    """None when ``mine`` matches ``reference`` (structure, shapes, dtypes, values within ``rel``), else a sentence."""
    import jax

    ref_paths, ref_def = jax.tree_util.tree_flatten_with_path(reference)
    my_leaves, my_def = jax.tree.flatten(mine)
    if ref_def != my_def:
        return f"{what} has another structure than the reference's: {structure_difference(mine, reference)}."
    leaves = [np.asarray(jax.device_get(leaf)) for _, leaf in ref_paths]
    scale = max((float(np.max(np.abs(a.astype(np.float64)))) for a in leaves if a.size), default=0.0) or 1.0
    for (path, _), ref, got in zip(ref_paths, leaves, my_leaves):
        got = np.asarray(jax.device_get(got))
        name = f"{what}{jax.tree_util.keystr(path)}"
        if got.shape != ref.shape:
            return f"{name} has shape {got.shape}; the reference has {ref.shape}."
        if got.dtype != ref.dtype:
            return f"{name} has dtype {got.dtype}; the reference has {ref.dtype}."
        if ref.size:
            diff = float(np.max(np.abs(got.astype(np.float64) - ref.astype(np.float64))))
            if diff > rel * scale:
                return (
                    f"{name} differs by up to {diff:.3g}, which is {diff / scale:.2g} times the reference's "
                    f"largest value ({scale:.3g}); at most {rel:g} times is tolerated."
                )
    return None


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


def check_against(reference: Callable, mine: Callable, *args, rel: float | None = None) -> Feedback:
    """Run ``mine(*args)`` and ``reference(*args)`` (compiled) and compare their outputs (and gradients).

    Outputs must have the same structure, shapes and dtypes, and values
    within ``rel`` of the reference's largest element (default:
    :func:`tolerance` for the platform of ``args``). When the first output
    is a float scalar (a loss) and ``args[0]`` holds float arrays (the
    parameters), the gradients of that scalar with respect to ``args[0]``
    are compared too, so a cell that gets the loss right but cuts the
    gradient (a ``stop_gradient``, say) is caught. Neither function may
    donate its arguments.

    Returns:
        A :class:`Feedback` (it renders as a box in a notebook): "correct"
        when everything matches, else "wrong" with a sentence naming the
        first output that differs and by how much, or what ``mine`` raised.

    Raises:
        ExerciseFailed: in strict mode (``DPCOURSE_EXERCISES_STRICT=1``, the
            course's CI) when the two differ.
    """
    import jax

    label = f"{_name(mine)} (your cell) vs {_name(reference)}"
    rel = tolerance(_platform(args)) if rel is None else rel
    ref_out = compiled_call(reference, args)
    try:
        my_out = compiled_call(mine, args)
        problem = compare_trees(ref_out, my_out, "the output", rel)
    except Exception as err:  # noqa: BLE001 - the learner reads a sentence
        first = (str(err).strip().splitlines() or [""])[0]
        problem = f"your cell raised {type(err).__name__}: {first[:200]}"
    if problem is None:
        first_ref = jax.tree.leaves(ref_out)[0] if jax.tree.leaves(ref_out) else None
        params_float = all(np.issubdtype(np.asarray(a).dtype, np.floating) for a in jax.tree.leaves(args[0]))
        if first_ref is not None and _is_scalar_float(first_ref) and args and params_float:

            def grad_of(fn):
                return compiled_call(jax.grad(lambda p: jax.tree.leaves(fn(p, *args[1:]))[0]), args[:1])

            ref_grad = grad_of(reference)
            try:
                problem = compare_trees(ref_grad, grad_of(mine), "the gradient", rel)
            except Exception as err:  # noqa: BLE001 - the learner reads a sentence
                first = (str(err).strip().splitlines() or [""])[0]
                problem = f"taking the gradient of your cell's loss raised {type(err).__name__}: {first[:200]}"
                if type(err).__name__ in _TRACER_ERRORS:
                    problem += " (jax.grad traces your cell: use jax.numpy, not numpy, float() or int(), on values)"
    if problem is None:
        feedback = Feedback(label, CORRECT, "Right: same outputs (and gradients) as the package's version, in numbers.")
    else:
        feedback = Feedback(label, WRONG, f"Your cell computes something else: {problem}")
    if strict() and not feedback.correct:
        raise ExerciseFailed(str(feedback))
    return feedback
