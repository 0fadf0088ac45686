"""coursetools/owner.py: root works on a learner's folder as the learner (make hub as root)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from coursetools.owner import as_owner, other_owner

NOBODY = (65534, 65534)  # Debian's nobody/nogroup: an owner that is neither root nor this test

as_root = pytest.mark.skipif(os.geteuid() != 0, reason="switching users needs root")


@pytest.fixture()
def open_dir():
    """A folder under /tmp that other users may enter (pytest's own are closed to them)."""
    folder = Path(tempfile.mkdtemp(prefix="owner-test-"))
    os.chmod(folder, 0o755)
    yield folder
    shutil.rmtree(folder)


def test_without_root_nothing_changes_hands(tmp_path):
    if os.geteuid() == 0:
        pytest.skip("this one is about a user who is not root")
    assert other_owner(tmp_path) is None


@as_root
def test_root_on_its_own_folder_stays_root(tmp_path):
    assert other_owner(tmp_path / "not-made-yet") is None


@as_root
def test_root_writes_a_learners_folder_as_the_learner_and_their_link_gives_it_no_rights(open_dir):
    home = open_dir / "home"
    home.mkdir()
    os.chown(home, *NOBODY)
    assert other_owner(home / "workspace") == NOBODY  # not made yet: its home's owner

    def work() -> int:
        (home / "workspace").mkdir()
        (home / "workspace" / "lesson.ipynb").write_text("{}")
        return 3

    assert as_owner(NOBODY, work) == 3
    made = home / "workspace" / "lesson.ipynb"
    assert (made.stat().st_uid, made.stat().st_gid) == NOBODY
    assert os.geteuid() == 0  # this process is still root
    os.symlink("/etc", home / "workspace" / "etc")
    os.lchown(home / "workspace" / "etc", *NOBODY)
    assert other_owner(home / "workspace" / "etc") == NOBODY  # the link is the learner's, not /etc

    def write_through_link() -> int:
        (home / "workspace" / "etc" / "owner-test").write_text("x")
        return 0

    assert as_owner(NOBODY, write_through_link) == 1  # PermissionError in the child, reported
    assert not Path("/etc/owner-test").exists()


@as_root
def test_the_workspace_command_as_root_leaves_the_learners_files_theirs(open_dir):
    home = open_dir / "bob"
    home.mkdir()
    os.chown(home, *NOBODY)
    run = [sys.executable, "-m", "coursetools", "workspace", "init", "--dir", str(home / "workspace")]
    done = subprocess.run(run, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    owners = {(p.stat().st_uid, p.stat().st_gid) for p in (home / "workspace").rglob("*")}
    assert owners == {NOBODY}


# The workspace commands with the course's notebooks and solutions at argv[1] and argv[2], run one after another
# in a process of their own (no fork from a test process where JAX's threads may run); prints their exit codes.
COMMANDS_WITH_THE_COURSE_AT = """
import json, sys
from pathlib import Path
from coursetools import cli, solutions, workspace
workspace.COURSE_NOTEBOOKS, solutions.SOLUTIONS_DIR = Path(sys.argv[1]), Path(sys.argv[2])
print(json.dumps([cli.main(command) for command in json.loads(sys.argv[3])]))
"""


@as_root
def test_root_reads_the_course_before_it_becomes_a_learner_who_may_not_enter_the_clone(open_dir):
    """A clone in a folder closed to others (mktemp -d is 0700): the learner's files are still theirs."""
    from coursetools import solutions
    from coursetools import workspace as ws

    closed = Path(tempfile.mkdtemp(prefix="owner-course-"))  # 0700: the learner may not enter it
    try:
        shutil.copytree(ws.COURSE_NOTEBOOKS, closed / "notebooks")
        shutil.copytree(solutions.SOLUTIONS_DIR, closed / "solutions")
        home = open_dir / "bob"
        home.mkdir()
        os.chown(home, *NOBODY)
        workspace = home / "workspace"
        actions = [["init"], ["catchup", "03"], ["status"], ["update", "99"]]
        commands = [["workspace", *action, "--dir", str(workspace)] for action in actions]
        run = [sys.executable, "-c", COMMANDS_WITH_THE_COURSE_AT, str(closed / "notebooks"), str(closed / "solutions")]
        done = subprocess.run([*run, json.dumps(commands)], capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout.splitlines()[-1]) == [0, 0, 0, 2], done.stderr  # 99: refused as root, said
        assert "error: No lesson '99' in the course" in done.stderr and "Traceback" not in done.stderr
        lessons = sorted(p.name for p in (closed / "notebooks").glob("[0-9][0-9]_*.ipynb"))
        assert sorted(p.name for p in workspace.glob("*.ipynb")) == lessons
        solved = ws.solved_copy("03_mesh", ws.learner_copy(closed / "notebooks" / "03_mesh.ipynb"))
        assert (workspace / "03_mesh.ipynb").read_text(encoding="utf-8") == solved
        assert len(list((workspace / "old").glob("*/03_mesh.ipynb"))) == 1
        owners = {(p.stat().st_uid, p.stat().st_gid) for p in workspace.rglob("*")}
        assert owners == {NOBODY}
    finally:
        shutil.rmtree(closed)
