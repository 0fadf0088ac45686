"""The shared checker machinery: not attempted, bad input, strict mode, display."""

import numpy as np
import pytest

from dpcourse.exercises import base
from dpcourse.exercises.base import Feedback, checker, wrong


@checker("ex00_1", "a number")
def _number_check(answer, reference):
    value = base.as_number(answer)
    if value != reference:
        raise wrong(f"Expected {reference}.")
    return "Right."


@checker("ex00_2", "a function f(x)")
def _crashing_call(answer):
    return str(answer(1))


def test_untouched_answers_report_not_attempted():
    for answer in (..., None):
        feedback = _number_check(answer, 3)
        assert feedback.status == base.NOT_ATTEMPTED
        assert "not attempted yet" in str(feedback).lower()


def test_correct_and_wrong():
    assert _number_check(3, 3).correct
    feedback = _number_check(4, 3)
    assert feedback.status == base.WRONG and "Expected 3." in feedback.message


@pytest.mark.parametrize("answer", ["3", [3], np.ones(2), True])
def test_wrong_type_says_what_was_expected_and_what_came(answer):
    feedback = _number_check(answer, 3)
    assert feedback.status == base.BAD_INPUT
    assert "Expected" in feedback.message and "got" in feedback.message


def test_a_crash_in_the_learners_code_becomes_a_sentence():
    feedback = _crashing_call(lambda x: 1 / 0)
    assert feedback.status == base.BAD_INPUT
    assert "ZeroDivisionError" in feedback.message and "a function f(x)" in feedback.message


def test_strict_mode_raises_for_anything_but_correct(monkeypatch):
    monkeypatch.setenv(base.STRICT_ENV, "1")
    assert _number_check(3, 3).correct
    for answer in (4, ..., "x"):
        with pytest.raises(base.ExerciseFailed):
            _number_check(answer, 3)
    monkeypatch.setenv(base.STRICT_ENV, "0")
    assert _number_check(..., 3).status == base.NOT_ATTEMPTED


def test_feedback_renders_as_html_and_text():
    feedback = Feedback("ex09_9", base.WRONG, "a < b & c")
    assert "a &lt; b &amp; c" in feedback._repr_html_()
    assert str(feedback).startswith("[Exercise 09.9] Not yet:")
    assert str(Feedback("ex09_9", base.CORRECT, "Right: 42.")) == "[Exercise 09.9] Right: 42."
    # The box names the exercise as the lesson does (05.1), not by its id (ex05_1); other labels stay.
    assert "Exercise 09.9 ·" in Feedback("ex09_9", base.CORRECT, "Right.")._repr_html_()
    assert Feedback("forward (your cell) vs model.forward", base.CORRECT, "Right.").title.startswith("forward")


def test_shape_and_tree_checks():
    with pytest.raises(base.Reject, match="tuple of ints"):
        base.as_shape((6.0, 784), "a shape")
    assert base.as_shape(None, "a shape") is None
    ref = {"w": np.zeros((2, 3), np.float32)}
    with pytest.raises(base.Reject, match=r"shape \(2, 3\)"):
        base.check_tree_like({"w": np.zeros((3, 2), np.float32)}, ref, "params")
    with pytest.raises(base.Reject, match="dtype float32"):
        base.check_tree_like({"w": np.zeros((2, 3), np.float64)}, ref, "params")
    with pytest.raises(base.Reject, match=r"structure.*yours differs: missing \['w'\], extra \['v'\]\.") as info:
        base.check_tree_like({"v": np.zeros((2, 3), np.float32)}, ref, "params")
    assert "PyTreeDef" not in str(info.value)


def test_a_size_or_time_answer_must_be_positive():
    # A learner's -3 or 0 used to get "off by a factor -2.17e-07".
    with pytest.raises(base.Reject, match="Expected a positive number for a step time; got -3"):
        base.as_number(-3, "a step time", positive=True)
    with pytest.raises(base.Reject, match="got 0"):
        base.as_number(0, "a step time", positive=True)
    assert base.as_number(0, "an offset") == 0.0


def test_how_far_says_which_way_the_answer_misses():
    assert base.how_far(129.0, 1.0) == "about 129x too large"
    assert base.how_far(1.0, 3.2) == "about 3.2x too small"


def test_backticks_render_as_code_not_as_raw_backticks():
    feedback = Feedback("ex00_1", base.NOT_ATTEMPTED, "Replace the `...` with a <number>.")
    html_text = feedback._repr_html_()
    assert "`" not in html_text and "<code>...</code>" in html_text and "&lt;number&gt;" in html_text
    untouched = _number_check(..., 3)._repr_html_()
    assert "`" not in untouched and "<code>" in untouched
    assert base.render_inline("an odd ` backtick") == "an odd ` backtick"


