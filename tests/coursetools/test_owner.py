"""coursetools/owner.py: root works on a learner's folder as the learner (make hub as root)."""

from __future__ import annotations

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
