"""Tests of coursetools.workspace: the learner's copy of the lessons never loses their work.

On temporary copies of the course's notebooks/ (and, for `git pull`, on a
temporary clone of a temporary origin), so nothing here writes into the
repository.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from coursetools import workspace as ws
from coursetools import workspace_summary

ROOT = Path(__file__).resolve().parents[2]
LESSON = "05_shard_map"


@pytest.fixture()
def course(tmp_path) -> Path:
    """A copy of the course's notebooks/ (both files of each pair)."""
    folder = tmp_path / "course" / "notebooks"
    shutil.copytree(ROOT / "notebooks", folder, ignore=shutil.ignore_patterns(".*"))
    return folder


def _cells(path: Path) -> list:
    return json.loads(path.read_text())["cells"]


def learner_edits(path: Path, marker: str = "# my own change") -> None:
    """Change the first code cell's source, as typing in the lab and saving would."""
    nb = json.loads(path.read_text())
    cell = next(c for c in nb["cells"] if c["cell_type"] == "code")
    cell["source"] = (
        [marker + "\n", *cell["source"]] if isinstance(cell["source"], list) else marker + "\n" + cell["source"]
    )
    cell["outputs"] = [{"output_type": "stream", "name": "stdout", "text": ["ran\n"]}]
    path.write_text(json.dumps(nb, indent=1))


def course_changes(course: Path, lesson: str = LESSON, text: str = "A sentence the course added.") -> None:
    path = course / f"{lesson}.ipynb"
    nb = json.loads(path.read_text())
    nb["cells"].append({"cell_type": "markdown", "id": "added00", "metadata": {}, "source": [text]})
    path.write_text(json.dumps(nb, indent=1))


def new_lesson(course: Path, name: str = "10_new") -> None:
    shutil.copy(course / "01_setup.ipynb", course / f"{name}.ipynb")


def kinds(actions) -> dict[str, str]:
    return {a.lesson: a.kind for a in actions}


def test_init_copies_one_notebook_per_lesson_and_a_results_folder(course, tmp_path):
    root = tmp_path / "ws"
    actions = ws.init(root, source=course)
    lessons = sorted(p.stem for p in course.glob("[0-9][0-9]_*.ipynb"))
    assert kinds(actions) == dict.fromkeys(lessons, "copied")
    shown = sorted(p.name for p in root.iterdir() if not p.name.startswith("."))
    assert shown == sorted([f"{name}.ipynb" for name in lessons] + ["results"])
    for name in lessons:
        copy = json.loads((root / f"{name}.ipynb").read_text())
        assert copy["cells"] == _cells(course / f"{name}.ipynb")
        # No pairing metadata: jupytext never writes a .py twin into the workspace.
        assert set(copy["metadata"]) <= {"kernelspec"}
    # Idempotent: a second start changes nothing.
    before = {p.name: p.read_bytes() for p in root.glob("*.ipynb")}
    assert set(kinds(ws.init(root, source=course)).values()) == {"unchanged"}
    assert before == {p.name: p.read_bytes() for p in root.glob("*.ipynb")}


def test_update_brings_new_lessons_and_replaces_only_untouched_copies(course, tmp_path):
    root = tmp_path / "ws"
    ws.init(root, source=course)
    learner_edits(root / "02_baseline.ipynb")
    mine = (root / "02_baseline.ipynb").read_text()
    course_changes(course, "02_baseline")
    course_changes(course, "03_mesh")
    new_lesson(course)
    actions = kinds(ws.update(root, source=course))
    assert actions["10_new"] == "copied" and (root / "10_new.ipynb").exists()
    # 03 untouched by the learner (outputs do not count as edits): replaced.
    assert actions["03_mesh"] == "replaced"
    assert _cells(root / "03_mesh.ipynb") == _cells(course / "03_mesh.ipynb")
    # 02 edited: kept byte for byte; the new version beside it.
    assert actions["02_baseline"] == "offered"
    assert (root / "02_baseline.ipynb").read_text() == mine
    beside = list(root.glob("updates/*/02_baseline.ipynb"))
    assert len(beside) == 1 and _cells(beside[0]) == _cells(course / "02_baseline.ipynb")
    # Again: nothing new is written, the waiting version is named.
    again = ws.update(root, source=course)
    assert kinds(again)["02_baseline"] == "waiting" and "updates/" in again[1].message
    assert len(list(root.glob("updates/*/02_baseline.ipynb"))) == 1
    status = kinds(ws.Workspace(root, course).status())
    assert status["02_baseline"] == "waiting" and status["03_mesh"] == "unchanged"
    # The learner deletes the waiting version: it is not written again.
    beside[0].unlink()
    assert kinds(ws.update(root, source=course))["02_baseline"] == "edited"
    assert not list(root.glob("updates/*/02_baseline.ipynb"))


