"""hub/users.py: learners' system user names, accounts made once, private homes, the spawner's user."""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import pwd
import subprocess
import sys
import uuid
from pathlib import Path
from types import SimpleNamespace

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "hub"))
import users  # noqa: E402 - hub/users.py


def run(coroutine):
    """``asyncio.run`` in a thread of its own: the session's Playwright browser keeps a loop running in this one."""
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(asyncio.run, coroutine).result()


as_root = pytest.mark.skipif(os.geteuid() != 0, reason="making system users needs root (make hub as root)")


def test_a_learner_never_gets_an_existing_account_and_two_learners_never_share_one():
    assert users.system_name("bob") == "jupyter-bob"
    assert users.system_name("root") == "jupyter-root"
    names = ["Bob", "bob.smith", "ana maría", "a" * 40, "a" * 41, "-x", "x" * 24]
    made = [users.system_name(n) for n in names]
    assert len(set(made)) == len(made)
    for name in made:
        assert name.startswith("jupyter-") and len(name) <= users.NAME_MAX
        assert all(ch.isascii() and (ch.isalnum() or ch in "_-") for ch in name), name
        assert name == name.lower()


@as_root
def test_the_account_is_made_once_with_a_private_home_of_its_own(tmp_path):
    learner = f"T{uuid.uuid4().hex[:8]}:, x"  # characters useradd refuses in a name and in its comment
    name = users.system_name(learner)
    home = tmp_path / learner
    try:
        account = users.ensure_user(name, home, learner)
        assert users.ensure_user(name, home, learner).pw_uid == account.pw_uid  # the next start
        assert account.pw_uid != 0 and account.pw_shell == "/bin/bash"
        home.mkdir()
        (home / "workspace").mkdir()
        (home / "workspace" / "note.txt").write_text("made by root in an earlier run")
        os.symlink("/etc/hostname", home / "workspace" / "link")
        users.give_home(home, account)
        assert home.stat().st_mode & 0o777 == 0o700
        for path in (home, home / "workspace", home / "workspace" / "note.txt"):
            assert path.stat().st_uid == account.pw_uid, path
        assert os.stat("/etc/hostname").st_uid == 0  # a link is changed, never what it points to
        said = run(users.run_as(account, ["id", "-u"], {"PATH": "/usr/bin:/bin"}))
        assert said.strip() == str(account.pw_uid)
        with pytest.raises(RuntimeError, match=f"as {name} failed"):
            run(users.run_as(account, ["cat", "/etc/shadow"], {"PATH": "/usr/bin:/bin"}))
    finally:
        subprocess.run(["userdel", name], capture_output=True)


@as_root
def test_the_spawner_runs_the_server_as_the_learners_account_with_its_home(tmp_path):
    learner = f"t{uuid.uuid4().hex[:8]}"
    name = users.system_name(learner)
    try:
        account = users.ensure_user(name, tmp_path / "elsewhere", learner)
        spawner = users.LearnerSpawner(user=SimpleNamespace(name=learner))
        spawner.home_dir = str(tmp_path / learner)
        env = spawner.user_env({})
        assert env["USER"] == name and env["HOME"] == str(tmp_path / learner) and env["SHELL"] == "/bin/bash"
        assert pwd.getpwnam(env["USER"]).pw_uid == account.pw_uid
    finally:
        subprocess.run(["userdel", name], capture_output=True)
