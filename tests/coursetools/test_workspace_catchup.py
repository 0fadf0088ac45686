"""Catching a learner up (a lesson with the solutions filled in) and room-wide workspace commands."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from coursetools import solutions as sol
from coursetools import workspace as ws

ROOT = Path(__file__).resolve().parents[2]


def exercise_sources(path: Path) -> dict[str, str]:
    nb = json.loads(path.read_text())
    return {sol.cell_id(c): "".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "code" and sol.cell_id(c)}


def test_catching_up_fills_the_solutions_in_and_keeps_the_old_copy(tmp_path):
    root = tmp_path / "ws"
    ws.init(root)
    mine = root / "04_sharding.ipynb"
    mine.write_text(mine.read_text().replace('"source": [', '"source": ["# mine\\n", ', 1))
    edited = mine.read_text()
    (action,) = ws.catch_up(root, ["04"])
    assert action.kind == "caught up" and "solutions filled in" in action.message
    kept = list((root / "old").glob("*/04_sharding.ipynb"))
    assert len(kept) == 1 and kept[0].read_text() == edited
    assert exercise_sources(mine) == sol.read_solutions("04_sharding")
    course = exercise_sources(ROOT / "notebooks" / "04_sharding.ipynb")
    assert course and all(exercise_sources(mine)[k] != course[k] for k in course)


def test_a_lesson_without_exercises_is_caught_up_as_the_course_has_it(tmp_path):
    root = tmp_path / "ws"
    ws.init(root)
    ws.catch_up(root, ["01"])
    assert (root / "01_setup.ipynb").read_text() == ws.learner_copy(ROOT / "notebooks" / "01_setup.ipynb")


def test_solutions_that_do_not_match_the_exercises_change_nothing(tmp_path):
    solutions = tmp_path / "solutions"
    solutions.mkdir()
    (solutions / "04_sharding.py").write_text("# %% tags=['exercise', 'ex04_1']\nx = 1\n")
    text = ws.learner_copy(ROOT / "notebooks" / "04_sharding.ipynb")
    with pytest.raises(ws.WorkspaceError, match="do not match the lesson's exercises"):
        ws.solved_copy("04_sharding", text, solutions)


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "coursetools", "workspace", *args],
        env={**os.environ},
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_room_wide_commands_reach_every_learners_workspace(tmp_path):
    users = tmp_path / "users"
    for name in ("ann", "ben"):
        ws.init(users / name / "workspace")
    (users / "ben" / "workspace" / "05_shard_map.ipynb").write_text(
        (users / "ben" / "workspace" / "05_shard_map.ipynb").read_text().replace("parameters", "parameters ", 1)
    )
    done = _cli("reset", "05", "--room", str(users))
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[0] == "ann:" and "ben:" in done.stdout
    for name in ("ann", "ben"):
        assert len(list((users / name / "workspace" / "old").glob("*/05_shard_map.ipynb"))) == 1
    assert "parameters " in next((users / "ben" / "workspace" / "old").glob("*/05_shard_map.ipynb")).read_text()
    done = _cli("catchup", "04", "--room", str(users))
    assert done.returncode == 0 and done.stdout.count("solutions filled in") == 2, done.stderr


def test_room_commands_refuse_unclear_requests(tmp_path):
    done = _cli("catchup", "--room", str(tmp_path))
    assert done.returncode == 2 and "no learner's workspace" in done.stderr
    ws.init(tmp_path / "ann" / "workspace")
    done = _cli("catchup", "--room", str(tmp_path))
    assert done.returncode == 2 and "Say which lessons" in done.stderr and done.stderr.count("error") == 1


def test_a_caught_up_lesson_survives_a_server_start_and_a_room_update(tmp_path):
    users = tmp_path / "users"
    root = users / "bob" / "workspace"
    ws.init(root)
    ws.catch_up(root, ["04"])
    filled = (root / "04_sharding.ipynb").read_text()
    assert exercise_sources(root / "04_sharding.ipynb") == sol.read_solutions("04_sharding")
    actions = {a.lesson: a for a in ws.init(root)}  # what a server's start runs
    assert actions["04_sharding"].kind == "edited"
    done = _cli("update", "--room", str(users))
    assert done.returncode == 0, done.stderr
    assert (root / "04_sharding.ipynb").read_text() == filled
    assert not (root / "updates").exists()


def test_a_course_change_after_a_catch_up_is_offered_beside_the_filled_lesson(tmp_path):
    source = tmp_path / "notebooks"
    source.mkdir()
    course = ROOT / "notebooks" / "04_sharding.ipynb"
    (source / course.name).write_text(course.read_text())
    root = tmp_path / "ws"
    ws.init(root, source)
    ws.Workspace(root, source).reset(["04"], solved=True)
    filled = (root / "04_sharding.ipynb").read_text()
    (source / course.name).write_text(course.read_text().replace('"source": [', '"source": ["# new\\n", ', 1))
    (action,) = ws.update(root, source=source)
    assert action.kind == "offered"
    assert (root / "04_sharding.ipynb").read_text() == filled
    assert "# new" in next((root / "updates").glob("*/04_sharding.ipynb")).read_text()


def test_a_fresh_copy_stays_the_course_version_for_later_updates(tmp_path):
    root = tmp_path / "ws"
    ws.init(root)
    ws.reset(root, ["05"])
    (action,) = ws.update(root, ["05"])
    assert action.kind == "unchanged"


def test_a_failed_catch_up_says_a_copy_moved_aside_only_when_one_did(tmp_path, monkeypatch, capsys):
    import errno

    from coursetools.cli import main

    root = tmp_path / "ws"
    ws.init(root)

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "replace", full)  # nothing can move
    assert main(["workspace", "catchup", "04", "--dir", str(root)]) == 2
    err = capsys.readouterr().err
    assert "the disk is full" in err and "moved aside" not in err and "old/" not in err, err
    monkeypatch.undo()
    monkeypatch.setattr(ws, "_write_atomic", full)  # the copy moves, the filled one cannot be written
    assert main(["workspace", "catchup", "04", "--dir", str(root)]) == 2
    err = capsys.readouterr().err.strip()
    (moved,) = (root / "old").glob("*/04_sharding.ipynb")
    assert f"({moved.relative_to(root).as_posix()} moved aside before it stopped)" in err and len(err.splitlines()) == 1


def test_a_reset_or_catch_up_forgets_the_lesson_s_checks_in_the_learner_s_progress(tmp_path):
    """After `make reset LESSON=13`, progress.json still listed 13's exercises as right."""
    from dpcourse.exercises import progress

    root = tmp_path / "ws"
    ws.init(root)
    record = {"version": 1, "lessons": {"04_sharding": {"started": 1.0, "finished": 2.0, "exercises": ["ex04_1"]}}}
    record["exercises"] = {e: {"lesson": e[2:4], "verdict": "correct", "correct_at": 2.0} for e in ("ex04_1", "ex05_1")}
    (root / progress.FILE).write_text(json.dumps(record))
    ws.reset(root, ["04"])
    after = progress.read(root / progress.FILE)
    assert list(after["exercises"]) == ["ex05_1"] and after["lessons"]["04_sharding"]["finished"] is None
    (root / progress.FILE).write_text(json.dumps(record))
    ws.catch_up(root, ["05"])
    assert list(progress.read(root / progress.FILE)["exercises"]) == ["ex04_1"]
