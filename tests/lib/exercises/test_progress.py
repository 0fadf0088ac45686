"""The learner's progress record: where it goes, what a check and a lesson start write, atomic and deletable."""

from __future__ import annotations

import json
import threading

import pytest

from dpcourse.exercises import base, lesson03, progress


@pytest.fixture()
def workspace(tmp_path, monkeypatch):
    """A learner's workspace (it holds the manifest) as the kernel's working directory."""
    root = tmp_path / "workspace"
    root.mkdir()
    (root / progress.MANIFEST).write_text('{"version": 1, "lessons": {}}\n')
    monkeypatch.delenv(progress.PROGRESS_ENV, raising=False)
    monkeypatch.delenv(progress.WORKSPACE_ENV, raising=False)
    monkeypatch.chdir(root)
    return root


def test_the_record_goes_in_the_workspace_that_holds_the_manifest(workspace):
    assert progress.progress_path() == workspace / "progress.json"
    (workspace / "sub").mkdir()
    assert progress.progress_path(workspace / "sub") == workspace / "progress.json"


def test_nothing_is_recorded_outside_a_workspace(tmp_path, monkeypatch):
    monkeypatch.delenv(progress.PROGRESS_ENV, raising=False)
    monkeypatch.delenv(progress.WORKSPACE_ENV, raising=False)
    monkeypatch.chdir(tmp_path)
    assert progress.progress_path() is None
    assert progress.record_check("ex03_1", "correct") is None
    assert list(tmp_path.iterdir()) == []


def test_a_workspace_variable_without_a_manifest_is_not_taken_for_a_workspace(tmp_path, monkeypatch):
    monkeypatch.setenv(progress.WORKSPACE_ENV, str(tmp_path))
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv(progress.PROGRESS_ENV, raising=False)
    assert progress.progress_path() is None


def test_the_progress_variable_names_the_file_or_switches_recording_off(workspace, monkeypatch, tmp_path):
    monkeypatch.setenv(progress.PROGRESS_ENV, str(tmp_path / "mine.json"))
    assert progress.progress_path() == tmp_path / "mine.json"
    monkeypatch.setenv(progress.PROGRESS_ENV, "off")
    assert progress.progress_path() is None


def test_the_workspace_manifest_name_is_the_workspace_modules():
    from coursetools import workspace

    assert progress.MANIFEST == workspace.MANIFEST
    assert progress.WORKSPACE_ENV == workspace.WORKSPACE_ENV


def test_a_wrong_then_right_answer_to_03_1_is_recorded_with_its_mistake(workspace):
    import jax
    from jax.sharding import Mesh

    mesh = Mesh(jax.devices()[:1], ("data",))
    whole = (48, 784)
    feedback = lesson03.shard_shapes(((48, 784), (48, 784), (1, 784)), mesh)
    assert feedback.status == base.WRONG
    entry = json.loads((workspace / "progress.json").read_text())["exercises"]["ex03_1"]
    assert entry["verdict"] == "wrong" and entry["mistake"] == "replicated-split"
    assert entry["attempts"] == 1 and entry["wrong_tries"] == 1 and entry["lesson"] == "03"
    assert entry["message"] == feedback.message
    assert lesson03.shard_shapes((whole, whole, whole), mesh).correct
    entry = json.loads((workspace / "progress.json").read_text())["exercises"]["ex03_1"]
    assert entry["verdict"] == "correct" and entry["mistake"] == ""
    assert entry["attempts"] == 2 and entry["wrong_tries"] == 0
    assert entry["first"] <= entry["correct_at"] == entry["last"]


def test_an_untouched_answer_is_recorded_as_not_attempted_and_not_counted_as_a_try(workspace):
    assert lesson03.shard_shapes(...).status == base.NOT_ATTEMPTED
    entry = progress.read(workspace / "progress.json")["exercises"]["ex03_1"]
    assert entry["verdict"] == base.NOT_ATTEMPTED and entry["attempts"] == 0


def test_bad_input_is_recorded_with_a_mistake_id(workspace):
    assert lesson03.shard_shapes("three shapes", None).status == base.BAD_INPUT
    entry = progress.read(workspace / "progress.json")["exercises"]["ex03_1"]
    assert entry["verdict"] == "bad input" and entry["mistake"] == "bad-input" and entry["wrong_tries"] == 1