@pytest.mark.parametrize("what", ["a global batch", "the rows per process", "a count of collectives per step"])
def test_a_batch_rows_or_count_must_be_a_whole_number(what):
    """09.1 accepted a batch of 6.554; every lesson's checker goes through as_number."""
    with pytest.raises(base.Reject) as err:
        base.as_number(6.554, what, positive=True)
    assert err.value.status == base.WRONG and "whole number" in err.value.message
    assert base.as_number(6.0, what, positive=True) == 6.0
    assert base.as_number(np.int64(64), what) == 64.0


def test_fractions_stay_allowed_where_they_make_sense():
    assert base.as_number(0.468, "the plateau in examples/s") == 0.468
    assert base.as_number(4.19, "a step time in milliseconds") == 4.19
    with pytest.raises(base.Reject):
        base.as_number(1.5, "a ratio", whole=True)


def test_a_crash_message_is_cut_at_a_sentence_never_mid_word():
    err = ValueError("shard_map applied to the function '_rem_singleton' was given bad specs. " + "word " * 200)
    text = base.first_sentence(err)
    assert text.endswith("bad specs.")
    whole = base.first_sentence(ValueError("word " * 200), limit=50)  # a first sentence is shown whole
    assert whole == ("word " * 200).strip()
    dump = base.first_sentence(ValueError("word " * 400), limit=50)  # 2,000 characters: a dump, cut at a word
    assert dump.endswith(" ...") and all(w == "word" for w in dump[:-4].split()) and len(dump) <= 1204


def _run_as_cells(cells: list[str], namespace: dict) -> None:
    """Run sources as IPython runs notebook cells: each in linecache, In[] kept, the newest error in sys.last_*."""
    import linecache
    import sys

    namespace.setdefault("In", [""])
    for i, source in enumerate(cells):
        name = f"<cell {len(namespace['In'])}-{i}>"
        linecache.cache[name] = (len(source), None, source.splitlines(True), name)
        namespace["In"].append(source)
        try:
            exec(compile(source, name, "exec"), namespace)
        except Exception as err:  # noqa: BLE001 - IPython shows it and keeps it
            sys.last_type, sys.last_value, sys.last_traceback = type(err), err, err.__traceback__


def test_an_exercise_cell_that_raised_is_not_called_not_attempted(monkeypatch):
    """04.2: a learner's jax.device_put(...) raises, x_mine keeps the `...` of the first run: say so."""
    import sys

    monkeypatch.setattr(sys, "last_value", None, raising=False)
    monkeypatch.setattr(sys, "last_traceback", None, raising=False)

    @base.checker("ex04_2", "x_mine: an array")
    def placed(answer):
        return "Right."

    ns = {"placed": placed}
    _run_as_cells(["x_mine = ...", "x_mine = [1, 2][5]", "fb = placed(x_mine)"], ns)
    assert ns["fb"].status == base.BAD_INPUT, ns["fb"]
    assert "Your exercise cell raised IndexError: list index out of range" in ns["fb"].message, ns["fb"]
    assert "`x_mine` still holds the `...`" in ns["fb"].message, ns["fb"]
    # put back to `...` and run again: the old error no longer speaks for the cell
    _run_as_cells(["x_mine = ...", "fb = placed(x_mine)"], ns)
    assert ns["fb"].status == base.NOT_ATTEMPTED, ns["fb"]


def test_a_crash_under_a_foreign_global_mesh_names_the_mesh_not_the_answer(cpu_devices):
    """A checker's own step stopped by a mesh the learner set blamed the learner's answer with JAX's message."""
    import jax

    foreign = jax.make_mesh((4, 2), ("data", "model"), axis_types=(jax.sharding.AxisType.Explicit,) * 2)
    one_device = jax.device_put(np.ones((4, 4), np.float32), cpu_devices[0])
    with jax.set_mesh(foreign):
        feedback = _crashing_call(lambda x: jax.jit(lambda a: a @ a)(one_device))
    assert feedback.status == base.BAD_INPUT and feedback.mistake == "raised-ForeignMeshError", feedback
    assert "raised ForeignMeshError: A global mesh {'data': 4, 'model': 2} (Explicit, Explicit axes) is set" in (
        feedback.message
    )
    assert "(ValueError): clear it with jax.set_mesh(None)" in feedback.message
    assert "raised ZeroDivisionError" in _crashing_call(lambda x: 1 / 0).message  # no global mesh: as it was