def test_outputs_alone_do_not_count_as_an_edit(course, tmp_path):
    root = tmp_path / "ws"
    ws.init(root, source=course)
    nb = json.loads((root / "01_setup.ipynb").read_text())
    for cell in nb["cells"]:
        if cell["cell_type"] == "code":
            cell["outputs"], cell["execution_count"] = [{"output_type": "stream", "name": "stdout", "text": "x"}], 1
    nb["metadata"]["language_info"] = {"name": "python"}
    (root / "01_setup.ipynb").write_text(json.dumps(nb))
    assert kinds(ws.Workspace(root, course).status())["01_setup"] == "unchanged"
    course_changes(course, "01_setup")
    assert kinds(ws.update(root, source=course))["01_setup"] == "replaced"


def test_reset_keeps_the_old_copy_with_a_timestamp(course, tmp_path):
    root = tmp_path / "ws"
    ws.init(root, source=course)
    learner_edits(root / f"{LESSON}.ipynb", "# reset me")
    mine = (root / f"{LESSON}.ipynb").read_text()
    actions = ws.reset(root, ["05"], source=course)
    assert kinds(actions) == {LESSON: "reset"}
    assert _cells(root / f"{LESSON}.ipynb") == _cells(course / f"{LESSON}.ipynb")
    old = list((root / "old").glob(f"*/{LESSON}.ipynb"))
    assert [p.read_text() for p in old] == [mine]
    assert old[0].relative_to(root).as_posix() in actions[0].message
    # Every lesson: each old copy kept, none overwritten (also a second reset in the same second).
    learner_edits(root / "01_setup.ipynb")
    ws.reset(root, all_lessons=True, source=course)
    ws.reset(root, all_lessons=True, source=course)
    lessons = sorted(p.stem for p in course.glob("[0-9][0-9]_*.ipynb"))
    assert len(list((root / "old").rglob("*.ipynb"))) == 1 + 2 * len(lessons)
    assert len(list((root / "old").iterdir())) == 3  # one folder per reset
    assert any("# my own change" in p.read_text() for p in (root / "old").glob("*/01_setup.ipynb"))
    assert set(kinds(ws.Workspace(root, course).status()).values()) == {"unchanged"}


def test_reset_also_moves_a_waiting_new_version_aside(course, tmp_path):
    root = tmp_path / "ws"
    ws.init(root, source=course)
    learner_edits(root / f"{LESSON}.ipynb")
    course_changes(course)
    ws.update(root, source=course)
    ws.reset(root, ["05_shard_map"], source=course)
    assert not list(root.glob(f"updates/*/{LESSON}.ipynb"))
    assert len(list((root / "old").rglob(f"{LESSON}.ipynb"))) == 2
    assert _cells(root / f"{LESSON}.ipynb") == _cells(course / f"{LESSON}.ipynb")


def test_bad_input_is_a_clear_error_that_changes_nothing(course, tmp_path):
    root = tmp_path / "ws"
    ws.init(root, source=course)
    snapshot = {p.name: p.read_bytes() for p in root.glob("*.ipynb")}
    with pytest.raises(ws.WorkspaceError, match=r"No lesson '42'.*05_shard_map"):
        ws.reset(root, ["42"], source=course)
    with pytest.raises(ws.WorkspaceError, match="reset --all"):
        ws.reset(root, source=course)
    a_file = tmp_path / "a_file"
    a_file.write_text("keep me")
    with pytest.raises(ws.WorkspaceError, match="is a file, not a folder"):
        ws.init(a_file, source=course)
    with pytest.raises(ws.WorkspaceError, match="is a file, not a folder"):
        ws.init(a_file / "ws", source=course)
    assert a_file.read_text() == "keep me"
    # A broken course notebook: nothing is written, and the error says how to restore it.
    (course / "03_mesh.ipynb").write_text("{not json")
    with pytest.raises(ws.WorkspaceError, match="git checkout"):
        ws.update(root, source=course)
    assert snapshot == {p.name: p.read_bytes() for p in root.glob("*.ipynb")}


def test_a_corrupt_learner_notebook_is_left_alone_until_reset(course, tmp_path):
    root = tmp_path / "ws"
    ws.init(root, source=course)
    (root / "03_mesh.ipynb").write_text('{"cells": [')  # a half-written save
    course_changes(course, "03_mesh")
    actions = ws.update(root, source=course)
    assert kinds(actions)["03_mesh"] == "unreadable" and "reset 03" in actions[2].message
    assert (root / "03_mesh.ipynb").read_text() == '{"cells": ['
    ws.reset(root, ["03"], source=course)
    assert [p.read_text() for p in (root / "old").glob("*/03_mesh.ipynb")] == ['{"cells": [']


