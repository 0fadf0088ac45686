"""What every exercise checker shares: feedback, "not attempted yet", type and shape checks.

A checker takes the learner's answer (and the lesson's context), compares it
with a reference it computes itself, and returns a :class:`Feedback` that a
notebook displays as the last value of a cell. A checker never raises at a
learner: a wrong type or shape, or an answer that crashes, becomes a
"bad input" feedback that says what was expected and what came. Only with
``DPCOURSE_EXERCISES_STRICT=1`` (the run with solutions filled in, in CI)
does a feedback other than "correct" raise :class:`ExerciseFailed`.
"""

from __future__ import annotations

import ast
import functools
import html
import linecache
import os
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

STRICT_ENV = "DPCOURSE_EXERCISES_STRICT"

CORRECT = "correct"
WRONG = "wrong"
NOT_ATTEMPTED = "not attempted yet"
BAD_INPUT = "bad input"
UNAVAILABLE = "cannot check here"

_STYLE = {
    CORRECT: ("#e7f5e9", "#1b7a2f", "Correct"),
    WRONG: ("#fdecea", "#a31515", "Not yet"),
    NOT_ATTEMPTED: ("#f3f3f3", "#555555", "Not attempted yet"),
    BAD_INPUT: ("#fff4e0", "#8a5300", "Cannot check this answer"),
    UNAVAILABLE: ("#f3f3f3", "#555555", "Cannot check here"),
}


class ExerciseFailed(AssertionError):
    """Raised in strict mode (``DPCOURSE_EXERCISES_STRICT=1``) by any feedback but "correct"."""


@dataclass(frozen=True)
class Feedback:
    """The outcome of one check.

    Attributes:
        exercise: the exercise's id, e.g. ``"ex04_2"``.
        status: one of "correct", "wrong", "not attempted yet", "bad input",
            "cannot check here".
        message: one or two sentences: what is right, or what is wrong and why.
        mistake: for a wrong answer, the named mistake's short id (``"whole-array"``;
            :func:`mistake_id` names one a checker did not); ``""`` otherwise.
    """

    exercise: str
    status: str
    message: str
    mistake: str = ""

    @property
    def correct(self) -> bool:
        return self.status == CORRECT

    @property
    def title(self) -> str:
        """The exercise as the lesson names it: ``"ex05_1"`` is shown as ``"Exercise 05.1"``; other labels as they are."""
        found = re.fullmatch(r"ex(\d\d)_(\d+)", self.exercise)
        return f"Exercise {found[1]}.{found[2]}" if found else self.exercise

    def __str__(self) -> str:
        if self.status == CORRECT:  # the message itself starts with "Right:"
            return f"[{self.title}] {self.message}"
        return f"[{self.title}] {_STYLE[self.status][2]}: {self.message}"

    __repr__ = __str__

    def _repr_html_(self) -> str:
        background, colour, title = _STYLE[self.status]
        return (
            f'<div style="background:{background};border-left:4px solid {colour};padding:6px 10px;margin:4px 0">'
            f'<b style="color:{colour}">{html.escape(self.title)} · {title}</b><br>{render_inline(self.message)}</div>'
        )


def render_inline(text: str) -> str:
    """HTML for a checker message: escaped, with each \u0060code\u0060 span shown as ``<code>``.

    Messages are shown as HTML in a notebook (a cell's last value), where
    markdown is not rendered: a backtick pair would show as raw backticks.
    """
    parts = html.escape(text).split("`")
    if len(parts) % 2 == 0:  # an unpaired backtick: leave it as it is
        return html.escape(text)
    return "".join(f"<code>{part}</code>" if i % 2 else part for i, part in enumerate(parts))


class Reject(Exception):  # noqa: N818 - a control-flow signal inside checkers, never seen by a learner
    """Raised inside a checker to end it with a given feedback status and message."""

    def __init__(self, status: str, message: str, mistake: str = ""):
        super().__init__(message)
        self.status = status
        self.message = message
        self.mistake = mistake