def test_a_lesson_start_lists_its_exercises_and_it_finishes_when_all_are_correct(workspace):
    progress.record_lesson_start("03_mesh", progress.lesson_exercises("03_mesh"))
    record = progress.read(workspace / "progress.json")
    assert record["lessons"]["03_mesh"]["exercises"] == ["ex03_1", "ex03_2"]
    assert record["lessons"]["03_mesh"]["finished"] is None
    progress.record_check("ex03_1", "correct")
    assert progress.read(workspace / "progress.json")["lessons"]["03_mesh"]["finished"] is None
    record = progress.record_check("ex03_2", "correct")
    assert record["lessons"]["03_mesh"]["finished"] == record["exercises"]["ex03_2"]["correct_at"]


def test_a_lesson_without_exercises_lists_none():
    assert progress.lesson_exercises("01_setup") == []


def test_mistakes_not_named_by_the_checker_get_an_id_without_the_figures_that_vary():
    one = base.mistake_id("Under P('data', None) you gave the whole array: naming 'data' divides by 8.")
    two = base.mistake_id("Under P(None, 'data') you gave the whole array: naming 'data' divides by 4.")
    assert one == two == "under-gave-whole-array"
    assert base.mistake_id("12 45") == "wrong"


def test_two_kernels_writing_at_once_lose_no_check(workspace):
    def checks(name):
        for _ in range(20):
            progress.record_check(name, "wrong", "m", "")

    threads = [threading.Thread(target=checks, args=(f"ex0{i}_1",)) for i in (2, 3, 4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    record = progress.read(workspace / "progress.json")
    assert {k: v["attempts"] for k, v in record["exercises"].items()} == {"ex02_1": 20, "ex03_1": 20, "ex04_1": 20}
    assert not list(workspace.glob(".progress.json.tmp-*"))


def test_a_broken_record_is_kept_aside_and_a_new_one_started(workspace):
    (workspace / "progress.json").write_text("{half a file")
    with pytest.raises(ValueError, match="delete it to start a new one"):
        progress.read(workspace / "progress.json")
    with pytest.warns(UserWarning, match="kept as progress.json.bad-"):
        progress.record_check("ex03_1", "correct")
    assert progress.read(workspace / "progress.json")["exercises"]["ex03_1"]["verdict"] == "correct"
    assert len(list(workspace.glob("progress.json.bad-*"))) == 1


def test_the_learner_can_delete_the_record_and_the_next_check_starts_a_new_one(workspace):
    progress.record_check("ex03_1", "wrong", "whole-array")
    assert progress.delete() == workspace / "progress.json"
    assert not (workspace / "progress.json").exists() and progress.delete() is None
    record = progress.record_check("ex03_2", "correct")
    assert list(record["exercises"]) == ["ex03_2"]


def test_a_record_that_cannot_be_written_warns_once_and_the_check_still_answers(workspace, monkeypatch):
    monkeypatch.setenv(progress.PROGRESS_ENV, str(workspace / "progress.json" / "inside-a-file.json"))
    (workspace / "progress.json").write_text("{}")
    monkeypatch.setattr(progress, "_warned", False)
    with pytest.warns(UserWarning, match="could not be saved"):
        assert lesson03.shard_shapes(...).status == base.NOT_ATTEMPTED
    assert lesson03.shard_shapes(...).status == base.NOT_ATTEMPTED  # no second warning (pytest would not fail)


def test_the_course_exercises_are_the_ones_its_checkers_check():
    import pkgutil

    from dpcourse import exercises

    lessons = [m.name[6:] for m in pkgutil.iter_modules(exercises.__path__) if m.name.startswith("lesson")]
    checked = [e for n in sorted(lessons) for e in progress.lesson_exercises(f"{n}_lesson")]
    assert tuple(checked) == progress.EXERCISES


GOOD = {
    "version": 1,
    "updated": 1_800_000_000.0,
    "lessons": {"03_mesh": {"started": 1_799_999_000.0, "finished": None, "exercises": ["ex03_1", "ex03_2"]}},
    "exercises": {
        "ex03_1": {"lesson": "03", "verdict": "wrong", "mistake": "m", "message": "said", "attempts": 2,
                   "wrong_tries": 2, "first": 1_799_999_100.0, "last": 1_799_999_900.0, "correct_at": None},
    },
}  # fmt: skip


def edited(path: str, value) -> str:
    """GOOD as text, with the value at ``path`` (keys joined by ``/``) replaced."""
    record = json.loads(json.dumps(GOOD))
    *parents, last = path.split("/")
    here = record
    for key in parents:
        here = here[key]
    here[last] = value
    return json.dumps(record)


# A learner's hand edits: each once made every check of every lesson raise, or added a column to the board.
EDITS = {
    "lessons a list": edited("lessons", []),
    "an exercise entry a string": edited("exercises/ex03_1", "correct"),
    "attempts null": edited("exercises/ex03_1/attempts", None),
    "wrong_tries a string": edited("exercises/ex03_1/wrong_tries", "3"),
    "a lesson's exercises a string": edited("lessons/03_mesh/exercises", "ex03_1"),
    "a lesson entry a list": edited("lessons/03_mesh", []),
    "exercises a list": edited("exercises", []),
    "a list at the top": json.dumps([GOOD]),
    "nested too deeply": '{"exercises": {"ex03_1": {"message": ' + "[" * 100_000 + "]" * 100_000 + "}}}",
    "NaN": json.dumps(GOOD).replace("1800000000.0", "NaN"),
    "not UTF-8": '{"exercises": {"ex03_1": {"message": "\xe9"}}}',
    "a made-up exercise": edited("exercises/ex99_1", GOOD["exercises"]["ex03_1"]),
    "a lesson listing a made-up exercise": edited("lessons/03_mesh/exercises", ["ex03_1", "ex03_9"]),
    "400 KB": edited("exercises/ex03_1/message", "m" * 400_000),
}


@pytest.mark.parametrize("shape", list(EDITS))
def test_a_hand_edited_record_of_another_shape_is_set_aside_with_one_warning_and_checks_go_on(workspace, shape):
    path = workspace / "progress.json"
    data = EDITS[shape].encode("latin-1") if shape == "not UTF-8" else EDITS[shape].encode()
    path.write_bytes(data)
    with pytest.raises(progress.RecordError, match="is not a progress record of the course's shape"):
        progress.read(path)
    with pytest.warns(UserWarning) as said:
        assert lesson03.shard_shapes(...).status == base.NOT_ATTEMPTED  # a check in a lesson: no traceback
    assert len(said) == 1
    message = str(said[0].message)
    assert message.startswith(f"Your progress record {path} was not of the course's shape (")
    kept = list(workspace.glob("progress.json.bad-*"))
    assert len(kept) == 1 and kept[0].read_bytes() == data and kept[0].name in message  # renamed, not deleted
    assert list(progress.read(path)["exercises"]) == ["ex03_1"]
    assert progress.record_check("ex03_1", "correct")["exercises"]["ex03_1"]["attempts"] == 1


def test_two_records_set_aside_in_one_second_are_both_kept(workspace):
    for text in ("[1]", "[2]"):
        (workspace / "progress.json").write_text(text)
        with pytest.warns(UserWarning, match="not of the course's shape"):
            progress.record_check("ex03_1", "wrong")
    assert sorted(p.read_text() for p in workspace.glob("progress.json.bad-*")) == ["[1]", "[2]"]


def test_a_made_up_exercise_is_not_recorded(workspace, monkeypatch):
    monkeypatch.setattr(progress, "_warned_ids", set())
    progress.record_check("ex03_1", "wrong")
    before = (workspace / "progress.json").read_text()
    with pytest.warns(UserWarning, match="'ex99_1' is not one of the course's exercises"):
        assert progress.record_check("ex99_1", "correct") is None
    assert progress.record_check("ex99_1", "correct") is None  # said once
    assert progress.record_lesson_start("03_mesh", ["ex03_1", "ex03_7"])["lessons"]["03_mesh"]["exercises"] == [
        "ex03_1"
    ]
    assert "ex99_1" not in (workspace / "progress.json").read_text() and "ex99_1" not in before
    assert progress.record_lesson_start("my own notebook", []) is None
    assert progress.shape_problem(progress.read(workspace / "progress.json")) is None


def test_what_the_course_writes_is_of_its_own_shape(workspace):
    progress.record_lesson_start("12_large_batch", progress.lesson_exercises("12_large_batch"))
    for exercise in progress.EXERCISES:
        progress.record_check(exercise, "wrong", "m" * 200, "x" * 400)
    record = progress.record_check("ex12_3", "correct")
    assert progress.shape_problem(record) is None
    assert not list(workspace.glob("progress.json.bad-*"))


def test_a_reset_lesson_s_checks_are_forgotten_and_the_others_kept(workspace):
    """After `make reset LESSON=13` the record still listed 13's exercises as right."""
    progress.record_lesson_start("13_elastic", progress.lesson_exercises("13_elastic"))
    for exercise in ("ex13_1", "ex13_2", "ex13_3", "ex03_1"):
        progress.record_check(exercise, "correct")
    path = workspace / "progress.json"
    assert progress.read(path)["lessons"]["13_elastic"]["finished"] is not None
    record = progress.forget_lesson("13_elastic", path)
    assert sorted(record["exercises"]) == ["ex03_1"] == sorted(progress.read(path)["exercises"])
    assert record["lessons"]["13_elastic"]["finished"] is None and record["lessons"]["13_elastic"]["started"]
    path.unlink()
    assert progress.forget_lesson("13_elastic", path) is None and not path.exists()  # none is made