def test_a_lost_manifest_keeps_edited_lessons(course, tmp_path):
    root = tmp_path / "ws"
    ws.init(root, source=course)
    learner_edits(root / "02_baseline.ipynb")
    mine = (root / "02_baseline.ipynb").read_text()
    (root / ws.MANIFEST).write_text("garbage")
    looked = ws.Workspace(root, course)
    assert kinds(looked.status())["02_baseline"] == "changed" and "unreadable" in looked.notes[0]
    space = ws.Workspace(root, course)
    actions = kinds(space.update())
    assert actions["01_setup"] == "unchanged" and actions["02_baseline"] == "edited"
    assert (root / "02_baseline.ipynb").read_text() == mine
    assert list(root.glob(f"{ws.MANIFEST}.bad-*")) and "unreadable" in space.notes[0]
    course_changes(course, "02_baseline")
    assert kinds(ws.update(root, source=course))["02_baseline"] == "offered"
    assert (root / "02_baseline.ipynb").read_text() == mine


def test_a_deleted_lesson_is_copied_in_again(course, tmp_path):
    root = tmp_path / "ws"
    ws.init(root, source=course)
    (root / "04_sharding.ipynb").unlink()
    assert kinds(ws.update(root, source=course))["04_sharding"] == "restored"


def test_lesson_names_by_number_name_or_file(course, tmp_path):
    space = ws.Workspace(tmp_path / "ws", course)
    lessons = ws.course_lessons(course)
    assert space.select(["5", "05", "05_shard_map", "05_shard_map.ipynb", "notebooks/05_shard_map.py"], lessons) == [
        LESSON
    ]
    assert space.select(None, lessons) == list(lessons)


def _cli(*args: str, cwd: Path, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "coursetools", "workspace", *args],
        cwd=cwd,
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_command_line(tmp_path):
    root = tmp_path / "ws"
    done = _cli("init", "--dir", str(root), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"workspace {root}:") and "copied in" in done.stdout
    assert len(done.stdout.strip().splitlines()) <= 2
    done = _cli("reset", "--dir", str(root), "05", cwd=tmp_path)
    assert done.returncode == 0 and re.search(r"old/[0-9T-]+/05_shard_map\.ipynb", done.stdout), done.stderr
    done = _cli("status", "05", cwd=tmp_path, env={ws.WORKSPACE_ENV: str(root)})
    assert done.returncode == 0 and done.stdout.splitlines()[1].strip() == "05_shard_map: unchanged, up to date."
    done = _cli("reset", "--dir", str(root), "99", cwd=tmp_path)
    assert done.returncode == 2 and "No lesson '99'" in done.stderr and "Traceback" not in done.stderr


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into a read-only folder")
@pytest.mark.parametrize("command", [["init"], ["reset", "05"]])
def test_a_read_only_workspace_is_one_sentence_naming_the_folder_the_cause_and_the_fix(tmp_path, command):
    root = tmp_path / "ws"
    assert _cli("init", "--dir", str(root), cwd=tmp_path).returncode == 0
    ws.Workspace(root).manifest_path.unlink()  # init must write the manifest again
    before = sorted(p.relative_to(root) for p in root.rglob("*"))
    root.chmod(0o555)
    try:
        done = _cli(*command, "--dir", str(root), cwd=tmp_path)
    finally:
        root.chmod(0o755)
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    assert str(root) in lines[0] and "permission denied" in lines[0] and "--dir" in lines[0]
    assert sorted(p.relative_to(root) for p in root.rglob("*")) == before  # no temporary file left


@pytest.mark.parametrize("command", [["init"], ["reset", "05"]])
def test_a_read_only_file_system_stops_init_and_reset_with_one_line(tmp_path, monkeypatch, capsys, command):
    from coursetools.cli import main

    root = tmp_path / "ws"
    ws.init(root)
    before = {p: p.read_bytes() for p in root.rglob("*") if p.is_file()}

    def read_only(*args, **kwargs):
        raise OSError(30, os.strerror(30), str(root / ".course.json.tmp-9444"))

    for name in ("write_text", "mkdir", "touch"):
        monkeypatch.setattr(Path, name, read_only)
    monkeypatch.setattr(os, "replace", read_only)
    assert main(["workspace", *command, "--dir", str(root)]) == 2
    monkeypatch.undo()
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("error: Cannot ") and str(root) in err, err
    assert "the file system is read-only" in err and "choose another folder" in err
    assert {p: p.read_bytes() for p in root.rglob("*") if p.is_file()} == before


def test_a_read_only_file_system_is_named_as_such(tmp_path):
    err = OSError(os.strerror(30))
    err.errno, err.filename = 30, str(tmp_path / ".course.json.tmp-9444")
    text = str(ws.file_system_error(err, tmp_path, "write in"))
    assert text.startswith(f"Cannot write in the workspace {tmp_path}: the file system is read-only.")
    assert "choose another folder" in text and "\n" not in text