def wrong(message: str, mistake: str = "") -> Reject:
    """End the check: the answer is wrong, and ``message`` says why.

    ``mistake``: a short id naming the mistake (``"whole-array"``), which the
    learner's progress record and the instructor's board count; without one,
    :func:`mistake_id` names it from the message.
    """
    return Reject(WRONG, message, mistake or mistake_id(message))


_VARYING = re.compile(r"\([^()]*\)|\[[^\]]*\]|`[^`]*`|'[^']*'|\d+(\.\d+)?(e[+-]?\d+)?")
_SMALL_WORDS = {"the", "a", "an", "of", "to", "is", "in", "on", "by", "so", "and", "it", "you", "your", "that", "this"}


def mistake_id(message: str) -> str:
    """A short id for a wrong answer's message: its first words, without the figures that vary.

    ``"Under P('data', None) you gave the whole array: ..."`` and the same
    sentence for another spec or device count both give ``"under-gave-whole-array"``.
    """
    text = _VARYING.sub(" ", message.split(":")[0].split(";")[0].lower())
    words = [w for w in re.findall(r"[a-z]{2,}", text) if w not in _SMALL_WORDS]
    return "-".join(words[:4]) or "wrong"


def bad_input(message: str) -> Reject:
    """End the check: the answer has the wrong type or shape; ``message`` says what was expected."""
    return Reject(BAD_INPUT, message)


def unavailable(message: str) -> Reject:
    """End the check: this run cannot check the exercise (e.g. too few measured sizes)."""
    return Reject(UNAVAILABLE, message)


def strict() -> bool:
    """Whether a feedback other than "correct" must fail the cell (the run with solutions)."""
    return os.environ.get(STRICT_ENV, "").strip() not in ("", "0")


def untouched(answer) -> bool:
    """True for an answer still at the placeholder: ``...`` or ``None``."""
    return answer is Ellipsis or answer is None


def checker(exercise: str, expects: str) -> Callable:
    """Decorate a checker ``fn(answer, *context) -> str`` (the success message).

    The wrapper returns a :class:`Feedback`: "not attempted yet" for an
    untouched answer; the message of a :class:`Reject` raised inside; "bad
    input" naming ``expects`` for any other exception (a learner's function
    that crashed, an answer of an unusable type); "correct" with the returned
    message otherwise. In strict mode anything but "correct" (or "cannot
    check here") raises :class:`ExerciseFailed`.
    """

    def wrap(fn: Callable[..., str]) -> Callable[..., Feedback]:
        @functools.wraps(fn)
        def check(answer=Ellipsis, *context, **kwargs) -> Feedback:
            failed = failed_exercise_cell(answer, sys._getframe(1)) if untouched(answer) else None
            if failed is not None:
                name, err = failed
                feedback = Feedback(
                    exercise,
                    BAD_INPUT,
                    f"Your exercise cell raised {type(err).__name__}: {first_sentence(err)} So `{name}` still "
                    "holds the `...` it had before: fix that error, run the exercise cell again, then this cell.",
                )
            elif untouched(answer):
                feedback = Feedback(
                    exercise,
                    NOT_ATTEMPTED,
                    f"Replace the `...` in the exercise cell with {expects}, then run this cell.",
                )
            else:
                try:
                    feedback = Feedback(exercise, CORRECT, fn(answer, *context, **kwargs))
                except Reject as stop:
                    feedback = Feedback(exercise, stop.status, stop.message, stop.mistake)
                except Exception as raised:  # noqa: BLE001 - a learner sees a sentence, never a traceback
                    err = under_global_mesh(raised)
                    feedback = Feedback(
                        exercise,
                        BAD_INPUT,
                        f"Expected {expects}; using your answer raised {type(err).__name__}: {first_sentence(err)}",
                        f"raised-{type(err).__name__}",
                    )
            if feedback.status == BAD_INPUT and not feedback.mistake:
                feedback = Feedback(exercise, BAD_INPUT, feedback.message, "bad-input")
            from dpcourse.exercises import progress

            progress.record_check(exercise, feedback.status, feedback.mistake, feedback.message)
            if strict() and feedback.status not in (CORRECT, UNAVAILABLE):
                raise ExerciseFailed(str(feedback))
            return feedback

        check.exercise = exercise
        check.expects = expects
        return check

    return wrap


