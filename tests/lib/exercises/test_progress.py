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