def test_the_update_line_names_the_lessons_that_changed(course, tmp_path):
    root = tmp_path / "ws"
    ws.init(root, source=course)
    learner_edits(root / "04_sharding.ipynb")
    course_changes(course, "04_sharding")
    course_changes(course, "06_pmap")
    first = workspace_summary.summary(root, ws.update(root, source=course))[0]
    assert "1 updated (06_pmap); 1 kept, new version in updates/ (04_sharding);" in first
    assert "up to date)." in first and "up to date (" not in first


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
def test_a_course_update_pulls_cleanly_and_keeps_the_learners_work(tmp_path):
    """origin gets a commit that changes 05 and adds a lesson; the learner's clone pulls it."""
    git_env = {
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@localhost",
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@localhost",
        "GIT_CONFIG_GLOBAL": os.devnull,
        "GIT_CONFIG_NOSYSTEM": "1",
    }

    def git(*args, cwd):
        done = subprocess.run(["git", *args], cwd=cwd, env={**os.environ, **git_env}, capture_output=True, text=True)
        assert done.returncode == 0, f"git {' '.join(args)}: {done.stderr}"
        return done.stdout

    origin = tmp_path / "origin"
    origin.mkdir()
    shutil.copytree(ROOT / "notebooks", origin / "notebooks", ignore=shutil.ignore_patterns(".*"))
    shutil.copytree(ROOT / "dpcourse", origin / "dpcourse", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(ROOT / "coursetools", origin / "coursetools", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / ".gitignore", origin / ".gitignore")
    git("init", "-q", "-b", "main", cwd=origin)
    git("add", "-A", cwd=origin)
    git("commit", "-q", "-m", "course", cwd=origin)
    clone = tmp_path / "clone"
    git("clone", "-q", str(origin), str(clone), cwd=tmp_path)
    # The learner: default workspace (workspace/ in the clone), an edited 05.
    assert _cli("init", cwd=clone, env={ws.WORKSPACE_ENV: ""}).returncode == 0
    learner_edits(clone / "workspace" / f"{LESSON}.ipynb", "# my 05")
    mine = (clone / "workspace" / f"{LESSON}.ipynb").read_text()
    assert git("status", "--porcelain", cwd=clone) == ""
    # The course: 05 changes, a lesson is added.
    course_changes(origin / "notebooks", LESSON, "New in the course.")
    new_lesson(origin / "notebooks", "10_added")
    git("add", "-A", cwd=origin)
    git("commit", "-q", "-m", "update", cwd=origin)
    git("pull", "-q", "--ff-only", cwd=clone)
    done = _cli("update", cwd=clone, env={ws.WORKSPACE_ENV: ""})
    assert done.returncode == 0, done.stderr
    space = clone / "workspace"
    assert (space / f"{LESSON}.ipynb").read_text() == mine
    assert (space / "10_added.ipynb").exists()
    beside = list(space.glob(f"updates/*/{LESSON}.ipynb"))
    assert len(beside) == 1 and "New in the course." in beside[0].read_text()
    assert beside[0].relative_to(space).as_posix() in done.stdout
    assert git("status", "--porcelain", cwd=clone) == ""


def test_make_lab_on_a_taken_port_refuses_first_with_no_token_url(tmp_path):
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        venv = tmp_path / "venv"
        (venv / "bin").mkdir(parents=True)
        os.symlink(sys.executable, venv / "bin" / "python")
        (venv / ".installed").touch()
        os.utime(venv / ".installed", (2**31, 2**31))  # newer than the requirements: nothing is installed
        done = subprocess.run(
            ["make", "-s", f"VENV={venv}", f"WORKSPACE={tmp_path / 'ws'}", f"LAB_PORT={port}", "lab"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=120,
        )
    assert done.returncode != 0
    assert f"Port {port} on 127.0.0.1 is already in use" in done.stderr and f"LAB_PORT={port + 1}" in done.stderr
    assert "token=" not in done.stdout + done.stderr and not (tmp_path / "ws").exists()


def test_status_of_a_workspace_path_that_is_a_file_is_one_sentence_and_exit_status_2(tmp_path, capsys):
    from coursetools.cli import main

    a_file = tmp_path / "a_file"
    a_file.write_text("keep me")
    for where in (a_file, a_file / "ws"):
        assert main(["workspace", "status", "--dir", str(where)]) == 2
        err = capsys.readouterr().err.strip()
        assert err == (
            f"error: {a_file} is a file, not a folder, so the workspace {where} cannot be read there: move that "
            f"file away or choose another folder with --dir (or ${ws.WORKSPACE_ENV})."
        )
    assert a_file.read_text() == "keep me"