def failed_exercise_cell(answer, caller) -> tuple[str, BaseException] | None:
    """``(name, error)`` when the newest error of this IPython kernel came from a cell that assigns ``answer``'s name.

    An exercise cell that raises never stores its answer, so the name keeps
    the ``...`` of an earlier run and the check would say "not attempted
    yet". IPython keeps the newest error of a cell in ``sys.last_value``
    (and its traceback, whose first frame in a cell is that cell's code,
    with the cell's source in ``linecache``), and each cell's source in
    its input history ``In``. ``caller`` is the check cell's frame: the
    answer's name is a global of it that holds ``answer``. None outside
    IPython, when no such cell failed, or when the exercise cell ran again
    after it failed.
    """
    err, tb = getattr(sys, "last_value", None), getattr(sys, "last_traceback", None)
    if err is None or tb is None or caller is None:
        return None
    while tb is not None and tb.tb_frame.f_code.co_name != "<module>":
        tb = tb.tb_next
    if tb is None:
        return None
    source = "".join(linecache.getlines(tb.tb_frame.f_code.co_filename))
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return None
    assigned = {
        target.id
        for node in tree.body
        if isinstance(node, (ast.Assign, ast.AnnAssign))
        for target in (node.targets if isinstance(node, ast.Assign) else [node.target])
        if isinstance(target, ast.Name)
    }
    names = sorted(n for n in assigned if caller.f_globals.get(n, object()) is answer)
    # IPython's input history ("In"): the newest run of the cell that assigns the name must be the failed one,
    # not an older error that a later, successful run of the exercise cell left behind.
    history = caller.f_globals.get("In")
    if not names or not isinstance(history, list):
        return None
    runs = [text for text in history[:-1] if _assigns(text, names[0])]
    return (names[0], err) if runs and runs[-1].strip() == source.strip() else None


def _assigns(text: str, name: str) -> bool:
    return re.search(rf"^{re.escape(name)}\s*(:[^=]*)?=(?!=)", text, flags=re.M) is not None


def under_global_mesh(err: BaseException) -> BaseException:
    """``err``, or the course's sentence when it stopped under a global mesh other than the lesson's (mesh_guard)."""
    from dpcourse.backend import mesh_guard

    return mesh_guard.explain(err) or err


def first_sentence(err: BaseException, limit: int = 400) -> str:
    """The start of an error's message, its first sentence whole (:func:`dpcourse.exercises.checks.first_sentence`)."""
    from dpcourse.exercises.checks import first_sentence as whole_first_sentence

    return whole_first_sentence(err, limit)


def describe(value) -> str:
    """A short description of a value's type (and shape and dtype for arrays)."""
    if hasattr(value, "shape") and hasattr(value, "dtype"):
        return f"{type(value).__name__} of shape {tuple(value.shape)} and dtype {value.dtype}"
    if isinstance(value, (tuple, list)):
        return f"{type(value).__name__} of length {len(value)}"
    return f"{type(value).__name__} {value!r}"[:120]


_WHOLE_WORDS = re.compile(r"\b(batch|batches|rows|count|counts|examples per device)\b", re.IGNORECASE)


def as_number(answer, what: str = "a number", positive: bool = False, whole: bool | None = None) -> float:
    """The answer as a float, or a :class:`Reject` saying what came instead.

    Not a number, not finite, or not positive where ``positive``: "bad input".
    A fraction where a whole number is meant: "wrong", with the reason.

    ``positive``: also refuse zero and negative values (sizes, times, counts).
    ``whole``: refuse a value that is not a whole number (a batch of 6.554
    examples does not exist). ``None`` (the default) decides from ``what``:
    a batch, rows or a count must be whole; ``"examples/s"`` need not.
    """
    if whole is None:
        whole = bool(_WHOLE_WORDS.search(what.replace("examples/s", "")))
    if isinstance(answer, bool) or not isinstance(answer, (int, float, np.integer, np.floating)):
        if hasattr(answer, "shape") and np.shape(answer) == () and np.issubdtype(np.asarray(answer).dtype, np.number):
            return float(np.asarray(answer))
        raise bad_input(f"Expected {what} (an int or a float); got {describe(answer)}.")
    value = float(answer)
    if not np.isfinite(value):
        raise bad_input(f"Expected a finite number for {what}; got {value}.")
    if positive and value <= 0:
        raise bad_input(f"Expected a positive number for {what}; got {value:g}.")
    if whole and value != round(value):
        # A wrong answer, not unreadable input: the learner gets the reason, not "cannot check".
        raise wrong(
            f"{what[:1].upper()}{what[1:]} is a whole number: there is no fraction of an example or of "
            f"a collective; you gave {value:g}. Round to the size you mean."
        )
    return value


def how_far(value: float, reference: float) -> str:
    """``"about 129x too large"`` / ``"about 3.2x too small"``: how a numeric answer misses (both positive)."""
    ratio = value / reference
    return f"about {ratio:.3g}x too large" if ratio >= 1 else f"about {1 / ratio:.3g}x too small"


def as_tuple(answer, length: int, what: str) -> tuple:
    """The answer as a tuple of ``length`` items, or a "bad input" :class:`Reject`."""
    if not isinstance(answer, (tuple, list)) or len(answer) != length:
        raise bad_input(f"Expected {what}: a tuple of {length} items; got {describe(answer)}.")
    return tuple(answer)


def as_shape(answer, what: str) -> tuple[int, ...] | None:
    """A shape given as a tuple of ints (``None`` allowed), or a "bad input" :class:`Reject`."""
    if answer is None:
        return None
    if not isinstance(answer, (tuple, list)) or not all(
        isinstance(d, (int, np.integer)) and not isinstance(d, bool) for d in answer
    ):
        raise bad_input(f"Expected {what} as a tuple of ints such as (6, 784), or None; got {describe(answer)}.")
    return tuple(int(d) for d in answer)


def as_callable(answer, what: str) -> Callable:
    """The answer if it can be called, else a "bad input" :class:`Reject`."""
    if not callable(answer):
        raise bad_input(f"Expected {what} (a function); got {describe(answer)}.")
    return answer


def close(value: float, reference: float, rel: float = 0.01) -> bool:
    """``value`` within ``rel`` (relative) of ``reference``; exact match needed for a zero reference."""
    if reference == 0:
        return abs(value) <= 1e-12
    return abs(value - reference) <= rel * abs(reference)


def tree_close(tree, reference, rel: float) -> bool:
    """Every leaf of ``tree`` within ``rel`` x (the largest reference element) of the reference."""
    import jax

    leaves, ref_leaves = jax.tree.leaves(tree), jax.tree.leaves(reference)
    scale = max(float(np.max(np.abs(np.asarray(r)))) for r in ref_leaves) or 1.0
    return all(
        float(np.max(np.abs(np.asarray(a, np.float64) - np.asarray(r, np.float64)))) <= rel * scale
        for a, r in zip(leaves, ref_leaves)
    )


def check_tree_like(tree, reference, what: str) -> None:
    """Raise a "bad input" :class:`Reject` unless ``tree`` has the reference's structure, shapes and dtypes."""
    import jax

    leaves, treedef = jax.tree.flatten(tree)
    ref_leaves, ref_def = jax.tree.flatten(reference)
    if treedef != ref_def:
        from dpcourse.exercises.checks import structure_difference

        raise bad_input(
            f"Expected {what} with the parameters' structure (one array per parameter, under the same names); "
            f"yours differs: {structure_difference(tree, reference)}."
        )
    for path_leaf, ref in zip(jax.tree_util.tree_leaves_with_path(tree), ref_leaves):
        path, leaf = path_leaf
        name = jax.tree_util.keystr(path)
        if np.shape(leaf) != np.shape(ref):
            raise bad_input(f"Expected {what}{name} of shape {np.shape(ref)}; got shape {np.shape(leaf)}.")
        if not hasattr(leaf, "dtype") or np.dtype(leaf.dtype) != np.dtype(ref.dtype):
            got = getattr(leaf, "dtype", type(leaf).__name__)
            raise bad_input(f"Expected {what}{name} of dtype {ref.dtype}; got {got}.")
